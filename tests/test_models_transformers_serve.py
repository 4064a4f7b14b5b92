"""The policy on a real ``transformers serve`` (issue 25): a server as it is, not our stub.

``transformers serve`` (``pip install "transformers[serving]"``, the ``serving`` test extra) runs
the embedded SmolLM2-135M-Instruct on the CPU. It answers HTTP 422 to vLLM's fields, returns one
choice whatever ``n``, samples only when ``generation_config`` asks for it, and returns no
log-probabilities or structured outputs; ``codetool run`` must still give k distinct candidates
per step and exit 0 with its default settings, and stop in one line where a setting needs what
the server lacks. Slow: the server decodes on a shared CPU (about 2 minutes).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_run_remote import run_against, write_tools

pytestmark = pytest.mark.slow

MODEL = Path(__file__).resolve().parents[1] / "checkpoints" / "base" / "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("openai", reason="transformers serve needs transformers[serving] (the serving extra)")
    pytest.importorskip("fastapi")
    if not (MODEL / "config.json").is_file():
        pytest.skip(f"the embedded default model is not cached at {MODEL} (run `codetool setup`)")
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
    log = tmp_path_factory.mktemp("serve") / "serve.log"  # a file, not a pipe: a full pipe would stall the server
    proc = subprocess.Popen([sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve",
                             str(MODEL), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                            env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 420  # loading the model on a loaded 2-core machine
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            pytest.fail(f"transformers serve did not start within 420 s: {log.read_text()[-2000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def tools(tmp_path):
    return write_tools(tmp_path)


def _run(url, tools, out, *extra):
    # Short steps, and a timeout for a busy 2-core machine; everything about the server is left
    # to the defaults (probing and adapting).
    return run_against(url, tools, out, "--search.max_new_tokens", "24", "--tool_doc", "brief",
                       "--policy_client.timeout_s", "600", "--policy_client.retries", "8", *extra)


def test_run_on_transformers_serve_gives_distinct_candidates(server, tools, tmp_path, capsys):
    from codetool.jsonl import read_jsonl

    assert _run(server, tools, tmp_path / "t.jsonl") == 0
    [traj] = list(read_jsonl(tmp_path / "t.jsonl"))
    assert traj["finish_type"] != "error", traj.get("error")
    for step in traj["steps"]:
        texts = [c["text"] for c in step["candidates"]]
        assert len(texts) == 2 and len(set(texts)) == 2, texts  # k distinct candidates
    policy = traj["serving"]["policy"]
    features = policy["features"]
    assert features["n"] is False and features["continuation"] is False
    assert features["sampling"] == "generation_config"
    adapted = " ".join(policy["adaptations"])
    assert "own request with its own seed" in adapted and "asked for in the prompt" in adapted
    assert "policy adapted" in capsys.readouterr().out


def test_constrained_run_on_transformers_serve_stops_in_one_line(server, tools, tmp_path, capsys):
    assert _run(server, tools, tmp_path / "t.jsonl", "--search.constrain", "line") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("codetool run: error: search.constrain is 'line'") and "\n" not in err, err
    assert "policy_client.constraint_field" in err


def test_judge_options_on_transformers_serve_is_one_line(server, tmp_path):
    from codetool.assemble import make_judge
    from codetool.config import ConfigError
    from codetool.judge.config import JudgeConfig

    with pytest.raises(ConfigError, match="judge.mode is 'options'") as e:
        make_judge(JudgeConfig(model=server, mode="options", cache=str(tmp_path / "c.jsonl")))
    assert "\n" not in str(e.value)
