"""Small hand-made trajectory files for showing ``codetool eval``'s comparability block (issue 15).

Writes two methods' runs (``single-sample`` and ``spot-only``) on the first three queries of
StableToolBench G1_instruction (the queries the ChatGPT CoT results also answer) and on two
RestBench-TMDB queries. They contain what the report has to tell apart: a finished answer, an
episode that ran out of steps and got its answer written after the search, a give-up, a chosen
step whose code failed next to an unchosen candidate that also failed, and RestBench paths that
are partly right. The trajectories are made by hand, not by a model: the numbers show the
bookkeeping, not a method's quality.

    python benchmarks/demo_eval_comparability.py --out /tmp/demo
    python -m codetool.cli eval /tmp/demo/single-sample.jsonl /tmp/demo/spot-only.jsonl \\
        --reference ../shared/data/StableToolBench/toolbench/tooleval/results/default_evalset/gpt-3.5-turbo_CoT/G1_instruction.json \\
        --judge.model none --out /tmp/demo/report
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from codetool.executor.result import ExecutionResult, ToolCall
from codetool.jsonl import write_jsonl
from codetool.search.records import Candidate, Step, Trajectory

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
COT = DATA / "StableToolBench/toolbench/tooleval/results/default_evalset/gpt-3.5-turbo_CoT/G1_instruction.json"
TMDB = [{"name": "search_person", "method": "GET", "path": "/search/person"},
        {"name": "person_movie_credits", "method": "GET", "path": "/person/{person_id}/movie_credits"},
        {"name": "search_movie", "method": "GET", "path": "/search/movie"}]


def _cand(i: int, code: str, ok: bool, calls=(), chosen=False, stdout="") -> Candidate:
    return Candidate(i, f"```python\n{code}\n```", code, ExecutionResult(
        ok=ok, stdout=stdout, error_type=None if ok else "NameError", outcome="ok" if ok else "runtime_error",
        tool_calls=[ToolCall(n, response="{}") for n in calls]),
        r_spot=float(ok), chosen=chosen)


def _stb(method: str, queries: list[tuple[str, str]]) -> list[Trajectory]:
    (q0, t0), (q1, t1), (q2, t2) = queries
    k2 = method != "single-sample"
    finished = Trajectory(q0, t0, "stabletoolbench", "G1_instruction", method, steps=[
        Step(0, [_cand(0, "r = vin_decode(vin='WBAWY32040L678750')\nprint(r)", True, ["vin_decode"], True, "BMW")]
             + ([_cand(1, "print(vin)", False)] if k2 else []), 0),
        Step(1, [_cand(0, "finish('The VIN decodes to a BMW.')", True, [], True)], 0)],
        final_answer="The VIN decodes to a BMW.", finish_type="finish")
    # ran out of steps; the answer was written after the search from the execution log
    generated = Trajectory(q1, t1, "stabletoolbench", "G1_instruction", method, steps=[
        Step(0, [_cand(0, "r = generate_resume(role='Graphic Designer')\nprint(r)", True, ["generate_resume"], True,
                       "Resume: visual design, branding")], 0)],
        final_answer="Here is a resume draft that highlights visual design and branding.", finish_type="max_steps",
        extra={"answer_source": "generated"})
    # a chosen step whose code failed, next to an unchosen candidate that failed too
    failing = Trajectory(q2, t2, "stabletoolbench", "G1_instruction", method, steps=[
        Step(0, [_cand(0, "print(regions)", False, [], True)] + ([_cand(1, "print(trends)", False)] if k2 else []), 0)],
        finish_type="give_up" if k2 else "max_steps")
    return [finished, generated, failing]


def _rest(method: str) -> list[Trajectory]:
    gold = ["GET /search/person", "GET /person/{person_id}/movie_credits"]
    full = Trajectory("r0", "Which movies did Sofia Coppola direct?", "restbench-tmdb", None, method, steps=[
        Step(0, [_cand(0, "...", True, ["search_person", "person_movie_credits"], True)], 0)],
        final_answer="Lost in Translation, Marie Antoinette", finish_type="finish", available_tools=TMDB,
        extra={"gold_path": gold})
    half = Trajectory("r1", "Which movies did Greta Gerwig direct?", "restbench-tmdb", None, method, steps=[
        Step(0, [_cand(0, "...", True, ["search_person"], True)], 0)],
        final_answer="I found the person but not the credits.", finish_type="finish", available_tools=TMDB,
        extra={"gold_path": gold})
    return [full, half]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/codetool-demo", help="folder for the two trajectory files")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cot = json.loads(COT.read_text())
    queries = [(qid, entry["query"]) for qid, entry in list(cot.items())[:3]]
    for method in ("single-sample", "spot-only"):
        trajs = _stb(method, queries) + _rest(method)
        write_jsonl(out / f"{method}.jsonl", [t.to_dict() for t in trajs])
        print(f"wrote {out / f'{method}.jsonl'} ({len(trajs)} trajectories)")


if __name__ == "__main__":
    main()
