"""Side by side in ``codetool eval-decision``: the probe, the verbalised and the log-prob confidence
of tool necessity on the same (held-out) queries, and the prompt-only baselines.

- :func:`probe_heldout`: with ``router.probe``, the probe's own draw of queries (``probe.json``'s
  ``info.draw``), restricted to its held-out query ids, labelled by its ``labels.jsonl`` (the
  no-tool run of ``codetool train-probe``), so nothing the probe was fitted on is scored;
- :func:`necessity_scores`: P(tool necessary) of each query under each method: ``probe``, the
  log-prob confidence (``logprobs``: ``1 - P(NONE)`` over the named options) and the verbalised one
  (``agreement``: ``1 -`` the share of sampled replies that say NONE);
- :func:`necessity_section`: ``report.json``'s ``necessity``: per method the AUROC with a bootstrap
  95% interval and the trade-off sweep (:mod:`codetool.decide.tradeoff`), the baselines, the
  definitions.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from codetool import CodetoolError
from codetool.decide.labelled import DecisionItem
from codetool.decide.stage import Decision, api_candidates, decide

logger = logging.getLogger(__name__)

VERBALISED = "agreement"
LABEL = {"probe": "probe (hidden states)", "logprobs": "log-prob confidence", "agreement": "verbalised (sampled answers)"}


def probe_heldout(probe, folder: str | Path) -> tuple[list[DecisionItem], dict[str, int]]:
    """The held-out queries of a probe trained by ``codetool train-probe`` in ``folder``, their
    ``needs_tool`` taken from its ``labels.jsonl``.

    Raises:
        CodetoolError: the probe records no draw or split, or ``labels.jsonl`` lacks a held-out id.
    """
    from codetool.decide.necessity import DRAW_KEYS, NecessityLabel, draw_items
    from codetool.jsonl import read_jsonl

    draw, split = probe.info.get("draw"), probe.info.get("split")
    if not draw or not split:
        raise CodetoolError(f"the probe in {folder} records no query draw or split; train it with codetool train-probe, "
                            f"or pass --heldout_only false to score eval-decision's own draw.")
    items, skipped = draw_items(SimpleNamespace(**{k: draw.get(k, "") for k in DRAW_KEYS}))
    held = set(split["heldout"])
    items = [it for it in items if it.item_id in held]
    path = Path(folder) / "labels.jsonl"
    labels = {r["id"]: NecessityLabel(**r) for r in read_jsonl(path)} if path.is_file() else {}
    missing = [it.item_id for it in items if it.item_id not in labels]
    if missing:
        raise CodetoolError(f"{path} has no label for {missing[:3]} ({len(missing)} held-out queries); rerun "
                            f"codetool train-probe --output {folder} (it resumes).")
    for it in items:
        it.needs_tool = labels[it.item_id].needs_tool
    return items, skipped


def probe_prompts(items: list[DecisionItem], tool_doc: str, step_format: str) -> list:
    """The first-step policy prompt of each item (what the probe reads)."""
    from codetool.decide.probe import probe_messages
    from codetool.tools import ToolEnvironment

    return [probe_messages(it.query, ToolEnvironment(it.apis, None, render_style=tool_doc), step_format)
            for it in items]


def necessity_scores(methods: list[str], items: list[DecisionItem], decider, router_cfg, *, primary: list[Decision],
                     probe=None, probe_backend=None, tool_doc: str = "compact", step_format: str = "code_only"
                     ) -> dict[str, list[float]]:
    """P(tool necessary) per method and query; ``primary`` (the decisions of ``router_cfg.method``)
    is reused for its own method. A method that cannot run here (probe without a probe, logprobs on
    a backend without log-probabilities) is left out with a warning."""
    from codetool.decide.probe import probe_decisions

    out: dict[str, list[float]] = {}
    if primary:
        out[primary[0].method] = [d.p_tool if d.p_tool is not None else 0.0 for d in primary]
    for method in methods:
        if method in out:
            continue
        if method == "probe":
            if probe is None:
                logger.warning("no probe (router.probe) to compare: leaving the probe out")
                continue
            decisions = probe_decisions(probe_backend or decider, probe_prompts(items, tool_doc, step_format),
                                        probe, router_cfg)
        else:
            if method == "logprobs" and not getattr(decider, "supports_logprobs", False):
                logger.warning("the decider gives no log-probabilities: leaving logprobs out")
                continue
            decisions = decide(decider, [(it.query, api_candidates(it.apis)) for it in items],
                               replace(router_cfg, method=method))
        out[method] = [d.p_tool if d.p_tool is not None else 0.0 for d in decisions]
    return out


def necessity_section(records, thresholds, baselines: list[dict] | None, *, samples: int, seed: int,
                      measured: bool, heldout: bool, labels_from: str) -> dict[str, Any] | None:
    """``report.json``'s ``necessity`` (``None`` when no record carries necessity scores)."""
    from codetool.decide.tradeoff import method_summary

    if not records or not records[0].necessity:
        return None
    labels = [int(r.needs_tool) for r in records]
    calls = [r.search_tool_calls or 0 for r in records] if measured else None
    ok = [float(bool(r.search_success)) for r in records] if measured else None
    methods = {m: method_summary(labels, [r.necessity[m] for r in records], thresholds, tool_calls=calls,
                                 tool_ok=ok, samples=samples, seed=seed) for m in records[0].necessity}
    return {"n": len(records), "needs_tool": sum(labels), "heldout": heldout, "methods": methods,
            "baselines": baselines or [], "tool_outcome": "measured (always-search trajectories)" if measured
            else "assumed: a tool-side query counts one call and is solved",
            "labels_from": labels_from}
