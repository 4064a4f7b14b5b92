"""The runs an evaluation compares: trajectory files read into one :class:`Run` per method, the
methods shown and the win-rate reference picked, and the warnings a run's records call for.

Inputs are trajectory files of ``codetool run`` (JSONL, one :class:`Trajectory` per line) or
StableToolBench converted answers (``<method>/<group>.json`` or the ``<method>/`` folder,
:func:`codetool.eval.convert.import_converted`), so ``codetool eval`` scores our runs and theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from codetool.config import ConfigError
from codetool.eval.convert import import_converted
from codetool.jsonl import read_jsonl
from codetool.search.records import Trajectory


@dataclass
class Run:
    """The trajectories of one method, from one input.

    Args:
        method (`str`): the method's name (the records' ``method``, else the file name).
        source (`str`): the input(s) it was read from, comma-separated.
        trajectories (`list[Trajectory]`): its trajectories, in file order.
    """

    method: str
    source: str
    trajectories: list[Trajectory]


def load_runs(paths: Sequence[str]) -> list[Run]:
    """One :class:`Run` per method. Inputs of the same method join into one run when their
    queries differ (one file per benchmark); when they hold the same query, the later input's run
    is named ``<method>@<file stem>``. A query repeated in a file (a resumed run) keeps its last record.

    Raises:
        CodetoolError: a missing input or an unreadable converted-answer file.
    """
    runs: list[Run] = []
    seen: set[str] = set()
    for raw in paths:
        path = Path(raw)
        if str(path.resolve()) in seen:  # the same file named twice (e.g. also in --compare)
            continue
        seen.add(str(path.resolve()))
        if path.suffix == ".jsonl":
            if not path.is_file():
                raise ConfigError(f"trajectory file not found: {path}.")
            try:
                trajs = [Trajectory.from_dict(r) for r in read_jsonl(path)]
            except (KeyError, TypeError, ValueError) as e:  # e.g. a PRM dataset passed by mistake
                raise ConfigError(f"{path}: not a trajectory file of 'codetool run' ({type(e).__name__}: "
                                  f"{str(e)[:100]}).") from None
        else:
            trajs = import_converted(path)
        by_method: dict[str, dict[tuple, Trajectory]] = {}
        for traj in trajs:
            name = traj.method or path.stem
            by_method.setdefault(name, {})[(traj.benchmark, traj.group, traj.query_id)] = traj
        for name, kept in by_method.items():
            same = next((r for r in runs if r.method == name), None)
            if same is not None and not ({(t.benchmark, t.group, t.query_id) for t in same.trajectories} & set(kept)):
                same.source = f"{same.source}, {path}"
                same.trajectories.extend(kept.values())
                continue
            if same is not None:
                name = f"{name}@{path.stem}"
            runs.append(Run(name, str(path), list(kept.values())))
    return runs


def pick_run(runs: Sequence[Run], key: str) -> Run:
    """The run named ``key`` (a method, or the file it was read from).

    Raises:
        ConfigError: no run has that method or source.
    """
    for run in runs:
        if key in (run.method, run.source) or Path(key).resolve() == Path(run.source).resolve():
            return run
    raise ConfigError(f"'{key}' names no loaded method or file; methods: {', '.join(r.method for r in runs)}.")


def open_runs(trajectories: Sequence[str], compare: Sequence[str] = (), reference: str = ""
              ) -> tuple[list[Run], Run | None]:
    """The runs to show, in order, and the win-rate reference, from ``codetool eval``'s inputs.

    Args:
        trajectories (`Sequence[str]`): the input files (see :func:`load_runs`).
        compare (`Sequence[str]`, *optional*): methods or files to show, in this order; the first
            is the reference unless ``reference`` names one. ``--compare A B C`` reaches us as
            ``compare=[A]`` and ``trajectories=[B, C]`` (argparse): when the compared entries are
            all files, the other inputs follow them; method names select exactly those.
        reference (`str`, *optional*): the reference's method or file. A file that is not among
            the inputs (an imported reference, e.g. ChatGPT CoT) is read too, and keeps only the
            queries the other runs hold.

    Raises:
        ConfigError: the inputs hold no trajectories, or a name matches no run.
    """
    ref_file = reference if reference and Path(reference).exists() else ""
    runs = load_runs(list(trajectories) + [c for c in compare if Path(c).exists()] + [ref_file] * bool(ref_file))
    if ref_file and len(runs) > 1:
        ref_run = pick_run(runs, ref_file)
        wanted = {(t.benchmark, t.group, t.query_id) for r in runs if r is not ref_run for t in r.trajectories}
        ref_run.trajectories = [t for t in ref_run.trajectories if (t.benchmark, t.group, t.query_id) in wanted]
    if not runs:
        raise ConfigError(f"the inputs hold no trajectories: {', '.join(trajectories)}.")
    named = [pick_run(runs, c) for c in compare]
    only_files = all(Path(c).exists() for c in compare)
    shown: list[Run] = []
    for run in (named + runs if only_files else named):
        if not any(run is r for r in shown):
            shown.append(run)
    chosen = pick_run(runs, reference) if reference else (shown[0] if compare else None)
    return shown, chosen


def run_warnings(runs: Sequence[Run], parse_failures: int = 0, judge_errors: int = 0) -> list[str]:
    """The warnings of a report on ``runs``: unreadable judge replies, failed judge requests, runs
    without code steps (SCEP n/a), and what a policy server made the run adapt to
    (:mod:`codetool.models.openai_backend` records it in ``Trajectory.serving``)."""
    warnings = []
    if parse_failures:
        warnings.append(f"{parse_failures} judge replies could not be read after retries; they count as Unsolved.")
    if judge_errors:
        warnings.append(f"{judge_errors} judge requests failed after their retries: their verdicts are error "
                        "records (Unsolved; an undecided comparison is a coin flip), listed in verdicts.jsonl; run "
                        "the same eval again to ask only those (the others are cached).")
    for run in runs:
        if run.trajectories and all(c.code is None for t in run.trajectories for s in t.steps for c in s.candidates):
            warnings.append(f"{run.method}: no code steps (an imported function-calling run): SCEP is n/a.")
        elif any(t.steps for t in run.trajectories) and not any(
                "reference_steps" in (t.extra or {}) for t in run.trajectories):
            warnings.append(f"{run.method}: the public SCEP is n/a: its trajectories carry no re-run of the chosen "
                            "path (CodeTool's eval_SCEP.py counts the re-run's status). Run the search again with "
                            "--search.reference_steps true (the default); scep_code_steps is ours, from each step's "
                            "own run.")
        serving = next((t.serving for t in reversed(run.trajectories) if t.serving), {})
        policy = serving.get("policy") or {}
        warnings += [f"{run.method}: policy server: {text}" for text in policy.get("adaptations", [])]
        if policy.get("identical_samples"):
            warnings.append(f"{run.method}: policy server: identical samples in {policy['identical_samples']}")
    return warnings
