"""The comparability block of an evaluation report: every way this run differs from the published
procedure its numbers would be put next to (CodeTool's table, or StableToolBench's own).

:func:`comparability_block` picks the **target** from the judge settings (``judge.prompts`` or
``judge.protocol`` ``codetool``: CodeTool's table, Lu et al. ACL 2025; otherwise StableToolBench's
own procedure) and checks, one line each:

- the settings in :data:`CHECKS` (data-driven: a new setting is one :class:`Check` line): the
  judge's prompts, procedure, rounds, temperature and cuts, and the run's final answers, tree
  label rule, PRM interface, tie-break and observation cut. Judge settings come from the
  ``judge`` config. Run settings are checked per method: what its trajectories recorded
  (``extra["fidelity"]``, written by ``codetool run``: the search's settings, the final answers,
  the PRM's interface and the label rules of its training rows; a method without a PRM skips the
  PRM's checks) over ``run_settings`` (the pipeline passes its own; ``codetool eval --recipe``
  reads a pipeline recipe, where a key it leaves out takes the package default written in the
  check). A run setting nobody recorded is a deviation ("not recorded"), never a match;
- the judge model (CodeTool: ``gpt-4-turbo-2024-04-09``, its ``eval/config.yaml``;
  StableToolBench: ``gpt-4-turbo-preview``, the standard evaluation model its README names; its
  tables since 2024-06 use ``gpt-4-turbo-2024-04-09``), a weak local judge, how replies were read
  (both references force a function call), replies that fell back to JSON text;
- the subset (group sizes against the official 765 queries in 6 groups and CodeTool's filtered
  580), where the final answers came from, the SoWR reference (the field's: ChatGPT CoT), SoWR
  rounds decided by our random stream or after an unreadable comparison;
- for RestBench, which published number each path metric is comparable with.

Against CodeTool's table it also checks each method's ``k``, steps, sampling and reward weights,
the query ids of the subset, and names the known differences no setting removes
(:mod:`codetool.eval.comparability_methods`); what it could not check is listed as such. The block
says "no setting deviates" only when every check passed and every setting was known, and even
then lists the known differences. Nothing here computes a metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codetool.config import load_yaml, to_dict
from codetool.eval.comparability_methods import known_differences, method_lines, subset_id_lines
from codetool.judge.config import PAPER_JUDGE, STB_STANDARD_JUDGE, JudgeConfig
from codetool.judge.reference_prompts import STB_EVALUATOR

STB_FULL = {"G1_instruction": 163, "G1_category": 153, "G1_tool": 158, "G2_instruction": 106,
            "G2_category": 124, "G3_instruction": 61}
STB_CODETOOL = {"G1_instruction": 131, "G1_category": 122, "G1_tool": 118, "G2_instruction": 92,
                "G2_category": 100, "G3_instruction": 17}
RESTBENCH = "restbench-tmdb"
TARGETS = {"codetool": "CodeTool's table (LimOkii/CodeTool eval/eval_pass_rate.py, Lu et al. ACL 2025)",
           "stabletoolbench": "StableToolBench's own procedure (eval_pass_rate.py / eval_preference.py)"}
JUDGE_MODELS = {"codetool": PAPER_JUDGE, "stabletoolbench": STB_STANDARD_JUDGE}
# Sections of a pipeline recipe whose settings the block reads (the judge's come from the judge config).
RUN_SECTIONS = ("trees", "search", "answer", "prm", "train", "methods")


@dataclass(frozen=True)
class Check:
    """One setting the block compares with a reference.

    Args:
        key (`str`): the dotted setting (``judge.rounds``, ``trees.label_rule``).
        expected (`dict`): target -> the reference's value (a tuple: any of these); a target that
            is not listed does not check the setting.
        default (`Any`): the package default, used for a run setting a recipe leaves out
            (``tests/test_eval_comparability.py`` keeps these equal to the dataclass defaults).
        what (`str`): what the reference does, for the message.
        aliases (`tuple[str, ...]`): other dotted keys of the same setting (a trajectory's record,
            the PRM training recipe's key).
    """

    key: str
    expected: dict[str, Any]
    default: Any
    what: str
    aliases: tuple[str, ...] = ()  # other dotted keys that carry the same setting (first found wins)

    def lookup(self, settings: Mapping[str, Any]) -> tuple[bool, Any]:
        """``(found, value)`` of this setting in ``settings`` (its key, then its aliases)."""
        for key in (self.key, *self.aliases):
            if key in settings:
                return True, settings[key]
        return False, None


BOTH = ("codetool", "stabletoolbench")
CHECKS: tuple[Check, ...] = (
    # the judge
    Check("judge.prompts", {"codetool": "codetool", "stabletoolbench": "stabletoolbench"}, "ours",
          "the reference's own judge prompts, read from its checkout (judge.prompts, judge.reference_dir)"),
    Check("judge.protocol", {"codetool": "codetool", "stabletoolbench": "stabletoolbench"}, "stabletoolbench",
          "CodeTool: one forced call per answer, no rule; StableToolBench: its rule and two stages"),
    Check("judge.rounds", {"codetool": 1, "stabletoolbench": 3}, None,
          "CodeTool judges each answer once; StableToolBench's README runs --evaluate_times 3"),
    Check("judge.temperature", {"codetool": 0.0, "stabletoolbench": 0.2}, None,
          "CodeTool's eval/config.yaml: 0.0; StableToolBench's evaluator config: 0.2"),
    Check("judge.max_trajectory_chars", dict.fromkeys(BOTH, 0), 0, "the whole answer is shown, uncut"),
    Check("judge.codetool_instruction", {"codetool": "v2"}, "v2", "run_pass_rate.sh passes --inst_version v2"),
    Check("judge.stabletoolbench_evaluator", {"stabletoolbench": STB_EVALUATOR}, STB_EVALUATOR,
          "eval_pass_rate.py and eval_preference.py load this evaluator by default"),
    Check("judge.blank_finish", {"stabletoolbench": "judge"}, "unsolved",
          "StableToolBench rules out only an exactly empty final_answer: a blank answer's JSON text is judged"),
    # the run: final answers, the PRM and its training rows, the search
    Check("answer.final_answer", {"codetool": "reference", "stabletoolbench": "off"}, "auto",
          "CodeTool writes a new final answer from each execution log for every trajectory, StableToolBench "
          "judges its runs' Finish answers"),
    Check("trees.label_rule", dict.fromkeys(BOTH, "reference"), "ours",
          "CodeTool's get_pair_data / get_sft_data rows"),
    Check("trees.success", dict.fromkeys(BOTH, "executed"), "grounded", "a leaf succeeds when its path ran"),
    Check("trees.tau_mode", dict.fromkeys(BOTH, "sum"), "mean", "tau sums the leaf depths"),
    Check("prm.interface", dict.fromkeys(BOTH, "reference"), "ours",
          "CodeTool's PRM: yes/no words, its prompt, full-vocabulary SFT, logit_yes / (logit_yes + logit_no)",
          aliases=("train.format.interface",)),
    Check("search.tie_break", dict.fromkeys(BOTH, "reference"), "random",
          "CodeTool's main method keeps the first of exactly equal candidates"),
    Check("search.observation_cut", dict.fromkeys(BOTH, "head"), "middle",
          "CodeTool cuts each output head-only ([0:500])"),
    Check("search.observation_history", dict.fromkeys(BOTH, "last"), "all", "the prompt shows the last output only"),
    Check("search.max_observation_chars", dict.fromkeys(BOTH, 500), 1500,
          "the last output is cut to 500 characters (1,500 for TMDB, set per evaluation set)"),
    Check("search.step_format", dict.fromkeys(BOTH, "step_text"), "code_only", "a plan line, then a code block"),
    Check("search.reference_steps", dict.fromkeys(BOTH, True), True,
          "SCEP counts every chosen step as CodeTool's eval_SCEP.py does"),
)
# Settings a trajectory records in extra["fidelity"] (``codetool run``), as the dotted keys above.
RECORDED = {"tie_break": "search.tie_break", "observation_cut": "search.observation_cut",
            "max_observation_chars": "search.max_observation_chars",
            "observation_history": "search.observation_history", "step_format": "search.step_format",
            "reference_steps": "search.reference_steps", "final_answer": "answer.final_answer",
            "prm.interface": "prm.interface", "prm.label_rules": "trees.label_rule"}  # the PRM's training rows
# Checks that concern the PRM: not applicable to a method that used none.
PRM_KEYS = ("trees.label_rule", "trees.success", "trees.tau_mode", "prm.interface")


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys (lists are values)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def recipe_settings(path: str | Path) -> dict[str, Any]:
    """The run settings of a pipeline recipe (its ``trees``, ``search``, ``answer``, ``prm`` and
    ``train`` sections) as dotted keys, and ``__source__`` naming the file.

    Raises:
        ConfigError: the file is missing or not a YAML mapping.
    """
    data = load_yaml(path)
    out = flatten({k: v for k, v in data.items() if k in RUN_SECTIONS})
    out["__source__"] = str(path)
    return out


def target_of(judge_cfg: JudgeConfig) -> str:
    """``codetool`` when the judge follows CodeTool's procedure or prompts, else ``stabletoolbench``."""
    return "codetool" if "codetool" in (judge_cfg.prompts, judge_cfg.protocol) else "stabletoolbench"


def _matches(value: Any, expected: Any) -> bool:
    if isinstance(value, (list, tuple)):  # e.g. the label rules of a PRM's training rows
        return bool(value) and all(_matches(v, expected) for v in value)
    options = expected if isinstance(expected, tuple) else (expected,)
    return any(value == o or (isinstance(o, float) and isinstance(value, (int, float)) and float(value) == o)
               for o in options)


def _shown(expected: Any) -> str:
    return " or ".join(map(repr, expected)) if isinstance(expected, tuple) else repr(expected)


def recorded_settings(run) -> tuple[dict[str, Any], bool]:
    """The settings ``run``'s trajectories recorded (``extra["fidelity"]``) as dotted keys, and
    whether the method used no PRM (recorded ``prm: null``); ``({}, False)`` when none recorded.
    Values that differ between trajectories are kept as a list."""
    seen: dict[str, list] = {}
    no_prm = False
    for traj in getattr(run, "trajectories", []):
        record = (traj.extra or {}).get("fidelity")
        if not isinstance(record, Mapping):
            continue
        no_prm = no_prm or record.get("prm", {}) is None
        for key, value in flatten(record).items():
            if key in RECORDED and value is not None:
                values = seen.setdefault(RECORDED[key], [])
                if value not in values:
                    values.append(value)
    return {k: v[0] if len(v) == 1 else v for k, v in seen.items()}, no_prm


def check_settings(settings: Mapping[str, Any], target: str, *, run_known: bool, judge_only: bool = False,
                   skip: tuple[str, ...] = ()) -> tuple[list[str], int]:
    """Deviation lines of ``settings`` (dotted keys) against ``target``, and how many settings were
    checked. A run setting is looked up in ``settings`` (its key, then its aliases), else
    (``run_known``: a recipe or the pipeline gave the settings) its check's package default, else
    it is "not recorded". ``judge_only`` checks the judge settings only, ``skip`` leaves keys out."""
    lines, checked, unknown = [], 0, []
    for check in CHECKS:
        is_judge = check.key.startswith("judge.")
        if target not in check.expected or check.key in skip or (judge_only and not is_judge) or (
                not judge_only and is_judge):
            continue
        expected = check.expected[target]
        found, value = check.lookup(settings)
        if found and value in ([], (), "", None):  # an empty record (e.g. a PRM without label rules) says nothing
            found = False
        if not found and (is_judge or run_known):
            found, value = True, check.default
        if not found:
            unknown.append(check.key)
            continue
        checked += 1
        if not _matches(value, expected):
            lines.append(f"{check.key} is {value!r}, not {_shown(expected)}: {check.what}.")
    if unknown:
        lines.append(f"run settings not recorded (pass --recipe, or run through `codetool pipeline`): "
                     f"{', '.join(unknown)} unchecked.")
    return lines, checked


def _run_lines(runs: list, run_settings: Mapping[str, Any], target: str) -> tuple[list[str], int]:
    """The run checks per method (its trajectories' records over the recipe's settings), one line
    per difference, naming the methods when not all share it."""
    per_line: dict[str, list[str]] = {}
    checked = 0
    for run in runs or [None]:
        recorded, no_prm = recorded_settings(run) if run is not None else ({}, False)
        lines, n = check_settings({**run_settings, **recorded}, target, run_known="__source__" in run_settings,
                                  skip=PRM_KEYS if no_prm else ())
        checked = max(checked, n)
        for line in lines:
            per_line.setdefault(line, []).append(run.method if run is not None else "")
    everyone = len(runs or [None])
    return [line if len(methods) == everyone else f"{line[:-1]} ({', '.join(methods)})."
            for line, methods in per_line.items()], checked


def _subset(report: dict[str, Any], id_kinds: dict[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Group sizes and what each group is: by its query ids where they were checked (``id_kinds``),
    else by its size alone (said so)."""
    subset, notes, id_kinds = {}, [], id_kinds or {}
    for bench, entry in report["benchmarks"].items():
        sizes: dict[str, int] = {}
        for data in entry["methods"].values():
            for group, summary in data["groups"].items():
                sizes[group] = max(sizes.get(group, 0), summary["n"])
        if bench == "stabletoolbench":
            kinds = {g: id_kinds.get(g) or ("full group (by size)" if STB_FULL.get(g) == n else
                                            "CodeTool's filtered group (by size; ids not checked)"
                                            if STB_CODETOOL.get(g) == n else f"{n} queries, a subset")
                     for g, n in sizes.items()}
            missing = [g for g in STB_FULL if g not in sizes]
            subset[bench] = {"groups": sizes, "kind": kinds, "groups_missing": missing}
            partial = [g for g, k in kinds.items() if k.endswith("subset") or k == "other queries"]
            if partial or missing:
                notes.append(f"{bench}: {', '.join(f'{g} {sizes[g]}' for g in partial) or 'groups'} "
                             f"{'are' if len(partial) != 1 else 'is'} not a full group (official: 765 queries in "
                             f"6 groups, CodeTool's filtered 580)" + (f"; groups not run: {', '.join(missing)}"
                                                                       if missing else "") +
                             ": the average over groups is not the papers' Avg.")
        elif bench == "world":  # the synthetic world (codetool.world): generated queries, no paper number
            subset[bench] = {"groups": sizes, "kind": "synthetic world (the testbed; no paper reports it)"}
            notes.append(f"{bench}: the synthetic testbed world ({', '.join(f'{g} {n}' for g, n in sizes.items())} "
                         "queries); no paper reports numbers on it.")
        elif bench == RESTBENCH:
            total = sum(sizes.values())
            subset[bench] = {"groups": sizes, "kind": "full (100 queries)" if total == 100 else f"{total} of 100"}
            if total != 100:
                notes.append(f"{bench}: {total} of the 100 RestBench-TMDB queries.")
        else:  # your own queries (benchmark custom or toolbench): no published number to stand beside
            subset[bench] = {"groups": sizes, "kind": "your own queries"}
            notes.append(f"{bench}: your own queries ({sum(sizes.values())}); no published number to compare "
                         "them with.")
    return subset, notes


def _judge_lines(judge_cfg: JudgeConfig, judge_info: dict[str, Any], target: str) -> list[str]:
    lines = []
    name, wanted = judge_info["name"], JUDGE_MODELS[target]
    if wanted not in name:
        also = (f" (its tables since 2024-06 use {PAPER_JUDGE}: comparable with those)"
                if target == "stabletoolbench" and PAPER_JUDGE in name else "")
        lines.append(f"judge model {name}, not {wanted}, the judge of {TARGETS[target].split(' (')[0]}{also}.")
    if judge_info.get("weak"):
        lines.append("the judge is a small local model: its labels are a smoke test.")
    mode = judge_info.get("mode", "")
    if judge_info["kind"] not in ("scripted",) and mode != "tools":
        lines.append(f"judge replies read as {'JSON text' if mode == 'json' else 'label log-probabilities'}, "
                     f"not through the forced function call both references use.")
    if judge_info.get("tool_fallbacks"):
        lines.append(f"{judge_info['tool_fallbacks']} judge replies came as JSON text after a forced function call "
                     f"failed or was refused.")
    if judge_cfg.prompts == "ours":
        lines.append(f"our judge prompts (codetool/prompts/judge_*.txt, answers cut to {judge_cfg.max_answer_chars} "
                     f"characters), not the reference's wording.")
    return lines


def comparability_block(report: dict[str, Any], judge_cfg: JudgeConfig, runs: list, reference,
                        judge_info: dict[str, Any] | None, run_settings: Mapping[str, Any] | None = None
                        ) -> dict[str, Any]:
    """The comparability block of ``report`` (a dict; see the module docstring).

    Args:
        report (`dict`): the report so far (benchmarks and win rates filled in).
        judge_cfg (`JudgeConfig`): the judge settings of the run.
        runs (`list[Run]`): the runs shown; reference (`Run` or `None`): the SoWR reference.
        judge_info (`dict` or `None`): ``Judge.describe()`` (``None`` without a judge).
        run_settings (`Mapping`, *optional*): the run's settings as dotted keys (``trees.label_rule``);
            ``__source__`` names the recipe or pipeline they came from (a key they lack then takes
            its package default; without ``__source__`` it is "not recorded").
    """
    target = target_of(judge_cfg)
    run_settings = dict(run_settings or {})
    judge_settings = {f"judge.{k}": v for k, v in to_dict(judge_cfg).items()}
    deviations, checked = check_settings(judge_settings, target, run_known=True, judge_only=True)
    not_applicable = []
    if judge_info is None:  # no judge ran: its settings decided no number of this report
        not_applicable, deviations, checked = deviations, [], 0
    run_lines, run_checked = _run_lines(runs, run_settings, target)
    deviations += run_lines
    checked += run_checked
    unchecked: list[str] = []
    known: list[str] = []
    id_kinds: dict[str, str] = {}
    if target == "codetool":  # each method's k, steps, sampling, weights; the subset's ids; fixed differences
        method_devs, unchecked, method_checked = method_lines(runs, run_settings)
        deviations += method_devs
        checked += method_checked
        id_devs, id_unchecked, id_kinds = subset_id_lines(runs, run_settings.get("__data_dir__"))
        deviations += id_devs
        unchecked += id_unchecked
        unchecked.append("trees.max_depth (the paper gives no depth for its trees)")
    known = known_differences(runs, run_settings, judge_info) if target == "codetool" else [
        line for line in known_differences([], {}, judge_info) if "judge requests" in line]
    if judge_info is None:
        deviations.insert(0, "no judge: no pass or win rate, only judge-free metrics.")
    else:
        deviations[:0] = _judge_lines(judge_cfg, judge_info, target)
    sources = {r.method: dict(sorted(_sources(r).items())) for r in runs}
    generated = {m: s.get("generated", 0) for m, s in sources.items() if s.get("generated")}
    if generated and target == "stabletoolbench":
        deviations.append("final answers generated after the search from the execution log for "
                          + ", ".join(f"{m} ({n})" for m, n in generated.items())
                          + " (StableToolBench judges its runs' Finish answers only); the report splits pass rates "
                            "by answer source.")
    if target == "codetool":
        partial = {m: s for m, s in sources.items() if any(k != "generated" for k in s)}
        if partial:
            deviations.append("final answers not regenerated for every trajectory in " + ", ".join(
                f"{m} ({', '.join(f'{k} {v}' for k, v in s.items())})" for m, s in partial.items())
                + ": CodeTool judges a new answer written from each execution log.")
    subset, notes = _subset(report, id_kinds)
    deviations += notes
    ref = None
    if reference is not None:
        field_ref = "cot" in f"{reference.method} {reference.source}".lower()
        ref = {"method": reference.method, "source": reference.source, "field_reference": field_ref}
        if report["win_rates"]:
            if not field_ref:
                deviations.append(f"SoWR reference is {reference.method}, not ChatGPT CoT (the field's reference; "
                                  f"pass --reference with its converted answers).")
            if judge_cfg.prompts == "codetool":
                deviations.append("SoWR follows StableToolBench's eval_preference.py with our comparison prompts "
                                  "(CodeTool's judge has only its pass-rate instruction).")
            groups = [g for pair in report["win_rates"].values() for b in pair.values() for g in b["groups"].values()]
            picks, undecided = sum(g.get("random_picks", 0) for g in groups), sum(g.get("undecided", 0) for g in groups)
            if picks:
                deviations.append(f"{picks} SoWR rounds between identical answers were picked by our seeded random "
                                  f"stream, not StableToolBench's.")
            if undecided:
                deviations.append(f"{undecided} SoWR comparisons could not be read after retries and were picked at "
                                  f"random (StableToolBench stops there).")
    if RESTBENCH in report["benchmarks"]:
        deviations.append("RestBench success rate is a judged pass rate (Solved 1, Unsure 0.5), not RestGPT's human "
                          "0/1 judgement. Path metrics: 'correct path % (0/1)' is RestGPT's correct path rate; "
                          "'gold calls % (pooled)' (path_pooled_rate) is the form of CodeTool's 91.15% (206 of 226 "
                          "gold calls); path_rate_coagents is CoAgents' api_eval correct_path (finish appended); "
                          "'path score % (frac.)' is a per-query mean no paper reports.")
    return {
        "target": target,
        "target_name": TARGETS[target],
        "judge_model": judge_info["name"] if judge_info else "none",
        "paper_judge": JUDGE_MODELS[target],
        "protocol": judge_cfg.protocol,
        "prompts": judge_cfg.prompts,
        "rounds": judge_cfg.rounds,
        "temperature": judge_cfg.temperature,
        "reply_format": {"tools": "forced function call", "json": "JSON text",
                         "options": "label log-probabilities"}.get((judge_info or {}).get("mode", ""), "n/a"),
        "settings_checked": checked,
        "run_settings_from": run_settings.get("__source__", "given" if run_settings else "none"),
        "subset": subset,
        "answer_sources": sources,
        "sowr_reference": ref,
        "deviations": deviations,
        "not_applicable": not_applicable,
        "known_differences": known,
        "unchecked": unchecked,
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
    target = block.get("target_name", TARGETS["stabletoolbench"])
    rows = [["compared with", target],
            ["judge model", f"{block['judge_model']} (reference: {block['paper_judge']})"],
            ["procedure", f"protocol {block['protocol']}, prompts {block.get('prompts', 'ours')}, {block['rounds']} "
                          f"round{'s' if block['rounds'] != 1 else ''}, temperature {block['temperature']}, replies "
                          f"as {block['reply_format']}"],
            ["run settings from", str(block.get("run_settings_from", "none"))],
            ["subset", subset or "none"],
            ["answer sources", "; ".join(f"{m}: " + ", ".join(f"{k} {v}" for k, v in s.items())
                                         for m, s in block["answer_sources"].items())],
            ["SoWR reference", f"{ref['method']} ({ref['source']})" if ref else "none"]]
    lines = ["## Comparability", "", "| item | this run |", "|---|---|"]
    lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows]
    head = target.split(" (")[0]
    lines += ["", f"Deviations from {head} in this run:" if block["deviations"]
              else f"No setting deviates from {head} ({block.get('settings_checked', 0)} settings checked)"
                   + ("; the known differences below remain." if block.get("known_differences") else "."), ""]
    lines += [f"- {d}" for d in block["deviations"]] + [""]
    if block.get("not_applicable"):
        lines += [f"Not applicable (no judge ran): {len(block['not_applicable'])} judge settings differ from "
                  f"{head}'s; they decide no number here.", ""]
    if block.get("known_differences"):
        lines += ["Known differences that no setting removes (docs/FIDELITY.md):", ""]
        lines += [f"- {d}" for d in block["known_differences"]] + [""]
    if block.get("unchecked"):
        lines += ["Not checked (so not vouched for):", ""] + [f"- {d}" for d in block["unchecked"]] + [""]
    return lines
