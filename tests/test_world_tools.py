"""The world's tools behind the normal seam: typed answers, chained ids, pagination, and each
failure mode with its status (as the policy's code sees it: a ToolError)."""

from __future__ import annotations

import json

import pytest

from codetool.assemble import tool_backend
from codetool.tools.environment import ToolEnvironment
from codetool.tools.render import render_tools
from codetool.tools.spec import APISpec
from codetool.world import WorldBackend, world_apis
from codetool.world.data import world
from codetool.world.tools import TOOLS


@pytest.fixture(scope="module")
def env():
    return ToolEnvironment(world_apis(), WorldBackend())


def call(env, function, /, **kwargs):
    response = env.call(function, (), kwargs)
    return response, (json.loads(response.content) if response.content else None)


def test_a_few_dozen_typed_tools_render_as_apis(env):
    assert len(TOOLS) == 25 and len({t.name for t in TOOLS}) == 25
    text = render_tools(world_apis(), "brief")
    assert "def find_city(name: str) -> dict:" in text and "def add_days(date: str, days: int) -> dict:" in text
    assert "def list_hotels(city_id: str, page: int | None = 1) -> dict:" in text
    with tool_backend("auto", benchmark="world") as backend:
        assert isinstance(backend, WorldBackend)
    with tool_backend("world") as backend:
        assert isinstance(backend, WorldBackend)


def test_lookups_chain_through_ids(env):
    city = sorted(world().cities.values(), key=lambda c: c.city_id)[0]
    found = call(env, "find_city", name=city.name.upper())[1]
    info = call(env, "city_info", city_id=found["city_id"])[1]
    assert info["population"] == city.population and info["name"] == city.name
    user = sorted(world().users.values(), key=lambda u: u.user_id)[0]
    uid = call(env, "find_user", email=user.email)[1]["user_id"]
    orders = call(env, "list_orders", user_id=uid)[1]
    details = call(env, "order_details", order_id=orders["orders"][0]["order_id"])[1]
    assert details["total_usd"] == world().orders[user.orders[0]].total_usd
    assert orders["total"] == len(user.orders)


def test_arithmetic_tools_compute_exactly(env):
    assert call(env, "convert_units", value=10, from_unit="km", to_unit="mi")[1] == {"value": 6.21, "unit": "mi"}
    assert call(env, "convert_units", value=100, from_unit="c", to_unit="f")[1]["value"] == 212.0
    assert call(env, "convert_units", value=90, from_unit="min", to_unit="h")[1]["value"] == 1.5
    assert call(env, "add_days", date="2025-02-27", days=2)[1] == {"date": "2025-03-01"}
    assert call(env, "add_days", date="2025-03-01", days=-1)[1] == {"date": "2025-02-28"}
    assert call(env, "days_between", start_date="2025-01-01", end_date="2025-03-01")[1] == {"days": 59}
    assert call(env, "weekday", date="2025-01-01")[1]["weekday"] == "Wednesday"
    assert call(env, "convert_currency", amount=100, from_currency="USD", to_currency="EUR")[1]["amount"] == 92.0


def test_pages_end_with_an_error_payload(env):
    city = next(c for c in world().cities.values() if 4 < len(world().hotels_in(c.city_id)) <= 8)
    first = call(env, "list_hotels", city_id=city.city_id)[1]
    assert first["page"] == 1 and first["total_pages"] == 2 and len(first["hotels"]) == 4
    second = call(env, "list_hotels", city_id=city.city_id, page=2)[1]
    assert {h["hotel_id"] for h in first["hotels"]} | {h["hotel_id"] for h in second["hotels"]} == {
        h.hotel_id for h in world().hotels_in(city.city_id)}
    response, body = call(env, "list_hotels", city_id=city.city_id, page=3)
    assert response.status == "api_error" and body == {"error": "page 3 is out of range: there are 2 page(s)"}


@pytest.mark.parametrize("name,kwargs,status,message", [
    ("find_city", {"name": "Atlantis"}, "not_found", "no city named 'Atlantis'"),
    ("city_info", {"city_id": "C1"}, "not_found", "get city ids from find_city"),
    ("forecast", {"city_id": "C1", "date": "2025-01-01"}, "not_found", "no city"),
    ("add_days", {"date": "01/02/2025", "days": 3}, "invalid_arguments", "YYYY-MM-DD"),
    ("add_days", {"date": "2025-01-02", "days": 2.5}, "invalid_arguments", "whole number"),
    ("convert_units", {"value": 3, "from_unit": "km", "to_unit": "kg"}, "invalid_arguments", "cannot convert km"),
    ("convert_units", {"value": "three", "from_unit": "km", "to_unit": "mi"}, "invalid_arguments", "number"),
    ("convert_currency", {"amount": 3, "from_currency": "USD", "to_currency": "XYZ"}, "invalid_arguments", "XYZ"),
    ("hotel_quote", {"hotel_id": "H0", "nights": 2}, "not_found", "list_hotels"),
    ("find_city", {"city": "Velmora"}, "invalid_arguments", "unknown argument 'city'"),
])
def test_bad_arguments_and_unknown_ids_fail_with_their_status(env, name, kwargs, status, message):
    response = env.call(name, (), kwargs)
    assert response.status == status and message in response.error


def test_refusals_that_are_error_payloads(env):
    city = next(iter(world().cities))
    response, body = call(env, "forecast", city_id=city, date="2031-05-01")
    assert response.status == "api_error" and "cover 2025" in body["error"]
    company = next(iter(world().companies.values()))
    response, body = call(env, "stock_quote", ticker=company.ticker, date="2025-03-08")  # a Saturday
    assert response.status == "api_error" and "market was closed" in body["error"]
    assert call(env, "stock_quote", ticker=company.ticker, date="2025-03-07")[0].ok


def test_the_backend_answers_only_world_apis_and_never_raises():
    backend = WorldBackend()
    assert backend.call(APISpec(category="other", tool="geo", api="find_city"), {"name": "x"}).status == "not_found"
    api = world_apis(["find_city"])[0]
    assert backend.call(api, {}).status == "invalid_arguments"
    assert backend.call(api, {"name": ["a", "list"]}).status == "not_found"


def test_answers_are_deterministic_across_calls(env):
    city = next(iter(world().cities))
    a = call(env, "forecast", city_id=city, date="2025-07-04")[1]
    b = call(env, "forecast", city_id=city, date="2025-07-04")[1]
    assert a == b and set(a) == {"city_id", "date", "temp_c", "condition", "wind_kmh"}


def test_a_failed_call_raises_tool_error_in_the_sandbox():
    from codetool.executor import Executor, ExecutorConfig

    env = ToolEnvironment(world_apis(["find_city", "city_info"]), WorldBackend())
    with Executor(ExecutorConfig(isolation="fallback", timeout_s=20), tools=env.functions()) as ex:
        bad = ex.run('result = city_info(city_id="C000")\nprint(result)')
        caught = ex.run('try:\n    city_info(city_id="C000")\nexcept ToolError as e:\n    print("caught", e)')
    assert not bad.ok and bad.error_type == "ToolError" and "not_found" in bad.error_message
    assert caught.ok and "caught" in caught.stdout and caught.tool_calls[0].status == "not_found"
