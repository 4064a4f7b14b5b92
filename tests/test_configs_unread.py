"""A key that no code reads is refused (issue 29).

For every shipped recipe and the config class of the command that reads it, a key that is not a
setting is refused under every section (each nested group, and the first item of each list of
groups), with an error that names the key's dotted path. And the keys of ``trees.search`` that the
tree builder never reads (``TreeConfig.search`` is typed as a whole ``SearchConfig``) are refused
with an error that says where each belongs, while every shipped recipe still loads.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest
import yaml

from codetool.cli import main
from codetool.commands.eval import EvalConfig
from codetool.commands.pipeline import PipelineConfig
from codetool.config import ConfigError, _exposed, _hints, _unwrap_optional, from_dict
from codetool.jobs.queries import RunConfig
from codetool.prm.trainer import PRMConfig
from codetool.search.config import SearchConfig
from codetool.tree.config import TreeConfig
from codetool.tree.search_settings import TREE_READS, TREE_SEARCH

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
UNKNOWN = "no_such_setting"


def _policy_config():
    from codetool.policy.config import TrainPolicyConfig

    return TrainPolicyConfig


def _search_recipe(data: dict) -> dict:
    """``configs/search/*.yaml``: bench_search_strategies.py reads ``run`` merged with each benchmark."""
    return {**data["run"], **data["benchmarks"][0]}


def _eval_recipe(data: dict) -> dict:
    """``configs/eval/*.yaml``: the trajectory files come on the command line."""
    return {**data, "trajectories": ["runs/demo.jsonl"]}


# folder -> (the config class of the command that reads its recipes, the mapping it reads)
READERS = {"pipeline": (lambda: PipelineConfig, dict), "train": (lambda: PRMConfig, dict),
           "policy": (_policy_config, dict), "eval": (lambda: EvalConfig, _eval_recipe),
           "search": (lambda: RunConfig, _search_recipe)}
RECIPES = sorted(p.relative_to(CONFIGS).as_posix() for folder in READERS for p in (CONFIGS / folder).glob("*.yaml"))


def sections(cls: type, prefix: tuple = ()) -> list[tuple]:
    """The path of every section of ``cls``: itself, each nested group, the first item of each list
    of groups (``("methods", 0)``), recursively."""
    out = [prefix]
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if not _exposed(f):
            continue
        tp, _ = _unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            out += sections(tp, (*prefix, f.name))
        elif typing.get_origin(tp) is list and typing.get_args(tp) and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            out += sections(typing.get_args(tp)[0], (*prefix, f.name, 0))
    return out


def load(recipe: str) -> tuple[type, dict]:
    cls, read = READERS[recipe.split("/")[0]]
    return cls(), read(yaml.safe_load((CONFIGS / recipe).read_text()))


def plant(data: dict, path: tuple, key: str, value) -> str:
    """Put ``key: value`` into the section at ``path`` of ``data``; returns the key's dotted name as
    the loader spells it (``trees.search.x``, ``methods[0].x``)."""
    node, name = data, ""
    for i, part in enumerate(path):
        if isinstance(part, int):
            if not node:
                node.append({})
            node, name = node[part], f"{name}[{part}]"
        else:
            if not isinstance(node.get(part), (dict, list)):
                node[part] = [] if path[i + 1:i + 2] == (0,) else {}
            node, name = node[part], f"{name}.{part}" if name else part
    node[key] = value
    return f"{name}.{key}" if name else key


CASES = [(recipe, path) for recipe in RECIPES for path in sections(load(recipe)[0])]


def test_every_shipped_recipe_loads():
    for recipe in RECIPES:
        cls, data = load(recipe)
        assert isinstance(from_dict(cls, data), cls), recipe


@pytest.mark.parametrize(("recipe", "path"), CASES, ids=[f"{r}:{'.'.join(map(str, p)) or '-'}" for r, p in CASES])
def test_an_unknown_key_under_any_section_is_refused_by_name(recipe, path):
    cls, data = load(recipe)
    dotted = plant(data, path, UNKNOWN, 1)
    with pytest.raises(ConfigError, match=rf"^unknown config key '{re.escape(dotted)}'"):
        from_dict(cls, data)


def test_the_tree_builder_reads_or_refuses_every_search_key():
    fields = {f.name for f in dataclasses.fields(SearchConfig) if f.init}
    assert set(TREE_READS) | set(TREE_SEARCH.homes) == fields
    assert not set(TREE_READS) & set(TREE_SEARCH.homes)
    assert len(TREE_READS) == 15 and len(TREE_SEARCH.homes) == len(fields) - 15


@pytest.mark.parametrize("key", sorted(TREE_SEARCH.homes))
def test_a_search_key_the_tree_builder_does_not_read_is_refused(key):
    cls, data = load("pipeline/quickstart.yaml")
    data["trees"]["search"][key] = getattr(SearchConfig(), key)
    with pytest.raises(ConfigError, match=rf"^trees\.search\.{key} is not read by build-trees; it reads trees\.search: "
                                          r"temperature, top_p, .*, schedule\. \S"):
        from_dict(cls, data)
    with pytest.raises(ConfigError, match=rf"^search\.{key} is not read by build-trees"):
        from_dict(TreeConfig, {"search": {key: getattr(SearchConfig(), key)}})


def test_the_refusal_says_where_the_key_belongs():
    with pytest.raises(ConfigError, match=r"The trees take candidates sampled per node from trees\.branching: set "
                                          r"that instead\.$"):
        from_dict(PipelineConfig, {"trees": {"search": {"k": 4}}})
    with pytest.raises(ConfigError, match=r"the depth of a tree from max_depth"):
        from_dict(TreeConfig, {"search": {"max_steps": 4}})
    with pytest.raises(ConfigError, match=r"w_latent is a setting of the search over queries: set it under search: of "
                                          r"a pipeline recipe, or pass --search\.w_latent to codetool run\.$"):
        from_dict(PipelineConfig, {"trees": {"search": {"w_latent": 0.5}}})


def test_the_read_search_keys_are_accepted_and_keep_the_trees_defaults():
    given = {key: getattr(SearchConfig(), key) for key in TREE_READS if key != "max_new_tokens"}
    cfg = from_dict(TreeConfig, {"search": given})
    assert cfg.search.max_new_tokens == 192  # the trees' own default, not SearchConfig's 256
    assert from_dict(TreeConfig, {"search": {"temperature": 0.5}}).search.max_new_tokens == 192


def test_build_trees_refuses_an_unread_flag_and_leaves_it_out_of_the_help(capsys):
    assert main(["build-trees", "--search.w_latent", "0.5"]) == 2
    assert "error: search.w_latent is not read by build-trees" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["build-trees", "--help"])
    shown = capsys.readouterr().out
    assert "--search.temperature" in shown and "--search.w_latent" not in shown and "--search.k " not in shown


# ---- the keys of a pipeline's search: that each method or seed sets for itself (run_configs overwrites them)

def test_the_pipeline_reads_or_refuses_every_search_key():
    from codetool.jobs.pipeline import PIPELINE_SEARCH

    fields = {f.name for f in dataclasses.fields(SearchConfig) if f.init}
    assert set(PIPELINE_SEARCH.reads) | set(PIPELINE_SEARCH.homes) == fields
    assert set(PIPELINE_SEARCH.homes) == {"method", "k", "w_spot", "w_latent", "w_cost", "latent", "seed"}


@pytest.mark.parametrize(("key", "home"), [("method", r"methods\[\]\.name"), ("k", r"methods\[\]\.k"),
                                           ("w_spot", r"methods\[\]\.w_spot"), ("w_latent", r"methods\[\]\.w_latent"),
                                           ("w_cost", r"methods\[\]\.w_cost"), ("latent", r"methods\[\]\.latent"),
                                           ("seed", "seeds")])
def test_a_per_method_search_key_of_a_pipeline_is_refused_with_its_home(key, home):
    for recipe in [r for r in RECIPES if r.startswith("pipeline/")]:
        cls, data = load(recipe)
        data.setdefault("search", {})[key] = getattr(SearchConfig(), key)
        with pytest.raises(ConfigError, match=rf"^search\.{key} is not read by pipeline; it reads search: (.*, )?max_steps, "
                                              rf".*\. Each (method|seed) sets its own: set {home} instead\.$"):
            from_dict(cls, data)


def test_the_pipelines_read_search_keys_are_still_accepted():
    from codetool.jobs.pipeline import PIPELINE_SEARCH

    cfg = from_dict(PipelineConfig, {"search": {key: getattr(SearchConfig(), key) for key in PIPELINE_SEARCH.reads}})
    assert cfg.search == SearchConfig()
    assert from_dict(PipelineConfig, {"search": {"temperature": 0.3}}).search.temperature == 0.3


def test_pipeline_refuses_a_per_method_flag_and_leaves_it_out_of_the_help(capsys):
    assert main(["pipeline", "--search.k", "4"]) == 2
    assert "error: search.k is not read by pipeline" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["pipeline", "--help"])
    shown = capsys.readouterr().out
    assert "--search.temperature" in shown and "--search.k " not in shown and "--search.seed" not in shown
