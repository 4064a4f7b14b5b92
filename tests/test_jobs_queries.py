"""The unit runner of ``codetool run`` (issue 39): what a finished trajectory still needs (the
reference re-run of its steps, its final answer) runs beside the search, never in its way."""

from __future__ import annotations

import threading

from codetool.config import load_config
from codetool.jobs.queries import QueryRunner, RunConfig, load_benchmark, run_hash
from codetool.models.completion import to_messages
from tests.test_search_schedule import ServerLike

WAIT_S = 60.0  # a safety net only: the test asserts which episodes had started, never a duration


class Recording(ServerLike):
    """A server-like policy that says when the first step of ``queries`` queries was asked for."""

    def __init__(self, queries: int, **kwargs):
        super().__init__(**kwargs)
        self.queries, self.all_started = queries, threading.Event()

    def generate(self, prompts, *args, **kwargs):
        out = super().generate(prompts, *args, **kwargs)
        if len(self.seeds) >= self.queries:
            self.all_started.set()
        return out


def test_the_reference_re_run_does_not_hold_back_the_next_episodes(shared_data, monkeypatch):
    """Two episodes in flight, six queries; the re-run of the first trajectory to finish waits
    until every query has started. Before issue 39 it ran in the thread that starts episodes, so
    no third episode could start while it waited."""
    import codetool.jobs.queries as queries

    policy = Recording(6, finish_at=2)
    seen: list[tuple[str, bool]] = []

    def slow_rerun(traj, task, make_executor):
        seen.append((traj.query_id, policy.all_started.wait(WAIT_S)))
        traj.extra["reference_steps"] = [{"status": 0, "res": "re-run"}] * len(traj.steps)
        return True

    monkeypatch.setattr(queries, "record_reference_steps", slow_rerun)
    monkeypatch.setattr(queries, "StepwiseReferences", AtTheEnd)  # every re-run once its trajectory ends
    cfg = load_config(RunConfig, overrides={
        "benchmark": "stabletoolbench", "group": "G1_instruction", "data_dir": str(shared_data), "limit": 6,
        "search.k": 1, "search.max_steps": 3, "search.concurrency": 2, "search.latent": "none",
        "executor.isolation": "fallback",
        "answer.final_answer": "off", "max_memory_mb": 0})
    records = []
    with QueryRunner(cfg, run_hash(cfg), policy=policy) as runner:
        assert runner.continuous and runner.search.episodes == 2
        assert runner.run(load_benchmark(cfg), records.append) == 0
    assert seen[0][1], "no other episode started while the first trajectory's steps were re-run"
    assert len(records) == 6 and all(r["finish_type"] == "finish" and len(r["steps"]) == 2 for r in records)
    assert all(r["extra"]["reference_steps"] == [{"status": 0, "res": "re-run"}] * 2 for r in records)


class AtTheEnd:
    """In place of ``StepwiseReferences``: no step re-run while its episode goes on (each
    trajectory's steps are re-run once it ends, as before issue 39's stepwise re-runs)."""

    def __init__(self, *args):
        pass

    def on_step(self, task, traj):
        pass

    def take(self, traj):
        return None

    def close(self):
        pass


def _run_one_query(shared_data, policy) -> dict:
    cfg = load_config(RunConfig, overrides={
        "benchmark": "stabletoolbench", "group": "G1_instruction", "data_dir": str(shared_data), "limit": 1,
        "search.k": 1, "search.max_steps": 3, "search.latent": "none", "executor.isolation": "fallback",
        "answer.final_answer": "off", "max_memory_mb": 0})
    records: list[dict] = []
    with QueryRunner(cfg, run_hash(cfg), policy=policy) as runner:
        assert runner.continuous
        assert runner.run(load_benchmark(cfg), records.append) == 0
    return records[0]


def test_each_chosen_step_is_re_run_while_the_episode_goes_on(shared_data, monkeypatch):
    """One query, three steps: the generation of its last step waits until a reference program
    has run, and the trajectory's reference steps are those of a re-run once it ended. Before,
    every re-run started after the trajectory's last reply (on the way of the job's end)."""
    import codetool.jobs.queries as queries
    import codetool.search.reference as reference

    ran = threading.Event()
    original = reference.ReferenceRunner.run

    def run(self, program):
        result = original(self, program)
        ran.set()
        return result

    class LastStepWaits(ServerLike):
        waited: bool | None = None

        def generate(self, prompts, *args, **kwargs):
            if sum(m["role"] == "assistant" for m in to_messages(prompts[0])[:-1]) == 2:
                self.waited = ran.wait(WAIT_S)
            return super().generate(prompts, *args, **kwargs)

    monkeypatch.setattr(reference.ReferenceRunner, "run", run)
    policy = LastStepWaits(finish_at=3)
    record = _run_one_query(shared_data, policy)
    assert policy.waited, "no reference program ran before the episode's last step was generated"
    assert len(record["steps"]) == 3 and len(record["extra"]["reference_steps"]) == 3
    monkeypatch.setattr(queries, "StepwiseReferences", AtTheEnd)
    ran.set()
    at_the_end = _run_one_query(shared_data, ServerLike(finish_at=3))
    assert [s["chosen"] for s in at_the_end["steps"]] == [s["chosen"] for s in record["steps"]]
    assert record["extra"]["reference_steps"] == at_the_end["extra"]["reference_steps"]


def test_the_memory_cap_is_not_part_of_the_settings_hash():
    base = {"benchmark": "stabletoolbench", "group": "G1_instruction"}
    assert run_hash(load_config(RunConfig, overrides=base)) == run_hash(
        load_config(RunConfig, overrides={**base, "max_memory_mb": 512}))


def test_the_memory_cap_measures_this_process_before_the_executors_start_anything(shared_data, monkeypatch):
    """The executors' principal check runs the sandbox interpreter in the background from the
    moment the executor factory exists; the cap's baseline (what this process has) is taken
    before, so that process is not counted as this process's own memory."""
    import codetool.jobs.queries as queries

    order: list[str] = []
    gate, factory = queries.memory_gate, queries.executor_factory
    monkeypatch.setattr(queries, "memory_gate", lambda setting: (order.append("memory cap"), gate(setting))[1])
    monkeypatch.setattr(queries, "executor_factory", lambda cfg: (order.append("executors"), factory(cfg))[1])
    cfg = load_config(RunConfig, overrides={"benchmark": "stabletoolbench", "group": "G1_instruction",
                                            "data_dir": str(shared_data), "executor.isolation": "fallback",
                                            "search.latent": "none"})
    with QueryRunner(cfg, run_hash(cfg), policy=ServerLike()):
        pass
    assert order == ["memory cap", "executors"]
