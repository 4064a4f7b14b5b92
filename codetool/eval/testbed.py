"""The testbed's summary (docs/TESTBED.md): held-out success per method with 95% intervals, paired
differences between methods, the PRM's accuracy on sibling pairs where both steps ran, and the
policy before/after RL, written as ``testbed.json`` and ``testbed.md``.

Every success number is exact: a trajectory on a world query succeeded when it ended in
``finish`` with an answer its answer key accepts (:func:`codetool.world.answers.episode_success`),
never by a judge. Units and intervals:

- **methods**: per query, the mean success over the search seeds; the method's success is the
  mean over queries, with a seeded 95% percentile bootstrap over queries
  (:func:`codetool.eval.paired.bootstrap_mean`); the per-seed rates are listed beside it;
- **paired differences**: method a minus method b per query (seed means), mean and bootstrap
  interval over queries (:func:`codetool.eval.paired.paired_difference`), in points;
- **PRM pairs**: the trees' held-out sibling pairs (the queries ``train-prm`` kept out; train
  templates, since trees are only built on them), each scored right when the more promising
  sibling scores higher (a tie counts 1/2), split by what the two steps did: both ran (the PRM's
  real job: R_spot cannot tell them apart), one ran (executability decided the label), neither
  ran; intervals resample queries;
- **policy RL**: the evaluation search's held-out success before and after each reward setting
  (each trained at the same generated-token budget), per query averaged over training seeds,
  with the paired difference after minus before.

Limits: with tens of queries an interval spans tens of points; the summary says what it measured
and its n, not whether a difference is "significant".
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
from collections import defaultdict
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np

from codetool.eval.paired import bootstrap_mean, mean_over_seeds, paired_difference
from codetool.jsonl import read_jsonl
from codetool.world.answers import episode_success

logger = logging.getLogger(__name__)
SEED_RE = re.compile(r"\.seed(\d+)\.jsonl$")


def world_scores(paths: list[str | Path]) -> dict[str, dict[int, dict[str, float]]]:
    """``{method: {seed: {query_id: 1.0 | 0.0}}}`` from trajectory files of world queries (the
    method from each record, the seed from a ``.seed<k>.jsonl`` name, else 0); records without an
    answer key are skipped; an error record counts as a failure."""
    out: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    for path in paths:
        m = SEED_RE.search(str(path))
        seed = int(m.group(1)) if m else 0
        for r in read_jsonl(Path(path)):
            ok = episode_success(r.get("extra"), r.get("finish_type"), r.get("final_answer"))
            if ok is None:
                continue
            out[str(r.get("method"))].setdefault(seed, {})[str(r["query_id"])] = float(ok)
    return dict(out)


def _seed_means(per_seed: dict[int, dict[str, float]]) -> dict[Hashable, float]:
    """Per query, its mean success over the seeds (:func:`mean_over_seeds` of the seeds' scores)."""
    return mean_over_seeds(cast("list[Mapping[Hashable, float]]", list(per_seed.values())))


def method_rows(scores: dict[str, dict[int, dict[str, float]]], *, samples: int = 2000, seed: int = 0) -> list[dict]:
    """One row per method: queries, seeds, success (mean over queries of the seed means) with its
    95% bootstrap interval over queries, and the success of each seed."""
    rows = []
    for method, per_seed in scores.items():
        per_query = _seed_means(per_seed)
        low, high = bootstrap_mean(per_query.values(), samples=samples, seed=seed)
        rows.append({"method": method, "queries": len(per_query), "seeds": sorted(per_seed),
                     "success": float(np.mean(list(per_query.values()))) if per_query else float("nan"),
                     "low": low, "high": high,
                     "per_seed": {s: float(np.mean(list(v.values()))) for s, v in sorted(per_seed.items())}})
    return rows


def paired_rows(scores: dict[str, dict[int, dict[str, float]]], comparisons: list[tuple[str, str]], *,
                samples: int = 2000, seed: int = 0) -> list[dict]:
    """:func:`paired_difference` of each ``(a, b)`` whose methods both ran (seed means per query)."""
    means = {m: _seed_means(v) for m, v in scores.items()}
    return [paired_difference(means[a], means[b], names=(a, b), samples=samples, seed=seed).to_dict()
            for a, b in comparisons if a in means and b in means]


def prm_pair_accuracy(trees: str | Path, scores: str | Path, *, samples: int = 2000, seed: int = 0) -> dict | None:
    """The PRM's accuracy on the labelled sibling pairs of the scored (held-out) queries, split by
    what the two steps did (module docstring); ``None`` when a file is missing.

    Args:
        trees (`Path`): the trees' JSONL (nodes with ``ok``, labelled ``pairs``).
        scores (`Path`): ``eval-prm``'s ``scores.jsonl`` (``source`` ``<query_id>:<node_id>``, ``score``).
    """
    trees, scores = Path(trees), Path(scores)
    if not trees.is_file() or not scores.is_file():
        return None
    score = {str(r["source"]): float(r["score"]) for r in read_jsonl(scores)}
    kinds: dict[str, dict[str, list[float]]] = {k: defaultdict(list) for k in ("both_ran", "one_ran", "none_ran")}
    for record in read_jsonl(trees):
        nodes, qid = record.get("nodes") or {}, str(record.get("query_id"))
        for better, worse in record.get("pairs") or []:
            a, b = score.get(f"{qid}:{better}"), score.get(f"{qid}:{worse}")
            if a is None or b is None:
                continue
            ran = bool(nodes[better].get("ok")) + bool(nodes[worse].get("ok"))
            kind = ("none_ran", "one_ran", "both_ran")[ran]
            kinds[kind][qid].append(1.0 if a > b else 0.5 if a == b else 0.0)
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, Any]] = {}
    for kind, by_query in kinds.items():
        wins = np.array([sum(v) for v in by_query.values()], dtype=np.float64)
        count = np.array([len(v) for v in by_query.values()], dtype=np.float64)
        if not len(count):
            out[kind] = {"pairs": 0, "queries": 0, "accuracy": None, "low": None, "high": None}
            continue
        pick = rng.integers(0, len(count), size=(samples, len(count)))
        boot = wins[pick].sum(axis=1) / count[pick].sum(axis=1)
        out[kind] = {"pairs": int(count.sum()), "queries": len(count), "accuracy": float(wins.sum() / count.sum()),
                     "low": float(np.percentile(boot, 2.5)), "high": float(np.percentile(boot, 97.5))}
    return out


def before_after(by_label: dict[str, dict[int, dict[str, float]]], *, samples: int = 2000,
                 seed: int = 0) -> dict[str, list[dict]]:
    """Exact success of a policy ``before`` RL and after each reward setting, and after minus before.

    Args:
        by_label (`dict[str, dict[int, dict[str, float]]]`): ``{label: {seed: {query_id: 1.0 | 0.0}}}``,
            ``before`` and one label per setting (:func:`answer_scores`).

    Returns:
        `dict`: ``methods`` (:func:`method_rows`: success with its 95% bootstrap interval over queries)
        and ``paired`` (each setting minus ``before``, per query over the seed means: :func:`paired_rows`).
    """
    return {"methods": method_rows(by_label, samples=samples, seed=seed),
            "paired": paired_rows(by_label, [(label, "before") for label in by_label if label != "before"],
                                  samples=samples, seed=seed)}


def answer_scores(trajectories: dict[str, dict[int, list]]) -> dict[str, dict[int, dict[str, float]]]:
    """``{label: {seed: [Trajectory]}}`` -> ``{label: {seed: {query_id: 1.0 | 0.0}}}`` by the answer key
    (:func:`codetool.world.answers.episode_success`); episodes without a key are left out, and a
    label whose episodes all lack one (not a world query set) is left out."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for label, per_seed in trajectories.items():
        for run_seed, trajs in per_seed.items():
            for t in trajs:
                ok = episode_success(t.extra, t.finish_type, t.final_answer)
                if ok is not None:
                    out.setdefault(label, {}).setdefault(run_seed, {})[str(t.query_id)] = float(ok)
    return out


def policy_section(out_dir: str | Path, *, samples: int = 2000, seed: int = 0) -> dict | None:
    """Before/after of a ``train-policy`` run in ``out_dir`` (its ``results.json`` and evaluation
    trajectories ``eval/<set>.<label>.seed<k>.jsonl``); ``None`` when it has not run."""
    out_dir = Path(out_dir)
    results_path = out_dir / "results.json"
    if not results_path.is_file():
        return None
    results = json.loads(results_path.read_text())
    by_label: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    for path in sorted((out_dir / "eval").glob("*.jsonl")):
        m = re.match(r"(?P<set>.+)\.(?P<label>[^.]+(?:\.[^.]+)*)\.seed(?P<seed>\d+)\.jsonl$", path.name)
        if not m:
            continue
        for r in read_jsonl(path):
            ok = episode_success(r.get("extra"), r.get("finish_type"), r.get("final_answer"))
            if ok is not None:
                by_label[str(r.get("method"))].setdefault(int(m["seed"]), {})[str(r["query_id"])] = float(ok)
    tokens = {name: [run.get("generated_tokens") for run in seeds.values()]
              for name, seeds in (results.get("runs") or {}).items()}
    return {**before_after(dict(by_label), samples=samples, seed=seed), "generated_tokens": tokens,
            "token_budget": results.get("token_budget"), "seeds": results.get("seeds"),
            "eval_search": results.get("eval_search"), "seconds": results.get("seconds")}


def _pct(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}"


def render(summary: dict[str, Any]) -> str:
    """``testbed.md``: the three tables (and the RL one when it ran), each with its n."""
    evaluated = summary.get("evaluated") or "held-out world queries"
    lines = [f"# Testbed: {summary['name']}", "",
             f"Exact success on {evaluated} (docs/TESTBED.md): an episode succeeds when it ends in "
             "`finish` with an answer that names the known value and no competing one.", "",
             "| method | success % | 95% interval | queries | per seed % |", "|---|---:|---:|---:|---|"]
    for r in summary["methods"]:
        seeds = ", ".join(_pct(v) for v in r["per_seed"].values())
        lines.append(f"| {r['method']} | {_pct(r['success'])} | {_pct(r['low'])} to {_pct(r['high'])} | "
                     f"{r['queries']} | {seeds} |")
    lines += ["", "Paired differences (a minus b, per query, mean over seeds; bootstrap over queries):", "",
              "| a - b | difference, points | 95% interval | queries |", "|---|---:|---:|---:|"]
    for p in summary["paired"]:
        lines.append(f"| {p['a']} - {p['b']} | {_pct(p['mean'])} | {_pct(p['low'])} to {_pct(p['high'])} | {p['n']} |")
    prm = summary.get("prm_pairs")
    if prm:
        lines += ["", "The PRM on the trees' held-out sibling pairs (train templates), by what the two steps did:", "",
                  "| pairs | n (queries) | accuracy % | 95% interval |", "|---|---:|---:|---:|"]
        names = {"both_ran": "both steps ran (R_spot ties)", "one_ran": "one ran (executability decides)",
                 "none_ran": "neither ran"}
        for kind, label in names.items():
            x = prm[kind]
            interval = f"{_pct(x['low'])} to {_pct(x['high'])}" if x["queries"] >= 2 else \
                "n/a" if not x["queries"] else "n/a (one query)"  # a bootstrap over one query resamples it alone
            lines.append(f"| {label} | {x['pairs']} ({x['queries']}) | {_pct(x['accuracy'])} | {interval} |")
    rl = summary.get("policy_rl")
    if rl:
        lines += ["", f"Policy RL (train-policy, {rl.get('token_budget')} generated tokens per run, seeds "
                      f"{rl.get('seeds')}; evaluation search: {rl.get('eval_search')}):", "",
                  "| policy | success % | 95% interval | queries |", "|---|---:|---:|---:|"]
        for r in rl["methods"]:
            lines.append(f"| {r['method']} | {_pct(r['success'])} | {_pct(r['low'])} to {_pct(r['high'])} | "
                         f"{r['queries']} |")
        for p in rl["paired"]:
            lines.append(f"\n{p['a']} - {p['b']}: {_pct(p['mean'])} points (95% interval {_pct(p['low'])} to "
                         f"{_pct(p['high'])}, {p['n']} queries); generated tokens per run: "
                         f"{rl['generated_tokens'].get(p['a'])}.")
    lines += ["", f"Search: {summary.get('search', '')}. Machine: {summary.get('machine', '')}.", ""]
    return "\n".join(lines)


def write_testbed(out_dir: str | Path, summary: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``testbed.json`` and ``testbed.md`` into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    clean = json.loads(json.dumps(summary, default=str).replace("NaN", "null"))
    (out_dir / "testbed.json").write_text(json.dumps(clean, indent=2) + "\n")
    (out_dir / "testbed.md").write_text(render(summary))
    return out_dir / "testbed.json", out_dir / "testbed.md"


def summarize(root: str | Path, *, name: str, methods: list[str], trajectories: list[str | Path], search: str,
              policy_rl: bool = False, samples: int = 2000, seed: int = 0, evaluated: str = "") -> Path:
    """The testbed summary of a pipeline folder ``root``: every method on the world trajectories,
    each later method paired against each earlier one (``methods`` order), the PRM on the trees'
    held-out pairs (``trees/trees.jsonl`` with ``prm_eval/scores.jsonl``), the RL before/after
    (``policy_rl/``) when it ran; ``evaluated`` names the query sets the methods ran on (the
    report's first line). Writes ``testbed.json`` and ``testbed.md``; returns the latter."""
    root = Path(root)
    scores = world_scores([p for p in trajectories if Path(p).is_file()])
    comparisons = [(b, a) for i, a in enumerate(methods) for b in methods[i + 1:]]
    summary = {"name": name, "evaluated": evaluated, "methods": method_rows(scores, samples=samples, seed=seed),
               "paired": paired_rows(scores, comparisons, samples=samples, seed=seed),
               "prm_pairs": prm_pair_accuracy(root / "trees" / "trees.jsonl", root / "prm_eval" / "scores.jsonl",
                                              samples=samples, seed=seed),
               "policy_rl": policy_section(root / "policy_rl", samples=samples, seed=seed) if policy_rl else None,
               "search": search,
               "machine": f"{os.cpu_count()} CPUs, load {', '.join(f'{x:.1f}' for x in os.getloadavg())}, "
                          f"{platform.machine()}"}
    _, md = write_testbed(root, summary)
    logger.info("testbed summary: %s", md)
    return md
