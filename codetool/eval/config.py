"""``EvalConfig``: the settings of ``codetool eval`` (the report of :mod:`codetool.commands.eval`).

``recipe`` names a pipeline recipe: its judge section is the base of ``judge`` (``--config`` and
``--judge.*`` override it) and its run settings fill ``run_settings`` for the comparability block
(:mod:`codetool.eval.comparability`). ``__post_init__`` refuses a call without inputs; it reads
the recipe file and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from codetool.config import ConfigError, option
from codetool.eval.comparability import recipe_settings
from codetool.judge.config import JudgeConfig


@dataclass
class EvalConfig:
    """Settings of ``codetool eval``."""

    recipe_sections = {"recipe": ("judge",)}  # see codetool.config.load_config

    trajectories: list[str] = option(default_factory=list, positional=True,
                                     help="trajectory files (.jsonl) or StableToolBench converted answers "
                                          "(<method>/<group>.json or the <method>/ folder)")
    compare: list[str] = option(default_factory=list,
                                help="methods or files to put side by side, in this order (comma-separated, "
                                     "or --compare A B C); the first is the win-rate reference")
    reference: str = option("", "method (or file) the others are compared with for the win rate (SoWR)")
    out: str = option("data/eval", "output folder: report.json, report.md, plots, verdicts, judge cache",
                      aliases=("--output",))
    judge: JudgeConfig = option(default_factory=JudgeConfig, help="the judge of pass and win rates")
    restbench_gold: str = option("", "RestGPT datasets/tmdb.json: gold paths for trajectories that lack "
                                 "extra.gold_path")
    export_stabletoolbench: str = option("", "also write the runs in StableToolBench's converted-answer "
                                         "layout into this folder (<method>/<group>.json)")
    plots: bool = option(True, "write the PNG plots")
    seed_runs: list[str] = option(default_factory=list,
                                  help="trajectory files of the same methods with other seeds (<slug>.seed<k>.jsonl): "
                                       "the summary's judge-free metrics are mean ± spread over them and the inputs")
    prm_metrics: str = option("", "metrics.json of `codetool eval-prm` on held-out trees: shown under "
                              "'what the PRM learned'")
    recipe: str = option("", "the pipeline recipe the trajectories were made with (e.g. "
                         "configs/pipeline/paper-qwen2.5-7b.yaml): its run settings (trees, search, answer, prm) are "
                         "checked in the comparability block, and its judge section is the base of the judge "
                         "settings (--config and --judge.* override it)")
    run_settings: dict[str, Any] = option(default_factory=dict,
                                          help="the run's settings as dotted keys for the comparability block "
                                               "(the pipeline passes its own; --recipe fills them)")

    def __post_init__(self):
        if not self.trajectories and not self.compare:
            raise ConfigError("no trajectory files given: pass one or more .jsonl files of `codetool run` "
                              "(or StableToolBench converted answers), e.g. codetool eval runs/demo.jsonl.")
        if self.recipe:
            self.run_settings = {**recipe_settings(self.recipe), **self.run_settings}
