"""codetool.fairness: who a request belongs to (its key or its connection, never its address),
fair turns weighted by cost, and JSON parsed in pieces (issue 39)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from codetool.fairness import (
    LOOPBACK_GROUP,
    FairTurns,
    address_group,
    identify,
    json_members,
    loads_without_stalling,
)


@pytest.mark.parametrize("host, group", [
    ("127.0.0.1", LOOPBACK_GROUP), ("127.3.4.5", LOOPBACK_GROUP), ("::1", LOOPBACK_GROUP),
    ("::ffff:127.0.0.2", LOOPBACK_GROUP), ("10.1.2.3", "10.1.2.0/24"), ("10.1.2.200", "10.1.2.0/24"),
    ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"), ("not-an-ip", "not-an-ip")])
def test_address_group(host, group):
    assert address_group(host) == group


def test_a_client_is_its_key_or_its_connection_never_its_address():
    a, b = {"client": ("127.0.0.1", 5000)}, {"client": ("127.0.0.1", 5001)}
    assert identify(a).id != identify(b).id and identify(a).group == identify(b).group == LOOPBACK_GROUP
    assert identify(a, 1).id == identify(b, 1).id == "key:1" != identify(b, 2).id


def _order(slots: int, requests: list[tuple[str, float]], held: int = 1) -> list[int]:
    """Indices of ``requests`` (client, cost) in the order FairTurns admits them, while ``held``
    requests of client "hold" keep every slot until all the others are queued."""
    async def run():
        turns, order, release = FairTurns(slots), [], asyncio.Event()

        async def holder():
            async with turns.turn("hold", 1e9):
                await release.wait()

        async def one(i, client, cost):
            async with turns.turn(client, cost):
                order.append(i)
                await asyncio.sleep(0)

        holders = [asyncio.create_task(holder()) for _ in range(held)]
        await asyncio.sleep(0)
        tasks = []
        for i, (client, cost) in enumerate(requests):
            tasks.append(asyncio.create_task(one(i, client, cost)))
            await asyncio.sleep(0)  # queued in this order
        release.set()
        await asyncio.gather(*holders, *tasks)
        assert turns.busy == 0
        return order

    return asyncio.run(run())


def test_a_short_request_overtakes_another_client_s_queue():
    """Client A queues five long requests; B's short one, sent after them, goes first."""
    order = _order(1, [("A", 1e6)] * 5 + [("B", 100)])
    assert order[0] == 5 and order[1:] == [0, 1, 2, 3, 4]


def test_clients_of_equal_cost_alternate_however_many_requests_one_queued():
    order = _order(1, [("A", 10)] * 4 + [("B", 10)] * 2)
    assert order == [0, 4, 1, 5, 2, 3]


def test_a_waiter_that_gives_up_frees_its_turn():
    async def run():
        turns = FairTurns(1)
        async with turns.turn("a", 1):
            waiting = asyncio.create_task(turns.turn("b", 1).__aenter__())
            await asyncio.sleep(0)
            waiting.cancel()
        async with turns.turn("c", 1):  # would wait for ever if b's cancelled wait held the slot
            pass
        return turns.busy

    assert asyncio.run(asyncio.wait_for(run(), 30)) == 0


def _random_json(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth >= 3 or roll < 0.4:
        return rng.choice([1, -2.5e-3, 'a "quoted" \\ back', "é \u2028 [}{,:", None, True, "x" * rng.randint(0, 90)])
    if roll < 0.7:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 12))]
    return {f"k{i} ,:[": _random_json(rng, depth + 1) for i in range(rng.randint(0, 12))}


@pytest.mark.parametrize("seed", range(20))
def test_parsing_in_pieces_gives_what_json_loads_gives(seed):
    rng = random.Random(seed)
    text = json.dumps(_random_json(rng), ensure_ascii=bool(seed % 2))
    assert loads_without_stalling(text, piece_bytes=64) == json.loads(text)
    assert loads_without_stalling(text.encode()) == json.loads(text)


@pytest.mark.parametrize("bad", ["[1, 2,]", '{"a": 1,}', "[1, 2]]", '{1: 2, "a": 1}', '[1, 2] tail', '{"a" 1}'])
def test_parsing_in_pieces_refuses_what_json_loads_refuses(bad):
    padded = bad[0] + " " * 200 + bad[1:]
    with pytest.raises(ValueError):
        json.loads(padded)
    with pytest.raises(ValueError):
        loads_without_stalling(padded, piece_bytes=64)


def test_no_piece_of_a_large_body_is_parsed_at_once(monkeypatch):
    """A 3.9 MB object of 300,000 keys held the interpreter in json.loads for 1.5-3 s (and every
    other thread of the server with it). In pieces, no call into the C parser sees more than
    about ``piece_bytes`` of text, so the interpreter switches threads between them."""
    body = json.dumps({f"key{i}": [i, {"v": "x" * (i % 7)}] for i in range(300_000)})
    spans = []
    real = json.JSONDecoder.raw_decode
    monkeypatch.setattr(json.JSONDecoder, "raw_decode",
                        lambda self, s, idx=0: spans.append((end := real(self, s, idx))[1] - idx) or end)
    monkeypatch.setattr(json, "loads", lambda *a, **k: pytest.fail("parsed whole"))
    assert len(loads_without_stalling(body, piece_bytes=65_536)) == 300_000
    assert max(spans) <= 65_536 and len(body) > 3_000_000


def test_json_members_counts_values_outside_strings():
    assert json_members(b'{"a": [1, 2, {"b": "x,y,[z]"}], "c": null}') == 7
    assert json_members(b"") == 0 and json_members("[]") == 2
    assert json_members(json.dumps({f"k{i}": 0 for i in range(300_000)})) >= 300_000
