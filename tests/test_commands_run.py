"""`codetool run` as a long job (issue 19): isolation, resume identity, settings guard, lock."""

from __future__ import annotations

import json

import pytest

import codetool.assemble as assemble
from codetool import CodetoolError
from codetool.commands.run import execute_run, run_command
from codetool.jobs.queries import RunConfig
from codetool.jsonl import append_jsonl, read_jsonl
from codetool.models.backends import ScriptedBackend
from codetool.resume import FatalError, OutputLock


def block(code: str) -> str:
    return f"Step.\n```python\n{code}\n```"


def api(name: str) -> dict:
    return {"category_name": "Data", "tool_name": "weather", "api_name": name, "api_description": "forecast",
            "required_parameters": [{"name": "city", "type": "STRING", "description": "city"}],
            "optional_parameters": [], "method": "GET"}


@pytest.fixture
def toolbench(tmp_path):
    """Two ToolBench files whose query ids repeat (1, 2, 3 in G1 and in G2)."""
    folder = tmp_path / "queries"
    folder.mkdir()
    for group in ("G1", "G2"):
        queries = [{"query_id": i, "query": f"{group} question {i}?", "api_list": [api("forecast")]} for i in (1, 2, 3)]
        (folder / f"{group}.json").write_text(json.dumps(queries))
    return folder


def _cfg(toolbench, out, **over) -> RunConfig:
    from codetool.config import load_config

    base = {"benchmark": "toolbench", "queries": str(toolbench), "output": str(out), "search.max_steps": 1,
            "search.k": 1, "search.concurrency": 4, "executor.isolation": "fallback", "prm": "none"}
    return load_config(RunConfig, overrides={**base, **over})


def _policy(monkeypatch, reply):
    policy = ScriptedBackend(reply)
    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: policy)
    return policy


def _prompt_text(prompt) -> str:
    return json.dumps(prompt, default=str)


def test_resume_keys_on_group_and_query_id(monkeypatch, toolbench, tmp_path):
    out = tmp_path / "t.jsonl"
    _policy(monkeypatch, lambda p: block("finish('ok')"))
    assert run_command(_cfg(toolbench, out, limit=4)) == 0  # G1: 1 2 3, G2: 1
    assert run_command(_cfg(toolbench, out)) == 0
    keys = [(r["group"], r["query_id"]) for r in read_jsonl(out)]
    assert sorted(keys) == sorted((g, str(i)) for g in ("G1", "G2") for i in (1, 2, 3))


def test_one_failing_query_is_recorded_and_the_run_goes_on(monkeypatch, toolbench, tmp_path):
    out = tmp_path / "t.jsonl"

    def reply(prompt):
        if "G1 question 2?" in _prompt_text(prompt):
            raise CodetoolError("http://policy/v1 answered HTTP 400: context length exceeded")
        return block("print('caf\\ud800e')\nfinish('ok')")  # a lone surrogate in the tool output

    _policy(monkeypatch, reply)
    assert run_command(_cfg(toolbench, out)) == 1
    records = list(read_jsonl(out))
    assert len(records) == 6
    bad = [r for r in records if r["finish_type"] == "error"]
    assert [(r["group"], r["query_id"]) for r in bad] == [("G1", "2")]
    assert "context length exceeded" in bad[0]["error"] and "Traceback" not in bad[0]["error"]
    # a plain rerun keeps the failure; --retry_failed reruns only that query, leaving one record each
    assert run_command(_cfg(toolbench, out)) == 1
    policy = _policy(monkeypatch, lambda p: block("finish('fixed')"))
    assert run_command(_cfg(toolbench, out, retry_failed=True)) == 0
    records = list(read_jsonl(out))
    assert len(records) == 6 and not [r for r in records if r["finish_type"] == "error"]
    assert len(policy.calls) == 1


def test_the_end_of_a_run_reads_its_output_once(monkeypatch, toolbench, tmp_path):
    """The summary and the exit status come from one read of the output (issue 39: before, the
    whole file was read twice after the last reply; 1,000 trajectories are megabytes)."""
    import codetool.jsonl as jsonl

    out, reads = tmp_path / "t.jsonl", []
    original = jsonl.read_jsonl

    def counted(path, *args, **kwargs):
        if str(path) == str(out):
            reads.append(path)
        return original(path, *args, **kwargs)

    def reply(prompt):
        if "G1 question 2?" in _prompt_text(prompt):
            raise CodetoolError("http://policy/v1 answered HTTP 400: context length exceeded")
        return block("finish('ok')")

    _policy(monkeypatch, reply)
    cfg = _cfg(toolbench, out)
    monkeypatch.setattr(jsonl, "read_jsonl", counted)
    reads.clear()
    assert run_command(cfg) == 1  # the failed query still sets the exit status
    assert len(reads) == 1


def test_the_summary_imports_start_when_the_first_record_lands(monkeypatch, toolbench, tmp_path):
    """The summary's imports (numpy, rich's table) run beside the search from its first record
    on, not after its last reply (issue 39)."""
    import codetool.commands.run as run_module

    out, written_then = tmp_path / "t.jsonl", []
    start = run_module.SummaryPrefetch.start

    def noted(self):
        written_then.append(len(list(read_jsonl(out))))
        start(self)

    monkeypatch.setattr(run_module.SummaryPrefetch, "start", noted)
    _policy(monkeypatch, lambda p: block("finish('ok')"))
    assert run_command(_cfg(toolbench, out)) == 0
    assert written_then == [1]  # once, when the first of the six records was written
    assert len(list(read_jsonl(out))) == 6


def test_changed_settings_refuse_to_mix_records(monkeypatch, toolbench, tmp_path):
    out = tmp_path / "t.jsonl"
    _policy(monkeypatch, lambda p: block("finish('ok')"))
    assert run_command(_cfg(toolbench, out, limit=2)) == 0
    with pytest.raises(CodetoolError, match="other settings.*--force_resume") as refused:
        execute_run(_cfg(toolbench, out, **{"search.k": 3}), show_summary=False)
    # codetool.api.search takes the same settings: the message names its arguments too (new-user trial)
    assert "search(output=...)" in str(refused.value) and "settings={'force_resume': True}" in str(refused.value)
    execute_run(_cfg(toolbench, out, limit=3, force_resume=True, **{"search.k": 3}), show_summary=False)
    assert len(list(read_jsonl(out))) == 3


def test_a_second_writer_is_refused(monkeypatch, toolbench, tmp_path):
    out = tmp_path / "t.jsonl"
    _policy(monkeypatch, lambda p: block("finish('ok')"))
    with OutputLock(out):
        with pytest.raises(CodetoolError, match="another run is writing"):
            execute_run(_cfg(toolbench, out), show_summary=False)
    execute_run(_cfg(toolbench, out, limit=1), show_summary=False)  # free again


def test_half_line_is_skipped_and_terminated(tmp_path):
    out = tmp_path / "t.jsonl"
    append_jsonl(out, {"a": 1})
    with open(out, "ab") as f:
        f.write(b'{"a": 2, "b"')  # a crash mid-write
    append_jsonl(out, {"a": "x\ud800"})  # and a lone surrogate: never UnicodeEncodeError
    skipped: list[int] = []
    assert [r["a"] for r in read_jsonl(out, skipped)] == [1, "x\ufffd"]
    assert skipped == [2]


def test_full_disk_is_one_line(tmp_path, monkeypatch):
    """A full disk fails the write (or the fsync that makes it durable): one line saying what to do."""
    import codetool.jsonl

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(codetool.jsonl.os, "fsync", full)
    with pytest.raises(CodetoolError, match="No space left on device.*resumes"):
        append_jsonl(tmp_path / "x.jsonl", {"a": 1})


def test_resumed_run_samples_with_the_seeds_of_an_uninterrupted_one(monkeypatch, toolbench, tmp_path):
    def seeds(policy) -> list:
        return [kwargs["seed"] for _, kwargs in policy.calls]

    reply = lambda p: block("print(1)")  # noqa: E731 - two steps per query
    whole = _policy(monkeypatch, reply)
    execute_run(_cfg(toolbench, tmp_path / "a.jsonl", **{"search.max_steps": 2, "search.concurrency": 1}),
                show_summary=False)
    first = _policy(monkeypatch, reply)
    execute_run(_cfg(toolbench, tmp_path / "b.jsonl", limit=2, **{"search.max_steps": 2, "search.concurrency": 1}),
                show_summary=False)
    rest = _policy(monkeypatch, reply)
    execute_run(_cfg(toolbench, tmp_path / "b.jsonl", **{"search.max_steps": 2, "search.concurrency": 1}),
                show_summary=False)
    assert len(seeds(whole)) == 12 and len(set(seeds(whole))) == 12
    assert seeds(first) + seeds(rest) == seeds(whole)


def test_the_default_method_label_says_what_ran_without_a_prm():
    """``codetool run`` without ``--prm`` labels its trajectories by what ran, not ``spot+latent``."""
    from codetool.jobs.queries import method_label
    from codetool.search.config import SearchConfig

    assert method_label(SearchConfig(latent="none")) == "spot-only"
    assert method_label(SearchConfig(latent="none", k=1)) == "single-sample"
    assert method_label(SearchConfig(latent="rollout")) == "spot+rollout"
    assert method_label(SearchConfig(latent="prm")) == "spot+latent"
    assert method_label(SearchConfig(method="mine", latent="none")) == "mine"


def test_a_torn_last_line_is_cut_back_when_the_run_resumes(monkeypatch, toolbench, tmp_path, caplog):
    """Before (issue 28) the fragment stayed in the file for good (skipped by every reader); now
    the resumed run cuts it off, says so, and reruns the query it held."""
    out = tmp_path / "t.jsonl"
    _policy(monkeypatch, lambda p: block("finish('ok')"))
    assert run_command(_cfg(toolbench, out, limit=2)) == 0
    whole = out.read_bytes()
    with open(out, "ab") as f:
        f.write(b'{"query_id": "3", "benchmark": "toolbench", "group": "G1", "ste')  # killed mid-write
    caplog.set_level("WARNING", logger="codetool")
    assert run_command(_cfg(toolbench, out, limit=3)) == 0
    assert "cut a torn last line (63 bytes" in caplog.text
    raw = out.read_bytes()
    assert raw.startswith(whole) and raw.count(b"\n") == 3
    assert [json.loads(line)["query_id"] for line in raw.splitlines()] == ["1", "2", "3"]


def test_repair_keeps_a_whole_last_record_that_lacks_its_newline(tmp_path):
    from codetool.jsonl import repair_jsonl

    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}')
    assert repair_jsonl(path) == 0 and path.read_bytes() == b'{"a": 1}\n{"a": 2}\n'
    path.write_bytes(b'{"a": 1')  # a torn only line
    assert repair_jsonl(path) == 7 and path.read_bytes() == b""
    assert repair_jsonl(tmp_path / "missing.jsonl") == 0


def test_duplicate_query_ids_in_one_file_are_refused(monkeypatch, toolbench, tmp_path):
    """Before (issue 28) both ran and resume kept whichever came first; now the ids are named."""
    queries = [{"query_id": i, "query": f"question {n}?", "api_list": [api("forecast")]}
               for n, i in enumerate((1, 2, 2, 7, 7, 7))]
    (toolbench / "G1.json").write_text(json.dumps(queries))
    _policy(monkeypatch, lambda p: block("finish('ok')"))
    with pytest.raises(CodetoolError, match=r"2 query ids occur more than once: toolbench/G1/2 \(2x\), "
                                            r"toolbench/G1/7 \(3x\)"):
        execute_run(_cfg(toolbench, tmp_path / "t.jsonl"), show_summary=False)
    assert not (tmp_path / "t.jsonl").exists()


def test_queries_with_a_benchmark_that_reads_its_own_files_is_refused():
    """``--queries`` is read only by ``--benchmark toolbench``; with StableToolBench it was silently
    ignored and the whole group ran (found by a fresh-clone check)."""
    from codetool.config import ConfigError
    from codetool.jobs.queries import RunConfig

    with pytest.raises(ConfigError, match=r"--queries /nope/q.json is read only with --benchmark toolbench"):
        RunConfig(benchmark="stabletoolbench", queries="/nope/q.json")
    assert RunConfig(benchmark="toolbench", queries="/nope/q.json").queries == "/nope/q.json"


def test_a_missing_prm_or_policy_folder_fails_before_any_model_loads(monkeypatch, toolbench, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    loaded = []
    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: loaded.append("policy"))
    with pytest.raises(CodetoolError, match="no such PRM folder"):
        run_command(_cfg(toolbench, tmp_path / "t.jsonl", prm="runs/missing"))
    monkeypatch.setattr(assemble, "make_scorer", lambda *a, **k: loaded.append("prm"))
    with pytest.raises(CodetoolError, match="looks like a path, not a Hub id"):
        run_command(_cfg(toolbench, tmp_path / "t.jsonl", policy="runs/missing-policy", prm="none"))
    assert loaded == []


class _DeadServerPolicy(ScriptedBackend):
    """A policy whose server went away: every call fails the way RemoteClient fails once its
    connect retries are spent, and its client says so."""

    def __init__(self):
        super().__init__(self._refuse)
        self.remote = type("Client", (), {"unreachable": None})()
        self.queries: set[str] = set()

    def _refuse(self, prompt):
        self.queries.add(next(q for q in ("G1 question 1?", "G1 question 2?", "G1 question 3?", "G2 question 1?",
                                          "G2 question 2?", "G2 question 3?") if q in _prompt_text(prompt)))
        self.remote.unreachable = ("http://127.0.0.1:9/v1/chat/completions: cannot connect (ConnectError) after "
                                   "7 attempts; check that the server is running and that the URL is right.")
        raise CodetoolError(self.remote.unreachable)


def test_a_dead_policy_server_stops_the_run_after_the_first_failed_query(monkeypatch, toolbench, tmp_path):
    out = tmp_path / "t.jsonl"
    policy = _DeadServerPolicy()
    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: policy)
    with pytest.raises(FatalError, match=r"the policy server cannot be reached \(http://127.0.0.1:9/v1/chat/"
                                         r"completions: cannot connect .*rerun: it resumes with the queries"):
        run_command(_cfg(toolbench, out, **{"search.concurrency": 1}))
    assert len(policy.queries) == 1  # not one query after another, each with its retries
    assert not out.exists() or list(read_jsonl(out)) == []  # no error records: a rerun runs them all
    # the server is back: the rerun runs every query
    _policy(monkeypatch, lambda p: block("finish('ok')"))
    assert run_command(_cfg(toolbench, out)) == 0
    assert len(list(read_jsonl(out))) == 6


def test_a_server_that_fails_after_its_retries_is_not_the_policys_failure(monkeypatch, toolbench, tmp_path):
    """A policy server that answers 503 to every retry gave the policy no turn: the query's error
    record says ``not_executed`` (no rate counts it, as for a sandbox that could not start), while
    an error the server answered (HTTP 400) stays the query's own. Before: both counted in n."""
    from codetool.eval.metrics import not_executed_trajectory
    from codetool.models.remote import EndpointError, ServerFailure
    from codetool.search.records import Trajectory

    def reply(prompt):
        text = _prompt_text(prompt)
        if "G1 question 1?" in text:
            raise ServerFailure("http://127.0.0.1:9/v1/chat/completions: HTTP 503 (busy) after 7 attempts; retry later.")
        if "G1 question 2?" in text:
            raise EndpointError("http://127.0.0.1:9/v1/chat/completions answered HTTP 400: prompt too long.", 400)
        return block("finish('ok')")

    out = tmp_path / "t.jsonl"
    _policy(monkeypatch, reply)
    assert run_command(_cfg(toolbench, out)) == 1
    records = {(r["group"], r["query_id"]): r for r in read_jsonl(out)}
    lost, own = records[("G1", "1")], records[("G1", "2")]
    assert lost["finish_type"] == own["finish_type"] == "error"
    assert "HTTP 503" in lost["extra"]["not_executed"]["reason"] and "not_executed" not in own["extra"]
    assert [not_executed_trajectory(Trajectory.from_dict(r)) for r in (lost, own)] == [True, False]


def test_run_help_lists_dvts_the_votes_and_the_budgeted_allocation():
    from codetool import cli

    config_cls, _ = cli._load("run")
    text = " ".join(cli._command_parser("run", config_cls).format_help().split())
    for piece in ("dvts", "compute_optimal", "--search.vote", "none, majority, prm_weighted", "--search.budget",
                  "--search.difficulty", "--search.level_strategies", "--search.level_weights"):
        assert piece in text, piece


LIBRARY = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "library"


def test_run_on_restgpt_layout_queries_with_an_openapi_spec(monkeypatch, tmp_path):
    from codetool.config import load_config

    out = tmp_path / "t.jsonl"
    _policy(monkeypatch, lambda p: block("print(get_books(q='Le Guin'))\nfinish('yes')"))
    cfg = load_config(RunConfig, overrides={"queries": str(LIBRARY / "queries.json"), "tools": str(LIBRARY / "openapi.json"),
                                            "output": str(out), "search.max_steps": 1, "search.k": 1,
                                            "executor.isolation": "fallback", "prm": "none"})
    assert cfg.benchmark == "toolbench"  # --queries alone says where the queries come from
    assert run_command(cfg) == 0
    records = list(read_jsonl(out))
    assert [(r["benchmark"], r["group"], r["query_id"]) for r in records] == [("custom", "queries", f"q{i}") for i in range(4)]


def test_run_refuses_a_query_file_as_tools():
    """Before: `run --query x --tools queries.json` was accepted as 57 nameless APIs."""
    from codetool.config import load_config
    from codetool.jobs.queries import single_query

    cfg = load_config(RunConfig, overrides={"query": "x", "tools": str(LIBRARY / "queries.json"), "prm": "none"})
    with pytest.raises(CodetoolError, match="RestGPT-layout query file .* not a tool description; pass it as --queries"):
        single_query(cfg)
    with pytest.raises(Exception, match="not read with --benchmark stabletoolbench"):
        load_config(RunConfig, overrides={"benchmark": "stabletoolbench", "tools": str(LIBRARY / "openapi.json")})


def test_an_output_that_is_the_query_file_or_a_link_is_refused_before_any_work(tmp_path, monkeypatch):
    """``--output`` naming the ``--queries`` file appended trajectories to it (the input destroyed);
    a dangling link as the output was refused only at the first write, after the whole search."""
    import os

    import codetool.commands.run as run_module

    monkeypatch.setattr(run_module, "load_benchmark", lambda cfg: pytest.fail("work started"))
    queries = tmp_path / "q.json"
    queries.write_text('[{"query": "What is 2 + 2?"}]')
    before = queries.read_bytes()
    same = RunConfig(queries=str(queries), output=str(queries))
    with pytest.raises(CodetoolError, match="is the --queries file"):
        execute_run(same, show_summary=False)
    assert queries.read_bytes() == before
    link = tmp_path / "out.jsonl"
    os.symlink(tmp_path / "nowhere.jsonl", link)
    with pytest.raises(CodetoolError, match="symbolic link"):
        execute_run(RunConfig(queries=str(queries), output=str(link)), show_summary=False)


def test_a_sandbox_that_could_not_start_is_an_error_record_no_rate_counts():
    """The machine failed, not the policy: the error record says not_executed, as the search's do."""
    from types import SimpleNamespace

    from codetool.eval.metrics import not_executed_trajectory
    from codetool.executor import ExecutorError
    from codetool.jobs.queries import error_record
    from codetool.search.records import Trajectory

    unit = SimpleNamespace(query_id="1", query="q", benchmark="stabletoolbench", group="G1_instruction")
    cfg = RunConfig(benchmark="stabletoolbench")
    lost = Trajectory.from_dict(error_record(cfg, "h", unit, ExecutorError("a sandbox worker did not start: x")))
    assert lost.finish_type == "error" and not_executed_trajectory(lost) and "did not start" in lost.error
    other = Trajectory.from_dict(error_record(cfg, "h", unit, CodetoolError("policy answered HTTP 500")))
    assert other.finish_type == "error" and not not_executed_trajectory(other)
