"""The comparability block of an evaluation report: what a reader needs before putting a number
of ours next to a published one (StableToolBench, CodeTool, RestGPT).

:func:`comparability_block` states the judge model and protocol, the rounds and temperature, how
replies were read (forced function calls or JSON text), the subset of each benchmark (group sizes
against the official ones), where the final answers came from, the SoWR reference run, and a
list of every deviation from the official protocol in this run. ``report.md`` shows it near the
top and ``codetool eval`` prints the deviations. Nothing here computes a metric.

Official facts it checks against: StableToolBench's solvable test groups have 163 / 153 / 158 /
106 / 124 / 61 queries (G1_instruction, G1_category, G1_tool, G2_instruction, G2_category,
G3_instruction); the CodeTool paper's filtered subset has 131 / 122 / 118 / 92 / 100 / 17; both
papers' judge is gpt-4-turbo-2024-04-09 under StableToolBench's two-stage procedure (temperature
0.2, 3 rounds, forced function calls); the field's SoWR reference is ChatGPT (gpt-3.5-turbo) CoT;
RestGPT's success rate is a human 0/1 judgement and its correct path rate binary per query.
"""

from __future__ import annotations

from typing import Any

from codetool.eval.judges import PAPER_JUDGE, JudgeConfig

STB_FULL = {"G1_instruction": 163, "G1_category": 153, "G1_tool": 158, "G2_instruction": 106,
            "G2_category": 124, "G3_instruction": 61}
STB_CODETOOL = {"G1_instruction": 131, "G1_category": 122, "G1_tool": 118, "G2_instruction": 92,
                "G2_category": 100, "G3_instruction": 17}
RESTBENCH = "restbench-tmdb"


def _subset(report: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    subset, notes = {}, []
    for bench, entry in report["benchmarks"].items():
        sizes: dict[str, int] = {}
        for data in entry["methods"].values():
            for group, summary in data["groups"].items():
                sizes[group] = max(sizes.get(group, 0), summary["n"])
        if bench == "stabletoolbench":
            kinds = {g: ("full group" if STB_FULL.get(g) == n else "CodeTool's filtered group"
                         if STB_CODETOOL.get(g) == n else f"{n} queries, a subset") for g, n in sizes.items()}
            missing = [g for g in STB_FULL if g not in sizes]
            subset[bench] = {"groups": sizes, "kind": kinds, "groups_missing": missing}
            partial = [g for g, k in kinds.items() if k.endswith("subset")]
            if partial or missing:
                notes.append(f"{bench}: {', '.join(f'{g} {sizes[g]}' for g in partial) or 'groups'} "
                             f"{'are' if len(partial) != 1 else 'is'} not a full group (official: 765 queries in "
                             f"6 groups, CodeTool's filtered 580)" + (f"; groups not run: {', '.join(missing)}"
                                                                       if missing else "") +
                             ": the average over groups is not the papers' Avg.")
        else:
            total = sum(sizes.values())
            subset[bench] = {"groups": sizes, "kind": "full (100 queries)" if total == 100 else f"{total} of 100"}
            if total != 100:
                notes.append(f"{bench}: {total} of the 100 RestBench-TMDB queries.")
    return subset, notes


def comparability_block(report: dict[str, Any], judge_cfg: JudgeConfig, runs: list, reference,
                        judge_info: dict[str, Any] | None) -> dict[str, Any]:
    """The comparability block of ``report`` (a dict; see the module docstring).

    Args:
        report (`dict`): the report so far (benchmarks and win rates filled in).
        judge_cfg (`JudgeConfig`): the judge settings of the run.
        runs (`list[Run]`): the runs shown; reference (`Run` or `None`): the SoWR reference.
        judge_info (`dict` or `None`): ``Judge.describe()`` (``None`` without a judge).
    """
    deviations: list[str] = []
    if judge_info is None:
        deviations.append("no judge: no pass or win rate, only judge-free metrics.")
    else:
        name = judge_info["name"]
        if PAPER_JUDGE not in name:
            deviations.append(f"judge model {name}, not the papers' {PAPER_JUDGE}.")
        if judge_info.get("weak"):
            deviations.append("the judge is a small local model: its labels are a smoke test.")
        if judge_cfg.protocol != "stabletoolbench":
            deviations.append("judge protocol codetool (one pass on the query and final answer), not "
                              "StableToolBench's two-stage procedure.")
        mode = judge_info.get("mode", "")
        if judge_info["kind"] not in ("scripted",) and mode != "tools":
            deviations.append(f"judge replies read as {'JSON text' if mode == 'json' else 'label log-probabilities'}"
                              f", not through forced function calls.")
        if judge_info.get("tool_fallbacks"):
            deviations.append(f"{judge_info['tool_fallbacks']} judge replies came as JSON text after a forced "
                              f"function call failed or was refused.")
        if judge_cfg.protocol == "stabletoolbench" and judge_cfg.temperature != 0.2:
            deviations.append(f"judge temperature {judge_cfg.temperature}, not 0.2.")
        if judge_cfg.protocol == "stabletoolbench" and judge_cfg.rounds != 3:
            deviations.append(f"{judge_cfg.rounds} judge rounds, not 3.")
        if judge_cfg.max_trajectory_chars:
            deviations.append(f"answer details shown to the judge cut to {judge_cfg.max_trajectory_chars} characters.")
    sources = {r.method: dict(sorted(_sources(r).items())) for r in runs}
    generated = {m: s.get("generated", 0) for m, s in sources.items() if s.get("generated")}
    if generated:
        deviations.append("final answers generated after the search from the execution log for "
                          + ", ".join(f"{m} ({n})" for m, n in generated.items())
                          + " (CodeTool's practice; StableToolBench's own runs are judged on Finish answers only). "
                            "The report splits pass rates by answer source.")
    subset, notes = _subset(report)
    deviations += notes
    ref = None
    if reference is not None:
        field_ref = "cot" in f"{reference.method} {reference.source}".lower()
        ref = {"method": reference.method, "source": reference.source, "field_reference": field_ref}
        if report["win_rates"]:
            if not field_ref:
                deviations.append(f"SoWR reference is {reference.method}, not ChatGPT CoT (the field's reference; "
                                  f"pass --reference with its converted answers).")
            deviations.append("SoWR shows the two answers in swapped places (A/B) on odd rounds, against position "
                              "bias.")
            flips = sum(g.get("coin_flips", 0) for pair in report["win_rates"].values()
                        for b in pair.values() for g in b["groups"].values())
            if flips:
                deviations.append(f"{flips} SoWR rounds were decided by a seeded coin flip (identical or absent "
                                  f"answers, or a comparison the judge left undecided).")
    if RESTBENCH in report["benchmarks"]:
        deviations.append("RestBench success rate is a judged pass rate (Solved 1, Unsure 0.5), not RestGPT's human "
                          "0/1 judgement; 'correct path % (0/1)' is RestGPT's binary rate, 'path score % (frac.)' "
                          "the fractional measure of the kind CodeTool reported (91.15% cannot be a 0/1 share of "
                          "100 queries).")
    return {
        "judge_model": judge_info["name"] if judge_info else "none",
        "paper_judge": PAPER_JUDGE,
        "protocol": judge_cfg.protocol,
        "rounds": judge_cfg.rounds,
        "temperature": judge_cfg.temperature,
        "reply_format": {"tools": "forced function call", "json": "JSON text",
                         "options": "label log-probabilities"}.get((judge_info or {}).get("mode", ""), "n/a"),
        "subset": subset,
        "answer_sources": sources,
        "sowr_reference": ref,
        "deviations": deviations,
    }


def _sources(run) -> dict[str, int]:
    from codetool.eval.metrics import answer_source

    out: dict[str, int] = {}
    for traj in run.trajectories:
        key = answer_source(traj)
        out[key] = out.get(key, 0) + 1
    return out


def render_block(block: dict[str, Any]) -> list[str]:
    """Markdown lines of the block (``report.md``'s "Comparability" section)."""
    ref = block["sowr_reference"]
    subset = "; ".join(f"{b}: " + ", ".join(f"{g} {n}" for g, n in s["groups"].items())
                       for b, s in block["subset"].items())
    rows = [["judge model", f"{block['judge_model']} (papers: {block['paper_judge']})"],
            ["protocol", f"{block['protocol']}, {block['rounds']} rounds, temperature {block['temperature']}, "
                         f"replies as {block['reply_format']}"],
            ["subset", subset or "none"],
            ["answer sources", "; ".join(f"{m}: " + ", ".join(f"{k} {v}" for k, v in s.items())
                                         for m, s in block["answer_sources"].items())],
            ["SoWR reference", f"{ref['method']} ({ref['source']})" if ref else "none"]]
    lines = ["## Comparability", "", "| item | this run |", "|---|---|"]
    lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows]
    lines += ["", "Deviations from the official protocols in this run:" if block["deviations"]
              else "No deviation from StableToolBench's protocol in this run.", ""]
    lines += [f"- {d}" for d in block["deviations"]] + [""]
    return lines
