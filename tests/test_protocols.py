"""Every implementation of a seam satisfies its Protocol (docs/ARCHITECTURE.md section 3).

The signatures are the type checker's to check (``mypy``, run by ``make lint`` and CI): each
choice table is typed ``dict[str, Callable[..., Protocol]]`` and ``codetool.assemble.SEAMS`` lists
the wrappers and test doubles, so a method whose signature drifts from its Protocol is a type
error. Here: the tables keep those annotations, and the implementations that are cheap to build
offline pass the runtime ``isinstance`` check (which also sees data attributes).
"""

from __future__ import annotations

import collections.abc
import inspect
import typing

import pytest

import codetool.assemble as assemble
import codetool.models.backends as policy_backends
import codetool.prm.scorer as prm_scorer
import codetool.tools.backends as tool_backends
from codetool.executor.result import StepExecutor
from codetool.judge.llm import LLMJudge
from codetool.judge.records import Judge, ScriptedJudge
from codetool.models.backends import BACKENDS as POLICY_BACKENDS
from codetool.models.backends import ScriptedBackend
from codetool.models.completion import LLMBackend
from codetool.models.openai_backend import OpenAIBackend
from codetool.prm.client import HTTPScorer
from codetool.prm.scorer import SCORERS
from codetool.rewards import ConstantScorer, PRMScorer
from codetool.search.schedule import Serialized
from codetool.tools.backends import make_tool_backend
from codetool.tools.simulator import SimulatorBackend
from codetool.tools.spec import ToolBackend

# Each choice table and the Protocol its annotation holds its entries to.
TABLES = [(policy_backends, "BACKENDS", LLMBackend), (prm_scorer, "SCORERS", PRMScorer),
          (assemble, "JUDGES", Judge), (tool_backends, "BACKENDS", ToolBackend)]


@pytest.mark.parametrize(("module", "name", "proto"), TABLES, ids=[f"{m.__name__}.{n}" for m, n, _ in TABLES])
def test_each_choice_table_is_typed_with_its_protocol(module, name, proto):
    hint = eval(module.__annotations__[name], vars(module))  # this annotation alone (others name TYPE_CHECKING imports)
    assert typing.get_origin(hint) is dict
    value = typing.get_args(hint)[1]
    assert typing.get_origin(value) is collections.abc.Callable and typing.get_args(value)[-1] is proto


def test_the_checked_seams_name_every_wrapper_and_double():
    source = inspect.getsource(assemble)
    block = source[source.index("SEAMS: tuple["):]
    for cls in ("Executor", "ConstantScorer", "Serialized", "FallbackBackend"):
        assert cls in block
    assert "type[StepExecutor]" in block and StepExecutor.__name__ == "StepExecutor"


def test_cheap_implementations_pass_isinstance():
    """The runtime check sees data attributes too (``name``, ``supports_logprobs``, ``weak``)."""
    built = {
        LLMBackend: [ScriptedBackend(["x"]), OpenAIBackend("http://127.0.0.1:9")],
        PRMScorer: [ConstantScorer(), HTTPScorer("http://127.0.0.1:9"), Serialized(ConstantScorer())],
        Judge: [ScriptedJudge(), LLMJudge(ScriptedBackend(['{"answer_status": "Solved"}']))],
        ToolBackend: [SimulatorBackend(), make_tool_backend("stabletoolbench"), make_tool_backend("mock-tmdb")],
    }
    for proto, objects in built.items():
        for obj in objects:
            assert isinstance(obj, proto), f"{type(obj).__name__} is not a {proto.__name__}"
    assert not isinstance(object(), Judge) and not isinstance(ConstantScorer(), ToolBackend)


def test_the_choice_tables_name_only_protocol_implementations():
    assert set(SCORERS) == {"local", "server", "vllm"}
    assert set(assemble.JUDGES) == {"llm", "scripted"}
    assert set(POLICY_BACKENDS) >= {"transformers", "openai", "vllm"}
