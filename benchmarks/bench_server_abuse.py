"""Issue 27's attack round on the servers: does one abusive client delay the others?

    .venv/bin/python benchmarks/bench_server_abuse.py [--server prm|stabletoolbench|tmdb|all]
        [--prm stub|default|CHECKPOINT] [--clients 4] [--seconds 15] [--attacks all|quad,stall,...]

Each server runs in this process on 127.0.0.1 behind ``codetool.serving``. Phase 1: ``--clients``
normal clients (from 127.0.0.1) send small requests back to back for ``--seconds`` (serve-prm:
one search step, 2 candidates; StableToolBench: one ``/virtual`` call; TMDB: one GET). Phase 2:
the same while an abuser, in its own process and from another address (127.0.0.2, another
client to the server), runs the attacks of the issue at once:

- ``quad``: bodies of escaped quotes and brackets (the old JSON depth scan was quadratic);
- ``stall``: 150 uploads that declare the largest body, send 1 KB, then nothing;
- ``hold``: 1,000 connections opened and left idle;
- ``loris``: 800 connections trickling one header line every 2 s;
- ``inflight``: 30 large valid requests kept in flight (serve-prm: 16 long items each);
- ``under``: (serve-prm) requests of items just under the old large-body threshold (250 KB).

It prints the normal clients' p50/p99 per phase and their ratio (issue 27's target: another
client is delayed by at most 2x), and what the abuser got back. On one machine the abuser's own
CPU use slows everything down too (a remote attacker's would not): ``--nice-abuser`` runs it at
nice 19 to separate the two. The machine is shared, so run it twice and read the medians.
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
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _result import emit  # noqa: E402

from codetool.serving import serve_in_background  # noqa: E402

ATTACKS = ("quad", "stall", "hold", "loris", "inflight", "under")
ITEM = {"query": "What is the weather in Paris?", "tools": "def forecast(city): ...",
        "history": [{"code": "x = forecast(city='Paris')", "output": "{'temp': 21}"}]}


def normal_request(server: str) -> tuple[str, str, dict | None]:
    if server == "prm":
        return "POST", "/score", {"items": [{**ITEM, "candidate": "print(x['temp'])", "candidate_output": "21"},
                                            {**ITEM, "candidate": "print(x)", "candidate_output": "{}"}]}
    if server == "stabletoolbench":
        return "POST", "/virtual", {"category": "Data", "tool_name": "theclique", "api_name": "songkick_concert",
                                    "tool_input": json.dumps({"id_conc": "42"})}
    return "GET", "/movie/550", None


def build_app(server: str, prm: str):
    if server == "prm":
        from bench_prm_server import _scorer

        from codetool.prm.server import create_app

        return create_app(_scorer(prm), request_timeout_s=60.0)
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


def normal_clients(url: str, server: str, n: int, seconds: float) -> tuple[list[float], int]:
    method, path, body = normal_request(server)
    latencies, errors, lock = [], [0], threading.Lock()
    deadline = time.monotonic() + seconds

    def loop() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            while time.monotonic() < deadline:
                start = time.perf_counter()
                try:
                    r = client.request(method, path, json=body)
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                with lock:
                    if ok:
                        latencies.append(time.perf_counter() - start)
                    else:
                        errors[0] += 1

    threads = [threading.Thread(target=loop) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors[0]


# ------------------------------------------------------------------------------- the abuser
SOURCE = "127.0.0.2"


def _connect(host: str, port: int) -> socket.socket | None:
    try:
        return socket.create_connection((host, port), source_address=(SOURCE, 0), timeout=5)
    except OSError:
        return None


_CLIENTS = threading.local()


def _post(host: str, port: int, path: str, body: bytes, outcomes: Counter, name: str) -> None:
    """One request on this thread's kept-alive connection (an attacker keeping requests in flight)."""
    client = getattr(_CLIENTS, "client", None)
    if client is None:
        client = _CLIENTS.client = httpx.Client(base_url=f"http://{host}:{port}", timeout=60,
                                                transport=httpx.HTTPTransport(local_address=SOURCE))
    try:
        r = client.post(path, content=body, headers={"content-type": "application/json"})
        outcomes[f"{name}:{r.status_code}"] += 1
    except httpx.HTTPError as e:
        outcomes[f"{name}:{type(e).__name__}"] += 1
        time.sleep(0.05)


def abuse(url: str, server: str, attacks: list[str], stop: threading.Event, outcomes: Counter) -> None:
    host, port = url[len("http://"):].split(":")
    port = int(port)
    path = {"prm": "/score", "stabletoolbench": "/virtual", "tmdb": "/movie/550"}[server]
    try:
        from codetool.tools.mock_servers import MOCK_MAX_BODY_BYTES
    except ImportError:  # an older codetool (--compare runs): its 1 MB default
        MOCK_MAX_BODY_BYTES = 1_000_000  # noqa: N806

    limit = 4_000_000 if server == "prm" else MOCK_MAX_BODY_BYTES
    held: list[socket.socket] = []
    workers: list[threading.Thread] = []

    def repeat(fn):
        def run():
            while not stop.is_set():
                fn()
        t = threading.Thread(target=run, daemon=True)
        t.start()
        workers.append(t)

    if "quad" in attacks:
        quad = (b'"' + b'\\"' * 32_000 + b"[" * 200)[:64_000]
        repeat(lambda: _post(host, port, path, quad, outcomes, "quad"))
    if "inflight" in attacks:
        if server == "prm":
            item = {**ITEM, "history": [{"code": "x = 1", "output": "o" * 600}] * 40, "candidate": "f()"}
            heavy = json.dumps({"items": [item] * 16}).encode()
        else:
            heavy = json.dumps({"tool_name": "theclique", "api_name": "songkick_concert",
                                "tool_input": json.dumps({"blob": "y" * (limit - 2_000)})}).encode()
        for _ in range(30):
            repeat(lambda: _post(host, port, path, heavy, outcomes, "inflight"))
    if "under" in attacks and server == "prm":
        under = json.dumps({"items": [{**ITEM, "candidate": "z" * 245_000}]}).encode()
        for _ in range(4):
            repeat(lambda: _post(host, port, path, under, outcomes, "under"))
    if "stall" in attacks:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {limit}\r\n\r\n".encode() + b"x" * 1000
        for _ in range(150):
            s = _connect(host, port)
            if s is not None:
                s.sendall(head)
                held.append(s)
        outcomes["stall:opened"] += len(held)
    if "hold" in attacks:
        for _ in range(1000):
            s = _connect(host, port)
            if s is not None:
                held.append(s)
        outcomes["hold:opened"] += len(held)
    loris: list[socket.socket] = []
    if "loris" in attacks:
        for _ in range(800):
            s = _connect(host, port)
            if s is not None:
                s.sendall(f"GET {path} HTTP/1.1\r\n".encode())
                loris.append(s)
        outcomes["loris:opened"] += len(loris)
    line = 0
    while not stop.wait(2.0):
        line += 1
        alive = []
        for s in loris:
            try:
                s.sendall(f"X-Trickle-{line}: {line}\r\n".encode())
                alive.append(s)
            except OSError:
                outcomes["loris:closed by server"] += 1
        loris = alive
        poller = select.poll()
        for s in held:
            poller.register(s.fileno(), select.POLLIN | select.POLLHUP)
        ready = {fd for fd, _ in poller.poll(0)}
        for s in [s for s in held if s.fileno() in ready]:
            outcomes["held:answered or closed by server"] += 1
            held.remove(s)
            s.close()
    outcomes["loris:still open"] += len(loris)
    for s in held + loris:
        s.close()


def run_server(server: str, args) -> dict:
    app = build_app(server, args.prm)
    with serve_in_background(app, name=f"the {server} server", header_timeout_s=10.0) as url:
        method, path, body = normal_request(server)
        httpx.request(method, url + path, json=body, timeout=60)  # warm-up
        calm, calm_errors = normal_clients(url, server, args.clients, args.seconds)
        nice = ["nice", "-n", "19"] if args.nice_abuser else []
        abuser = subprocess.Popen(nice + [sys.executable, __file__, "--abuse", url, "--server", server,
                                   "--attacks", ",".join(args.attacks), "--seconds", str(args.seconds + 2)],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(1.5)  # the attacks are in place
        abused, abused_errors = normal_clients(url, server, args.clients, args.seconds)
        out, _ = abuser.communicate(timeout=300)
    outcomes = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    r50 = statistics.median(abused) / statistics.median(calm)
    r99 = percentile(abused, 0.99) / percentile(calm, 0.99)
    print(f"\n{server}: {args.clients} normal clients, {args.seconds:g} s per phase, attacks {','.join(args.attacks)}")
    print(f"{'phase':<13}{'requests':>9}{'errors':>8}{'p50 ms':>9}{'p99 ms':>9}")
    for name, lat, err in (("undisturbed", calm, calm_errors), ("with abuser", abused, abused_errors)):
        print(f"{name:<13}{len(lat):>9}{err:>8}{statistics.median(lat) * 1000:>9.1f}{percentile(lat, 0.99) * 1000:>9.1f}")
    print(f"p50 ratio {r50:.2f}, p99 ratio {r99:.2f} (target: within 2x)")
    print("abuser got:", dict(sorted(outcomes.items())))
    return {"server": server, "p50_ratio": r50, "p99_ratio": r99, "calm_p50_ms": statistics.median(calm) * 1000,
            "abused_p50_ms": statistics.median(abused) * 1000, "normal_errors": abused_errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="all", choices=("prm", "stabletoolbench", "tmdb", "all"))
    parser.add_argument("--prm", default="stub")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--attacks", default="all")
    parser.add_argument("--nice-abuser", action="store_true",
                        help="run the abuser at nice 19, so its own CPU use on this machine does not count")
    parser.add_argument("--abuse", metavar="URL", help=argparse.SUPPRESS)  # internal: be the abuser
    args = parser.parse_args()
    args.attacks = list(ATTACKS) if args.attacks == "all" else args.attacks.split(",")
    if args.abuse:
        stop, outcomes = threading.Event(), Counter()
        threading.Timer(args.seconds, stop.set).start()
        abuse(args.abuse, args.server, args.attacks, stop, outcomes)
        print(json.dumps(outcomes))
        return
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    servers = ["prm", "stabletoolbench", "tmdb"] if args.server == "all" else [args.server]
    results = [run_server(server, args) for server in servers]
    emit(bench="server_abuse", prm=args.prm, **{f"{r['server']}_{k}": v for r in results for k, v in r.items()
                                                if k != "server"})


if __name__ == "__main__":
    main()
