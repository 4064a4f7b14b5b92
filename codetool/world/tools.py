"""The tools of the synthetic world: 25 deterministic Python functions with typed arguments.

Each tool is a :class:`WorldTool`: its service (``geo``, ``weather``, ``finance``, ``shop``,
``travel``, ``calc``), its function name, a one-line description, its parameters
(:class:`codetool.tools.spec.Parameter`, so the policy sees them rendered like any benchmark's
APIs) and the function. A function takes the arguments by name and returns a JSON-able dict, or
raises :class:`WorldError` with one of the :class:`~codetool.tools.spec.ToolResponse` statuses:

- ``invalid_arguments``: a wrong type, a date not written ``YYYY-MM-DD``, units that cannot be
  converted into each other, a currency the world does not know;
- ``not_found``: an id or a name that does not exist (``C999``, an e-mail of no customer);
- ``api_error``: a well-formed request the service refuses, sent back as an error payload
  (``{"error": ...}``): a page past the last one, a forecast outside the covered year, a stock
  quote on a day the market was closed.

Lookups chain: a city's facts need its ``city_id`` from ``find_city``, an order's total needs an
``order_id`` from ``list_orders`` (which needs the ``user_id`` from ``find_user``), and so on.
Lists are paginated (``page``, ``total_pages``). Arithmetic is done by tools (``convert_units``,
``convert_currency``, ``add_days``, ``days_between``, ``weekday``), so a policy whose steps may
only pass literal arguments can still compute: it copies numbers from one answer into the next call.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass

from codetool.tools.spec import Parameter
from codetool.world.data import (
    COUNTRIES,
    USD_RATES,
    WEEKDAYS,
    YEAR,
    close_price,
    distance_km,
    forecast_for,
    keyed,
    world,
)


class WorldError(Exception):
    """A tool's refusal: ``status`` is a ``ToolResponse`` status, ``message`` one model-readable line."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class WorldTool:
    """One tool of the world (rendered as one API: ``category`` world, ``tool`` the service)."""

    service: str
    name: str
    description: str
    parameters: tuple[Parameter, ...]
    function: Callable[..., dict]
    returns: tuple[str, ...]  # the top-level keys of the answer (the rendered response sketch)


def _p(name: str, kind: str, description: str, required: bool = True, default=None) -> Parameter:
    return Parameter(name=name, type=kind, description=description, required=required, default=default)


# ---------------------------------------------------------------- argument checks
def _date(value, name: str = "date") -> dt.date:
    try:
        return dt.date.fromisoformat(str(value).strip())
    except ValueError:
        raise WorldError("invalid_arguments", f"{name} must be a date written YYYY-MM-DD, got {value!r}") from None


def _int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise WorldError("invalid_arguments", f"{name} must be an integer, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise WorldError("invalid_arguments", f"{name} must be an integer, got {value!r}") from None
    if not number.is_integer():
        raise WorldError("invalid_arguments", f"{name} must be a whole number, got {value!r}")
    return int(number)


def _number(value, name: str) -> float:
    if isinstance(value, bool):
        raise WorldError("invalid_arguments", f"{name} must be a number, got {value!r}")
    try:
        number = float(str(value).replace(",", "")) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise WorldError("invalid_arguments", f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise WorldError("invalid_arguments", f"{name} must be a finite number, got {value!r}")
    return number


def _page(items: list, page, size: int, key: str, **head) -> dict:
    page = _int(page, "page")
    pages = max(1, math.ceil(len(items) / size))
    if page < 1 or page > pages:
        raise WorldError("api_error", f"page {page} is out of range: there are {pages} page(s)")
    return {**head, key: items[(page - 1) * size: page * size], "page": page, "total_pages": pages,
            "total": len(items)}


def _city(city_id):
    city = world().cities.get(str(city_id).strip().upper())
    if city is None:
        raise WorldError("not_found", f"no city with id {city_id!r}; get city ids from find_city")
    return city


def _currency(code, name: str) -> str:
    code = str(code).strip().upper()
    if code not in USD_RATES:
        raise WorldError("invalid_arguments", f"{name} {code!r} is not supported; use one of {', '.join(USD_RATES)}")
    return code


# ---------------------------------------------------------------- geo
def find_city(name):
    city = world().city_by_name(name)
    if city is None:
        raise WorldError("not_found", f"no city named {name!r}")
    return {"city_id": city.city_id, "name": city.name, "country": city.country}


def city_info(city_id):
    c = _city(city_id)
    return {"city_id": c.city_id, "name": c.name, "country": c.country, "population": c.population,
            "elevation_m": c.elevation_m, "timezone_offset_h": c.timezone_offset}


def city_distance(from_city_id, to_city_id):
    a, b = _city(from_city_id), _city(to_city_id)
    return {"from_city_id": a.city_id, "to_city_id": b.city_id, "distance_km": distance_km(a, b)}


def list_cities(country, page=1):
    wanted = str(country).strip().lower()
    if wanted not in {c.lower() for c in COUNTRIES}:
        raise WorldError("not_found", f"no country named {country!r}")
    rows = sorted((c for c in world().cities.values() if c.country.lower() == wanted), key=lambda c: c.name)
    return _page([{"city_id": c.city_id, "name": c.name} for c in rows], page, 5, "cities")


# ---------------------------------------------------------------- weather
def forecast(city_id, date):
    city, day = _city(city_id), _date(date)
    if day.year != YEAR:
        raise WorldError("api_error", f"no forecast for {day.isoformat()}: forecasts cover {YEAR} only")
    return forecast_for(city, day)


def air_quality(city_id):
    city = _city(city_id)
    return {"city_id": city.city_id, "aqi": int(10 + 140 * keyed("aqi", city.city_id))}


# ---------------------------------------------------------------- finance
def find_company(name):
    company = world().company_by_name(name)
    if company is None:
        raise WorldError("not_found", f"no company named {name!r}")
    return {"company_id": company.company_id, "name": company.name, "ticker": company.ticker}


def company_profile(company_id):
    c = world().companies.get(str(company_id).strip().upper())
    if c is None:
        raise WorldError("not_found", f"no company with id {company_id!r}; get ids from find_company")
    return {"company_id": c.company_id, "name": c.name, "employees": c.employees, "founded": c.founded,
            "headquarters_city_id": c.headquarters_city_id}


def stock_quote(ticker, date):
    day = _date(date)
    company = next((c for c in world().companies.values() if c.ticker == str(ticker).strip().upper()), None)
    if company is None:
        raise WorldError("not_found", f"no company with ticker {ticker!r}; get tickers from find_company")
    if day.year != YEAR:
        raise WorldError("api_error", f"no quotes for {day.isoformat()}: quotes cover {YEAR} only")
    if day.weekday() >= 5:
        raise WorldError("api_error", f"the market was closed on {day.isoformat()} ({WEEKDAYS[day.weekday()]})")
    return {"ticker": company.ticker, "date": day.isoformat(), "close_usd": close_price(company, day)}


def exchange_rate(from_currency, to_currency):
    a, b = _currency(from_currency, "from_currency"), _currency(to_currency, "to_currency")
    return {"from_currency": a, "to_currency": b, "rate": round(USD_RATES[b] / USD_RATES[a], 6)}


# ---------------------------------------------------------------- shop
def find_user(email):
    user = world().user_by_email(email)
    if user is None:
        raise WorldError("not_found", f"no customer with e-mail {email!r}")
    return {"user_id": user.user_id, "name": user.name, "member_since": user.member_since}


def list_orders(user_id, page=1):
    user = world().users.get(str(user_id).strip().upper())
    if user is None:
        raise WorldError("not_found", f"no customer with id {user_id!r}; get ids from find_user")
    rows = [{"order_id": o, "placed_on": world().orders[o].placed_on} for o in user.orders]
    return _page(rows, page, 3, "orders", user_id=user.user_id)


def _order(order_id):
    order = world().orders.get(str(order_id).strip().upper())
    if order is None:
        raise WorldError("not_found", f"no order with id {order_id!r}; get ids from list_orders")
    return order


def order_details(order_id):
    o = _order(order_id)
    return {"order_id": o.order_id, "placed_on": o.placed_on, "items": o.items, "total_usd": o.total_usd,
            "status": o.status}


def track_order(order_id):
    o = _order(order_id)
    eta = dt.date.fromisoformat(o.placed_on) + dt.timedelta(days=2 + int(6 * keyed("eta", o.order_id)))
    return {"order_id": o.order_id, "status": o.status, "carrier": ("Postwing", "Rapidly", "Cargola")[
        int(3 * keyed("carrier", o.order_id))], "delivery_date": eta.isoformat()}


def product_info(product_id):
    p = world().products.get(str(product_id).strip().upper())
    if p is None:
        raise WorldError("not_found", f"no product with id {product_id!r}")
    return dict(p)


# ---------------------------------------------------------------- travel
def list_hotels(city_id, page=1):
    city = _city(city_id)
    rows = [{"hotel_id": h.hotel_id, "name": h.name, "stars": h.stars} for h in world().hotels_in(city.city_id)]
    return _page(rows, page, 4, "hotels", city_id=city.city_id)


def _hotel(hotel_id):
    hotel = world().hotels.get(str(hotel_id).strip().upper())
    if hotel is None:
        raise WorldError("not_found", f"no hotel with id {hotel_id!r}; get ids from list_hotels")
    return hotel


def hotel_details(hotel_id):
    h = _hotel(hotel_id)
    return {"hotel_id": h.hotel_id, "name": h.name, "city_id": h.city_id, "stars": h.stars,
            "price_per_night_eur": h.price_per_night_eur}


def hotel_quote(hotel_id, nights):
    h, n = _hotel(hotel_id), _int(nights, "nights")
    if not 1 <= n <= 30:
        raise WorldError("invalid_arguments", f"nights must be between 1 and 30, got {n}")
    return {"hotel_id": h.hotel_id, "nights": n, "total_eur": round(h.price_per_night_eur * n, 2)}


def _flights(a, b, day: dt.date) -> list[dict]:
    count = 3 + int(5 * keyed("n", a.city_id, b.city_id, day))
    km = distance_km(a, b)
    out = []
    for k in range(count):
        minute = int(5 * 60 + 17 * 60 * keyed("dep", a.city_id, b.city_id, day, k)) // 5 * 5
        out.append({"flight_id": f"FL-{a.city_id}-{b.city_id}-{day.strftime('%m%d')}-{k + 1}",
                    "departure": f"{minute // 60:02d}:{minute % 60:02d}",
                    "price_usd": round(40 + km * 0.11 * (0.7 + 0.9 * keyed("fare", a.city_id, b.city_id, day, k)), 2),
                    "duration_min": int(35 + km / 11 + 40 * keyed("dur", a.city_id, b.city_id, k))})
    return sorted(out, key=lambda f: f["departure"])


def search_flights(origin_city_id, destination_city_id, date, page=1):
    a, b, day = _city(origin_city_id), _city(destination_city_id), _date(date)
    if a.city_id == b.city_id:
        raise WorldError("invalid_arguments", "origin and destination are the same city")
    rows = [{k: f[k] for k in ("flight_id", "departure", "price_usd")} for f in _flights(a, b, day)]
    return _page(rows, page, 3, "flights")


def flight_details(flight_id):
    parts = str(flight_id).strip().upper().split("-")
    try:
        _, a_id, b_id, mmdd, k = parts
        a, b = _city(a_id), _city(b_id)
        day = dt.date(YEAR, int(mmdd[:2]), int(mmdd[2:]))
        return _flights(a, b, day)[int(k) - 1] | {"date": day.isoformat()}
    except (ValueError, IndexError, WorldError):
        raise WorldError("not_found", f"no flight with id {flight_id!r}; get ids from search_flights") from None


# ---------------------------------------------------------------- calc
_UNITS = {"km": ("length", 1000.0), "mi": ("length", 1609.344), "m": ("length", 1.0), "ft": ("length", 0.3048),
          "kg": ("mass", 1.0), "lb": ("mass", 0.45359237), "min": ("time", 60.0), "h": ("time", 3600.0)}
_TEMPERATURES = ("c", "f")


def convert_units(value, from_unit, to_unit):
    x = _number(value, "value")
    a, b = str(from_unit).strip().lower(), str(to_unit).strip().lower()
    known = sorted(_UNITS) + list(_TEMPERATURES)
    for unit in (a, b):
        if unit not in known:
            raise WorldError("invalid_arguments", f"unknown unit {unit!r}; use one of {', '.join(known)}")
    if a in _TEMPERATURES or b in _TEMPERATURES:
        if not (a in _TEMPERATURES and b in _TEMPERATURES):
            raise WorldError("invalid_arguments", f"cannot convert {a} to {b}")
        out = x if a == b else (x * 9 / 5 + 32 if a == "c" else (x - 32) * 5 / 9)
    else:
        if _UNITS[a][0] != _UNITS[b][0]:
            raise WorldError("invalid_arguments", f"cannot convert {a} ({_UNITS[a][0]}) to {b} ({_UNITS[b][0]})")
        out = x * _UNITS[a][1] / _UNITS[b][1]
    return {"value": round(out, 2), "unit": b}


def convert_currency(amount, from_currency, to_currency):
    x = _number(amount, "amount")
    a, b = _currency(from_currency, "from_currency"), _currency(to_currency, "to_currency")
    return {"amount": round(x * USD_RATES[b] / USD_RATES[a], 2), "currency": b}


def add_days(date, days):
    day, n = _date(date), _int(days, "days")
    if abs(n) > 3650:
        raise WorldError("invalid_arguments", f"days must lie within +-3650, got {n}")
    return {"date": (day + dt.timedelta(days=n)).isoformat()}


def days_between(start_date, end_date):
    a, b = _date(start_date, "start_date"), _date(end_date, "end_date")
    return {"days": (b - a).days}


def weekday(date):
    day = _date(date)
    return {"date": day.isoformat(), "weekday": WEEKDAYS[day.weekday()]}


def _tool(service, function, description, params, returns) -> WorldTool:
    return WorldTool(service, function.__name__, description, tuple(params), function, tuple(returns))


_PAGE = _p("page", "integer", "page number, from 1", required=False, default=1)
_DATE = _p("date", "string", "a date, YYYY-MM-DD")
TOOLS: tuple[WorldTool, ...] = (
    _tool("geo", find_city, "Find a city by name: its city_id.", [_p("name", "string", "city name")],
          ("city_id", "name", "country")),
    _tool("geo", city_info, "Population, elevation, country of a city.", [_p("city_id", "string", "from find_city")],
          ("city_id", "name", "country", "population", "elevation_m", "timezone_offset_h")),
    _tool("geo", city_distance, "Distance in km between two cities.",
          [_p("from_city_id", "string", "from find_city"), _p("to_city_id", "string", "from find_city")],
          ("from_city_id", "to_city_id", "distance_km")),
    _tool("geo", list_cities, "Cities of a country, 5 per page.", [_p("country", "string", "country name"), _PAGE],
          ("cities", "page", "total_pages", "total")),
    _tool("weather", forecast, "Weather forecast of a city on a date.",
          [_p("city_id", "string", "from find_city"), _DATE], ("city_id", "date", "temp_c", "condition", "wind_kmh")),
    _tool("weather", air_quality, "Air quality index of a city today.", [_p("city_id", "string", "from find_city")],
          ("city_id", "aqi")),
    _tool("finance", find_company, "Find a company by name: id, ticker.", [_p("name", "string", "company name")],
          ("company_id", "name", "ticker")),
    _tool("finance", company_profile, "Employees, founding year, HQ city.",
          [_p("company_id", "string", "from find_company")],
          ("company_id", "name", "employees", "founded", "headquarters_city_id")),
    _tool("finance", stock_quote, "Closing stock price (USD) on a date.",
          [_p("ticker", "string", "from find_company"), _DATE], ("ticker", "date", "close_usd")),
    _tool("finance", exchange_rate, "Exchange rate between two currencies.",
          [_p("from_currency", "string", "e.g. USD"), _p("to_currency", "string", "e.g. EUR")],
          ("from_currency", "to_currency", "rate")),
    _tool("shop", find_user, "Find a customer by e-mail: user_id.", [_p("email", "string", "e-mail address")],
          ("user_id", "name", "member_since")),
    _tool("shop", list_orders, "A customer's orders, newest first.",
          [_p("user_id", "string", "from find_user"), _PAGE], ("user_id", "orders", "page", "total_pages", "total")),
    _tool("shop", order_details, "Items, total (USD), status of an order.",
          [_p("order_id", "string", "from list_orders")], ("order_id", "placed_on", "items", "total_usd", "status")),
    _tool("shop", track_order, "Carrier and delivery date of an order.",
          [_p("order_id", "string", "from list_orders")], ("order_id", "status", "carrier", "delivery_date")),
    _tool("shop", product_info, "Name, price and weight of a product.", [_p("product_id", "string", "product id")],
          ("product_id", "name", "price_usd", "weight_kg")),
    _tool("travel", list_hotels, "Hotels of a city, 4 per page.", [_p("city_id", "string", "from find_city"), _PAGE],
          ("city_id", "hotels", "page", "total_pages", "total")),
    _tool("travel", hotel_details, "Stars and nightly price (EUR) of a hotel.",
          [_p("hotel_id", "string", "from list_hotels")],
          ("hotel_id", "name", "city_id", "stars", "price_per_night_eur")),
    _tool("travel", hotel_quote, "Total price (EUR) of a stay.",
          [_p("hotel_id", "string", "from list_hotels"), _p("nights", "integer", "number of nights")],
          ("hotel_id", "nights", "total_eur")),
    _tool("travel", search_flights, "Flights between two cities on a date.",
          [_p("origin_city_id", "string", "from find_city"), _p("destination_city_id", "string", "from find_city"),
           _DATE, _PAGE], ("flights", "page", "total_pages", "total")),
    _tool("travel", flight_details, "Departure, price, duration of a flight.",
          [_p("flight_id", "string", "from search_flights")],
          ("flight_id", "departure", "price_usd", "duration_min", "date")),
    _tool("calc", convert_units, "Convert km/mi/m/ft, kg/lb, min/h, c/f.",
          [_p("value", "number", "the number"), _p("from_unit", "string", "e.g. km"),
           _p("to_unit", "string", "e.g. mi")], ("value", "unit")),
    _tool("calc", convert_currency, "Convert an amount between currencies.",
          [_p("amount", "number", "the amount"), _p("from_currency", "string", "e.g. USD"),
           _p("to_currency", "string", "e.g. EUR")], ("amount", "currency")),
    _tool("calc", add_days, "The date a number of days after a date.",
          [_DATE, _p("days", "integer", "days to add (negative: before)")], ("date",)),
    _tool("calc", days_between, "Days from one date to another.",
          [_p("start_date", "string", "YYYY-MM-DD"), _p("end_date", "string", "YYYY-MM-DD")], ("days",)),
    _tool("calc", weekday, "The day of the week of a date.", [_DATE], ("date", "weekday")),
)
BY_NAME: dict[str, WorldTool] = {t.name: t for t in TOOLS}
