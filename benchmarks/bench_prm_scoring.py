"""Benchmark: PRM scoring of the candidates of one search step (issue 7, performance (a)).

    .venv/bin/python benchmarks/bench_prm_scoring.py [--model default] [--candidates 16]
        [--prefix-tokens 1500] [--suffix-tokens 100] [--repeats 2] [--threads 0]

One step: 16 candidates that share a ~1,500-token prefix (query, tools, history), each with a
~100-token suffix (candidate code, output, question), the default model (SmolLM2-135M-Instruct),
float32 on CPU. Methods:

- ``generate x16`` (baseline, the public CodeTool way): per candidate, one greedy ``generate`` of
  3 tokens over the full prompt; the score is read from the first step's label logits. The
  original also made one HTTP request per candidate; that hop is skipped here (it only makes the
  baseline slower).
- ``padded batch``: the 16 full prompts in one left-padded forward, ``logits_to_keep=1``.
- ``shared prefix`` (ours, ``LocalPRMScorer``) in each sharing mode of ``PRMModel``: ``packed``
  (the prefix once and the 16 suffixes after it in one forward, block attention mask), ``trie``
  (the prefix once, the suffixes on its KV cache), and ``auto`` (the default: times the modes on
  the first call and keeps the fastest; that first call is not in the timing).

Every method's scores are checked against an unbatched float32 forward of each full prompt
(``reference_scores``); the table reports the largest difference. Token bound for this shape:
16 * 1600 / (1500 + 16 * 100) = 8.3x. Timings are the best of ``--repeats`` runs; the machine is
shared, so they are noisy.
"""

from __future__ import annotations

import argparse
import time

import torch
from _result import emit  # benchmarks/_result.py

from codetool.prm.folder import new_prm
from codetool.prm.format import PRMFormat, PromptEncoder
from codetool.prm.scorer import LocalPRMScorer, reference_scores
from codetool.prm.synthetic import render_tools
from codetool.rewards import PRMItem


def make_step(encoder: PromptEncoder, candidates: int, prefix_tokens: int, suffix_tokens: int) -> list[PRMItem]:
    """Items of one step with prefix and suffix lengths close to the targets (in tokens)."""
    history = [{"code": f"result_{i} = get_forecast_for_weather(city='City {i}')\nprint(result_{i})",
                "output": f'{{"city": "City {i}", "temperature_c": {10 + i}, "sky": "clear"}}'} for i in range(4)]
    tools = "\n\n".join(render_tools(t, 4) for t in range(5)) * 4

    def item(tools_chars: int, code: str = "", output: str = "") -> PRMItem:
        return PRMItem(query="Compare the weather in ten cities and tell me which one is warmest today.",
                       tools=tools[:tools_chars], history=history, candidate=code, candidate_output=output)

    low, high = 0, len(tools)  # longest tools text whose prefix fits the target
    while low < high:
        mid = (low + high + 1) // 2
        if len(encoder.encode_prefix(item(mid))[0]) <= prefix_tokens:
            low = mid
        else:
            high = mid - 1
    items = []
    for c in range(candidates):
        code = f"data = get_forecast_for_weather(city='Candidate city {c}')\nprint(data)"
        output = f'{{"city": "Candidate city {c}", "temperature_c": {c}, "sky": "rain"}} '
        while len(encoder.encode_suffix(item(low, code, output))[0]) < suffix_tokens:
            output += f"note {c} "
        items.append(item(low, code, output))
    return items


def generate_scores(model, encoder: PromptEncoder, items: list[PRMItem]) -> list[float]:
    """The baseline: one greedy 3-token generate per candidate over its full prompt."""
    pos, neg = encoder.label_ids
    scores = []
    with torch.inference_mode():
        for item in items:
            ids = torch.tensor([encoder.encode(item).input_ids])
            out = model.lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                                    output_scores=True, return_dict_in_generate=True, pad_token_id=0)
            first = out.scores[0][0]
            scores.append(torch.softmax(first[[pos, neg]].float(), dim=-1)[0].item())
    return scores


def padded_scores(model, encoder: PromptEncoder, items: list[PRMItem]) -> list[float]:
    """All full prompts in one left-padded batch, logits at the last position only."""
    pos, neg = encoder.label_ids
    prompts = [encoder.encode(item).input_ids for item in items]
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        logits = model.lm(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits[:, -1]
    return torch.softmax(logits[:, [pos, neg]].float(), dim=-1)[:, 0].tolist()


def best_time(fn, repeats: int) -> tuple[float, list[float]]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--candidates", type=int, default=16)
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--suffix-tokens", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--skip-padded", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    fmt = PRMFormat(max_length=2304, max_suffix_length=256, max_tools_chars=100_000)
    model, tokenizer = new_prm(args.model, fmt, dtype="float32", device="cpu")
    scorer = LocalPRMScorer(model, tokenizer, fmt)
    items = make_step(scorer.encoder, args.candidates, args.prefix_tokens, args.suffix_tokens)
    prefix = len(scorer.encoder.encode(items[0]).prefix_ids)
    suffixes = [len(scorer.encoder.encode(i).suffix_ids) for i in items]
    mean_suffix = sum(suffixes) / len(suffixes)
    bound = args.candidates * (prefix + mean_suffix) / (prefix + sum(suffixes))
    print(f"model {args.model}, {torch.get_num_threads()} threads; {args.candidates} candidates, prefix {prefix} "
          f"tokens, suffix {min(suffixes)}-{max(suffixes)} tokens (token bound {bound:.1f}x)", flush=True)
    start = time.perf_counter()
    reference = reference_scores(model, scorer.encoder, items)
    print(f"  unbatched float32 reference: {time.perf_counter() - start:.2f} s", flush=True)
    methods = [("generate x16 (baseline)", lambda: generate_scores(model, scorer.encoder, items))]
    if not args.skip_padded:
        methods.append(("padded batch", lambda: padded_scores(model, scorer.encoder, items)))
    for mode in ("packed", "trie"):
        methods.append((f"shared prefix, {mode}", lambda m=mode: LocalPRMScorer(model, tokenizer, fmt,
                                                                                share_prefix=m).score(items)))
    scorer.score(items)  # auto: the measurement happens on this first call
    methods.append((f"shared prefix (ours, auto: {model.share_mode})", lambda: scorer.score(items)))
    rows = []
    for name, fn in methods:
        seconds, scores = best_time(fn, args.repeats)
        rows.append((name, seconds, max(abs(a - b) for a, b in zip(scores, reference))))
        print(f"  {name}: {seconds:.2f} s", flush=True)
    base = rows[0][1]
    print(f"\n{'method':<40}{'seconds':>9}{'speed-up':>10}{'max |score - ref|':>20}")
    for name, seconds, diff in rows:
        print(f"{name:<40}{seconds:>9.2f}{base / seconds:>9.2f}x{diff:>20.2e}")
    emit(seconds=rows[-1][1], baseline_seconds=base, speedup=base / rows[-1][1], max_abs_diff=rows[-1][2],
         token_bound=bound, candidates=args.candidates, prefix_tokens=prefix)


if __name__ == "__main__":
    main()
