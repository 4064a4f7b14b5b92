"""The settings of ``codetool build-trees`` (:class:`TreeConfig`) and the hash its tree records carry.

Declared beside their reader, the tree builder (:mod:`codetool.tree.build`), so that the builder,
the job that runs it (:mod:`codetool.jobs.trees`) and the command (:mod:`codetool.commands.build_trees`)
all import it downward. :func:`tree_hash` is the config hash stored in every tree record and checked
on resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from codetool.config import ConfigError, config_hash, option
from codetool.config_groups import with_defaults
from codetool.distributed.ray_cluster import ShardedWorkersGroup
from codetool.executor import ExecutorConfig
from codetool.memory_use import MemoryGroup
from codetool.models.spec import PolicyGroup
from codetool.resume import OutputGroup
from codetool.search.config import LatentRewardGroup
from codetool.tools.config import ToolBackendGroup
from codetool.tree.labels import LABEL_RULES, SUCCESS_MODES
from codetool.tree.search_settings import TREE_SEARCH, TreeSearch


@with_defaults(policy_max_batch_size=32)  # a tree level decodes many candidates at once
class TreePolicy(PolicyGroup):
    """The policy group of ``build-trees``."""


@with_defaults(tools_backend="simulator")
class TreeTools(ToolBackendGroup):
    """The tools group of ``build-trees``: the simulator unless told otherwise."""


@with_defaults(output="runs/trees/trees.jsonl")
class TreeOutput(OutputGroup):
    """The output group of ``build-trees``."""


@dataclass
class TreeConfig(TreePolicy, TreeTools, TreeOutput, ShardedWorkersGroup, MemoryGroup, LatentRewardGroup):
    """Settings of ``codetool build-trees``: the groups it composes (policy, tools, output, workers
    with shards, the latent reward's constants), its own, and its ``search:``
    (:class:`~codetool.tree.search_settings.TreeSearch`: the candidate, sampling and schedule groups
    of the search only)."""

    config_unread = {"search": TREE_SEARCH}  # the search's keys TreeSearch lacks: refused naming build-trees

    queries: str | None = option(None, "query file or folder: ToolBench/StableToolBench format, or RestGPT's layout "
                                 "(a list of {query, solution}) with --tools SPEC (default: ToolBench's 10 example "
                                 "queries), or, for the synthetic world's queries, world:<train|heldout>[:<n>] (queries 0 "
                                 "to n-1) or world:<train|heldout>:<offset>:<n> (queries offset to offset+n-1)")
    tools: str | None = option(None, "the APIs of RestGPT-layout --queries: an OpenAPI 3 spec (JSON or YAML) or an "
                               "api_list file; with ToolBench queries that list API names only, ToolBench's "
                               "toolenv/tools folder")
    never_train_on: list[str] = option(default_factory=lambda: ["stabletoolbench", "restbench-tmdb"],
                                       help="test sets no tree may hold, by id and by text: stabletoolbench[:<group>] "
                                            "(its 765 solvable test queries; ToolBench's G*_query.json holds them), "
                                            "restbench-tmdb[:<first>-<last>] (codetool.tools.heldout)")
    dataset_dir: str = option("data/prm", "where the PRM dataset goes (prm_examples.jsonl, train/validation splits)")
    branching: int = option(2, "candidates sampled per node")
    distinct_draws: int = option(0, "0: a node's children are its samples as drawn, a repeated step included (the "
                                 "public code; two samples of the same step are no pair: dropped as same_step). n > 0: "
                                 "a sample that repeats a sibling's reply is dropped before it runs and the node "
                                 "samples again, at most n more times: up to branching distinct children, fewer where "
                                 "the policy keeps repeating itself (trees spend their nodes on different steps)")
    max_depth: int = option(5, "depth at which nodes become leaves")
    failure_policy: str = option("continue", "what a failed node does", choices=["continue", "stop"])
    success: str = option("grounded", "leaf success: executed (public code: the path ran cleanly), grounded (finish "
                          "with an answer after a successful tool call), judged (grounded + a judge says Solved), "
                          "answer (the query's answer key accepts the finish answer: the synthetic world)",
                          choices=list(SUCCESS_MODES))
    label_rule: str = option("ours", "sibling labels: ours (every sibling pair; executability of the step's own "
                             "run, then hard/soft LR; no success difference: no pair), reference (the public "
                             "code's rows exactly: paths re-run with prints stripped, x-1/x-2 and x-3/x-2 pairs, "
                             "both-'no' rows, replies without code as successful leaves) or latent (paper "
                             "wording: compare R_latent; both-LR-0 pairs dropped)", choices=list(LABEL_RULES))
    generator_quirks: bool = option(False, "with label_rule reference: also the public generator's history "
                                    "bookkeeping after a reply without code (it drops that reply's later siblings "
                                    "and one ancestor step from the nodes after it)")
    judge: str = option("default", "judge model for success=judged: default (the embedded model), a path, Hub id "
                        "or http(s) URL")
    tau_mode: str = option("mean", "tau over a node's leaves: mean (paper text) or sum (public code)",
                           choices=["mean", "sum"])
    emit: str = option("pairs", "PRM rows: sibling pairs, or every node with its soft target", choices=["pairs", "nodes"])
    val_fraction: float = option(0.2, "share of query ids held out for validation")
    merge: bool = option(False, "join the shard files of --output, then export the dataset")
    relabel: bool = option(False, "recompute leaf success (executed/grounded) and sibling labels of the trees already "
                           "in --output under the current settings, then export; nothing is sampled")
    limit: int | None = option(None, "build at most this many trees")
    seed: int = option(0, "base seed; each tree's seed mixes in its query id")
    batch_trees: int | None = option(None, "trees grown together (none: 8 with a local policy, level by level, so "
                                     "their samples share forward passes (1: each tree's samples depend on its "
                                     "query id alone); with a remote policy, node by node as samples return, "
                                     "enough trees to fill policy_client.max_in_flight)")
    search: TreeSearch = field(default_factory=TreeSearch)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)

    def __post_init__(self):
        super().__post_init__()  # each group's checks; the policy group parses policy_spec
        if not isinstance(self.search, TreeSearch):  # code that built a whole SearchConfig for the trees
            raise ConfigError(f"build-trees' search is a TreeSearch (the candidate, sampling and schedule groups), "
                              f"got {type(self.search).__name__}: build TreeSearch(...) with the keys it reads.")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}.")
        if self.batch_trees is not None and self.batch_trees < 1:
            raise ConfigError(f"batch_trees must be >= 1, got {self.batch_trees}.")
        if self.distinct_draws < 0:
            raise ConfigError(f"distinct_draws must be >= 0 (0: samples as drawn), got {self.distinct_draws}.")
        if self.branching < 1 or self.max_depth < 1:
            raise ConfigError(f"branching and max_depth must be >= 1, got {self.branching} and {self.max_depth}.")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction must lie in [0, 1), got {self.val_fraction}.")
        if self.success == "judged" and str(self.judge or "none").lower() in ("none", "", "null"):
            raise ConfigError(f"trees.success is 'judged' but trees.judge is {self.judge!r}: set trees.judge to a "
                              "judge model (default, a path, a Hub id or an http(s) URL), or use success: grounded.")

    def shard_path(self) -> Path:
        out = Path(self.output)
        if self.shard is None:
            return out
        i, n = self.shard_index()
        return out.with_name(f"{out.stem}.shard-{i}-of-{n}{out.suffix}")


def tree_hash(cfg: TreeConfig) -> str:
    """The config hash stored in tree records and checked on resume (not paths, sharding or speed,
    nor ``never_train_on``: which queries get trees, not how a tree is built; the export drops held-out
    queries from trees built before, so the guarantee does not depend on the hash)."""
    # a setting added later hashes only when set
    unset = (*(("tools",) if cfg.tools is None else ()), *(("distinct_draws",) if not cfg.distinct_draws else ()))
    return config_hash(cfg, ignore=("output", "dataset_dir", "shard", "merge", "limit", "batch_trees", "never_train_on",
                                    "policy_max_batch_size", "retry_failed", "force_resume", "relabel", "ray",
                                    "cluster", "policy_client", "max_memory_mb", *unset))
