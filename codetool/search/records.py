"""Trajectory records: what a run of the search writes, one JSON line per query (docs/DESIGN.md §3).

A :class:`Trajectory` holds every step, each with *all* its candidates (code, typed execution
result, tool calls, every reward term, and which one was chosen), so evaluation, reports and PRM
data building never need to re-run anything. ``to_dict``/``from_dict`` are the only
(de)serialisers: in memory a candidate's result is an :class:`ExecutionResult` (or an
:class:`ImportedResult` for a step read from another system's answer file); it becomes JSON only
there, in the same format as always. ``codetool.jsonl`` writes the lines (and redacts secrets on
the way out).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from codetool.executor.result import ExecutionResult

FINISH_TYPES = ("finish", "give_up", "max_steps", "error")


@dataclass(frozen=True)
class ImportedCall:
    """A tool call of a step imported from a StableToolBench converted-answer file
    (``codetool.eval.convert``), kept verbatim so the export writes it back unchanged.

    Args:
        data (`dict`): the call as imported: ``name``, ``status`` (``unknown`` without a response),
            and where the file had them ``arguments`` (parsed JSON, ``None`` when it did not
            parse), ``arguments_text``, ``response``, ``truncated``, ``stb_message``.
    """

    data: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.data.get("name", ""))

    @property
    def status(self) -> str:
        return str(self.data.get("status", "unknown"))

    @property
    def arguments(self) -> Any:
        return self.data.get("arguments")

    @property
    def arguments_text(self) -> Any:
        return self.data.get("arguments_text", "")

    @property
    def error(self) -> str | None:
        return self.data.get("error")

    @property
    def response(self) -> Any:
        """The response as imported (any JSON value; ``content`` or ``error`` when it had none)."""
        return self.data.get("response", self.data.get("content", self.data.get("error", "")))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)


@dataclass
class ImportedResult:
    """The result of a step imported from a StableToolBench converted-answer file: nothing ran
    here, so it has no outcome, output or error (``ok`` is ``None``), only the calls the answer
    recorded. Reads like an :class:`ExecutionResult` for the fields readers use.

    Args:
        assistant (`bool`): the step came from an assistant node (a thought, then its calls);
            ``False`` for a tool node with no thought before it.
        tool_calls (`list[ImportedCall]`): the calls, in order.
    """

    assistant: bool = True
    tool_calls: list[ImportedCall] = field(default_factory=list)
    ok = None
    outcome = None
    stdout = ""
    error_type = None
    error_message = None
    final_answer = None
    give_up_reason = None
    host_error = None
    state_lost = False
    isolation = ""

    def to_dict(self) -> dict[str, Any]:
        return {"ok": None, "tool_calls": [c.to_dict() for c in self.tool_calls], "stb_assistant": self.assistant}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImportedResult:
        return cls(assistant=bool(data.get("stb_assistant", True)),
                   tool_calls=[ImportedCall(dict(c)) for c in data.get("tool_calls", [])])


@dataclass
class Candidate:
    """One sampled step.

    Args:
        index (`int`): position among the step's K candidates (0-based).
        text (`str`): the raw model output.
        code (`str` or `None`): the parsed Python block; ``None`` when the text had none.
        result (`ExecutionResult`, `ImportedResult` or `None`): what running the code gave
            (``None`` before it ran); on disk ``ExecutionResult.to_dict()`` (``{}`` for ``None``).
        r_spot (`float`): on-the-spot reward in {0, 1}.
        r_latent (`float` or `None`): latent reward in [0, 1], ``None`` when not computed.
        cost (`float`): LIT tool cost of the step (code cost + API costs), >= 0.
        score (`float`): the selection score ``w_spot*r_spot + w_latent*r_latent - w_cost*cost``.
        chosen (`bool`): whether the search kept this candidate.
        prompt_tokens, completion_tokens (`int`): token counts of its generation.
    """

    index: int
    text: str
    code: str | None
    result: ExecutionResult | ImportedResult | None = None
    r_spot: float = 0.0
    r_latent: float | None = None
    cost: float = 0.0
    score: float = 0.0
    chosen: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __post_init__(self):
        if isinstance(self.result, dict):
            raise TypeError("Candidate.result takes an ExecutionResult (or None), not a dict; "
                            "use Candidate.from_dict for records read from a file.")

    def to_dict(self) -> dict[str, Any]:
        """The candidate as in a trajectory file (``result`` as ``ExecutionResult.to_dict()``)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["result"] = {} if self.result is None else self.result.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        """Inverse of :meth:`to_dict`: a result with ``stb_assistant`` is an :class:`ImportedResult`."""
        data = dict(data)
        result = data.pop("result", None) or None
        if result is not None:
            result = ImportedResult.from_dict(result) if "stb_assistant" in result else ExecutionResult.from_dict(result)
        return cls(result=result, **data)


@dataclass
class Step:
    """One search step: its candidates and the observation the policy sees next.

    Args:
        index (`int`): 0-based step number.
        candidates (`list[Candidate]`): all K candidates, in sampling order.
        chosen (`int`): index of the kept candidate.
        observation (`str`): the (truncated) output of the chosen candidate shown to the policy.
    """

    index: int
    candidates: list[Candidate] = field(default_factory=list)
    chosen: int = 0
    observation: str = ""

    @property
    def chosen_candidate(self) -> Candidate:
        return self.candidates[self.chosen]

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "candidates": [c.to_dict() for c in self.candidates], "chosen": self.chosen,
                "observation": self.observation}


@dataclass
class Trajectory:
    """A whole episode on one query.

    Args:
        query_id (`str`): benchmark query id (as text).
        query (`str`): the user query.
        benchmark (`str`): ``stabletoolbench``, ``restbench-tmdb``, ``toolbench`` or ``custom``.
        group (`str` or `None`): benchmark group, e.g. ``G1_instruction``.
        method (`str`): the method name of the run config (e.g. ``spot+latent``).
        config_hash (`str`): hash of the run config (resume and report checks).
        steps (`list[Step]`): the chosen path with all candidates.
        final_answer (`str` or `None`): the argument of ``finish``, if called.
        finish_type (`str`): one of ``finish``, ``give_up``, ``max_steps``, ``error``.
        available_tools (`list[dict]`): the APIs offered, each ``{"name", "tool", "api"}``.
        prompt_tokens, completion_tokens (`int`): totals over every generation of the episode.
        wall_time_s (`float`): seconds for the whole episode, its final answer's generation included
            (``codetool.search.answer``).
        phase_seconds (`dict`): seconds per phase: ``generation``, ``execution``, ``scoring``.
        tool_cost (`float`): sum of the chosen steps' costs (LIT).
        routing (`dict` or `None`): the decide-first stage's decision, confidence and route.
        isolation (`str`): which executor isolation was active (e.g. ``bwrap+rlimits``).
        error (`str` or `None`): why the episode ended with ``finish_type='error'``.
        extra (`dict`): benchmark-specific fields (e.g. RestBench gold path).
        generated_tokens (`int`): every token the policy generated for this query, including
            discarded candidates, rollouts and the other episodes/beams of a search strategy.
        prm_scored_tokens (`int`): tokens of every item sent to the PRM (whitespace words where
            the scorer cannot count its own tokens).
        tool_calls (`int`): tool calls executed for this query, over all candidates.
        executor_forks (`int`): executor forks made for this query.
        strategy (`dict`): the search strategy and its choices (``codetool.assemble.STRATEGIES``).
        serving (`dict`): how remote servers were used (``policy``/``prm``: endpoints, probed
            features, adaptations, client limits; ``schedule``); empty for local models.

    The compute fields default to 0 so records written before they existed still load.
    """

    query_id: str
    query: str
    benchmark: str = "custom"
    group: str | None = None
    method: str = ""
    config_hash: str = ""
    steps: list[Step] = field(default_factory=list)
    final_answer: str | None = None
    finish_type: str = "max_steps"
    available_tools: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_time_s: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    tool_cost: float = 0.0
    routing: dict[str, Any] | None = None
    isolation: str = ""
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    generated_tokens: int = 0
    prm_scored_tokens: int = 0
    tool_calls: int = 0
    executor_forks: int = 0
    strategy: dict[str, Any] = field(default_factory=dict)
    serving: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.finish_type not in FINISH_TYPES:
            raise ValueError(f"finish_type must be one of {FINISH_TYPES}, got {self.finish_type!r}.")
        self.query_id = str(self.query_id)

    def executed_calls(self) -> list[Any]:
        """Tool calls (``ToolCall`` or ``ImportedCall``) of the chosen candidates, in order (for
        path metrics)."""
        return [call for step in self.steps if step.chosen_candidate.result is not None
                for call in step.chosen_candidate.result.tool_calls]

    def to_dict(self) -> dict[str, Any]:
        """The trajectory as one line of a trajectory file (the format of docs/DESIGN.md §3)."""
        data = dataclasses.asdict(dataclasses.replace(self, steps=[]))  # keeps the key order
        data["steps"] = [s.to_dict() for s in self.steps]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        data = dict(data)
        steps = []
        for s in data.pop("steps", []):
            s = dict(s)
            cands = [Candidate.from_dict(c) for c in s.pop("candidates", [])]
            steps.append(Step(candidates=cands, **s))
        known = {f.name for f in dataclasses.fields(cls)}
        extra = {k: v for k, v in data.items() if k not in known}
        data = {k: v for k, v in data.items() if k in known}
        traj = cls(steps=steps, **data)
        traj.extra.update(extra)
        return traj
