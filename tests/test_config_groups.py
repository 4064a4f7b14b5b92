"""Config groups declared once (issue 29): ``run``, ``build-trees`` and ``pipeline`` compose the
policy, tools, queries, output and workers groups; in every config of every command, a field of a
group keeps the group's help text wherever it is composed (and a field named like a group's is that
field, but for the listed namesakes, each with the reason it stays); per-command defaults come from ``config.with_defaults``; a model spec is
parsed once, by its config (``policy_spec``, ``prm_spec``, ``model_spec``), and never becomes a
setting; and ``ModelSpec.parse`` is called only where text enters: a config's ``__post_init__``
or the CLI (checked with ``ast``)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from test_configs_read import _config_classes  # tests/: the walk of every command's config tree

import codetool
from codetool.config import ConfigError, _flat_fields, config_hash, from_dict, to_dict
from codetool.config_groups import Group, with_defaults
from codetool.decide.config import DecisionEvalConfig, TrainProbeConfig
from codetool.decide.labelled import DrawGroup
from codetool.distributed.ray_cluster import ShardedWorkersGroup, WorkersGroup
from codetool.jobs.pipeline import EvalSetConfig, PipelineConfig
from codetool.jobs.queries import RunConfig
from codetool.models.spec import PolicyBackendGroup, PolicyGroup
from codetool.resume import OutputGroup
from codetool.tools.config import ToolBackendGroup, ToolDocGroup, ToolsGroup
from codetool.tools.loaders import QueriesGroup
from codetool.tree.config import TreeConfig

ROOT = Path(codetool.__file__).resolve().parent
CONFIGS = sorted(_config_classes(), key=lambda c: (c.__module__, c.__qualname__))  # every command's, nested
GROUPS = sorted({b for c in CONFIGS for b in c.__mro__ if b is not Group and isinstance(b, type) and issubclass(b, Group)
                 and b.__name__.endswith("Group")}, key=lambda c: c.__name__)
COMPOSED = {RunConfig: (QueriesGroup, PolicyBackendGroup, ToolsGroup, OutputGroup, WorkersGroup),
            TreeConfig: (PolicyGroup, ToolBackendGroup, OutputGroup, ShardedWorkersGroup),
            PipelineConfig: (PolicyGroup, ToolDocGroup),
            EvalSetConfig: (QueriesGroup, ToolBackendGroup),
            DecisionEvalConfig: (DrawGroup, ToolDocGroup), TrainProbeConfig: (DrawGroup, ToolDocGroup)}
# An evaluation set's tool_doc overrides the pipeline's (none: the pipeline's): it redeclares the
# field of the ToolDocGroup it composes, with its own type and help text.
REDECLARED = {("EvalSetConfig", "tool_doc")}
# Fields declared with a group's field name by a config that does not compose that group, each with
# why it stays: another setting under the same name, which composing the group would make wrong.
# (Issue 42 phase C composed the groups where the field meant the group's: train-policy's tools and
# query sets, eval-decision's tool backend, build-trees' latent-reward constants.) A test below keeps
# the list current.
_FOLDER = "a folder of the command's results (report, records), not a resumable JSONL file"
_SEED = "another seed: of what the config itself draws, not a query draw's or the search's sampling"
_OTHER_MODEL = ("another model's setting in a config beside the policy's (composing the policy group "
                "would clash with the policy's keys in the pipeline, or rename generate's --model)")
_SERVER_KEY = "the key a client must send to this server, not the key that calls a model"
_LIMIT = "another model's generation limit (the answer, generate, the judge, the router), not a policy step's"
NAMESAKES = {
    ("DecisionEvalConfig", "output"): _FOLDER, ("TrainProbeConfig", "output"): _FOLDER,
    ("ScoreConfig", "output"): "the scored copy of its input (default: beside it), written whole, no resume",
    ("GenerateConfig", "api_key_env"): _OTHER_MODEL, ("GenerateConfig", "remote_model"): _OTHER_MODEL,
    ("JudgeConfig", "api_key_env"): _OTHER_MODEL, ("JudgeConfig", "remote_model"): _OTHER_MODEL,
    ("GenerateConfig", "seed"): _SEED, ("JudgeConfig", "seed"): _SEED, ("RouterConfig", "seed"): _SEED,
    ("ServeMockConfig", "seed"): _SEED, ("TreeConfig", "seed"): "each tree's seed mixes it with its query id",
    ("DrawGroup", "seed"): "a decide-first query draw's seed; the search's (SelectionGroup) seeds its sampling",
    ("SelectionGroup", "seed"): "the search's sampling and tie-break seed; DrawGroup's draws queries",
    ("ServeMockConfig", "api_key_env"): _SERVER_KEY, ("ServePRMConfig", "api_key_env"): _SERVER_KEY,
    ("TrainPolicyConfig", "policy"): "the policy trained: a folder or a Hub id, never a URL; the policy group "
                                     "brings remote, client and batch settings that training does not read",
    ("TrainPolicyConfig", "policy_dtype"): "the same: trained in this dtype, without the policy group",
    ("TreeConfig", "limit"): "a count of trees over build-trees' own query file (it has no benchmark)",
    ("AnswerConfig", "max_new_tokens"): _LIMIT, ("GenerateConfig", "max_new_tokens"): _LIMIT,
    ("JudgeConfig", "max_new_tokens"): _LIMIT, ("RouterConfig", "max_new_tokens"): _LIMIT,
    ("EvalSetConfig", "max_observation_chars"): "an evaluation set's override (none: the search's)",
    ("EvalSetConfig", "concurrency"): "an evaluation set's override of the episodes in flight (none: the search's)",
    ("TrainProbeConfig", "step_format"): "the probe's prompt format, not the policy's reply format",
    ("GenerateConfig", "n"): "completions of one prompt, not best-of-n's episodes",
    ("GenerateConfig", "top_p"): "generate's nucleus mass (1.0: none), not the search's sampling default",
    ("JudgeConfig", "temperature"): "the judge's (none: by benchmark)",
    ("RouterConfig", "temperature"): "the temperature of the router's agreement samples",
    ("RouterConfig", "method"): "the router's confidence source, not the search method's name",
    ("MethodConfig", "k"): "a pipeline method's part of the search, set per method (its search: refuses k)",
    ("MethodConfig", "w_cost"): "a pipeline method's part of the search, set per method (its search: refuses it)",
    ("MethodConfig", "temperature"): "a pipeline method's override (none: the pipeline's search temperature)",
    ("TrainPolicyConfig", "aggregate"): "per-step rewards -> one episode reward, not a trajectory's score "
                                        "from its PRM scores",
    # setup --testbed's warm start (issue 41): its own fine-tuning and demonstrations
    ("WarmStartConfig", "seed"): _SEED,
    ("WarmStartConfig", "finetune"): "the warm start's fine-tuning (full, or a LoRA merged into the weights); the "
                                     "LoRA group brings adapter settings it does not read",
    ("WarmStartConfig", "lora_r"): "the same: the rank of the merged LoRA, default 32",
    ("WarmStartConfig", "max_observation_chars"): "the demonstrations' observations, 400 as the testbed's search "
                                                  "shows them; the candidate group brings step keys it does not read",
}

PARSE_MODULES = {"codetool.cli", "codetool.api"}  # where text enters outside a config's __post_init__ (the CLI, the Python API)


def _help(cls: type) -> dict[str, str]:
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("cls", list(COMPOSED), ids=lambda c: c.__name__)
def test_each_command_config_composes_its_groups(cls):
    assert all(issubclass(cls, group) for group in COMPOSED[cls])


def test_the_walk_finds_every_command_s_config_and_the_groups():
    from codetool.cli import COMMANDS, _load

    assert {_load(name)[0] for name in COMMANDS} <= set(CONFIGS)
    assert {QueriesGroup, PolicyBackendGroup, ToolsGroup, OutputGroup, WorkersGroup, DrawGroup} <= set(GROUPS)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_an_inherited_field_keeps_its_help_text_in_every_config(cls):
    """Every config of every command (``cli.COMMANDS``, nested groups included): a field it takes
    from one of our bases (a group, ``with_defaults``' variants) keeps that base's help text."""
    mine = _help(cls)
    for base in cls.__mro__[1:]:
        if dataclasses.is_dataclass(base) and base.__module__.startswith("codetool."):
            for name, text in _help(base).items():
                if (cls.__name__, name) not in REDECLARED:
                    assert mine[name] == text, f"{cls.__name__}.{name} redeclares {base.__name__}'s with its own help"


def _namesakes() -> set[tuple[str, str]]:
    """(config, field) of every field named like a group's in a config that composes no group with
    that field (a composed one is the test above's), with another help text."""
    found = set()
    for cls in [*CONFIGS, *GROUPS]:  # a group too: two groups' fields of one name are namesakes as well
        mine, inherited = _help(cls), {n for b in cls.__mro__[1:] if dataclasses.is_dataclass(b) for n in _help(b)}
        found |= {(cls.__name__, name) for group in GROUPS if not issubclass(group, cls)
                  for name, text in _help(group).items()
                  if name in mine and name not in inherited and mine[name] != text}
    return found


def test_a_group_s_field_name_means_that_field_in_every_config_but_the_listed_namesakes():
    found = _namesakes()
    listed = set(NAMESAKES)
    assert not found - listed, f"new fields named like a group's, with another meaning: {sorted(found - listed)}"
    assert not listed - found, f"gone from the code, remove from NAMESAKES: {sorted(listed - found)}"
    assert all(reason.strip() for reason in NAMESAKES.values())


def test_with_defaults_changes_only_the_default():
    tools, plain = dataclasses.fields(TreeConfig), {f.name: f for f in dataclasses.fields(ToolBackendGroup)}
    backend = next(f for f in tools if f.name == "tools_backend")
    assert backend.default == "simulator" and RunConfig(benchmark="stabletoolbench").tools_backend == "auto"
    assert backend.metadata == plain["tools_backend"].metadata
    assert TreeConfig().policy_max_batch_size == 32 and PipelineConfig().policy_max_batch_size == 16
    assert EvalSetConfig().limit == 10 and EvalSetConfig().benchmark == "stabletoolbench"
    assert (TrainProbeConfig().n_tool, TrainProbeConfig().n_toolbench, DecisionEvalConfig().n_tool) == (24, 8, 20)
    assert TreeConfig().output == "runs/trees/trees.jsonl" and RunConfig(query="q", tools="t").output.startswith("runs/run/")
    with pytest.raises(TypeError, match="has no field nope"):
        with_defaults(nope=1)(type("Nope", (OutputGroup,), {}))

    @with_defaults(stages=["trees"])  # a list default is copied per instance
    class listed(PipelineConfig):
        pass

    first, second = listed(), listed()
    first.stages.append("train")
    assert second.stages == ["trees"] and PipelineConfig().stages == ["trees", "train", "search", "eval"]


def test_group_checks_run_in_every_config_that_composes_them():
    with pytest.raises(ConfigError, match="--offset must be >= 0"):
        RunConfig(benchmark="stabletoolbench", offset=-1)
    with pytest.raises(ConfigError, match="--offset must be >= 0"):
        EvalSetConfig(offset=-1)
    with pytest.raises(ConfigError, match="--subset 'full' is not one of"):
        EvalSetConfig(benchmark="restbench-tmdb", subset="full")
    for cls in (DecisionEvalConfig, TrainProbeConfig):
        with pytest.raises(ConfigError, match="n_tool, n_restbench, n_toolbench and n_free must be >= 0"):
            cls(n_free=-1)
    with pytest.raises(ConfigError, match="--shard must look like i/n"):
        TreeConfig(shard="half")
    with pytest.raises(ConfigError, match="evals\\[\\].benchmark: got 'toolbench'"):
        from_dict(PipelineConfig, {"evals": [{"benchmark": "toolbench"}]})
    with pytest.raises(ConfigError, match="remote_model"):
        PipelineConfig(remote_model="p")


def test_the_parsed_spec_is_not_a_setting():
    run = RunConfig(benchmark="stabletoolbench", policy="http://h/v1", remote_model="m", prm="rollout")
    assert run.policy_spec.kind == "openai" and run.policy_spec.remote_model == "m" and run.prm_spec.kind == "rollout"
    names = {name for name, _, _ in _flat_fields(RunConfig)}
    for attr in ("policy_spec", "prm_spec"):
        assert attr not in to_dict(run) and attr not in names
    assert TreeConfig().policy_spec.max_batch_size == 32
    again = dataclasses.replace(run, policy="default", remote_model=None)  # a replaced config parses again
    assert again.policy_spec.kind == "local" and config_hash(again) != config_hash(run)


def _parse_calls(path: Path) -> list[tuple[int, str | None]]:
    """(line, enclosing function name) of every ``ModelSpec.parse(...)`` call in ``path``."""
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "parse"
                    and isinstance(child.func.value, ast.Name) and child.func.value.id == "ModelSpec"):
                found.append((child.lineno, function))
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), None)
    return found


def test_model_specs_are_parsed_only_where_text_enters():
    """``ModelSpec.parse`` runs in a config's ``__post_init__`` (the groups, the configs of the
    commands) or in the CLI; everything below takes the parsed ``ModelSpec``."""
    misplaced, seen = [], 0
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        for line, function in _parse_calls(path):
            seen += 1
            if function != "__post_init__" and module not in PARSE_MODULES:
                misplaced.append(f"{module}:{line} (in {function})")
    assert seen and not misplaced, f"ModelSpec.parse outside a config's __post_init__: {misplaced}"


def test_the_parse_site_check_sees_a_call_in_a_library_function(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("class C:\n    def __post_init__(self):\n        ModelSpec.parse(self.x)\n\n"
                    "def build(text):\n    return ModelSpec.parse(text, role='prm')\n")
    assert _parse_calls(path) == [(3, "__post_init__"), (6, "build")]


def test_both_trainers_compose_one_lora_group():
    from codetool.models.lora import LoRAGroup
    from codetool.policy.config import TrainPolicyConfig
    from codetool.prm.config import PRMConfig

    lora = _help(LoRAGroup)
    for cls in (PRMConfig, TrainPolicyConfig):
        assert issubclass(cls, LoRAGroup)
        assert {name: text for name, text in _help(cls).items() if name in lora} == lora
    assert (PRMConfig().lora_r, TrainPolicyConfig().lora_r, TrainPolicyConfig().lora_alpha) == (8, 16, 32)
    assert PRMConfig(finetune="full").lora_config() is None
    made = PRMConfig(lora_target_modules=["q_proj", "v_proj"]).lora_config()
    assert made.r == 8 and set(made.target_modules) == {"q_proj", "v_proj"}


def test_the_search_is_its_groups_and_each_command_composes_only_what_it_reads():
    """Issue 42 (phase C): ``SearchConfig`` declares no field of its own; its groups partition its
    fields; build-trees' search composes the candidate, sampling and schedule groups and no other
    search key, train-policy's rollout the step group."""
    from codetool.policy.config import TrainPolicyConfig
    from codetool.search.allocation import BudgetGroup
    from codetool.search.config import (
        CandidateGroup,
        LatentGroup,
        LatentRewardGroup,
        SamplingGroup,
        ScheduleGroup,
        SchedulingGroup,
        SearchConfig,
        SelectionGroup,
        StepGroup,
        StrategyGroup,
    )
    from codetool.search.vote import VoteGroup
    from codetool.tree.search_settings import TreeSearch

    def own(cls):
        return {n for n in cls.__dict__.get("__annotations__", {}) if n in {f.name for f in dataclasses.fields(cls)}}

    groups = (CandidateGroup, StepGroup, SamplingGroup, SelectionGroup, LatentRewardGroup, LatentGroup, StrategyGroup,
              ScheduleGroup, SchedulingGroup)
    assert not own(SearchConfig) and all(issubclass(SearchConfig, g) for g in groups)
    declared = [n for g in (*groups, VoteGroup, BudgetGroup) for n in own(g)]
    assert len(declared) == len(set(declared))  # one declaration per key
    assert set(declared) == {f.name for f in dataclasses.fields(SearchConfig)}
    tree = {f.name for f in dataclasses.fields(TreeSearch)}
    assert tree == {f.name for g in (CandidateGroup, SamplingGroup, ScheduleGroup) for f in dataclasses.fields(g)}
    assert not tree & {"k", "max_steps", "seed", "w_latent", "strategy", "vote", "budget", "concurrency", "latent"}
    assert TreeConfig().search.max_new_tokens == 192 and issubclass(TreeConfig, LatentRewardGroup)
    with pytest.raises(ConfigError, match="build-trees' search is a TreeSearch .* got SearchConfig"):
        TreeConfig(search=SearchConfig())  # type: ignore[arg-type]  # what code written before the split did
    rollout = TrainPolicyConfig.__dataclass_fields__["rollout"]
    assert rollout.default_factory().__class__ is StepGroup  # type: ignore[misc]


def test_with_defaults_sees_every_group_of_a_class_of_several():
    from codetool.search.config import SamplingGroup, ScheduleGroup

    @with_defaults(top_p=0.5)  # a field of the second base: with_defaults read the first base's alone
    class Both(ScheduleGroup, SamplingGroup):
        pass

    assert Both().top_p == 0.5 and Both().schedule == "auto"


def test_train_policy_and_eval_decision_compose_the_tools_and_queries_groups():
    """Issue 42 (phase C): the fields they redeclared are the groups' (defaults kept)."""
    from codetool.policy.config import QuerySet, TrainPolicyConfig

    assert issubclass(TrainPolicyConfig, ToolsGroup) and TrainPolicyConfig().tool_doc == "brief"
    assert issubclass(QuerySet, QueriesGroup) and QuerySet(queries="q").benchmark == "toolbench"
    assert QuerySet("stabletoolbench", limit=8).name == "stabletoolbench:G1_instruction"
    with pytest.raises(ConfigError, match="--subset 'nope'"):  # the group's check, now run for a query set
        QuerySet("restbench-tmdb", subset="nope")
    assert issubclass(DecisionEvalConfig, ToolBackendGroup)
    assert (DecisionEvalConfig().tools_backend, DecisionEvalConfig().tool_doc) == ("simulator", "compact")
