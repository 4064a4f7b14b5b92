"""The facts of the synthetic tool world: cities, weather, companies, shop customers and hotels.

Everything is made once from :data:`WORLD_SEED` with :class:`random.Random`, so every process
(and every machine) sees the same world: the same ids, the same prices, the same forecasts.
Names are invented (``Velmora``, ``Quillfield``...) so that a pretrained model cannot know a fact
without calling a tool; ids (``C204``, ``U5512``, ``O40317``...) are random digits, so an id can
only be copied from a tool's answer, never guessed from a name.

Limits: the world is small (24 cities, 40 customers, 12 companies) and static; a forecast or a
stock price is a hash of its key, not a model of weather or markets.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

WORLD_SEED = 41
YEAR = 2025  # forecasts and stock prices cover this year
CONDITIONS = ("sunny", "cloudy", "rainy", "snowy", "windy", "foggy")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
COUNTRIES = {  # name -> currency
    "Ostrava": "EUR", "Belmark": "GBP", "Sunaria": "JPY", "Tallinor": "SEK", "Corvenia": "CHF", "Ardesia": "USD",
}
# units of one US dollar (fixed rates: conversion is exact arithmetic, not a market)
USD_RATES = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.4, "SEK": 10.6, "CHF": 0.88}
_CITY_NAMES = ("Velmora", "Quillfield", "Brassport", "Norhaven", "Ashcombe", "Dravik", "Elmstead", "Farrowgate",
               "Glimmerton", "Harlowe", "Istrell", "Jorvale", "Kestrun", "Lowmere", "Marisco", "Nettleby",
               "Orlin", "Pembrook", "Rookhaven", "Saltmarsh", "Tiverly", "Umbria Vale", "Wexcombe", "Yarrowdale")
_FIRST = ("mira", "tomas", "anya", "felix", "lena", "oskar", "ines", "jonah", "petra", "ravi", "sofia", "emil",
          "nadia", "hugo", "clara", "viktor", "alma", "bruno", "greta", "idris")
_LAST = ("holt", "varga", "lindqvist", "moreau", "okafor", "brandt", "castell", "dunmore", "esposito", "falk")
_COMPANIES = ("Lumora Systems", "Brightwell Foods", "Kestrel Motors", "Orchid Pharma", "Tidewater Energy",
              "Copperleaf Media", "Northgate Bank", "Silverpine Logistics", "Aurel Textiles", "Quartzline Chips",
              "Harbor & Finch", "Vantor Aerospace")
_PRODUCTS = ("desk lamp", "water bottle", "hiking boots", "coffee grinder", "backpack", "bike helmet", "yoga mat",
             "rain jacket", "thermos", "headphones", "camp stove", "notebook set", "wool scarf", "phone stand",
             "travel pillow", "kettle", "sunglasses", "tent", "frying pan", "board game")
_HOTEL_WORDS = ("Grand", "Harbor", "Lantern", "Willow", "Summit", "Garden", "Crown", "Meadow", "Anchor", "Beacon")
_HOTEL_KINDS = ("Hotel", "Inn", "Lodge", "Suites", "House")


@dataclass
class City:
    city_id: str
    name: str
    country: str
    population: int
    elevation_m: int
    timezone_offset: int
    lat: float
    lon: float


@dataclass
class Hotel:
    hotel_id: str
    name: str
    city_id: str
    stars: int
    price_per_night_eur: float


@dataclass
class Company:
    company_id: str
    name: str
    ticker: str
    employees: int
    founded: int
    headquarters_city_id: str


@dataclass
class Order:
    order_id: str
    user_id: str
    placed_on: str
    items: list[dict]
    total_usd: float
    status: str


@dataclass
class User:
    user_id: str
    name: str
    email: str
    member_since: str
    orders: list[str] = field(default_factory=list)  # newest first


@dataclass
class World:
    """All facts, indexed the ways the tools look them up."""

    cities: dict[str, City]
    hotels: dict[str, Hotel]
    companies: dict[str, Company]
    users: dict[str, User]
    orders: dict[str, Order]
    products: dict[str, dict]

    def city_by_name(self, name: str) -> City | None:
        key = " ".join(str(name).lower().split())
        return next((c for c in self.cities.values() if c.name.lower() == key), None)

    def hotels_in(self, city_id: str) -> list[Hotel]:
        return sorted((h for h in self.hotels.values() if h.city_id == city_id), key=lambda h: h.name)

    def company_by_name(self, name: str) -> Company | None:
        key = " ".join(str(name).lower().split())
        return next((c for c in self.companies.values() if c.name.lower() == key), None)

    def user_by_email(self, email: str) -> User | None:
        key = str(email).strip().lower()
        return next((u for u in self.users.values() if u.email == key), None)


def _ids(rng: random.Random, prefix: str, digits: int, n: int) -> list[str]:
    pool = rng.sample(range(10 ** (digits - 1), 10 ** digits), n)
    return [f"{prefix}{x}" for x in pool]


@lru_cache(maxsize=1)
def world() -> World:
    """The world (built once per process from :data:`WORLD_SEED`)."""
    rng = random.Random(WORLD_SEED)
    countries = list(COUNTRIES)
    cities = {}
    for cid, name in zip(_ids(rng, "C", 3, len(_CITY_NAMES)), _CITY_NAMES):
        cities[cid] = City(cid, name, rng.choice(countries), rng.randrange(40_000, 2_400_000),
                           rng.randrange(2, 2400), rng.randrange(-5, 9), round(rng.uniform(35, 62), 4),
                           round(rng.uniform(-10, 30), 4))
    city_ids = list(cities)
    hotels, used = {}, set()
    hotel_ids = iter(_ids(rng, "H", 4, 10 * len(cities)))
    for cid in city_ids:
        for _ in range(rng.randrange(6, 10)):
            name = f"{rng.choice(_HOTEL_WORDS)} {rng.choice(_HOTEL_KINDS)} {cities[cid].name}"
            if name in used:
                continue
            used.add(name)
            hid = next(hotel_ids)
            hotels[hid] = Hotel(hid, name, cid, rng.randrange(2, 6), round(rng.uniform(55, 420), 2))
    companies = {}
    for kid, name in zip(_ids(rng, "K", 3, len(_COMPANIES)), _COMPANIES):
        letters = "".join(w[0] for w in name.replace("&", "").split())
        ticker = (letters + name.replace(" ", "")[1:4]).upper()[:4]
        companies[kid] = Company(kid, name, ticker, rng.randrange(120, 90_000), rng.randrange(1902, 2019),
                                 rng.choice(city_ids))
    products: dict[str, dict[str, Any]] = {
        pid: {"product_id": pid, "name": name, "price_usd": round(rng.uniform(8, 260), 2),
              "weight_kg": round(rng.uniform(0.1, 6.5), 2)}
        for pid, name in zip(_ids(rng, "P", 4, len(_PRODUCTS)), _PRODUCTS)}
    users, orders = {}, {}
    order_ids = iter(_ids(rng, "O", 5, 400))
    names = rng.sample([(f, last) for f in _FIRST for last in _LAST], 40)
    for uid, (first, last) in zip(_ids(rng, "U", 4, 40), names):
        user = User(uid, f"{first.title()} {last.title()}", f"{first}.{last}@example.com",
                    _date(rng, 2018, 2024))
        dates = sorted((_date(rng, 2023, 2025) for _ in range(rng.randrange(1, 9))), reverse=True)
        for placed in dates:
            oid = next(order_ids)
            picked = rng.sample(sorted(products), rng.randrange(1, 4))
            items: list[dict[str, Any]] = [{"product_id": pid, "qty": rng.randrange(1, 4)} for pid in picked]
            total = round(sum(products[i["product_id"]]["price_usd"] * i["qty"] for i in items), 2)
            orders[oid] = Order(oid, uid, placed, items, total, rng.choice(("delivered", "shipped", "processing")))
            user.orders.append(oid)
        users[uid] = user
    return World(cities, hotels, companies, users, orders, products)


def _date(rng: random.Random, first_year: int, last_year: int) -> str:
    start = dt.date(first_year, 1, 1)
    span = (dt.date(last_year, 12, 31) - start).days
    return (start + dt.timedelta(days=rng.randrange(span + 1))).isoformat()


def keyed(*parts: object) -> float:
    """A number in [0, 1) that depends only on ``parts`` (forecasts, stock prices)."""
    digest = hashlib.sha256("|".join(map(str, (WORLD_SEED, *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


def forecast_for(city: City, date: dt.date) -> dict:
    """The forecast of ``city`` on ``date``: a seasonal curve plus a keyed deviation."""
    season = -12 * math.cos(2 * math.pi * (date.timetuple().tm_yday - 15) / 365)
    temp = round(8 + season - city.elevation_m / 300 + 10 * (keyed("t", city.city_id, date) - 0.5), 1)
    condition = CONDITIONS[int(keyed("c", city.city_id, date) * len(CONDITIONS))]
    if condition == "snowy" and temp > 3:
        condition = "rainy"
    return {"city_id": city.city_id, "date": date.isoformat(), "temp_c": temp, "condition": condition,
            "wind_kmh": int(5 + 40 * keyed("w", city.city_id, date))}


def close_price(company: Company, date: dt.date) -> float:
    """The closing price (USD) of ``company`` on a trading day ``date``."""
    base = 20 + 300 * keyed("base", company.company_id)
    return round(base * (0.8 + 0.4 * keyed("p", company.company_id, date)), 2)


def distance_km(a: City, b: City) -> float:
    """Great-circle distance between two cities, in km (haversine, radius 6371 km), 1 decimal."""
    p1, p2 = math.radians(a.lat), math.radians(b.lat)
    dp, dl = p2 - p1, math.radians(b.lon - a.lon)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return round(2 * 6371 * math.asin(math.sqrt(h)), 1)
