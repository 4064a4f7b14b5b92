"""What the comparability block checks per method, per subset and in the rewards (issue 38).

:mod:`codetool.eval.comparability` compares a run's settings with the reference procedure; this
module adds what decides the numbers of CodeTool's table itself:

- **each method's search**: its candidates per step ``k`` (2; a method with ``k`` 1 is the table's
  single-sample row), at most 5 steps, sampling temperature 0.9 and top_p 0.95, and its reward
  weights, which must make one of the table's four methods (single sample, spot only
  ``w_latent 0``, latent only ``w_spot 0``, spot + latent ``1/1``; a tool cost is no row of it).
  The settings come from what the method's trajectories recorded (``extra["fidelity"]``), else
  from the pipeline's ``methods`` over its ``search``, else they are "not recorded";
- **the queries of the subset**, by id: a StableToolBench group is CodeTool's filtered group only
  when its query ids are the filtered file's (sizes alone prove nothing), read from the benchmark
  data (:func:`subset_id_lines`); without the data the ids are listed as not checked;
- **known differences** that no setting removes (docs/FIDELITY.md): our on-the-spot reward (a
  step's own run) against CodeTool's re-run status; replies without code scored 0 where the
  public search asks its PRM; one PRM system template for training and scoring where the public
  PRM used two; our judge requests carry a ``seed``.

Every function returns plain lines; nothing here computes a metric.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PAPER_SEARCH = {"k": 2, "max_steps": 5, "temperature": 0.9, "top_p": 0.95}
METHOD_KEYS = ("k", "max_steps", "temperature", "top_p", "w_spot", "w_latent", "w_cost", "latent")
# the package defaults (SearchConfig), for a recipe that leaves a key out
SEARCH_DEFAULTS = {"k": 2, "max_steps": 5, "temperature": 0.9, "top_p": 0.95, "w_spot": 1.0, "w_latent": 1.0,
                   "w_cost": 0.0, "latent": "prm"}
TABLE_ROWS = ("single sample", "spot only", "latent only", "spot + latent")


def method_settings(run, run_settings: Mapping[str, Any]) -> dict[str, Any] | None:
    """The search settings of ``run``'s method: recorded by its trajectories, else the pipeline's
    ``methods`` entry of that name over its ``search`` keys (package defaults for a recipe's missing
    keys), else ``None`` (not recorded)."""
    for traj in getattr(run, "trajectories", []):
        search = ((traj.extra or {}).get("fidelity") or {}).get("search")
        if isinstance(search, Mapping) and all(k in search for k in METHOD_KEYS):
            return {k: search[k] for k in METHOD_KEYS}
    methods = run_settings.get("methods")
    if not isinstance(methods, list) or "__source__" not in run_settings:
        return None
    entry = next((m for m in methods if isinstance(m, Mapping) and m.get("name") == run.method), None)
    if entry is None:
        return None
    out = {k: run_settings.get(f"search.{k}", SEARCH_DEFAULTS[k]) for k in METHOD_KEYS}
    out.update({k: v for k, v in entry.items() if k in METHOD_KEYS and v is not None})
    return out


def table_row(s: Mapping[str, Any]) -> str | None:
    """Which row of CodeTool's table these settings make, or ``None``."""
    if s["k"] == 1:
        return "single sample"
    if s.get("w_cost"):
        return None
    spot, latent = float(s["w_spot"]), float(s["w_latent"]) if s["latent"] == "prm" else 0.0
    return {(1.0, 0.0): "spot only", (0.0, 1.0): "latent only", (1.0, 1.0): "spot + latent"}.get((spot, latent))


def method_lines(runs: list, run_settings: Mapping[str, Any]) -> tuple[list[str], list[str], int]:
    """``(deviations, not checked, settings checked)`` of every method's search (module docstring)."""
    deviations, unchecked, checked, rows = [], [], 0, set()
    for run in runs:
        s = method_settings(run, run_settings)
        name = run.method
        if s is None:
            unchecked.append(f"{name}: its k, steps, sampling and weights (not recorded: pass --recipe, or run through "
                             "`codetool pipeline`)")
            continue
        row = table_row(s)
        rows.add(row)
        checked += 4
        if row is None:
            deviations.append(f"{name}: weights w_spot {s['w_spot']}, w_latent {s['w_latent']} ({s['latent']}), w_cost "
                              f"{s['w_cost']} make no method of CodeTool's table (single sample, spot only, latent "
                              "only, spot + latent).")
        if s["max_steps"] != PAPER_SEARCH["max_steps"]:
            deviations.append(f"{name}: search.max_steps is {s['max_steps']}, not 5: CodeTool's episodes take at most 5 "
                              "steps.")
        if row == "single sample":
            unchecked.append(f"{name}: the single-sample row's temperature ({s['temperature']}; the paper does not "
                             "give it)")
            continue
        for key in ("k", "temperature", "top_p"):
            if float(s[key]) != float(PAPER_SEARCH[key]):
                deviations.append(f"{name}: search.{key} is {s[key]}, not {PAPER_SEARCH[key]}: "
                                  + {"k": "CodeTool samples 2 candidates per step.",
                                     "temperature": "CodeTool samples candidates at temperature 0.9.",
                                     "top_p": "CodeTool samples candidates with top_p 0.95."}[key])
    missing = [r for r in TABLE_ROWS if r not in rows]
    if runs and missing and len(rows - {None}) < len(TABLE_ROWS):
        unchecked.append(f"CodeTool's table rows this run has no method for: {', '.join(missing)}")
    return deviations, unchecked, checked


def known_differences(runs: list, run_settings: Mapping[str, Any], judge_info: Mapping[str, Any] | None) -> list[str]:
    """The differences from CodeTool that no setting removes (docs/FIDELITY.md), for the methods
    they concern."""
    settings = [s for s in (method_settings(r, run_settings) for r in runs) if s is not None]
    uses_spot = not settings or any(s["k"] > 1 and float(s["w_spot"]) for s in settings)
    uses_prm = not settings or any(s["k"] > 1 and s["latent"] == "prm" and float(s["w_latent"]) for s in settings)
    lines = []
    if uses_spot:
        lines.append("on-the-spot reward: 1 when the step's own run raised nothing and no tool call failed; CodeTool's is "
                     "its re-run status (the path re-run with prints stripped; a printed 'Function executing from' is 0, "
                     "a printed error payload 1): no option yet (docs/FIDELITY.md).")
    if uses_prm:
        lines.append("replies without a code block get latent reward 0; the public search asks its PRM about them too "
                     "(docs/FIDELITY.md).")
        if any(run_settings.get(k) == "reference" for k in ("prm.interface", "train.format.interface")):
            lines.append("the PRM reads one system template in training and scoring; the public PRM was trained with "
                         "rm_generative_data.py's and scored with step_infer.py's (docs/FIDELITY.md).")
    if judge_info and judge_info.get("kind") not in (None, "scripted"):
        lines.append("our judge requests carry a seed (for repeatable rounds); CodeTool's and StableToolBench's do not "
                     "(docs/FIDELITY.md).")
    return lines


def _ids(path: Path) -> set[str] | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return {str(q["query_id"]) for q in data} if isinstance(data, list) else {str(k) for k in data}


def subset_id_lines(runs: list, data_dir: str | Path | None = None) -> tuple[list[str], list[str], dict]:
    """``(deviations, not checked, kinds)``: per StableToolBench group the run holds, whether its query
    ids are CodeTool's filtered group, the full group, or neither (compared with the data files)."""
    from codetool import CodetoolError

    groups: dict[str, set[str]] = {}
    for run in runs:
        for traj in getattr(run, "trajectories", []):
            if traj.benchmark == "stabletoolbench":
                groups.setdefault(traj.group, set()).add(str(traj.query_id))
    if not groups:
        return [], [], {}
    try:
        from codetool.tools.data import data_root

        root = Path(data_dir) if data_dir else data_root()
    except CodetoolError:
        return [], [f"the query ids of {', '.join(sorted(groups))} (no benchmark data: `codetool data fetch`)"], {}
    deviations, unchecked, kinds = [], [], {}
    for group, ids in sorted(groups.items()):
        filtered = _ids(root / "CodeTool" / "StableToolBench" / "solvable_queries" / "filter_test_instruction"
                        / f"{group}.json")
        full = _ids(root / "StableToolBench" / "solvable_queries" / "test_query_ids" / f"{group}.json")
        if filtered is None:
            unchecked.append(f"the query ids of {group} (CodeTool's filtered file is not in {root})")
            continue
        if ids == filtered:
            kinds[group] = "CodeTool's filtered group (ids checked)"
            continue
        kinds[group] = "full group (ids checked)" if full is not None and ids == full else "other queries"
        extra, lacking = len(ids - filtered), len(filtered - ids)
        deviations.append(f"stabletoolbench {group}: {len(ids)} queries, not CodeTool's filtered group ({lacking} of its "
                          f"{len(filtered)} missing, {extra} not in it): the group's number is not the table's.")
    return deviations, unchecked, kinds
