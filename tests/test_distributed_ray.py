"""``--ray`` on a real local Ray cluster (issue 28): a head without CPUs and two 1-CPU worker nodes
on this machine, every node pinned to 127.0.0.1 (nothing listens beyond loopback: checked), a stub
OpenAI-compatible policy server on loopback with a fixed latency. One
worker node is killed (its raylet and processes, SIGKILL) while it has units in flight: every
unit still gets exactly one record, the driver's log counts the units it sent again, and the trees
equal those of the single-machine run. Needs ``pip install 'codetool[ray]'`` (CI's slow stage)."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from codetool.distributed.ray_cluster import LOCAL_ONLY_ENV, LOOPBACK
from codetool.serving import is_loopback
from tests.conftest import CANARY_KEY

ray_cluster_utils = pytest.importorskip("ray.cluster_utils", reason="needs Ray: pip install 'codetool[ray]'")
pytestmark = pytest.mark.slow

CODETOOL = str(Path(sys.executable).with_name("codetool"))
LATENCY_S = 0.6
API = {"category_name": "Data", "tool_name": "weather", "api_name": "forecast", "api_description": "forecast",
       "required_parameters": [], "optional_parameters": [], "method": "GET"}


class Policy:
    """``/v1/chat/completions`` after LATENCY_S: query 0's episode answers with the canary key (the
    records must not show it), the others finish; tree nodes alternate a step that runs and one
    that raises, so every tree has labelled pairs. While ``gate`` is clear, every completion waits
    (up to 240 s): a test holds the workers' first calls in flight until it has killed a node."""

    def __init__(self):
        self.count = 0
        self.gate = threading.Event()
        self.gate.set()
        policy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send({"data": [{"id": "stub"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                policy.gate.wait(240)
                time.sleep(LATENCY_S)
                text = json.dumps(body["messages"])
                policy.count += 1
                if "tree question" in text:
                    replies = ["print('looked it up')\n```", "raise KeyError('no such field')\n```"]
                else:
                    replies = [f"finish('{CANARY_KEY if 'question 0?' in text else 'ok'}')\n```"]
                n = body.get("n", 1)
                self._send({"choices": [{"index": i, "message": {"role": "assistant", "content": replies[i % len(replies)]},
                                         "finish_reason": "stop"} for i in range(n)],
                            "usage": {"prompt_tokens": 10, "completion_tokens": 5 * n}})

            def _send(self, payload):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(200)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the asking worker was killed
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _address(c) -> str:
    """The cluster's GCS on loopback (Ray may report it under the machine's address)."""
    return f"{LOOPBACK}:{c.address.rsplit(':', 1)[1]}"


def _add_node(c):
    return c.add_node(num_cpus=1, object_store_memory=80 * 2**20, node_ip_address=LOOPBACK)


def _descendants(pid: int) -> set[int]:
    """The processes started under ``pid`` (from /proc: the Ray cluster of this test process)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie does not: a killed raylet's worker may wait unreaped under a PID 1 that
    reaps nothing, CI 2026-12-06)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _listening(pids: set[int]) -> list[str]:
    """The addresses the TCP sockets of ``pids`` listen on (``ip:port``), from /proc/net/tcp{,6}."""
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # ended meanwhile
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    found = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                hex_ip, port = fields[1].split(":")
                raw = bytes.fromhex(hex_ip)
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))  # per 32-bit word, host order
                found.append(f"{ipaddress.ip_address(raw)}:{int(port, 16)}")
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    for name in ("TOOLBENCH_KEY", "OPENAI_API_KEY"):  # the nodes inherit the canary, as they would a real key
        os.environ[name] = CANARY_KEY
    os.environ[LOCAL_ONLY_ENV] = "0"  # Ray's "this machine only": the drivers join on 127.0.0.1
    quick = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000, "health_check_failure_threshold": 2}
    c = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "object_store_memory": 80 * 2**20, "_system_config": quick,
        "node_ip_address": LOOPBACK})
    workers = [_add_node(c) for _ in range(2)]
    c.wait_for_nodes()
    yield c, workers
    c.shutdown()
    for name in ("TOOLBENCH_KEY", "OPENAI_API_KEY", LOCAL_ONLY_ENV):
        os.environ.pop(name, None)


@pytest.fixture
def whole(cluster):
    """The cluster with two live worker nodes whatever an earlier test left (a test that failed
    after killing a node must not fail the next one too, CI 2026-12-06)."""
    c, workers = cluster
    for i, node in enumerate(workers):
        if node not in c.worker_nodes:
            workers[i] = _add_node(c)
    c.wait_for_nodes()
    return c, workers


@pytest.fixture(scope="module")
def policy():
    p = Policy()
    yield p
    p.server.shutdown()


def _queries(folder: Path, n: int, text: str) -> Path:
    folder.mkdir()
    (folder / "G1.json").write_text(json.dumps([{"query_id": i, "query": f"{text} {i}?", "api_list": [API]}
                                                for i in range(n)]))
    return folder


def _start(args: list[str]) -> tuple[subprocess.Popen, list[str]]:
    """The command in a subprocess, and the list its output lines land in as they come."""
    env = {**os.environ, "COLUMNS": "400", "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.Popen([CODETOOL, *args, "--log-level", "INFO"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines


def _wait_until(done, what: str, proc: subprocess.Popen, lines: list[str]) -> None:
    """Until ``done()`` (a safety limit of 240 s, never a measured bound); fails naming ``what``."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if done():
            return
        if proc.poll() is not None:
            pytest.fail(f"the job ended before {what}: {''.join(lines)[-3000:]}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"not {what} within the time limit: {''.join(lines)[-3000:]}")


def _wait_for(out: Path, records: int, proc: subprocess.Popen, lines: list[str]) -> None:
    _wait_until(lambda: out.exists() and out.read_bytes().count(b"\n") >= records, f"{records} records", proc, lines)


def _wait_ready(workers: int, proc: subprocess.Popen, lines: list[str]) -> None:
    """Until the driver has logged ``workers`` workers ready (each then has its first calls)."""
    _wait_until(lambda: len(set(re.findall(r"ray worker (\d) ready on", "".join(lines)))) >= workers,
                f"{workers} workers ready", proc, lines)


def _stats(log: str) -> dict[str, int]:
    line = " ".join(log.split())
    m = re.search(r"ray: (\d+) units on (\d+) workers in ([\d.]+) s: (\d+) records written \((\d+) errors\), "
                  r"(\d+) workers lost, (\d+) units sent again, (\d+) duplicate results dropped", line)
    assert m, log[-3000:]
    keys = ("units", "workers", "seconds", "records", "errors", "lost", "resent", "duplicates")
    return {k: float(v) if k == "seconds" else int(v) for k, v in zip(keys, m.groups())}


def test_the_local_cluster_listens_on_loopback_only(cluster):
    """Ray left to itself listens on the machine's address (GCS, raylets, object managers): the
    tests, like the docs, pin the node address to 127.0.0.1."""
    listening = _listening(_descendants(os.getpid()))
    assert len(listening) >= 3, listening  # the GCS and two raylets at least
    outside = [a for a in listening if not is_loopback(a.rsplit(":", 1)[0])]
    assert outside == [], f"listening beyond this machine: {outside}"


def test_run_on_ray_loses_and_duplicates_nothing_when_a_worker_node_dies(whole, policy, tmp_path):
    """Node A is killed after 3 records; later the worker process on node B is killed too (Ray
    restarts it there and the driver sends it work again)."""
    c, workers = whole
    queries = _queries(tmp_path / "q", 16, "question")
    out = tmp_path / "traj.jsonl"
    args = ["run", "--benchmark", "toolbench", "--queries", str(queries), "--output", str(out), "--prm", "none",
            "--policy", policy.url, "--search.k", "1", "--search.max_steps", "1", "--search.concurrency", "1",
            "--executor.isolation", "fallback", "--ray", _address(c), "--cluster.batch", "1"]
    start = time.monotonic()
    policy.gate.clear()  # both workers up and holding calls first: on a busy machine one may start late
    try:
        proc, lines = _start(args)
        _wait_ready(2, proc, lines)
    finally:
        policy.gate.set()
    _wait_for(out, 3, proc, lines)
    c.remove_node(workers[0], allow_graceful=False)  # SIGKILL: raylet, object store, the worker processes
    _wait_for(out, 8, proc, lines)
    pids = [int(m.group(1)) for x in lines if (m := re.search(r"ray worker \d ready on \S+ pid (\d+)", x))]
    assert len(pids) == 2, lines
    # The killed node's worker ends when it sees its raylet gone: on a busy machine that may come after
    # the 8th record (it was still running there, CI 2026-12-06).
    _wait_until(lambda: sum(map(_alive, pids)) == 1, "the dead node's worker ended", proc, lines)
    survivor = [pid for pid in pids if _alive(pid)]
    os.kill(survivor[0], 9)
    assert proc.wait(timeout=300) == 0
    wall = time.monotonic() - start
    time.sleep(0.2)
    log = "".join(lines)
    raw = out.read_bytes()
    records = [json.loads(line) for line in raw.splitlines()]  # every line whole
    keys = [(r["group"], r["query_id"]) for r in records]
    assert sorted(keys, key=lambda k: int(k[1])) == [("G1", str(i)) for i in range(16)]  # 0 lost
    assert len(keys) == len(set(keys))  # 0 duplicated
    assert all(r["finish_type"] == "finish" for r in records)
    stats = _stats(log)
    assert (stats["units"], stats["workers"], stats["records"], stats["errors"]) == (16, 2, 16, 0)
    assert stats["lost"] == 2 and stats["resent"] >= 2  # each death caught units in flight
    assert len(re.findall(r"ray worker \d ready on", log)) == 3  # the restarted worker came back
    assert CANARY_KEY not in raw.decode() and CANARY_KEY not in log
    per_worker = re.search(r"records per worker (\[[^]]*\])", log).group(1)
    print(f"\nray run: 16 units, 0 lost, 0 duplicated, {stats['lost']} workers lost, {stats['resent']} sent again, "
          f"records per worker {per_worker}, wall {wall:.1f} s "
          f"(driver {stats['seconds']:.1f} s)")


def test_build_trees_on_ray_equals_the_single_machine_trees_after_a_worker_node_dies(whole, policy, tmp_path):
    c, workers = whole
    queries = _queries(tmp_path / "q", 8, "tree question")
    base = ["build-trees", "--queries", str(queries), "--policy", policy.url, "--branching", "2", "--max_depth", "1",
            "--executor.isolation", "fallback"]  # default settings: the workers batch other trees than the single run
    single = subprocess.run([CODETOOL, *base, "--output", str(tmp_path / "single.jsonl"), "--dataset_dir",
                             str(tmp_path / "single_prm")], capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    out = tmp_path / "ray.jsonl"
    # Two trees per call (the single run grows all 8 at once), two calls per worker. The policy holds
    # every completion until the node is dead, so its worker surely has trees in flight (on a busy
    # machine a worker that started late had none: it died unnoticed, CI 2026-12-06).
    policy.gate.clear()
    try:
        proc, lines = _start([*base, "--output", str(out), "--dataset_dir", str(tmp_path / "ray_prm"), "--ray",
                              _address(c), "--cluster.batch", "2"])
        _wait_ready(2, proc, lines)
        c.remove_node(workers[1], allow_graceful=False)
    finally:
        policy.gate.set()
    assert proc.wait(timeout=300) == 0
    time.sleep(0.2)
    stats = _stats("".join(lines))
    assert (stats["units"], stats["records"], stats["lost"]) == (8, 8, 1)

    def strip(r):
        r = dict(r, summary={k: v for k, v in r["summary"].items() if k != "seconds"})
        for node in r["nodes"].values():
            node["result"].pop("duration_s", None)
        return r

    a = {r["query_id"]: strip(r) for r in map(json.loads, (tmp_path / "single.jsonl").read_text().splitlines())}
    lines = out.read_text().splitlines()
    b = {r["query_id"]: strip(r) for r in map(json.loads, lines)}
    assert len(lines) == len(b) == 8 and a == b
    assert (tmp_path / "ray_prm" / "train.jsonl").read_text() == (tmp_path / "single_prm" / "train.jsonl").read_text()
