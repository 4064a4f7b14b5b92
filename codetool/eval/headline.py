"""The first screen of a report: did the PRM help? (issue 40)

For each benchmark, the method that chose steps with the PRM is compared query by query with each
method that did not (:func:`codetool.eval.paired.paired_difference`: mean difference of per-query
scores and a 95% bootstrap interval over queries), on

- a judge-free score per query: grounded success (1 when the episode finished with a non-empty
  answer after a successful call of a listed tool; :func:`codetool.eval.summary.grounded`), or on
  RestBench-TMDB the share of the gold path matched in order (``path score``);
- the judged pass score per query (Solved 1, Unsure 0.5, Unsolved 0, mean over rounds), when a
  judge ran (marked when the judge is weak).

Several search seeds of a method are averaged per query first, so the bootstrap resamples
queries. The PRM methods are those whose trajectories recorded a PRM scorer
(``extra["fidelity"]["prm"]``), else whose name says ``latent``; without one, every method is
compared with the first. Beside it the PRM's held-out pairwise accuracy with its number of pairs
(or why it was not measured). Nothing here changes a metric: it reads what the report computed.
"""

from __future__ import annotations

from typing import Any

from codetool.eval.metrics import not_executed_trajectory
from codetool.eval.paired import mean_over_seeds, paired_difference
from codetool.eval.restbench import path_metrics
from codetool.eval.runs import load_runs
from codetool.eval.summary import grounded, seed_of
from codetool.judge.records import LABEL_SCORES

RESTBENCH = "restbench-tmdb"
SAMPLES, SEED = 2000, 0


def uses_prm(trajs: list) -> bool:
    """Whether a method's trajectories were chosen with a PRM (see the module docstring)."""
    recorded = [t.extra.get("fidelity") for t in trajs if isinstance(t.extra.get("fidelity"), dict)]
    if recorded:
        return any(f.get("prm") is not None for f in recorded)
    return any("latent" in (t.method or "") for t in trajs)


def _key(t) -> tuple:
    return (t.group or "", t.query_id)


def free_scores(trajs: list, bench: str) -> dict[tuple, float]:
    """Per query of one method on one benchmark: grounded success (0/1), or on RestBench the path
    score; an episode the machine could not run is left out (no score, not a 0)."""
    trajs = [t for t in trajs if not not_executed_trajectory(t)]
    if bench == RESTBENCH:
        per = path_metrics(trajs).per_query
        return {_key(t): per[t.query_id]["fraction"] for t in trajs if t.query_id in per}
    return {_key(t): float(grounded(t)) for t in trajs}


def judged_scores(trajs: list, labels: list[list[str]] | None) -> dict[tuple, float]:
    """Per query: the mean over rounds of its pass score (1 / 0.5 / 0); unreadable rounds left out."""
    out = {}
    for t, rounds in zip(trajs, labels or []):
        if not_executed_trajectory(t):
            continue
        values = [LABEL_SCORES[label] for label in rounds if label in LABEL_SCORES]
        if values:
            out[_key(t)] = sum(values) / len(values)
    return out


def headline(shown: list, labels: dict[str, Any], seed_paths: list[str]) -> dict[str, Any]:
    """The first screen's data: ``{"comparisons": [...], "prm_methods": [...]}``, one comparison per
    benchmark, PRM method, other method and score (``judge-free`` / ``judged``), each with the
    :class:`~codetool.eval.paired.PairedDifference` fields in points (x100)."""
    free: dict[str, dict[str, list[tuple[str, dict]]]] = {}  # method -> bench -> (seed, per-query scores)
    for path in seed_paths:
        for run in load_runs([path]):
            for bench in dict.fromkeys(t.benchmark for t in run.trajectories):
                trajs = [t for t in run.trajectories if t.benchmark == bench]
                free.setdefault(run.method.split("@")[0], {}).setdefault(bench, []).append(
                    (seed_of(path), free_scores(trajs, bench)))
    methods = [r.method for r in shown]
    prm = [r.method for r in shown if uses_prm(r.trajectories)]
    pairs = ([(p, m) for p in prm for m in methods if m not in prm] if prm
             else [(m, methods[0]) for m in methods[1:]])
    comparisons = []
    benches = list(dict.fromkeys(t.benchmark for r in shown for t in r.trajectories))
    by_name = {r.method: r for r in shown}
    for bench in benches:
        for a, b in pairs:
            score = {m: mean_over_seeds(s for _, s in free.get(m, {}).get(bench, [])) for m in (a, b)}
            metric = "path score" if bench == RESTBENCH else "grounded success"
            comparisons.append(_entry(bench, a, b, metric, "judge-free", score[a], score[b]))
            if labels.get(a) is not None and labels.get(b) is not None:
                judged = {}
                for m in (a, b):
                    idx = [i for i, t in enumerate(by_name[m].trajectories) if t.benchmark == bench]
                    judged[m] = judged_scores([by_name[m].trajectories[i] for i in idx], [labels[m][i] for i in idx])
                name = "success" if bench == RESTBENCH else "pass (SoPR)"
                comparisons.append(_entry(bench, a, b, name, "judged", judged[a], judged[b]))
    return {"prm_methods": prm, "comparisons": [c for c in comparisons if c["n"]]}


def _entry(bench: str, a: str, b: str, metric: str, kind: str, sa: dict, sb: dict) -> dict[str, Any]:
    d = paired_difference(sa, sb, names=(a, b), samples=SAMPLES, seed=SEED)
    scale = {k: None if v is None else 100 * v for k, v in d.to_dict().items() if k in ("mean", "low", "high")}
    return {"benchmark": bench, "a": a, "b": b, "metric": metric, "kind": kind, "n": d.n, **scale,
            "samples": d.samples, "only_a": d.only_a, "only_b": d.only_b}


def verdict(c: dict[str, Any]) -> str:
    """``better`` / ``worse`` when the interval excludes 0, else ``no clear difference``; no verdict
    from fewer than 2 queries (a bootstrap over one query resamples it alone)."""
    if c.get("n", 2) < 2:
        return "too few queries to tell"
    if c["low"] is not None and c["low"] > 0:
        return "better"
    if c["high"] is not None and c["high"] < 0:
        return "worse"
    return "no clear difference"


def render_headline(report: dict[str, Any], weak_mark: str = "") -> list[str]:
    """Markdown lines of the first screen (nothing when there is a single method and no PRM)."""
    data, prm = report.get("headline") or {}, report.get("prm")
    comparisons = data.get("comparisons") or []
    if not comparisons and not prm:
        return []
    title = "## Did the PRM help?" if data.get("prm_methods") else "## How the methods differ"
    lines = [title, ""]
    if comparisons:
        rows = []
        for c in comparisons:
            mark = weak_mark if c["kind"] == "judged" else ""
            interval = f"{c['low']:+.1f} to {c['high']:+.1f}" if c["n"] >= 2 else "n/a (one query)"
            rows.append(f"| {c['benchmark']} | {c['a']} − {c['b']} | {c['metric']}{mark} | {c['mean']:+.1f} | "
                        f"{interval} | {c['n']} | {verdict(c)} |")
        lines += ["| benchmark | methods | per-query score | difference (points) | 95% interval | queries | "
                  "verdict |", "|---|---|---|---:|---|---:|---|", *rows, "",
                  "Paired over the queries both methods ran (seeds averaged per query first), with a bootstrap "
                  f"of {comparisons[0]['samples']} resamples of queries; an interval that spans 0 cannot tell "
                  "the methods apart at this size.", ""]
    lines += [prm_line(report), ""]
    return lines


def prm_line(report: dict[str, Any]) -> str:
    """One line on the PRM's held-out pairwise accuracy with its n, or why it was not measured."""
    prm = report.get("prm")
    if not prm:
        if (report.get("headline") or {}).get("prm_methods"):
            return ("PRM accuracy: not measured for this report (no held-out pairs were given: `codetool eval-prm "
                    "--prm DIR --dataset pairs.jsonl`, then `--prm_metrics OUT/metrics.json`).")
        return ""
    acc, ci, who = prm.get("pairwise_accuracy"), prm.get("pairwise_accuracy_ci95"), prm.get("prm", "the PRM")
    if acc is None:
        return f"PRM `{who}`: no held-out sibling pair with both labels ({prm.get('rows', 0)} rows): accuracy not measured."
    decided = prm.get("decided") or {}
    queries = (decided.get("all") or {}).get("queries")
    if queries is not None and queries < 2:  # a bootstrap over one query resamples it alone: no interval
        interval = f" (no interval: the pairs come from {queries} held-out quer{'y' if queries == 1 else 'ies'})"
    else:
        interval = f" (95% interval {100 * ci[0]:.0f}-{100 * ci[1]:.0f})" if ci else ""
    line = (f"PRM `{who}`: pairwise accuracy **{100 * acc:.0f}%**{interval} on **{prm.get('pairs')}** held-out "
            "sibling pairs (50% is chance)")
    both = decided.get("both_ran") or {}
    if both.get("pairs"):  # the pairs R_spot cannot decide: the PRM's own job in the search
        line += (f"; on the {both['pairs']} whose steps both ran (R_spot ties, the PRM's own job): "
                 f"**{100 * both['accuracy']:.0f}%**")
    elif decided:
        line += "; no held-out pair whose steps both ran (the PRM's own job in the search) was measured"
    return line + "."
