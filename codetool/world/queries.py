"""Multi-step queries of the synthetic world with known answers, in train and held-out splits.

A query comes from a :class:`Template`: it draws its parameters (a city, a date, a customer...)
from a seeded :class:`random.Random`, then *solves itself* by calling the world's tools in order,
so its answer key (:mod:`codetool.world.answers`) and its scripted solution (the calls, each with
literal arguments, copied from the answers before it) are exact. A query needs 1 to 4 tool calls.

**Splits are by template.** :data:`TEMPLATES` names each template's split: ``train`` templates
feed demonstrations, trees and RL prompts; ``heldout`` templates only evaluation. No template is
in both (a test checks it), so a held-out query asks something no training query asked, with the
same tools combined another way (a field not asked before, a conversion added, a tool never
demonstrated).

**Seeded and prefix-stable.** Query ``i`` of a split depends only on ``(seed, split, i)`` (and on
the queries before it only to skip a repeated text), so ``generate("heldout", 40)`` starts with
``generate("heldout", 20)``; templates take turns (query ``i`` uses template ``i mod T``). Each
query offers its template's tools plus seeded distractors, :data:`TOOLS_PER_QUERY` in all.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from codetool.world.answers import given_values
from codetool.world.data import YEAR, world
from codetool.world.tools import BY_NAME, TOOLS

SPLITS = ("train", "heldout")
TOOLS_PER_QUERY = 7


@dataclass
class WorldQuery:
    """One generated query.

    Args:
        query_id (`str`): ``<split>-<index>``, e.g. ``heldout-0003``.
        query (`str`): the request, as the policy reads it.
        template (`str`), split (`str`): where it comes from.
        tools (`list[str]`): the function names it offers, in prompt order.
        calls (`list[tuple[str, dict]]`): the scripted solution, literal arguments.
        key (`dict`): the answer key (``codetool.world.answers.check_answer``).
        answer (`str`): the answer as a demonstration writes it (``finish("...")``).
    """

    query_id: str
    query: str
    template: str
    split: str
    tools: list[str]
    calls: list[tuple[str, dict]]
    key: dict
    answer: str
    extra: dict = field(default_factory=dict)


class Solver:
    """Calls tools the way a scripted solution does and records each call."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def __call__(self, tool: str, /, **arguments) -> dict:
        self.calls.append((tool, dict(arguments)))
        return BY_NAME[tool].function(**arguments)


@dataclass(frozen=True)
class Template:
    """A kind of query: ``make(rng, solve) -> (text, kind, value, answer text[, domain])``."""

    name: str
    split: str
    make: Callable


def _day(rng: random.Random, weekdays_only: bool = False) -> str:
    while True:
        day = dt.date(YEAR, 1, 1) + dt.timedelta(days=rng.randrange(365))
        if not weekdays_only or day.weekday() < 5:
            return day.isoformat()


def _city(rng):
    return rng.choice(sorted(world().cities.values(), key=lambda c: c.city_id))


def _user(rng):
    return rng.choice(sorted(world().users.values(), key=lambda u: u.user_id))


def _company(rng):
    return rng.choice(sorted(world().companies.values(), key=lambda c: c.company_id))


def _km(rng) -> float:
    return float(rng.randrange(3, 900)) if rng.random() < 0.6 else round(rng.uniform(1, 400), 1)


def _num(x: float) -> str:
    return f"{x:g}" if float(x).is_integer() else f"{x}"


# ---------------------------------------------------------------- train templates
def km_to_miles(rng, solve):
    km = _km(rng)
    v = solve("convert_units", value=km, from_unit="km", to_unit="mi")["value"]
    return f"How many miles is {_num(km)} km?", "number", v, f"{v} miles"


def days_after(rng, solve):
    start, n = _day(rng), rng.randrange(2, 200)
    v = solve("add_days", date=start, days=n)["date"]
    return f"What is the date {n} days after {start}?", "date", v, v


def population(rng, solve):
    city = _city(rng)
    cid = solve("find_city", name=city.name)["city_id"]
    v = solve("city_info", city_id=cid)["population"]
    return f"What is the population of {city.name}?", "number", v, f"{v} people"


def forecast_celsius(rng, solve):
    city, day = _city(rng), _day(rng)
    cid = solve("find_city", name=city.name)["city_id"]
    v = solve("forecast", city_id=cid, date=day)["temp_c"]
    return f"What temperature in Celsius is forecast for {city.name} on {day}?", "number", v, f"{v} C"


def order_count(rng, solve):
    user = _user(rng)
    uid = solve("find_user", email=user.email)["user_id"]
    v = solve("list_orders", user_id=uid)["total"]
    return f"How many orders has the customer {user.email} placed?", "number", v, f"{v} orders"


def stock_close(rng, solve):
    company, day = _company(rng), _day(rng, weekdays_only=True)
    ticker = solve("find_company", name=company.name)["ticker"]
    v = solve("stock_quote", ticker=ticker, date=day)["close_usd"]
    return f"What was the closing price of {company.name} stock on {day}?", "number", v, f"{v} USD"


def distance_km(rng, solve):
    a, b = rng.sample(sorted(world().cities.values(), key=lambda c: c.city_id), 2)
    ia, ib = solve("find_city", name=a.name)["city_id"], solve("find_city", name=b.name)["city_id"]
    v = solve("city_distance", from_city_id=ia, to_city_id=ib)["distance_km"]
    return f"How far apart are {a.name} and {b.name} in km?", "number", v, f"{v} km"


def last_order_usd(rng, solve):
    user = _user(rng)
    uid = solve("find_user", email=user.email)["user_id"]
    oid = solve("list_orders", user_id=uid)["orders"][0]["order_id"]
    v = solve("order_details", order_id=oid)["total_usd"]
    return f"What was the total in USD of the latest order of {user.email}?", "number", v, f"{v} USD"


def hotel_stay(rng, solve):
    city = _city(rng)
    hotels = world().hotels_in(city.city_id)
    hotel, nights = rng.choice(hotels), rng.randrange(2, 10)
    while hotels.index(hotel) >= 8:  # on the third page: more than 4 calls (draws again)
        hotel = rng.choice(hotels)
    cid = solve("find_city", name=city.name)["city_id"]
    page = solve("list_hotels", city_id=cid)
    while hotel.hotel_id not in {h["hotel_id"] for h in page["hotels"]}:  # the next page, as a reader would
        page = solve("list_hotels", city_id=cid, page=page["page"] + 1)
    v = solve("hotel_quote", hotel_id=hotel.hotel_id, nights=nights)["total_eur"]
    return f"How much do {nights} nights at the {hotel.name} in {city.name} cost in EUR?", "number", v, f"{v} EUR"


def forecast_fahrenheit(rng, solve):
    city, day = _city(rng), _day(rng)
    cid = solve("find_city", name=city.name)["city_id"]
    temp = solve("forecast", city_id=cid, date=day)["temp_c"]
    v = solve("convert_units", value=temp, from_unit="c", to_unit="f")["value"]
    return f"What temperature in Fahrenheit is forecast for {city.name} on {day}?", "number", v, f"{v} F"


def weekday_of(rng, solve):
    day = _day(rng)
    v = solve("weekday", date=day)["weekday"]
    return f"Which day of the week is {day}?", "text", v, v, "weekday"


def hq_population(rng, solve):
    company = _company(rng)
    kid = solve("find_company", name=company.name)["company_id"]
    cid = solve("company_profile", company_id=kid)["headquarters_city_id"]
    v = solve("city_info", city_id=cid)["population"]
    return f"What is the population of the city where {company.name} has its headquarters?", "number", v, \
        f"{v} people"


# ---------------------------------------------------------------- held-out templates
def elevation(rng, solve):
    city = _city(rng)
    cid = solve("find_city", name=city.name)["city_id"]
    v = solve("city_info", city_id=cid)["elevation_m"]
    return f"What is the elevation of {city.name} in meters?", "number", v, f"{v} m"


def distance_miles(rng, solve):
    a, b = rng.sample(sorted(world().cities.values(), key=lambda c: c.city_id), 2)
    ia, ib = solve("find_city", name=a.name)["city_id"], solve("find_city", name=b.name)["city_id"]
    km = solve("city_distance", from_city_id=ia, to_city_id=ib)["distance_km"]
    v = solve("convert_units", value=km, from_unit="km", to_unit="mi")["value"]
    return f"How far apart are {a.name} and {b.name} in miles?", "number", v, f"{v} miles"


def days_before(rng, solve):
    start, n = _day(rng), rng.randrange(2, 200)
    v = solve("add_days", date=start, days=-n)["date"]
    return f"What was the date {n} days before {start}?", "date", v, v


def days_from_to(rng, solve):
    a, b = sorted(rng.sample(range(365), 2))
    d1, d2 = ((dt.date(YEAR, 1, 1) + dt.timedelta(days=x)).isoformat() for x in (a, b))
    v = solve("days_between", start_date=d1, end_date=d2)["days"]
    return f"How many days are there from {d1} to {d2}?", "number", v, f"{v} days"


def last_order_eur(rng, solve):
    user = _user(rng)
    uid = solve("find_user", email=user.email)["user_id"]
    oid = solve("list_orders", user_id=uid)["orders"][0]["order_id"]
    usd = solve("order_details", order_id=oid)["total_usd"]
    v = solve("convert_currency", amount=usd, from_currency="USD", to_currency="EUR")["amount"]
    return f"What was the total in EUR of the latest order of {user.email}?", "number", v, f"{v} EUR"


def condition(rng, solve):
    city, day = _city(rng), _day(rng)
    cid = solve("find_city", name=city.name)["city_id"]
    v = solve("forecast", city_id=cid, date=day)["condition"]
    return f"Which weather condition is forecast for {city.name} on {day}?", "text", v, v, "condition"


def hq_city(rng, solve):
    company = _company(rng)
    kid = solve("find_company", name=company.name)["company_id"]
    cid = solve("company_profile", company_id=kid)["headquarters_city_id"]
    v = solve("city_info", city_id=cid)["name"]
    return f"In which city does {company.name} have its headquarters?", "text", v, v, "city"


def weekday_after(rng, solve):
    start, n = _day(rng), rng.randrange(2, 200)
    day = solve("add_days", date=start, days=n)["date"]
    v = solve("weekday", date=day)["weekday"]
    return f"Which day of the week is {n} days after {start}?", "text", v, v, "weekday"


TEMPLATES: tuple[Template, ...] = tuple(
    Template(f.__name__, split, f) for split, fs in (
        ("train", (km_to_miles, days_after, population, forecast_celsius, order_count, stock_close, distance_km,
                   last_order_usd, hotel_stay, forecast_fahrenheit, weekday_of, hq_population)),
        ("heldout", (elevation, distance_miles, days_before, days_from_to, last_order_eur, condition, hq_city,
                     weekday_after)))
    for f in fs)


def templates(split: str) -> list[Template]:
    """The templates of ``split`` (``train`` or ``heldout``).

    Raises:
        ValueError: an unknown split.
    """
    if split not in SPLITS:
        raise ValueError(f"world split must be one of {SPLITS}, got {split!r}.")
    return [t for t in TEMPLATES if t.split == split]


def make_query(template: Template, rng: random.Random, query_id: str) -> WorldQuery:
    """One query of ``template`` drawn with ``rng``: solved by its scripted calls, tools offered."""
    solve = Solver()
    text, kind, value, answer, *domain = template.make(rng, solve)
    key = {"kind": kind, "value": value, "given": given_values(kind, text)}
    if kind == "number":
        key["decimals"] = 0 if isinstance(value, int) else len(f"{value}".split(".")[1]) if "." in f"{value}" else 0
    if domain:
        key["domain"] = domain[0]
    needed = list(dict.fromkeys(name for name, _ in solve.calls))
    others = sorted(t.name for t in TOOLS if t.name not in needed)
    offered = needed + rng.sample(others, max(0, TOOLS_PER_QUERY - len(needed)))
    rng.shuffle(offered)
    return WorldQuery(query_id, text, template.name, template.split, offered, solve.calls, key, answer)


def generate(split: str, n: int, seed: int = 0) -> list[WorldQuery]:
    """The first ``n`` queries of ``split`` under ``seed`` (module docstring: prefix-stable).

    Raises:
        ValueError: an unknown split or ``n < 0``.
    """
    if n < 0:
        raise ValueError(f"the number of world queries must be >= 0, got {n}.")
    pool = templates(split)
    out, seen = [], set()
    for i in range(n):
        for attempt in range(50):  # a repeated text draws again (a small template can repeat itself)
            rng = random.Random(f"world:{seed}:{split}:{i}:{attempt}")
            query = make_query(pool[i % len(pool)], rng, f"{split}-{i:04d}")
            if query.query not in seen:
                break
        seen.add(query.query)
        out.append(query)
    return out
