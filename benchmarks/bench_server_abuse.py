"""Does one abusive client delay the others? Issue 27's attacks and issue 39's clients that are not
addresses, on every codetool server, ours and ``--compare REF``'s side by side.

    .venv/bin/python benchmarks/bench_server_abuse.py [--scenario all|attacks,many-addresses,...]
        [--server prm|stabletoolbench|tmdb|all] [--prm cost|stub|default|CHECKPOINT]
        [--clients 4] [--seconds 10] [--compare main] [--nice-abuser]

Each server runs in a child process of this one, on 127.0.0.1 behind ``codetool.serving``. Phase 1:
``--clients`` normal clients send short requests back to back for ``--seconds`` (serve-prm: one
search step, 2 candidates; StableToolBench: one ``/virtual`` call; TMDB: one GET). Phase 2: the
same while ONE abusive client, in its own process, runs the scenario:

- ``attacks`` (issue 27), from 127.0.0.2: ``quad`` bodies of escaped quotes, ``stall`` 150 uploads
  that declare the largest body then stop, ``hold`` 1,000 idle connections, ``loris`` 800
  connections trickling a header line every 2 s, ``inflight`` 30 large valid requests kept in
  flight, ``under`` (serve-prm) items just under the old large-body threshold;
- ``many-addresses``: the same attacks spread over 16 loopback addresses (127.0.0.2-17): one
  client, 16 addresses (issue 39: the victim's p99 rose x13-21 on serve-prm);
- ``trickle``: 20 addresses x 60 connections trickling request heads (issue 39: 36 of 39 victim
  requests failed on the TMDB mock);
- ``keepalive``: one local process (127.0.0.1) holding 64 keep-alive connections, the policy
  client's default; the normal clients, also on 127.0.0.1, open a connection per request
  (issue 39: 15 of 23 requests refused);
- ``same-address``: 8 connections from 127.0.0.1, the normal clients' address, each keeping a
  request of 16 long items in flight (issue 39: short requests waited 18x);
- ``big-json`` (serve-prm): 3.9 MB JSON objects of 300,000 keys sent back to back; the normal
  clients ask ``GET /health`` (issue 39: it stalled 1.5-3.2 s in ``json.loads``).

Prints the normal clients' p50/p99 per phase, their ratios (the target: within 2x whatever one
other client does), their failed requests, and what the abuser got back. With ``--compare REF``
each (scenario, server) runs against REF's ``codetool`` package (``git archive``) and ours,
alternately, and one table gives both. ``--prm cost`` (the default) is a stand-in scorer that
takes 20 us per token, releasing the interpreter like a forward pass (``stub`` costs nothing, so
only the server's own overheads count). On one machine the abuser's own CPU use slows everything
down too (a remote attacker's would not): ``--nice-abuser`` runs it at nice 19. The machine is
shared: say the load (printed), and read ratios, not times.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _result import emit  # noqa: E402

ATTACKS = ("quad", "stall", "hold", "loris", "inflight", "under")
SCENARIOS = {  # name -> servers it applies to
    "attacks": ("prm", "stabletoolbench", "tmdb"),
    "many-addresses": ("prm", "stabletoolbench", "tmdb"),
    "trickle": ("tmdb", "stabletoolbench", "prm"),
    "keepalive": ("tmdb", "prm"),
    "same-address": ("prm", "stabletoolbench"),
    "big-json": ("prm",),
}
ITEM = {"query": "What is the weather in Paris?", "tools": "def forecast(city): ...",
        "history": [{"code": "x = forecast(city='Paris')", "output": "{'temp': 21}"}]}
LONG_ITEM = {**ITEM, "history": [{"code": "x = 1", "output": "o" * 600}] * 40, "candidate": "f()"}


class CostScorer:
    """20 us per token (four characters), slept: the interpreter is free meanwhile, as during a
    forward pass on a GPU. What a batch costs depends on its tokens, not on the request's body."""

    class _Encoder:
        class fmt:
            max_length = 2048

        @staticmethod
        def encode(item):
            chars = len(item.query) + len(item.candidate) + sum(len(h.get("output", "")) for h in item.history)
            return type("Encoded", (), {"input_ids": [0] * min(2048, max(1, chars // 4))})()

    encoder = _Encoder()

    def score(self, items):
        time.sleep(2e-5 * sum(len(self.encoder.encode(item).input_ids) for item in items))
        return [0.5] * len(items)


def normal_request(server: str, scenario: str) -> tuple[str, str, dict | None]:
    if server == "prm":
        if scenario == "big-json":
            return "GET", "/health", None
        return "POST", "/score", {"items": [{**ITEM, "candidate": "print(x['temp'])", "candidate_output": "21"},
                                            {**ITEM, "candidate": "print(x)", "candidate_output": "{}"}]}
    if server == "stabletoolbench":
        return "POST", "/virtual", {"category": "Data", "tool_name": "theclique", "api_name": "songkick_concert",
                                    "tool_input": json.dumps({"id_conc": "42"})}
    return "GET", "/movie/550", None


def build_app(server: str, prm: str):
    if server == "prm":
        from codetool.prm.server import create_app

        if prm == "cost":
            scorer = CostScorer()
        else:
            from bench_prm_server import _scorer

            scorer = _scorer(prm)
        return create_app(scorer, request_timeout_s=60.0)
    from codetool.tools.mock_servers import build_stabletoolbench_app, build_tmdb_app
    from codetool.tools.spec import APISpec, Parameter

    if server == "stabletoolbench":
        return build_stabletoolbench_app([APISpec(category="Data", tool="theclique", api="songkick_concert")])
    movie = APISpec(category="openapi", tool="tmdb", api="GET /movie/{movie_id}", path="/movie/{movie_id}",
                    parameters=[Parameter(name="movie_id", type="integer", required=True, location="path")],
                    example_response={"id": 1, "title": "x"})
    return build_tmdb_app([movie])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def normal_clients(url: str, server: str, scenario: str, n: int, seconds: float,
                   failures: Counter | None = None) -> tuple[list[float], int]:
    """``n`` clients from 127.0.0.1 sending short requests back to back (under ``keepalive``, each
    a new client every 10 requests: new clients must get in); their latencies and failed requests
    (counted by status or error in ``failures``)."""
    method, path, body = normal_request(server, scenario)
    latencies, errors, lock = [], [0], threading.Lock()
    failures = Counter() if failures is None else failures
    deadline = time.monotonic() + seconds
    per_client = 10 if scenario == "keepalive" else 10**9

    def loop() -> None:
        while time.monotonic() < deadline:
            with httpx.Client(base_url=url, timeout=60) as client:
                for _ in range(per_client):
                    if time.monotonic() >= deadline:
                        break
                    start = time.perf_counter()
                    try:
                        status = client.request(method, path, json=body).status_code
                        ok, why = status == 200, str(status)
                    except httpx.HTTPError as e:
                        ok, why = False, type(e).__name__
                    with lock:
                        if ok:
                            latencies.append(time.perf_counter() - start)
                        else:
                            errors[0] += 1
                            failures[why] += 1
                    if not ok:
                        time.sleep(0.05)

    threads = [threading.Thread(target=loop) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors[0]


# ------------------------------------------------------------------------------- the abuser
_LOCAL = threading.local()


class Abuser:
    """One abusive client: every connection it opens comes from one of ``sources``, in turn."""

    def __init__(self, url: str, server: str, sources: list[str], outcomes: Counter):
        host, port = url[len("http://"):].split(":")
        self.host, self.port, self.server, self.sources, self.outcomes = host, int(port), server, sources, outcomes
        self.path = {"prm": "/score", "stabletoolbench": "/virtual", "tmdb": "/movie/550"}[server]
        self._next = 0

    def source(self) -> str:
        self._next += 1
        return self.sources[self._next % len(self.sources)]

    def connect(self) -> socket.socket | None:
        try:
            return socket.create_connection((self.host, self.port), source_address=(self.source(), 0), timeout=5)
        except OSError:
            return None

    def post(self, body: bytes, name: str) -> None:
        """One request on this thread's kept-alive connection (a request kept in flight)."""
        client = getattr(_LOCAL, "client", None)
        if client is None:
            client = _LOCAL.client = httpx.Client(base_url=f"http://{self.host}:{self.port}", timeout=60,
                                                  transport=httpx.HTTPTransport(local_address=self.source()))
        try:
            r = client.post(self.path, content=body, headers={"content-type": "application/json"})
            self.outcomes[f"{name}:{r.status_code}"] += 1
        except httpx.HTTPError as e:
            self.outcomes[f"{name}:{type(e).__name__}"] += 1
            time.sleep(0.05)


def abuse(url: str, server: str, scenario: str, stop: threading.Event, outcomes: Counter) -> None:
    sources = {"many-addresses": [f"127.0.0.{i}" for i in range(2, 18)], "trickle": [f"127.0.0.{i}" for i in range(2, 22)],
               "keepalive": ["127.0.0.1"], "same-address": ["127.0.0.1"]}.get(scenario, ["127.0.0.2"])
    me = Abuser(url, server, sources, outcomes)
    try:
        from codetool.tools.mock_servers import MOCK_MAX_BODY_BYTES
    except ImportError:  # an older codetool: its 1 MB default
        MOCK_MAX_BODY_BYTES = 1_000_000  # noqa: N806
    limit = 4_000_000 if server == "prm" else MOCK_MAX_BODY_BYTES
    held: list[socket.socket] = []
    loris: list[socket.socket] = []
    workers: list[threading.Thread] = []

    def repeat(fn):
        def run():
            while not stop.is_set():
                fn()
        t = threading.Thread(target=run, daemon=True)
        t.start()
        workers.append(t)

    def heavy() -> bytes:
        if server == "prm":
            return json.dumps({"items": [LONG_ITEM] * 16}).encode()
        return json.dumps({"tool_name": "theclique", "api_name": "songkick_concert",
                           "tool_input": json.dumps({"blob": "y" * (limit - 2_000)})}).encode()

    attacks = ATTACKS if scenario in ("attacks", "many-addresses") else ()
    if "quad" in attacks:
        quad = (b'"' + b'\\"' * 32_000 + b"[" * 200)[:64_000]
        repeat(lambda: me.post(quad, "quad"))
    if "inflight" in attacks or scenario == "same-address":
        body = heavy()
        for _ in range(30 if attacks else 8):
            repeat(lambda: me.post(body, "inflight"))
    if "under" in attacks and server == "prm":
        under = json.dumps({"items": [{**ITEM, "candidate": "z" * 245_000}]}).encode()
        for _ in range(4):
            repeat(lambda: me.post(under, "under"))
    if scenario == "big-json":
        big = json.dumps({f"k{i}": 0 for i in range(300_000)}, separators=(",", ":")).encode()  # 3.6 MB
        for _ in range(2):
            repeat(lambda: me.post(big, "big-json"))
    if "stall" in attacks:
        head = f"POST {me.path} HTTP/1.1\r\nHost: x\r\nContent-Length: {limit}\r\n\r\n".encode() + b"x" * 1000
        for _ in range(150):
            if (s := me.connect()) is not None:
                s.sendall(head)
                held.append(s)
    if "hold" in attacks:
        held += [s for _ in range(1000) if (s := me.connect()) is not None]
    if scenario == "keepalive":  # 64 connections, each served once, then kept alive and idle
        request = f"GET {'/health' if server == 'prm' else '/movie/550'} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        for _ in range(64):
            if (s := me.connect()) is not None:
                s.sendall(request)
                held.append(s)
    if "loris" in attacks or scenario == "trickle":
        for _ in range(800 if attacks else 20 * 60):
            if (s := me.connect()) is not None:
                s.sendall(f"GET {me.path} HTTP/1.1\r\n".encode())
                loris.append(s)
    outcomes["connections opened"] += len(held) + len(loris)
    line = 0
    while not stop.wait(2.0 if attacks else 1.0):
        line += 1
        alive = []
        for s in loris:  # trickle: one header line each, then reopen what the server closed
            try:
                s.sendall(f"X-Trickle-{line}: {line}\r\n".encode())
                alive.append(s)
            except OSError:
                outcomes["trickling closed by server"] += 1
                s.close()
                if scenario == "trickle" and (fresh := me.connect()) is not None:
                    fresh.sendall(f"GET {me.path} HTTP/1.1\r\n".encode())
                    alive.append(fresh)
        loris = alive
        if scenario != "keepalive":
            poller = select.poll()
            for s in held:
                poller.register(s.fileno(), select.POLLIN | select.POLLHUP)
            ready = {fd for fd, _ in poller.poll(0)}
            for s in [s for s in held if s.fileno() in ready]:
                outcomes["held: answered or closed by server"] += 1
                held.remove(s)
                s.close()
    outcomes["trickling still open"] += len(loris)
    for s in held + loris:
        s.close()


# ------------------------------------------------------------------------------- one measurement
def measure(server: str, scenario: str, args) -> dict:
    """Both phases against ``server`` under ``scenario``, in this process (the server in a thread)."""
    from codetool.serving import serve_in_background

    app = build_app(server, args.prm)
    with serve_in_background(app, name=f"the {server} server", header_timeout_s=10.0) as url:
        method, path, body = normal_request(server, scenario)
        httpx.request(method, url + path, json=body, timeout=60)  # warm-up
        calm, calm_errors = normal_clients(url, server, scenario, args.clients, args.seconds)
        nice = ["nice", "-n", "19"] if args.nice_abuser else []
        abuser = subprocess.Popen(nice + [sys.executable, __file__, "--abuse", url, "--server", server,
                                          "--scenario", scenario, "--seconds", str(args.seconds + 3)],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(2.0)  # the abuse is in place
        failures = Counter()
        abused, abused_errors = normal_clients(url, server, scenario, args.clients, args.seconds, failures)
        out, _ = abuser.communicate(timeout=600)
    outcomes = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    return {"server": server, "scenario": scenario, "calm_p50_ms": statistics.median(calm) * 1000,
            "calm_p99_ms": percentile(calm, 0.99) * 1000, "calm_requests": len(calm), "calm_errors": calm_errors,
            "abused_p50_ms": statistics.median(abused) * 1000 if abused else float("nan"),
            "abused_p99_ms": percentile(abused, 0.99) * 1000, "abused_requests": len(abused),
            "abused_errors": abused_errors,
            "p50_ratio": statistics.median(abused) / statistics.median(calm) if abused else float("nan"),
            "p99_ratio": percentile(abused, 0.99) / percentile(calm, 0.99) if abused else float("nan"),
            "abuser": outcomes, "failures": dict(failures)}


def checkout(ref: str) -> Path:
    """``ref``'s ``codetool`` package in a temporary folder (for ``PYTHONPATH``)."""
    folder = Path(tempfile.mkdtemp(prefix="codetool-bench-"))
    archive = subprocess.run(["git", "-C", str(HERE.parent), "archive", ref, "codetool"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def measure_in(root: Path, server: str, scenario: str, args) -> dict:
    """:func:`measure` in a child process whose ``codetool`` is the package under ``root``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(HERE)])}
    command = [sys.executable, __file__, "--measure", "--server", server, "--scenario", scenario, "--prm", args.prm,
               "--clients", str(args.clients), "--seconds", str(args.seconds)] + (["--nice-abuser"] * args.nice_abuser)
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(rows: list[tuple[str, dict]]) -> None:
    print(f"\n{'scenario':<15}{'server':<16}{'code':<7}{'calm p50':>9}{'p99':>8}{'abused p50':>11}{'p99':>8}"
          f"{'p50 x':>7}{'p99 x':>7}{'failed':>8}")
    for code, r in rows:
        print(f"{r['scenario']:<15}{r['server']:<16}{code:<7}{r['calm_p50_ms']:>9.1f}{r['calm_p99_ms']:>8.1f}"
              f"{r['abused_p50_ms']:>11.1f}{r['abused_p99_ms']:>8.1f}{r['p50_ratio']:>7.2f}{r['p99_ratio']:>7.2f}"
              f"{r['abused_errors']:>5}/{r['abused_errors'] + r['abused_requests']:<4}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="all", choices=("prm", "stabletoolbench", "tmdb", "all"))
    parser.add_argument("--scenario", default="all", help=f"all, or a comma list of {', '.join(SCENARIOS)}")
    parser.add_argument("--prm", default="cost")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--compare", metavar="REF", help="a git ref (e.g. main) measured side by side with this tree")
    parser.add_argument("--nice-abuser", action="store_true",
                        help="run the abuser at nice 19, so its own CPU use on this machine does not count")
    parser.add_argument("--abuse", metavar="URL", help=argparse.SUPPRESS)  # internal: be the abuser
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # internal: one measurement
    args = parser.parse_args()
    if args.abuse:
        stop, outcomes = threading.Event(), Counter()
        threading.Timer(args.seconds, stop.set).start()
        abuse(args.abuse, args.server, args.scenario, stop, outcomes)
        print(json.dumps(outcomes))
        return
    if args.measure:
        print(json.dumps(measure(args.server, args.scenario, args)))
        return
    scenarios = list(SCENARIOS) if args.scenario == "all" else args.scenario.split(",")
    pairs = [(sc, sv) for sc in scenarios for sv in SCENARIOS[sc] if args.server in ("all", sv)]
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; PRM scorer {args.prm}; "
          f"{args.clients} normal clients, {args.seconds:g} s per phase")
    old = checkout(args.compare) if args.compare else None
    rows, results = [], []
    for scenario, server in pairs:
        ours = measure_in(HERE.parent, server, scenario, args)
        base = measure_in(old, server, scenario, args) if old else None
        rows += ([(args.compare[:6], base)] if base else []) + [("ours", ours)]
        results.append({"ours": ours, "base": base})
        show(rows[-2:] if base else rows[-1:])
        print("  abuser got:", dict(sorted(ours["abuser"].items())), "| normal clients' failures:",
              {code: r["failures"] for code, r in (("ours", ours), (args.compare, base)) if r and r["failures"]})
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}; the target: p99 within 2x, no failed request")
    show(rows)
    emit(bench="server_abuse", prm=args.prm, compare=args.compare,
         **{f"{r['ours']['scenario']}_{r['ours']['server']}_{k}": v for r in results
            for k, v in ([("p99_ratio", r["ours"]["p99_ratio"]), ("failed", r["ours"]["abused_errors"])]
                         + ([("base_p99_ratio", r["base"]["p99_ratio"]), ("base_failed", r["base"]["abused_errors"])]
                            if r["base"] else []))})


if __name__ == "__main__":
    main()
