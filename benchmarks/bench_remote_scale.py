"""Does every long job keep a remote server full, and what does it cost the client? (issues 28, 39)

One command, from the repository root after ``make setup`` (it reads StableToolBench's G1 test
queries from ``$CODETOOL_DATA``, ``../shared/data`` or what ``codetool data`` fetched)::

    .venv/bin/python benchmarks/bench_remote_scale.py                      # 40 queries, ~3 min
    .venv/bin/python benchmarks/bench_remote_scale.py --queries 40 1000    # the README table, ~1 h
    git archive main | tar -x -C /tmp/old && .venv/bin/python benchmarks/bench_remote_scale.py \
        --baseline-src /tmp/old                                            # beside older code

It starts a stub OpenAI-compatible server (plus a ``serve-prm``-style ``/prm/score``) in its own
process, on loopback: a request waits a fixed latency (1 s for 256 tokens) plus jitter once it
holds its slots (a request for n samples holds n), and the server counts what is in flight. Then
the real commands run against it as subprocesses with their default settings at 64 sequences
allowed (``--policy_client.max_in_flight 64``): ``codetool run`` (k = 2, 5 steps, the simulator
as tool backend), ``run`` with a PRM server, ``codetool build-trees`` (depth 4) and ``codetool
eval`` with the stub as judge (3 rounds). With more queries than G1 holds (163), the queries
are G1's repeated under new ids (a copy of the file in the output folder is the data folder).

For each command, from the server's side: requests, sequences, the **mean in flight** from the
first request to the last reply (sequence-seconds over that window; the target is 75% of what is
allowed, 48 of 64), the peak, the window; from the client's side: the command's wall time and
its ratio to the window (startup, probes and the last writes included; the target for ``run`` is
1.3x) with the seconds before the window (from the command's start to the first request) and
after it (from the last reply to the command's exit), and the peak memory of the command's process tree (proportional set size, and the sum of
resident sizes that counts a shared page in every process) per unit in flight (episodes for
``run``: ``search.concurrency``'s default 2 x 64 / k, at most the queries; trees for
``build-trees``: 2 x 64 / (2 x branching), at least 8). ``uptime``'s load is printed with the table,
and the stub's own lag (the latest its event loop woke from a 10 ms sleep, the longest a request
waited in it before it held its slots): the stub shares the machine, and on a busy one its delays
stretch the window as a slow server would, which no client removes. ``--repeat R`` runs each
command R times and prints min / median / max with how many runs met the targets (one run is one
draw on a shared machine); ``--timeline`` prints each window's sequences in flight every 0.25 s,
which shows where a window loses its mean (a probe before the first wave, the gap between waves,
the tail).

The stub's replies: a policy prompt (it starts with a system message) gets a short code step
(``x = <number>`` and a print), or ``finish(...)`` at the fifth step (and before it with
``--finish-rate``); a judge prompt (it asks for ``answer_status``) gets a Solved verdict (JSON
text, or a tool call when forced); anything else a short text. Replies depend on the prompt, the
seed and the sample index only. It plays vLLM: ``n``, ``seed`` and ``continue_final_message``
work. With ``--faults F`` a share F of the policy replies is a fault (a 500, a 200 whose body is
not JSON, or a dropped connection, in turn): the client retries each (``policy_client.*``).

Loopback only, bounded: each command has a time limit (``--max-seconds``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from _result import emit  # benchmarks/_result.py
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from codetool.memory_use import tree_memory  # noqa: E402 - the package of this checkout

ALLOWED = 64  # sequences the client may keep in flight (the setting)
CHAIN = {"run": 5, "run+prm": 5, "trees": 4, "eval": 1}  # dependent requests in a row


def data_root() -> Path:
    """Where StableToolBench's queries are: $CODETOOL_DATA, ../shared/data, or codetool's data folder."""
    for candidate in (os.environ.get("CODETOOL_DATA"), ROOT.parent / "shared" / "data"):
        if candidate and (Path(candidate) / "StableToolBench").is_dir():
            return Path(candidate)
    from codetool.tools.loaders import data_root as ours

    return ours()


# ------------------------------------------------------------------------------- the stub server
class Meter:
    """Sequences in flight over time, for one kind of request (policy or PRM)."""

    def __init__(self):
        self.requests = self.sequences = self.current = self.peak = 0
        self.area = self.busy = 0.0
        self.lag = 0.0  # the most seconds one request waited in the stub before it held its slots
        self.first = self.last_end = None
        self.last = time.monotonic()
        self.events: list[tuple[float, int]] = []  # (time.monotonic(), +n on entry / -n on leaving)

    def _tick(self):
        now = time.monotonic()
        if self.current:
            self.area += self.current * (now - self.last)
            self.busy += now - self.last
        self.last = now

    def enter(self, n: int, arrived: float | None = None):
        self._tick()
        if arrived is not None:
            self.lag = max(self.lag, time.monotonic() - arrived)
        self.requests += 1
        self.sequences += n
        self.current += n
        self.peak = max(self.peak, self.current)
        self.first = self.first if self.first is not None else time.monotonic()
        self.events.append((self.last, n))

    def leave(self, n: int):
        self._tick()
        self.current -= n
        self.last_end = time.monotonic()
        self.events.append((self.last_end, -n))

    def stats(self, events: bool = False) -> dict:
        self._tick()
        extra = {"events": self.events} if events else {}
        return {"requests": self.requests, "sequences": self.sequences, "peak": self.peak,
                "sequence_seconds": round(self.area, 2), "busy_s": round(self.busy, 2),
                "effective": round(self.area / self.busy, 2) if self.busy else 0.0, "lag_s": round(self.lag, 2),
                "wall_s": round((self.last_end or 0) - (self.first or 0), 2) if self.first else 0.0,
                "first_t": self.first, "last_t": self.last_end, **extra}  # time.monotonic(): one clock for every process


def _rand(*parts) -> random.Random:
    return random.Random(int(hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:12], 16))


def policy_reply(body: dict, i: int, steps: int, finish_rate: float, fail_rate: float = 0.0) -> str:
    """A code step; ``finish(...)`` at step ``steps`` (1-based) or, before it, with ``finish_rate``;
    with ``fail_rate``, a step that raises (its siblings then carry executability labels)."""
    messages = body["messages"]
    history = messages[:-1] if messages[-1]["role"] == "assistant" else messages  # a final one is the fence
    step = sum(m["role"] == "assistant" for m in history) + 1
    rng = _rand(messages[1]["content"][:200] if len(messages) > 1 else "", step, body.get("seed"), i)
    fence = "" if messages[-1]["role"] == "assistant" else "```python\n"
    if step >= steps or rng.random() < finish_rate:
        return f'{fence}finish("the answer is {rng.randint(1, 99)}")'
    if rng.random() < fail_rate:
        return f"{fence}raise KeyError('field {rng.randint(1, 99)}')"
    return f"{fence}x = {rng.randint(1, 10**6)}\nprint(x)"


def build_app(latency: float, jitter: float, capacity: int, prm_latency: float, prm_capacity: int, steps: int = 5,
              finish_rate: float = 0.0, faults: float = 0.0, fail_rate: float = 0.0):
    app = FastAPI()
    fault_count = [0, 0]  # replies so far, faults so far: every 1/faults-th reply is one, in turn
    meters = {"policy": Meter(), "prm": Meter(), "all": Meter()}  # "all": policy and PRM together
    slots = {"policy": [capacity, asyncio.Condition()], "prm": [prm_capacity, asyncio.Condition()]}
    loop_lag = {"max": 0.0, "task": None}  # how late the stub's event loop wakes (a 10 ms sleep)

    async def watch_loop():
        while True:
            start = time.monotonic()
            await asyncio.sleep(0.01)
            loop_lag["max"] = max(loop_lag["max"], time.monotonic() - start - 0.01)

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
        arrived = time.monotonic()  # the stub's own delay (its CPU on a busy machine) is not the client's
        if loop_lag["task"] is None:
            loop_lag["task"] = asyncio.create_task(watch_loop())
        body = await request.json()
        n = int(body.get("n") or 1)
        meters["policy"].enter(n, arrived)
        meters["all"].enter(n)
        # Decoding dominates: a request takes its share of the latency by the tokens it may write
        # (256, the search's max_new_tokens, takes all of it; a probe of a few tokens next to none).
        share = min(1.0, int(body.get("max_tokens") or 256) / 256)
        try:
            await hold("policy", n, share * (latency + random.uniform(0, jitter)))
        finally:
            meters["policy"].leave(n)
            meters["all"].leave(n)
        fault_count[0] += 1
        if faults and fault_count[0] * faults >= fault_count[1] + 1:
            fault_count[1] += 1
            kind = fault_count[1] % 3
            if kind == 0:
                return PlainTextResponse("upstream failed", status_code=500)
            if kind == 1:
                return PlainTextResponse("<html>bad gateway</html>", status_code=200)  # a 200 that is not JSON
            return PlainTextResponse('{"choi', headers={"content-length": "4096"})  # the connection drops mid-body
        judge = "answer_status" in body["messages"][0]["content"]
        choices = []
        for i in range(n):
            if judge:
                text = '{"answer_status": "Solved", "reason": "stub"}'
            elif body["messages"][0]["role"] == "system":
                text = policy_reply(body, i, steps, finish_rate, fail_rate)
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
    async def stats(events: bool = False):
        return {**{k: m.stats(events) for k, m in meters.items()}, "loop_lag_s": round(loop_lag["max"], 3)}

    @app.post("/reset")
    async def reset():
        for k in meters:
            meters[k] = Meter()
        loop_lag["max"] = 0.0
        return {}

    return app


def serve(args) -> None:
    import uvicorn

    app = build_app(args.latency, args.jitter, args.capacity, args.prm_latency, args.prm_capacity, CHAIN["run"],
                    args.finish_rate, args.faults, args.fail_rate)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", backlog=2048, limit_concurrency=4096)



# ---------------------------------------------------------------------------------- the scenarios
def write_queries(out: Path, n: int) -> Path:
    """A data folder whose G1_instruction holds ``n`` queries: G1's, repeated under new ids."""
    source = data_root() / "StableToolBench" / "solvable_queries" / "test_instruction" / "G1_instruction.json"
    if not source.is_file():
        raise SystemExit(f"no StableToolBench queries at {source}: set CODETOOL_DATA or run `codetool data fetch "
                         "stabletoolbench`.")
    base = json.loads(source.read_text())
    queries = []
    for i in range(n):
        q = dict(base[i % len(base)])
        if i >= len(base):
            q["query_id"] = int(q["query_id"]) * 1000 + i // len(base)
        queries.append(q)
    folder = out / f"data-{n}"
    target = folder / "StableToolBench" / "solvable_queries" / "test_instruction" / "G1_instruction.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(queries))
    return folder


def scenarios(url: str, out: Path, n: int, data: Path, only: list[str], baseline: Path | None,
              this_first: bool = False) -> list[dict]:
    """The commands for ``n`` queries, in order; each beside the baseline code's when given (after
    it, or before it with ``this_first``)."""
    common = ["--tool_doc", "brief", "--executor.isolation", "fallback", "--policy", f"{url}/v1",
              "--policy_client.max_in_flight", str(ALLOWED)]
    run = ["run", "--benchmark", "stabletoolbench", "--group", "G1_instruction", "--subset", "full", "--data_dir",
           str(data), "--limit", str(n), "--search.max_steps", str(CHAIN["run"]), *common]
    queries = data / "StableToolBench" / "solvable_queries" / "test_instruction" / "G1_instruction.json"
    found = []
    for kind in ("run", "trees", "run+prm", "eval"):
        if kind not in only:
            continue
        codes = ([("baseline", baseline)] if baseline else []) + [("this checkout", None)]
        for code in (codes[::-1] if this_first else codes):
            tag = f"{kind.replace('+', '')}-{n}" + ("-baseline" if code[1] else "")
            runs = f"{out}/run-{n}" + ("-baseline" if code[1] else "") + ".jsonl"
            argv = {"run": run + ["--prm", "none", "--output", runs],
                    "run+prm": run + ["--prm", f"{url}/prm", "--prm_client.max_in_flight", str(ALLOWED),
                                      "--output", f"{out}/{tag}.jsonl"],
                    # --search.max_new_tokens 192: the trees' default (a --search.* flag on build-trees
                    # otherwise starts the group from SearchConfig's defaults, 256 tokens)
                    "trees": ["build-trees", "--queries", str(queries), "--limit", str(n), "--max_depth",
                              str(CHAIN["trees"]), "--search.max_new_tokens", "192", *common, "--output",
                              f"{out}/{tag}.jsonl", "--dataset_dir", f"{out}/{tag}-data",
                              # the queries are StableToolBench's test set, which build-trees refuses by
                              # default (never_train_on); these trees train nothing
                              *(["--never_train_on", "[]"] if not code[1] else [])],
                    "eval": ["eval", runs, "--judge.model", f"{url}/v1", "--judge.mode", "json", "--judge.protocol",
                             "codetool", "--judge.rounds", "3", "--judge.client.max_in_flight", str(ALLOWED),
                             "--plots", "false", "--out", f"{out}/{tag}"]}[kind]
            units = {"run": min(n, 2 * ALLOWED // 2), "run+prm": min(n, 2 * ALLOWED // 2),
                     "trees": min(n, max(8, 2 * ALLOWED // 4)), "eval": min(3 * n, ALLOWED)}[kind]
            found.append({"kind": kind, "code": code[0], "tag": tag, "argv": argv, "pythonpath": code[1],
                          "units": units, "n": n, "out": out})
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, method: str = "GET") -> dict:
    import httpx

    return httpx.request(method, url, timeout=10).json()


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


class Sampler:
    """Peak memory of a process tree, sampled every ``every_s`` in a thread."""

    def __init__(self, pid: int, every_s: float = 0.5):
        self.pid, self.every_s = pid, every_s
        self.peak_pss = self.peak_rss = 0.0
        self.processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            use = tree_memory(self.pid)
            if use.pss_mb > self.peak_pss:
                self.peak_pss, self.processes = use.pss_mb, use.processes
            self.peak_rss = max(self.peak_rss, use.rss_mb)
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def ramp(events: list, every_s: float = 0.25) -> list[int]:
    """Sequences in flight at every ``every_s`` from the first request (the shape of a window:
    a slow start, a gap between waves, a long tail)."""
    if not events:
        return []
    start, current, shape, i = events[0][0], 0, [], 0
    t = start
    while i < len(events):
        while i < len(events) and events[i][0] <= t:
            current += events[i][1]
            i += 1
        shape.append(current)
        t += every_s
    return shape


def run_one(sc: dict, url: str, env: dict, max_seconds: float, timeline: bool = False) -> dict:
    """Run one scenario's command; what the server and the sampler saw (with ``timeline``, also
    the sequences in flight every 0.25 s, written to ``<tag>.timeline.json``)."""
    _get(f"{url}/reset", "POST")
    out = sc["out"]
    run_env = {**env, "PYTHONPATH": str(sc["pythonpath"])} if sc["pythonpath"] else {**env, "PYTHONPATH": str(ROOT)}
    load = _load()
    start = time.monotonic()
    with open(out / f"{sc['tag']}.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "codetool.cli", *sc["argv"], "--log-level", "WARNING"],
                                cwd=sc["pythonpath"] or ROOT, env=run_env, stdout=log, stderr=subprocess.STDOUT)
        sampler = Sampler(proc.pid)
        try:
            rc = proc.wait(timeout=max_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        finally:
            end = time.monotonic()  # before the sampler's last reading of /proc ends (it is not the command's)
            sampler.stop()
    seconds = end - start
    s = _get(f"{url}/stats?events={str(timeline).lower()}")
    served = s["all"] if sc["kind"] == "run+prm" else s["policy"]
    shape = ramp(served.get("events", []))
    if timeline:
        (out / f"{sc['tag']}.timeline.json").write_text(json.dumps({"start": start, "end": end, "every_s": 0.25,
                                                                   "in_flight": shape}))
    window = served["wall_s"] or 1e-9
    return {"kind": sc["kind"], "code": sc["code"], "queries": sc["n"], "rc": rc, "command_s": round(seconds, 1),
            "requests": served["requests"], "sequences": served["sequences"], "peak": served["peak"],
            "window_s": window, "mean_in_flight": round(served["sequence_seconds"] / window, 1),
            "effective_busy": served["effective"], "wall_over_window": round(seconds / window, 2),
            "policy_mean_in_flight": round(s["policy"]["sequence_seconds"] / (s["policy"]["wall_s"] or 1e-9), 1),
            "prm_requests": s["prm"]["requests"], "units": sc["units"], "stub_lag_s": served["lag_s"],
            "stub_loop_lag_s": s["loop_lag_s"],
            # the command's serial parts: from its start to the first request the server saw, and
            # from the last reply to its exit (what the window leaves out)
            "lead_s": round(served["first_t"] - start, 2) if served["first_t"] else None,
            "tail_s": round(end - served["last_t"], 2) if served["last_t"] else None,
            "pss_mb": round(sampler.peak_pss), "rss_mb": round(sampler.peak_rss), "processes": sampler.processes,
            "pss_per_unit_mb": round(sampler.peak_pss / sc["units"], 1),
            "rss_per_unit_mb": round(sampler.peak_rss / sc["units"], 1), "load": load,
            **({"in_flight_every_0.25s": shape} if timeline else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, nargs="+", default=[40])
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per 256-token request once it holds its slots")
    parser.add_argument("--jitter", type=float, default=0.2, help="extra seconds, uniform in [0, jitter]")
    parser.add_argument("--capacity", type=int, default=256, help="sequences the stub serves at once")
    parser.add_argument("--finish-rate", type=float, default=0.0,
                        help="chance that a step before the last finishes (0: every episode takes 5 steps)")
    parser.add_argument("--faults", type=float, default=0.0, help="share of policy replies that are a fault")
    parser.add_argument("--fail-rate", type=float, default=0.0,
                        help="chance that a code step raises (trees then carry executability labels to compare)")
    parser.add_argument("--prm-latency", type=float, default=0.3)
    parser.add_argument("--prm-capacity", type=int, default=256)
    parser.add_argument("--only", nargs="*", default=["run", "trees", "run+prm", "eval"])
    parser.add_argument("--out", default="runs/bench/remote_scale")
    parser.add_argument("--baseline-src", default="", help="a source tree of older code (`git archive` of a commit): "
                        "each command also runs on it, before ours")
    parser.add_argument("--this-first", action="store_true", help="with --baseline-src, run this checkout's "
                        "command before the baseline's (alternate it across repetitions: the load drifts)")
    parser.add_argument("--max-seconds", type=float, default=3600, help="time limit of each command")
    parser.add_argument("--repeat", type=int, default=1, help="run each command this many times (a spread, not one draw)")
    parser.add_argument("--timeline", action="store_true", help="print the sequences in flight every 0.25 s "
                        "of each window (where a window loses its mean: the start, the gap between waves, the tail)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return

    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--port", str(port), "--latency", str(args.latency),
                               "--jitter", str(args.jitter), "--capacity", str(args.capacity), "--finish-rate",
                               str(args.finish_rate), "--faults", str(args.faults), "--fail-rate",
                               str(args.fail_rate), "--prm-latency",
                               str(args.prm_latency), "--prm-capacity", str(args.prm_capacity)])
    results = []
    try:
        for _ in range(100):
            try:
                _get(f"{url}/v1/models")
                break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.1)
        # bytecode caching on, as in a user's install (a PYTHONDONTWRITEBYTECODE shell would compile
        # every module at each start, ~0.5 s on 2 busy cores, and time that against the commands)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
        baseline = Path(args.baseline_src).resolve() if args.baseline_src else None
        for n in args.queries:
            data = write_queries(out, n)
            # each repeat in a folder of its own (a command given its own finished output would resume it)
            repeats = [out] + [out / f"repeat-{i + 1}" for i in range(1, args.repeat)]
            for folder in repeats:
                folder.mkdir(exist_ok=True)
            for sc in [sc for folder in repeats
                       for sc in scenarios(url, folder, n, data, args.only, baseline, args.this_first)]:
                row = run_one(sc, url, env, args.max_seconds, args.timeline)
                results.append(row)
                print(f"{row['kind']:<8} {row['queries']:>5} q  {row['code']:<14} rc {row['rc']}  requests "
                      f"{row['requests']:>5}  mean in flight {row['mean_in_flight']:>5.1f} (peak {row['peak']})  "
                      f"window {row['window_s']:>6.1f} s  command {row['command_s']:>6.1f} s "
                      f"({row['wall_over_window']:.2f}x: {row['lead_s']} s before, {row['tail_s']} s after)  client {row['pss_mb']} MiB PSS / {row['rss_mb']} MiB RSS "
                      f"({row['pss_per_unit_mb']} / {row['rss_per_unit_mb']} per unit)  stub lag "
                      f"{row['stub_lag_s']:.2f} s (loop {row['stub_loop_lag_s']:.2f} s)  load {row['load']}",
                      flush=True)
                if args.timeline:
                    print(f"         in flight every 0.25 s: {' '.join(map(str, row['in_flight_every_0.25s']))}",
                          flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=2))
        groups: dict[tuple, list[dict]] = {}
        for r in results:
            groups.setdefault((r["kind"], r["queries"], r["code"]), []).append(r)
        emit(**{f"{kind}_{n}_{code.split()[0]}_mean_in_flight": statistics.median(r["mean_in_flight"] for r in rows)
                for (kind, n, code), rows in groups.items()})
        if args.repeat > 1:
            print(f"\nover {args.repeat} runs each: min / median / max, and how many met the targets "
                  f"(>= {0.75 * ALLOWED:g} in flight; run's wall <= 1.3x its window)")
            for (kind, n, code), rows in groups.items():
                mean, ratio = [r["mean_in_flight"] for r in rows], [r["wall_over_window"] for r in rows]
                print(f"{kind:<8} {n:>5} q  {code:<14} mean in flight {min(mean):.1f} / {statistics.median(mean):.1f}"
                      f" / {max(mean):.1f} ({sum(m >= 0.75 * ALLOWED for m in mean)} of {len(rows)})  command / "
                      f"window {min(ratio):.2f} / {statistics.median(ratio):.2f} / {max(ratio):.2f}x "
                      + (f"({sum(x <= 1.3 for x in ratio)} of {len(rows)})" if kind == "run" else "(no target)"))
        print(f"\nat {ALLOWED} allowed, {args.latency:g} s stub (+ up to {args.jitter:g} s); load (1, 5, 15 min) "
              f"when each started in the last column")
        print("| command | queries | code | mean in flight (of 64) | peak | window s | command s | command / window "
              "| before / after window s | client MiB PSS (RSS) | per unit in flight, MiB PSS (RSS) | stub lag s "
              "| load |")
        print("|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|")
        for r in results:
            print(f"| {r['kind']} | {r['queries']} | {r['code']} | {r['mean_in_flight']:.1f} | {r['peak']} | "
                  f"{r['window_s']:.1f} | {r['command_s']:.1f} | {r['wall_over_window']:.2f}x | {r['lead_s']} / "
                  f"{r['tail_s']} | {r['pss_mb']} "
                  f"({r['rss_mb']}) | {r['pss_per_unit_mb']} ({r['rss_per_unit_mb']}) of {r['units']} | "
                  f"{r['stub_loop_lag_s']:.2f} | {r['load']} |")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
