"""The ``judge.*`` settings: which model labels answers, and by which procedure.

``codetool.assemble.make_judge`` turns a :class:`JudgeConfig` into a judge
(:class:`~codetool.judge.llm.LLMJudge`); evaluation (``codetool eval``), leaf success ``judged``
of ``build-trees`` and the judged rewards of policy RL all read this one group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codetool.config import ConfigError, option
from codetool.judge.reference_prompts import PROMPT_SETS, STB_EVALUATOR
from codetool.models.remote import RemoteConfig
from codetool.models.spec import ModelSpec

PROTOCOLS = ("stabletoolbench", "codetool")
PAPER_JUDGE = "gpt-4-turbo-2024-04-09"  # CodeTool's judge (eval/config.yaml); StableToolBench's tables since 2024-06
STB_STANDARD_JUDGE = "gpt-4-turbo-preview"  # the standard evaluation model StableToolBench's README names


@dataclass
class JudgeConfig:
    """Which judge scores answers, and by which procedure (``codetool eval --judge.model ...``).

    ``protocol`` picks the procedure (see :mod:`codetool.eval.stabletoolbench`):
    ``stabletoolbench`` (its evaluator: two stages, an Unsure answer decided again from the whole
    answer with its details; forced function calls where the server supports them; temperature
    0.2; 3 rounds) or ``codetool`` (CodeTool's ``eval/eval_pass_rate.py``: one forced call per
    answer on the query and final answer at temperature 0, one round, no rule).
    ``rounds``, ``temperature`` and ``max_new_tokens`` left empty take the protocol's / prompts'.
    ``prompts`` picks the wording: ``ours`` (``codetool/prompts/judge_*.txt``) or a reference's,
    read from the user's checkout (``reference_dir``, else ``$CODETOOL_STABLETOOLBENCH_DIR`` or
    ``$CODETOOL_CODETOOL_DIR``, see :mod:`codetool.judge.reference_prompts`).
    """

    model: str = option("default", "'none' (judge-free metrics only), 'default' (the embedded local "
                        "model: a weak smoke-test judge), a local model directory or Hub id, or the "
                        "http(s):// base URL of an OpenAI-compatible server")
    remote_model: str = option("", "model name sent to an http(s) judge (default: the server's first model); "
                               f"the papers' judge is {PAPER_JUDGE}")
    api_key_env: str = option("OPENAI_API_KEY", "environment variable that holds the judge's API key")
    protocol: str = option("stabletoolbench", "judging procedure: stabletoolbench (two-stage, 3 rounds at 0.2) "
                           "or codetool (single pass on query + final answer at temperature 0)",
                           choices=list(PROTOCOLS))
    rounds: int | None = option(None, "judge rounds per answer; the pass rate is their mean, with their spread "
                                "(default: 3 for stabletoolbench, 1 for codetool)")
    mode: str = option("auto", "json: the judge writes JSON; tools: a forced function call (OpenAI tools + "
                       "tool_choice, JSON text where refused); options: score the labels by log-probs (local "
                       "models); auto: options for local models, tools for servers under the stabletoolbench "
                       "protocol, else json", choices=["auto", "json", "tools", "options"])
    temperature: float | None = option(None, "judge sampling temperature (default: 0.2 for stabletoolbench, "
                                       "as its evaluator; 0 for codetool)")
    max_new_tokens: int | None = option(None, "most tokens of a judge reply (default: 256 with our prompts, 1000 "
                                        "with a reference's, StableToolBench's max_tokens)")
    prompts: str = option("ours", "judge prompts: ours, stabletoolbench (its evaluator's template and functions) or "
                          "codetool (CodeTool's eval/utils.py instruction), the last two read from your own checkout "
                          "(judge.reference_dir)", choices=list(PROMPT_SETS))
    reference_dir: str = option("", "your clone of StableToolBench or CodeTool for judge.prompts stabletoolbench / "
                                "codetool (default: $CODETOOL_STABLETOOLBENCH_DIR / $CODETOOL_CODETOOL_DIR)")
    stabletoolbench_evaluator: str = option(STB_EVALUATOR, "StableToolBench evaluator folder the prompts are read "
                                            "from (toolbench/tooleval/evaluators/<name>)")
    codetool_instruction: str = option("v2", "CodeTool's judge instruction: v2 (EVAL_INST_V2, what its "
                                       "run_pass_rate.sh passes) or v1", choices=["v1", "v2"])
    retries: int = option(2, "extra attempts when a judge reply does not parse")
    batch_size: int | None = option(None, "a local judge: prompts per call, verdicts cached after each batch (none: "
                                    "8); a server: requests in flight, one per verdict, each cached as it lands "
                                    "(none: judge.client.max_in_flight)")
    client: RemoteConfig = field(default_factory=RemoteConfig)
    cache: str = option("", "JSONL file of cached verdicts (default: judge_cache.jsonl in the output folder)")
    weak: bool | None = option(None, "flag the judge as weak in reports (default: true for local models)")
    dtype: str = option("auto", "dtype of a local judge", choices=["auto", "float32", "bfloat16", "float16"])
    device: str = option("auto", "device of a local judge: auto, cpu, cuda, ...")
    max_answer_chars: int = option(2000, "answers shown to the judge are cut to this many characters")
    max_trajectory_chars: int = option(0, "the answer details (steps and tool calls) shown to the judge are cut "
                                       "to this many characters; 0: never cut (StableToolBench's evaluator "
                                       "shows them whole; a cut is reported as a deviation)")
    seed: int = option(0, "seed of the win rate's random draws: the order of the two answers in each comparison "
                       "and the pick between identical answers")
    blank_finish: str = option("unsolved", "under protocol stabletoolbench, a finish with an empty or blank answer: "
                               "unsolved (ours: Unsolved, no judge call) or judge (StableToolBench: its export "
                               "holds ToolBench's JSON text there, which its evaluator judges); protocol codetool "
                               "judges every answer", choices=["unsolved", "judge"])

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"judge.protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}.")
        if self.prompts not in PROMPT_SETS:
            raise ConfigError(f"judge.prompts must be one of {', '.join(PROMPT_SETS)}, got {self.prompts!r}.")
        if self.max_new_tokens is None:
            self.max_new_tokens = 256 if self.prompts == "ours" else 1000
        if self.max_new_tokens < 1:
            raise ConfigError(f"judge.max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if self.rounds is None:
            self.rounds = 3 if self.protocol == "stabletoolbench" else 1
        if self.temperature is None:
            self.temperature = 0.2 if self.protocol == "stabletoolbench" else 0.0
        if self.rounds < 1:
            raise ConfigError(f"judge.rounds must be >= 1, got {self.rounds}.")
        if self.temperature < 0:
            raise ConfigError(f"judge.temperature must be >= 0, got {self.temperature}.")
        if self.retries < 0 or (self.batch_size is not None and self.batch_size < 1):
            raise ConfigError(f"need judge.retries >= 0 and judge.batch_size >= 1, got {self.retries}, "
                              f"{self.batch_size}.")
        if self.max_trajectory_chars < 0:
            raise ConfigError(f"judge.max_trajectory_chars must be >= 0 (0: no cut), got {self.max_trajectory_chars}.")
        # The judge's model, parsed once (not a setting: not in to_dict or the hashes); None: no judge.
        self.model_spec = ModelSpec.parse(self.model, role="judge", remote_model=self.remote_model,
                                          api_key_env=self.api_key_env, dtype=self.dtype, device=self.device,
                                          client=self.client) if self.enabled else None

    @property
    def enabled(self) -> bool:
        return self.model.strip().lower() not in ("", "none")
