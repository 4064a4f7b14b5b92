"""Synthetic PRM example rows, for tests, benchmarks and a quickstart without built trees.

The rows have the fields of the tree builder's PRM examples (docs/DESIGN.md §3): ``query``,
``query_id``, ``tools``, ``history``, ``candidate``, ``candidate_output``, ``label``,
``latent_reward``, ``source``. Every step has one good candidate (calls an offered tool with the
right arguments and prints a result) and one or more worse ones (an unknown function, a missing
argument, an empty print), so a PRM can learn the difference: loss must go down on them.

They are made up, clearly labelled (``synthetic: true``), and never a substitute for the real
dataset when measuring the method. Write a file with::

    python -m codetool.prm.synthetic --out data/prm/prm_examples.jsonl --queries 100
"""

from __future__ import annotations

import argparse
import json
import random

_TOPICS = [
    ("weather", "get_forecast", "city", ["Paris", "Lima", "Osaka", "Nairobi", "Oslo"],
     lambda v, r: {"city": v, "temperature_c": r.randint(-5, 35), "sky": r.choice(["clear", "rain", "clouds"])}),
    ("movies", "search_movies", "director", ["Christopher Nolan", "Agnes Varda", "Bong Joon-ho"],
     lambda v, r: {"director": v, "results": [{"title": f"Film {r.randint(1, 99)}", "year": r.randint(1960, 2024)}]}),
    ("stocks", "get_quote", "symbol", ["AAPL", "MSFT", "NVDA", "SAP"],
     lambda v, r: {"symbol": v, "price": round(r.uniform(10, 900), 2), "currency": "USD"}),
    ("recipes", "find_recipes", "ingredient", ["lentils", "rice", "tomato", "tofu"],
     lambda v, r: {"ingredient": v, "recipes": [f"{v} stew", f"{v} salad"][: r.randint(1, 2)]}),
    ("flights", "search_flights", "destination", ["Berlin", "Tokyo", "Quito"],
     lambda v, r: {"destination": v, "cheapest_eur": r.randint(80, 900), "stops": r.randint(0, 2)}),
]


def render_tools(topic_index: int, extra_tools: int = 2) -> str:
    """Python signatures with docstrings for the topic's tool and a few distractors."""
    names = [_TOPICS[topic_index]] + [_TOPICS[(topic_index + k) % len(_TOPICS)] for k in range(1, extra_tools + 1)]
    return "\n\n".join(
        f"def {fn}_for_{topic}({param}: str) -> dict:\n"
        f"    \"\"\"Query the {topic} API (RapidAPI tool '{topic}').\n\n"
        f"    Args:\n        {param} (str): the {param} to look up, required.\n"
        f"    Returns:\n        dict: the JSON response of the API.\n    \"\"\""
        for topic, fn, param, _, _ in names)


def _good(topic_index: int, value: str, rng: random.Random) -> tuple[str, str]:
    topic, fn, param, _, response = _TOPICS[topic_index]
    code = f"result = {fn}_for_{topic}({param}={value!r})\nprint(result)"
    return code, json.dumps(response(value, rng))


def _bad(topic_index: int, value: str, rng: random.Random) -> tuple[str, str]:
    topic, fn, param, _, _ = _TOPICS[topic_index]
    kind = rng.randrange(3)
    if kind == 0:
        return (f"data = fetch_{topic}_data({value!r})\nprint(data)",
                f"Traceback (most recent call last):\n  File \"<step>\", line 1\nNameError: name 'fetch_{topic}_data' is not defined")
    if kind == 1:
        return (f"result = {fn}_for_{topic}()\nprint(result)",
                f"TypeError: {fn}_for_{topic}() missing 1 required positional argument: '{param}'")
    return f"result = {fn}_for_{topic}({param}={value!r})", ""


def synthetic_rows(n_queries: int = 40, *, steps: int = 2, candidates: int = 2, seed: int = 0,
                   extra_tools: int = 2) -> list[dict]:
    """PRM example rows: ``n_queries * steps * candidates`` of them, one good candidate per step.

    Args:
        n_queries (`int`, *optional*, defaults to 40): distinct queries (``query_id`` synthetic-i).
        steps (`int`, *optional*, defaults to 2): steps per query; step k has k earlier steps.
        candidates (`int`, *optional*, defaults to 2): candidates per step (>= 2).
        seed (`int`, *optional*, defaults to 0): everything is a function of the seed.
        extra_tools (`int`, *optional*, defaults to 2): distractor tools in the tool docs.
    """
    rng = random.Random(seed)
    rows = []
    for q in range(n_queries):
        t = rng.randrange(len(_TOPICS))
        topic, _, param, values, _ = _TOPICS[t]
        picks = [rng.choice(values) for _ in range(steps)]
        query = f"Using the {topic} API, look up {', then '.join(picks)} and report what you find."
        tools = render_tools(t, extra_tools)
        history: list[dict] = []
        for s, value in enumerate(picks):
            good_at = rng.randrange(candidates)
            for c in range(candidates):
                code, output = _good(t, value, rng) if c == good_at else _bad(t, value, rng)
                label = int(c == good_at)
                rows.append({"query_id": f"synthetic-{q}", "query": query, "tools": tools,
                             "history": [dict(h) for h in history], "candidate": code,
                             "candidate_output": output, "label": label,
                             "latent_reward": round(rng.uniform(0.8, 0.95) if label else rng.uniform(0.3, 0.6), 4),
                             "source": f"synthetic-{q}:{'-'.join(['1'] * s + [str(c + 1)])}", "synthetic": True})
            code, output = _good(t, value, rng)
            history.append({"code": code, "output": output})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write synthetic PRM example rows (JSONL)")
    parser.add_argument("--out", required=True, help="output JSONL path")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--candidates", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from codetool.jsonl import write_jsonl

    count = write_jsonl(args.out, synthetic_rows(args.queries, steps=args.steps,
                                                 candidates=args.candidates, seed=args.seed))
    print(f"wrote {count} synthetic PRM rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
