"""How busy do ``run``, ``build-trees`` and ``eval`` keep a remote server? (issue 28)

Starts a stub OpenAI-compatible server (plus a ``serve-prm``-style ``/prm/score``) in its own
process, on loopback: every request waits a fixed latency plus jitter once it holds a slot of the
server's capacity (sequences: a request for n samples holds n), and the server counts what is in
flight. The latency is that of a request for 256 tokens (the search's ``max_new_tokens``); one
that may write fewer takes its share (a probe of a few tokens next to none). Then the real commands run against it as subprocesses (``codetool run`` on StableToolBench
G1 with the simulator, ``codetool build-trees`` on the same queries, ``codetool eval`` with the stub
as judge), each twice or more: as before issue 28 (batched rounds, 8 requests in flight: the old
client's fixed cap, ``search.concurrency`` 4, ``batch_trees`` 8, judge batches of 8) and with the
current defaults (continuous scheduling, ``max_in_flight`` 64), and with 4 allowed in flight.

For each it reports, from the server's side: requests, sequences, the effective concurrency
(sequence-seconds over the seconds in which anything was in flight, i.e. the mean number of
sequences the server held), the peak, the busy wall time, and the ideal wall time (the work at the
allowed concurrency, or the longest chain of dependent requests if that is longer).

The stub's replies: a policy prompt (it starts with a system message) gets a short code step
(``x = <number>`` and a print), or ``finish(...)`` at the fifth step (and before it with
``--finish-rate``: episodes of different lengths leave the end of a run with few in flight); a judge prompt (it asks for ``answer_status``) gets a Solved verdict (JSON text,
or a tool call when forced); anything else a short text. Replies depend on the prompt, the seed
and the sample index only. It plays vLLM: ``n``, ``seed`` and ``continue_final_message`` work.

    .venv/bin/python benchmarks/bench_remote_scale.py [--queries 40] [--latency 1.0] [--jitter 0.2]
        [--only run trees eval run+prm] [--out runs/bench/remote_scale] [--baseline-src DIR]

Loopback only, bounded: each command has a time limit (``--max-seconds``). Needs ../shared/data.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from _result import emit  # benchmarks/_result.py
from fastapi import FastAPI, Request

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
QUERIES = DATA / "StableToolBench" / "solvable_queries" / "test_instruction" / "G1_instruction.json"


# ------------------------------------------------------------------------------- the stub server
class Meter:
    """Sequences in flight over time, for one kind of request (policy or PRM)."""

    def __init__(self):
        self.requests = self.sequences = self.current = self.peak = 0
        self.area = self.busy = 0.0
        self.first = self.last_end = None
        self.last = time.monotonic()

    def _tick(self):
        now = time.monotonic()
        if self.current:
            self.area += self.current * (now - self.last)
            self.busy += now - self.last
        self.last = now

    def enter(self, n: int):
        self._tick()
        self.requests += 1
        self.sequences += n
        self.current += n
        self.peak = max(self.peak, self.current)
        self.first = self.first if self.first is not None else time.monotonic()

    def leave(self, n: int):
        self._tick()
        self.current -= n
        self.last_end = time.monotonic()

    def stats(self) -> dict:
        self._tick()
        return {"requests": self.requests, "sequences": self.sequences, "peak": self.peak,
                "sequence_seconds": round(self.area, 2), "busy_s": round(self.busy, 2),
                "effective": round(self.area / self.busy, 2) if self.busy else 0.0,
                "wall_s": round((self.last_end or 0) - (self.first or 0), 2) if self.first else 0.0}


def _rand(*parts) -> random.Random:
    return random.Random(int(hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:12], 16))


def policy_reply(body: dict, i: int, steps: int, finish_rate: float) -> str:
    """A code step; ``finish(...)`` at step ``steps`` (1-based) or, before it, with ``finish_rate``."""
    messages = body["messages"]
    history = messages[:-1] if messages[-1]["role"] == "assistant" else messages  # a final one is the fence
    step = sum(m["role"] == "assistant" for m in history) + 1
    rng = _rand(messages[1]["content"][:200] if len(messages) > 1 else "", step, body.get("seed"), i)
    fence = "" if messages[-1]["role"] == "assistant" else "```python\n"
    if step >= steps or rng.random() < finish_rate:
        return f'{fence}finish("the answer is {rng.randint(1, 99)}")'
    return f"{fence}x = {rng.randint(1, 10**6)}\nprint(x)"


def build_app(latency: float, jitter: float, capacity: int, prm_latency: float, prm_capacity: int, steps: int = 5,
              finish_rate: float = 0.0):
    app = FastAPI()
    meters = {"policy": Meter(), "prm": Meter(), "all": Meter()}  # "all": policy and PRM together
    slots = {"policy": [capacity, asyncio.Condition()], "prm": [prm_capacity, asyncio.Condition()]}

    async def hold(kind: str, n: int, seconds: float):
        free, cond = slots[kind]
        n = min(n, capacity if kind == "policy" else prm_capacity)
        async with cond:
            await cond.wait_for(lambda: slots[kind][0] >= n)
            slots[kind][0] -= n
        try:
            await asyncio.sleep(seconds)
        finally:
            async with cond:
                slots[kind][0] += n
                cond.notify_all()

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "stub"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        n = int(body.get("n") or 1)
        meters["policy"].enter(n)
        meters["all"].enter(n)
        # Decoding dominates: a request takes its share of the latency by the tokens it may write
        # (256, the search's max_new_tokens, takes all of it; a probe of a few tokens next to none).
        share = min(1.0, int(body.get("max_tokens") or 256) / 256)
        try:
            await hold("policy", n, share * (latency + random.uniform(0, jitter)))
        finally:
            meters["policy"].leave(n)
            meters["all"].leave(n)
        judge = "answer_status" in body["messages"][0]["content"]
        choices = []
        for i in range(n):
            if judge:
                text = '{"answer_status": "Solved", "reason": "stub"}'
            elif body["messages"][0]["role"] == "system":
                text = policy_reply(body, i, steps, finish_rate)
            else:  # a final answer, or a probe of the client (different samples for different seeds)
                text = f"text {_rand(body['messages'][-1]['content'], body.get('seed'), i).randint(1, 10**6)}"
            message = {"role": "assistant", "content": text}
            if judge and body.get("tool_choice"):
                name = body["tool_choice"]["function"]["name"]
                message["tool_calls"] = [{"id": "c", "type": "function", "function": {
                    "name": name, "arguments": json.dumps({"reason": "stub", "answer_status": "Solved"})}}]
            choices.append({"index": i, "message": message, "finish_reason": "stop"})
        return {"choices": choices, "usage": {"prompt_tokens": 100, "completion_tokens": 12 * n}}

    @app.post("/prm/score")
    async def score(request: Request):
        items = (await request.json())["items"]
        meters["prm"].enter(len(items))
        meters["all"].enter(len(items))
        try:
            await hold("prm", len(items), prm_latency + random.uniform(0, jitter / 4))
        finally:
            meters["prm"].leave(len(items))
            meters["all"].leave(len(items))
        return {"scores": [_rand(it["candidate"]).random() for it in items]}

    @app.get("/stats")
    async def stats():
        return {k: m.stats() for k, m in meters.items()}

    @app.post("/reset")
    async def reset():
        for k in meters:
            meters[k] = Meter()
        return {}

    return app


def serve(args) -> None:
    import uvicorn

    app = build_app(args.latency, args.jitter, args.capacity, args.prm_latency, args.prm_capacity, CHAIN["run"],
                    args.finish_rate)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", backlog=2048, limit_concurrency=4096)


# ---------------------------------------------------------------------------------- the scenarios
# Before issue 28: batched rounds, the old client's fixed 8 requests in flight (k = 2 samples each),
# search.concurrency 4 and batch_trees 8 (their old defaults), judge batches of 8.
ROUNDS_8 = ["--search.schedule", "rounds", "--policy_client.max_in_flight", "16", "--prm_client.max_in_flight", "16"]
SETTINGS = {  # kind -> [(label, extra flags, sequences allowed in flight)]
    "run": [("before (rounds, 8 requests)", ROUNDS_8, 16), ("after (continuous, 64)", [], 64),
            ("after, 4 allowed", ["--policy_client.max_in_flight", "4"], 4)],
    "trees": [("before (rounds, 8 requests)", ROUNDS_8[:4], 16), ("after (continuous, 64)", [], 64),
              ("after, 4 allowed", ["--policy_client.max_in_flight", "4"], 4)],
    "run+prm": [("before (rounds, 8 requests)", ROUNDS_8, 16), ("after (continuous, 64)", [], 64)],
    "eval": [("before (batches of 8)", ["--judge.batch_size", "8", "--judge.client.max_in_flight", "8"], 8),
             ("after (64 in flight)", [], 64)],
}
CHAIN = {"run": 5, "run+prm": 5, "trees": 4, "eval": 1}  # dependent requests in a row


def scenarios(url: str, out: Path, queries: int, only: list[str], baseline: Path | None = None) -> list[dict]:
    """The commands to run, in order (``eval`` judges the trajectories of the continuous run)."""
    common = ["--tool_doc", "brief", "--executor.isolation", "fallback", "--policy", f"{url}/v1"]
    run = ["run", "--benchmark", "stabletoolbench", "--group", "G1_instruction", "--subset", "full", "--limit",
           str(queries), "--search.max_steps", str(CHAIN["run"]), *common]
    argv = {"run": run + ["--prm", "none"], "run+prm": run + ["--prm", f"{url}/prm"],
            # --search.max_new_tokens 192 (the trees' default) in every variant: a --search.* flag on
            # build-trees otherwise starts the group from SearchConfig's defaults (256 tokens).
            "trees": ["build-trees", "--queries", str(QUERIES), "--limit", str(queries), "--max_depth",
                      str(CHAIN["trees"]), "--search.max_new_tokens", "192", *common],
            "eval": ["eval", str(out / "run-1.jsonl"), "--judge.model", f"{url}/v1", "--judge.mode", "json",
                     "--judge.protocol", "codetool", "--plots", "false"]}
    found = []
    for kind in ("run", "trees", "run+prm", "eval"):
        if kind not in only:
            continue
        for i, (label, extra, allowed) in enumerate(SETTINGS[kind]):
            tag = f"{kind.replace('+', '')}-{i}"
            where = {"run": ["--output", f"{out}/{tag}.jsonl"], "run+prm": ["--output", f"{out}/{tag}.jsonl"],
                     "trees": ["--output", f"{out}/{tag}.jsonl", "--dataset_dir", f"{out}/{tag}-data"],
                     "eval": ["--out", f"{out}/{tag}"]}[kind]
            found.append({"kind": kind, "label": label, "tag": tag, "argv": argv[kind] + where + extra,
                          "allowed": allowed, "chain": CHAIN[kind]})
            if baseline and label.startswith("before"):  # the same command on the older code itself
                found.append({"kind": kind, "label": f"baseline code ({baseline.name})", "tag": f"{tag}-baseline",
                              "argv": argv[kind] + [a.replace(tag, f"{tag}-baseline") for a in where], "allowed": allowed,
                              "chain": CHAIN[kind], "pythonpath": str(baseline)})
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, method: str = "GET") -> dict:
    import httpx

    return httpx.request(method, url, timeout=10).json()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per request once it holds its slots")
    parser.add_argument("--jitter", type=float, default=0.2, help="extra seconds, uniform in [0, jitter]")
    parser.add_argument("--capacity", type=int, default=256, help="sequences the stub serves at once")
    parser.add_argument("--finish-rate", type=float, default=0.0,
                        help="chance that a step before the last finishes (0: every episode takes 5 steps, every "
                             "tree is full)")
    parser.add_argument("--prm-latency", type=float, default=0.3)
    parser.add_argument("--prm-capacity", type=int, default=256)
    parser.add_argument("--only", nargs="*", default=["run", "trees", "eval", "run+prm"])
    parser.add_argument("--out", default="runs/bench/remote_scale")
    parser.add_argument("--baseline-src", default="", help="a source tree of older code (e.g. `git archive` of a "
                        "commit before issue 28): its commands run beside the 'before' settings, with its defaults")
    parser.add_argument("--max-seconds", type=float, default=600, help="time limit of each command")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return

    out = Path(args.out).resolve()
    if out.exists():
        import shutil

        shutil.rmtree(out)
    out.mkdir(parents=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--port", str(port), "--latency", str(args.latency),
                               "--jitter", str(args.jitter), "--capacity", str(args.capacity), "--finish-rate",
                               str(args.finish_rate), "--prm-latency",
                               str(args.prm_latency), "--prm-capacity", str(args.prm_capacity)])
    try:
        for _ in range(100):
            try:
                _get(f"{url}/v1/models")
                break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.1)
        results = []
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "CODETOOL_DATA": str(DATA)}
        baseline = Path(args.baseline_src).resolve() if args.baseline_src else None
        for sc in scenarios(url, out, args.queries, args.only, baseline):
            _get(f"{url}/reset", "POST")
            start = time.perf_counter()
            run_env = {**env, "PYTHONPATH": sc["pythonpath"]} if sc.get("pythonpath") else env
            proc = subprocess.run([sys.executable, "-m", "codetool.cli", *sc["argv"], "--log-level", "WARNING"],
                                  cwd=sc.get("pythonpath", ROOT), env=run_env, capture_output=True, text=True,
                                  timeout=args.max_seconds)
            seconds = time.perf_counter() - start
            stats = _get(f"{url}/stats")
            s = stats["policy"]
            latency = args.latency + args.jitter / 2
            ideal = max(s["sequence_seconds"] / sc["allowed"], sc["chain"] * latency)
            row = {"kind": sc["kind"], "label": sc["label"], "rc": proc.returncode, "command_s": round(seconds, 1),
                   **s, "allowed": sc["allowed"], "ideal_s": round(ideal, 1),
                   "prm_effective": stats["prm"]["effective"], "prm_requests": stats["prm"]["requests"],
                   "wall_all_s": stats["all"]["wall_s"]}
            results.append(row)
            (out / f"{sc['tag']}.log").write_text(proc.stdout + proc.stderr)
            print(f"{row['kind']:<8} {row['label']:<30} rc {row['rc']}  requests {row['requests']:>5}  sequences "
                  f"{row['sequences']:>5}  effective {row['effective']:>6.1f}  peak {row['peak']:>3}  busy "
                  f"{row['busy_s']:>6.1f} s  ideal {row['ideal_s']:>6.1f} s  (command {row['command_s']} s)"
                  + (f"  PRM effective {row['prm_effective']:.1f}, policy+PRM wall {row['wall_all_s']} s"
                     if row["prm_requests"] else ""), flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=2))
        emit(**{f"{r['kind']}_{r['label'].split()[0]}_{r['allowed']}_effective": r["effective"] for r in results})
        print("\n| command | schedule | allowed | requests | sequences | effective | peak | busy s | ideal s | "
              "PRM effective | wall s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in results:
            prm = f"{r['prm_effective']:.1f}" if r["prm_requests"] else "-"
            print(f"| {r['kind']} | {r['label']} | {r['allowed']} | {r['requests']} | {r['sequences']} | "
                  f"{r['effective']:.1f} | {r['peak']} | {r['busy_s']:.1f} | {r['ideal_s']:.1f} | {prm} | "
                  f"{r['wall_all_s']:.1f} |")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
