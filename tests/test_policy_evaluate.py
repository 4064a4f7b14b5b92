"""Before/after evaluation (the search itself, resumable files, seed summaries) and the report."""

from __future__ import annotations

import pytest

from codetool.assemble import make_task
from codetool.executor import Executor, ExecutorConfig
from codetool.models.backends import ScriptedBackend
from codetool.policy.evaluate import metrics, run_eval, summarise
from codetool.policy.report import render, write_report
from codetool.search.config import SearchConfig
from codetool.tools.backends import make_tool_backend
from codetool.tools.loaders import load_toolbench_queries

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)


@pytest.fixture(scope="module")
def tasks(shared_data):
    queries = load_toolbench_queries(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json")[:2]
    return [make_task(q, make_tool_backend("simulator"), tool_doc="brief") for q in queries]


def test_run_eval_runs_the_search_once_and_reads_complete_files_back(tasks, tmp_path):
    call, answer = "r = checkhealth_for_squake()\nprint(r)\n```", "finish(str(r))\n```"
    policy = ScriptedBackend([call, call, answer, answer])  # one round of both sets, then the next
    search = SearchConfig(k=1, max_steps=2, latent="none", w_latent=0.0)
    make = lambda t: Executor(EXEC, tools=t.env.functions())  # noqa: E731
    sets = {"toolbench:a": tasks[:1], "toolbench:b": tasks[1:]}
    first = run_eval(policy, sets, search, make, label="before", seed=0, out_dir=tmp_path)
    assert [t.method for t in first["toolbench:a"]] == ["before"]
    calls = len(policy.calls)
    assert calls == 2  # both sets in one search: one generate call per round
    again = run_eval(policy, sets, search, make, label="before", seed=0, out_dir=tmp_path)
    assert len(policy.calls) == calls and again["toolbench:b"][0].query_id == first["toolbench:b"][0].query_id
    assert (tmp_path / "toolbench_a.before.seed0.jsonl").is_file()
    m = metrics(first["toolbench:a"])
    assert m["scep"] == 1.0 and m["finish"] == 1.0 and m["tokens"] > 0


def test_summarise_gives_mean_and_half_range_over_two_seeds(tasks, tmp_path):
    search = SearchConfig(k=1, max_steps=2, latent="none", w_latent=0.0)
    make = lambda t: Executor(EXEC, tools=t.env.functions())  # noqa: E731
    ok = ScriptedBackend(["r = checkhealth_for_squake()\nprint(r)\n```", "finish(str(r))\n```"], cycle=True)
    bad = ScriptedBackend(["raise ValueError('x')\n```"], cycle=True)
    runs = {0: run_eval(ok, {"s": tasks[:1]}, search, make, label="x", seed=0, out_dir=tmp_path),
            1: run_eval(bad, {"s": tasks[:1]}, search, make, label="x", seed=1, out_dir=tmp_path)}
    cell = summarise(runs)["s"]
    assert cell["grounded"]["values"] == [1.0, 0.0]
    assert cell["grounded"]["mean"] == 0.5 and cell["grounded"]["spread"] == 0.5
    assert cell["correct_path"] is None


def test_the_report_has_the_curves_the_table_and_the_histogram(tmp_path):
    run = {"steps": 2, "generated_tokens": 300, "seconds": 12.0, "outcomes": {"tool_ok": 3, "runtime_error": 1},
           "curve": [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.4}]}
    cell = {"grounded": {"mean": 0.25, "spread": 0.05, "values": [0.2, 0.3]}, "scep": None}
    results = {"name": "t", "scale": "tiny.", "policy": "default", "prm": "p", "advantage": "process",
               "aggregate": "mean", "token_budget": 300, "weights": {"outcome": {"grounded": 1.0}},
               "runs": {"outcome": {"0": run, "1": {**run, "curve": [{"step": 1, "reward": 0.3}]}}},
               "eval": {"before": {"set": cell}, "outcome": {"set": cell}}, "eval_sets": ["set"],
               "eval_sizes": {"set": 4}, "eval_search": "k=1", "spread": "half the range over 2 seeds"}
    text = render(results)
    assert "| 1 | 0.200 |" in text and "| 2 | 0.400 |" in text  # mean over seeds of step 1; step 2 has one seed
    assert "| grounded success % | 25.0 ± 5.0 | 25.0 ± 5.0 |" in text
    assert "| tool_ok | 75.0% |" in text
    write_report(tmp_path, results)
    assert (tmp_path / "reward_curves.png").stat().st_size > 1000 and (tmp_path / "outcome_histogram.png").is_file()


def test_the_report_shows_each_rewards_component_and_the_prms_share():
    from codetool.policy.report import component_lines

    point = {"step": 1, "reward": 1.2, "grounded": 1.0, "on_the_spot": 0.5, "prm": 0.4, "outcomes/finish": 1.0,
             "generated_tokens": 30.0}
    runs = {"outcome": {"0": {"curve": [{"step": 1, "reward": 1.0, "grounded": 1.0}], "advantage_shares": {
                "grounded": 1.0}}},
            "outcome+spot+prm": {"0": {"curve": [point], "advantage_shares": {"grounded": 0.9, "prm": 0.0}},
                                 "1": {"curve": [{**point, "prm": 0.6}], "advantage_shares": {"prm": 0.2}}}}
    weights = {"outcome": {"grounded": 1.0}, "outcome+spot+prm": {"grounded": 1.0, "on_the_spot": 0.5, "prm": 0.5}}
    text = "\n".join(component_lines(runs, weights))
    assert "| setting | grounded | on_the_spot | prm | PRM share of the advantage |" in text
    assert "| outcome | 1.000 | – | – | – |" in text
    assert "| outcome+spot+prm | 1.000 | 0.500 | 0.500 | 10.0% |" in text  # seed means; share (0 + 0.2) / 2
