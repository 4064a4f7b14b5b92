"""How fast is the local judge, and how often can it be read? (codetool.judge)

Judges the final answers of StableToolBench's data example (3 queries, CoT and DFS runs) and of
the first answered queries of the gpt-3.5-turbo CoT results with the embedded default model
(SmolLM2-135M-Instruct, CPU), once in ``options`` mode (labels scored by log-probs) and once in
``json`` mode (the model writes JSON; no retries, so failures show), and reports seconds per
verdict, unreadable replies and the labels. It also times importing and scoring the 600 CoT
trajectories without a judge. No cache is used, so every verdict is computed.

    .venv/bin/python benchmarks/bench_eval_judge.py [--n 3]

Needs ``codetool setup`` (the default model) and ../shared/data. Timings on a shared 2-core CPU
are noisy.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from codetool.eval.convert import import_converted
from codetool.eval.metrics import run_metrics
from codetool.eval.stabletoolbench import judge_pass
from codetool.judge.llm import LLMJudge
from codetool.judge.records import AnswerRequest, ScriptedJudge
from codetool.models.backends import make_backend
from codetool.models.spec import ModelSpec

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "StableToolBench"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3, help="answered CoT queries to judge besides the example")
    args = parser.parse_args()

    start = time.perf_counter()
    cot = import_converted(DATA / "toolbench/tooleval/results/default_evalset/gpt-3.5-turbo_CoT")
    imported = time.perf_counter() - start
    start = time.perf_counter()
    metrics = run_metrics(cot)
    counter = ScriptedJudge("Solved")
    judge_pass(cot, counter, rounds=3)
    scored = time.perf_counter() - start
    print(f"import 600 converted answers: {imported:.2f} s; metrics + pass-rate bookkeeping: {scored:.3f} s; "
          f"judge calls needed for 3 rounds: {len(counter.answer_calls)} of {3 * len(cot)} "
          f"(the rest are Unsolved by rule); mean steps {metrics.mean_steps:.2f}")

    example = []
    for method in ("virtual_chatgpt_cot", "virtual_chatgpt_dfs"):
        example += import_converted(DATA / "data_example/model_predictions_converted" / method)
    answered = [t for t in example + cot if t.finish_type == "finish" and (t.final_answer or "").strip()]
    answered = answered[: 5 + args.n]
    requests = [AnswerRequest(t.query, t.final_answer or "", None, 0) for t in answered]

    start = time.perf_counter()
    backend = make_backend(ModelSpec.parse("default", dtype="float32", device="cpu"))
    print(f"load default model: {time.perf_counter() - start:.1f} s; {len(requests)} answers to judge")
    print(f"{'mode':<8} {'s/verdict':>10} {'unreadable':>11}  labels")
    for mode in ("options", "json"):
        judge = LLMJudge(backend, kind="local", weak=True, mode=mode, temperature=0.0, retries=0,
                         max_new_tokens=48, batch_size=8)
        start = time.perf_counter()
        verdicts = judge.judge_answers(requests)
        seconds = (time.perf_counter() - start) / len(requests)
        bad = sum(v.parse_failed for v in verdicts)
        print(f"{mode:<8} {seconds:>10.2f} {bad:>5}/{len(verdicts):<5}  {dict(Counter(v.label for v in verdicts))}")


if __name__ == "__main__":
    main()
