"""The reward-hacking table (docs/REWARD_HACKING.md): what each scripted hack of
``tests/reward_hacks.py`` earns, against the honest episode it imitates, through ``train-policy``'s
rollout and reward functions and ``build-trees``' labeller, on whichever ``codetool`` is importable.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/reward_hacking.py             # this checkout
    PYTHONPATH=/path/to/main .venv/bin/python benchmarks/reward_hacking.py    # another checkout ("before")

Prints, per hack, the episode's total under each reward setting of ``tests/reward_hacks.py``
(hack / honest; ``drop``: left out of its GRPO group) and the labeller's verdict on the first-step
sibling pair, then one ``BENCH-RESULT`` line. Needs ../shared/data; no model (a tiny tokenizer is
trained on the spot for the rollout rows). About 30 s on 2 CPUs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(1, str(REPO / "tests"))

import reward_hacks as rh  # noqa: E402
from _result import emit  # noqa: E402
from conftest import SHARED_DATA, build_tiny_tokenizer  # noqa: E402

import codetool  # noqa: E402


def _cell(value: float | None) -> str:
    return "drop" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="hack names (default: all)")
    args = parser.parse_args()
    tokenizer = build_tiny_tokenizer(Path(tempfile.mkdtemp(prefix="reward-hacking-tok-")))
    print(f"codetool from {Path(codetool.__file__).parent}")
    settings = list(rh.SETTINGS)
    print("| hack | " + " | ".join(f"{s} (hack / honest)" for s in settings) + " | tree pair | leaf success (hack / honest) |")
    print("|---" * (len(settings) + 3) + "|")
    results = {}
    for hack in rh.HACKS:
        if args.only and hack.name not in args.only:
            continue
        task = rh.load_task(SHARED_DATA, *hack.query)
        got = rh.rewards(rh.rollout(tokenizer, task, hack.hack))
        honest = rh.rewards(rh.rollout(tokenizer, task, hack.honest))
        record = rh.tree(task, hack)
        verdict = "error" if "error" in record else rh.outcome(record, hack)
        leaves = [rh.leaf_success(record, hack, side) for side in ("hack", "honest")]
        cells = [f"{_cell(got[s])} / {_cell(honest[s])}" for s in settings]
        print(f"| {hack.name} | " + " | ".join(cells) + f" | {verdict} | {leaves[0]:.2f} / {leaves[1]:.2f} |")
        gains = [s for s in settings if s not in hack.legitimate_under
                 and (got[s] is None or (honest[s] is not None and got[s] > honest[s] + 1e-9))]
        results[hack.name] = {"gains_under": gains, "tree": verdict}
    wins = sum(bool(r["gains_under"]) or r["tree"] == "hack wins" for r in results.values())
    print(f"\n{wins} of {len(results)} hacks earn more than their honest episode somewhere")
    emit(name="reward_hacking", hacks=len(results), hacks_that_pay=wins)


if __name__ == "__main__":
    main()
