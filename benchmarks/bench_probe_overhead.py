"""What does When2Tool's probe cost per query, against one decode step? (codetool.decide.probe)

On the embedded model (SmolLM2-135M-Instruct, CPU, float32) and the first-step policy prompts of
``--n`` StableToolBench G1_instruction queries (compact tool docs), per query, medians of
``--repeats`` runs:

- ``prefill``: the prompt's forward as generation runs it (KV cache, logits of the last position);
- ``prefill + states``: the same forward with ``output_hidden_states`` (what the probe reads);
- ``decode step``: one more token on that KV cache (the unit of generation cost);
- ``probe``: concatenating the chosen states, standardising and the logistic regression (numpy).

It prints the probe's overhead as a ratio to one decode step twice: when the probe reads the
states of the prefill that generation pays anyway (``probe`` + the ``states`` extra), and when it
runs its own forward, as ``codetool.decide.probe.last_token_states`` does today (``prefill +
states`` + ``probe``).

    .venv/bin/python benchmarks/bench_probe_overhead.py [--n 8] [--repeats 5] [--threads 2]

Needs ``codetool setup`` and ../shared/data. Timings on the shared 2-core CPU are noisy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _result import emit  # benchmarks/_result.py

from codetool.decide.probe import Probe, probe_messages
from codetool.tools import ToolEnvironment, load_stabletoolbench

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(model, ids, probe: Probe, repeats: int) -> dict[str, float]:
    """Median seconds of the four costs (module docstring) on one prompt ``ids`` (1, T)."""
    import torch

    plain = timed(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1), repeats)
    states = timed(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1, output_hidden_states=True), repeats)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, output_hidden_states=True)
    cache, hidden = out.past_key_values, out.hidden_states
    nxt = out.logits[:, -1:].argmax(-1)
    grown = [ids.shape[1]]

    def step():  # one token on the cache (it grows by one each time: a few tokens of 1,000)
        model(input_ids=nxt, past_key_values=cache, position_ids=torch.tensor([grown]), use_cache=True)
        grown[0] += 1

    decode = timed(step, repeats)
    read = timed(lambda: probe.predict(torch.cat([hidden[i][0, -1] for i in probe.layers]).float().numpy()[None]),
                 repeats * 20)
    return {"tokens": ids.shape[1], "prefill": plain, "states": states, "decode": decode, "probe": read}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8, help="queries")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    import torch

    from codetool.models.backends import TransformersBackend

    if args.threads:
        torch.set_num_threads(args.threads)
    backend = TransformersBackend("default", dtype="float32", device="cpu")
    model, config = backend.model, backend.model.config
    n_states, width = config.num_hidden_layers + 1, config.hidden_size
    rng = np.random.default_rng(0)
    d = n_states * width
    probe = Probe(coef=rng.normal(size=d), intercept=0.1, mean=rng.normal(size=d), scale=rng.uniform(0.5, 2, size=d),
                  layers=list(range(n_states)), n_states=n_states, hidden_size=width, model="default")
    queries = [q for q in load_stabletoolbench("G1_instruction", DATA) if q.apis][: args.n]
    rows = []
    with torch.inference_mode():
        for q in queries:
            ids = torch.tensor([backend.encode(probe_messages(q.query, ToolEnvironment(q.apis, None,
                                                                                          render_style="compact")))])
            rows.append(measure(model, ids, probe, args.repeats))
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    shared = (med["probe"] + max(0.0, med["states"] - med["prefill"])) / med["decode"]
    alone = (med["states"] + med["probe"]) / med["decode"]
    print(f"{len(rows)} prompts, median {med['tokens']:.0f} tokens, {n_states} states x {width} = {d} features, "
          f"{torch.get_num_threads()} threads")
    print(f"{'prefill':24s}{1000 * med['prefill']:10.1f} ms")
    print(f"{'prefill + states':24s}{1000 * med['states']:10.1f} ms")
    print(f"{'decode step':24s}{1000 * med['decode']:10.1f} ms")
    print(f"{'probe (numpy)':24s}{1000 * med['probe']:10.3f} ms")
    print(f"overhead / decode step: {shared:.3f} reading the prefill's states (probe + states extra), "
          f"{alone:.1f} with its own forward; probe arithmetic alone {med['probe'] / med['decode']:.4f}")
    emit(benchmark="probe_overhead", prompts=len(rows), tokens=med["tokens"], features=d,
         prefill_ms=1000 * med["prefill"], prefill_states_ms=1000 * med["states"], decode_ms=1000 * med["decode"],
         probe_ms=1000 * med["probe"], ratio_shared=shared, ratio_own_forward=alone,
         ratio_probe_only=med["probe"] / med["decode"])


if __name__ == "__main__":
    main()
