"""``codetool train-probe`` end to end on the tiny model (a scripted no-tool run on When2Tool-style
tasks written here), then ``codetool eval-decision`` on the probe's held-out queries."""

from __future__ import annotations

import json

import numpy as np
import pytest

from codetool.commands.eval_decision import DecisionEvalConfig, eval_decision_command
from codetool.commands.train_probe import TrainProbeConfig, train_probe_command
from codetool.decide.probe import Probe, auroc, last_token_states, probe_messages
from codetool.decide.stage import RouterConfig
from codetool.decide.when2tool import load_when2tool
from codetool.models.completion import Completion
from codetool.split import split_query_ids
from codetool.tools import ToolEnvironment

TASKS = [{"id": f"t{i}", "difficulty": "easy", "instruction": f"What is {i} plus {i}?",
          "environments": [{"name": "CalculatorEnv", "tools": ["evaluate_expression"], "parameters": {}}],
          "expected": {"answer": str(2 * i)}} for i in range(12)]


@pytest.fixture
def scripted_tiny(tiny_model_dir, monkeypatch):
    """The tiny model for hidden states and option scores; its replies scripted: even tasks are
    answered right without tools, odd ones wrong."""
    from codetool.models.backends import TransformersBackend

    backend = TransformersBackend(str(tiny_model_dir), dtype="float32", device="cpu")

    def generate(prompts, n=1, **kwargs):
        out = []
        for p in prompts:
            text = p[-1]["content"]
            i = next((k for k in range(11, -1, -1) if f"What is {k} plus" in text), None)
            reply = "```python\nfinish('ok')\n```" if i is None else f"\\boxed{{{2 * i + (i % 2)}}}"
            out.append([Completion(reply, 10, 4, "stop") for _ in range(n)])
        return out

    backend.generate = generate
    monkeypatch.setattr("codetool.assemble.make_policy", lambda spec, **kw: backend)
    return backend


def test_train_probe_then_eval_decision_on_its_heldout_queries(tmp_path, shared_data, scripted_tiny):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(TASKS))
    out = tmp_path / "probe"
    cfg = TrainProbeConfig(data=str(shared_data), n_tool=0, n_restbench=0, n_toolbench=0, n_free=0,
                           when2tool=str(tasks), layers=[0, -1], C=1.0, heldout_fraction=0.34,
                           bootstrap_samples=50, output=str(out))
    assert train_probe_command(cfg) == 0
    labels = {r["id"]: r for r in map(json.loads, (out / "labels.jsonl").read_text().splitlines())}
    assert {k: v["needs_tool"] for k, v in labels.items()} == {f"w2t-t{i}": bool(i % 2) for i in range(12)}
    assert {v["rule"] for v in labels.values()} == {"reference"}
    probe = Probe.load(out)
    train, held = split_query_ids([f"w2t-t{i}" for i in range(12)], 0.34, 0)
    assert probe.info["split"]["heldout"] == held and len(held) == 4 and probe.layers == [0, 2]
    report = json.loads((out / "report.json").read_text())
    assert report["counts"] == {"queries": 12, "train": 8, "heldout": 4, "needs_tool": 6, "skipped": {}}
    # the reported AUROC is the loaded probe's on the held-out prompts
    items = {it.item_id: it for it in load_when2tool(tasks)}
    feats = last_token_states(scripted_tiny, [probe_messages(items[i].query, ToolEnvironment(
        items[i].apis, None, render_style="compact")) for i in held], probe.layers)
    y = [int(labels[i]["needs_tool"]) for i in held]
    expected = auroc(probe.predict(feats), y)
    got = report["heldout"]["auroc"]
    assert (got is None and np.isnan(expected)) or got == pytest.approx(expected)
    assert "Held-out AUROC" in (out / "report.md").read_text()

    # eval-decision on the probe's held-out queries: probe, verbalised and log-prob side by side
    ev = DecisionEvalConfig(output=str(tmp_path / "ev"), answer_direct=False, baselines=["default", "no_tool"],
                            bootstrap_samples=50, router=RouterConfig(probe=str(out), samples=2))
    assert eval_decision_command(ev) == 0
    rep = json.loads((tmp_path / "ev" / "report.json").read_text())
    nec = rep["necessity"]
    assert nec["heldout"] and nec["n"] == 4 and nec["needs_tool"] == sum(y)
    assert set(nec["methods"]) == {"logprobs", "probe", "agreement"}
    assert nec["methods"]["probe"]["auroc"] == report["heldout"]["auroc"]
    assert [p["t"] for p in nec["methods"]["probe"]["sweep"]] == [round(0.1 * k, 1) for k in range(1, 10)]
    assert {(b["mode"], b["reasoning"]) for b in nec["baselines"]} == {
        ("default", "direct"), ("default", "reason"), ("no_tool", "direct"), ("no_tool", "reason")}
    assert (tmp_path / "ev" / "decision_tradeoff.png").read_bytes()[:4] == b"\x89PNG"
    assert "probe (hidden states)" in (tmp_path / "ev" / "report.md").read_text()

    # the probe as the primary method, hard prefill: its routes and sweep read P(tool) against t_probe
    ev2 = DecisionEvalConfig(output=str(tmp_path / "ev2"), answer_direct=False, baselines=[], compare=["probe"],
                             bootstrap_samples=20, router=RouterConfig(method="probe", probe=str(out), prefill="hard"))
    assert eval_decision_command(ev2) == 0
    rep2 = json.loads((tmp_path / "ev2" / "report.json").read_text())
    assert rep2["method"] == "probe" and rep2["thresholds"] == {"t_probe": 0.5}
    records = [json.loads(line) for line in (tmp_path / "ev2" / "records.jsonl").read_text().splitlines()]
    routes = [("direct" if r["p_tool"] < 0.5 else "search") for r in records]
    assert [r["route"] for r in records] == routes and rep2["at_threshold"]["routes"]["fast"] == 0
    assert rep2["necessity"]["methods"]["probe"]["auroc"] == nec["methods"]["probe"]["auroc"]

    # the router loads the probe from router.probe and reads the decider's hidden states
    from types import SimpleNamespace

    from codetool.decide.router import Router
    from codetool.search.config import SearchConfig
    from codetool.search.search import SearchTask

    search = SimpleNamespace(policy=scripted_tiny, cfg=SearchConfig(), make_executor=None)
    router = Router(RouterConfig(method="probe", probe=str(out), t_probe=0.5), search)
    env = ToolEnvironment(items[held[0]].apis, None, render_style="compact")
    [d] = router._decide([SearchTask(held[0], items[held[0]].query, env)])
    assert d.method == "probe" and d.p_tool == pytest.approx(float(probe.predict(feats[:1])[0]), abs=1e-6)
