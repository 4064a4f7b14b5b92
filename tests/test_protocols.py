"""Every implementation of a seam satisfies its Protocol (docs/ARCHITECTURE.md section 3).

Two checks per implementation: the methods' signatures (without building anything: a local model
or vLLM is never loaded) accept every argument the Protocol names, and, for those that are cheap to
build offline, ``isinstance`` against the runtime-checkable Protocol.
"""

from __future__ import annotations

import inspect

import pytest

import codetool.assemble as assemble
from codetool.executor import Executor
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
from codetool.tools.backends import BACKENDS as TOOL_BACKENDS
from codetool.tools.backends import FallbackBackend, make_tool_backend
from codetool.tools.simulator import SimulatorBackend
from codetool.tools.spec import ToolBackend

# The Protocols and their implementations: the tables that choose among them, plus the wrappers
# and test doubles the package ships.
IMPLEMENTATIONS = {
    LLMBackend: sorted(POLICY_BACKENDS.values(), key=lambda c: c.__name__),
    PRMScorer: sorted({*SCORERS.values(), ConstantScorer, Serialized}, key=lambda c: c.__name__),
    Judge: sorted(set(assemble.JUDGES.values()), key=lambda c: c.__name__),
    ToolBackend: sorted({c for c in TOOL_BACKENDS.values() if inspect.isclass(c)} | {FallbackBackend},
                        key=lambda c: c.__name__),
    StepExecutor: [Executor],
}


def protocol_members(proto: type) -> tuple[dict[str, inspect.Signature], set[str], set[str]]:
    """``(methods, properties, attributes)`` a Protocol declares (its own, not ``object``'s)."""
    methods, properties = {}, set()
    for name, value in vars(proto).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            properties.add(name)
        elif inspect.isfunction(value):
            methods[name] = inspect.signature(value)
    attributes = {n for n in getattr(proto, "__annotations__", {}) if not n.startswith("_")}
    return methods, properties, attributes


def signature_problems(wanted: inspect.Signature, got: inspect.Signature) -> list[str]:
    """What a call written against ``wanted`` would break on ``got``: a parameter ``got`` cannot
    take (by name, or by position where ``wanted`` passes it positionally), or a parameter of
    ``got`` that has no default and that ``wanted`` does not pass."""
    problems = []
    params = list(got.parameters.values())
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    named = {p.name: p for p in params}
    wanted_params = [p for p in wanted.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for i, p in enumerate(wanted_params):
        if p.kind is p.KEYWORD_ONLY:
            if p.name not in named and not var_kw:
                problems.append(f"takes no keyword {p.name!r}")
            elif p.name in named and named[p.name].kind is named[p.name].POSITIONAL_ONLY:
                problems.append(f"takes {p.name!r} by position only")
        else:
            if i >= len(positional) and not var_pos:
                problems.append(f"takes no positional argument {i} ({p.name!r})")
            elif i < len(positional) and positional[i] != p.name and p.kind is not p.POSITIONAL_ONLY:
                problems.append(f"names positional argument {i} {positional[i]!r}, not {p.name!r}")
    passed = {p.name for p in wanted_params if p.kind is p.KEYWORD_ONLY}
    passed |= {positional[i] for i, p in enumerate(wanted_params) if p.kind is not p.KEYWORD_ONLY and i < len(positional)}
    for p in params:
        if (p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                and p.name not in passed):
            problems.append(f"needs {p.name!r}, which the Protocol does not pass")
    return problems


CASES = [(proto, impl) for proto, impls in IMPLEMENTATIONS.items() for impl in impls]


@pytest.mark.parametrize(("proto", "impl"), CASES, ids=[f"{p.__name__}-{i.__name__}" for p, i in CASES])
def test_each_implementation_has_the_methods_of_its_protocol(proto, impl):
    methods, properties, _ = protocol_members(proto)
    assert methods, f"{proto.__name__} declares no method"
    for name, wanted in methods.items():
        got = getattr(impl, name, None)
        assert callable(got), f"{impl.__name__} has no method {name}() of {proto.__name__}"
        problems = signature_problems(wanted, inspect.signature(got))
        assert not problems, f"{impl.__name__}.{name}: {problems} (the Protocol: {wanted})"
    for name in properties:
        assert isinstance(getattr(impl, name, None), property), f"{impl.__name__}.{name} is not a property"


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


def test_the_signature_check_catches_a_mismatch():
    class Wrong:
        def run(self, source: str, *, limit: float = 1.0): ...

    wanted = protocol_members(StepExecutor)[0]["run"]
    assert signature_problems(wanted, inspect.signature(Wrong.run)) == [
        "names positional argument 1 'source', not 'code'", "takes no keyword 'timeout_s'"]
    assert signature_problems(wanted, inspect.signature(Executor.run)) == []


def test_the_choice_tables_name_only_protocol_implementations():
    assert set(SCORERS) == {"local", "server", "vllm"}
    assert set(assemble.JUDGES) == {"llm", "scripted"}
    assert set(POLICY_BACKENDS) >= {"transformers", "openai", "vllm"}
