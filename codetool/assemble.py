"""Composition: turn settings into the parts a search or a tree build runs with.

The commands (``codetool run``, ``build-trees``, ``eval``, ``eval-decision``, ``pipeline``) read
their configs and ask this module for a policy (:func:`make_policy`), a PRM scorer
(:func:`make_scorer`), a judge (:func:`make_judge`), a tool backend and the local mock server it
may need, for the duration of a ``with`` block (:func:`tool_backend`), an executor per task
(:func:`executor_factory`), the tasks themselves (:func:`make_task`) and the search that solves
them (:func:`make_search`, with its strategy from :data:`STRATEGIES`). Model specs arrive parsed
(:class:`codetool.models.spec.ModelSpec`, by the config groups where the text enters).

Layering (``tests/test_layering.py``): this module sits above the stages it composes (``models``,
``prm``, ``tools``, ``executor``, ``search``, ``judge``) and below the commands; it imports
nothing from ``tree``, ``eval``, ``decide``, ``pipeline``, ``run`` or ``cli``, and none of the
stages imports it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codetool.config import ConfigError
from codetool.executor import ExecutorConfig
from codetool.executor.result import StepExecutor
from codetool.judge.llm import LLMJudge
from codetool.judge.records import Judge, ScriptedJudge
from codetool.models.completion import LLMBackend
from codetool.models.spec import ModelSpec
from codetool.rewards import PRMScorer
from codetool.search.beam import beam_search
from codetool.search.best_of_n import best_of_n
from codetool.search.compute_optimal import compute_optimal
from codetool.search.config import SearchConfig
from codetool.search.dvts import dvts
from codetool.search.episode import Search, SearchParts, Strategy
from codetool.search.greedy import greedy
from codetool.search.lookahead import lookahead
from codetool.search.search import SearchTask

if TYPE_CHECKING:
    from codetool.judge.config import JudgeConfig
    from codetool.search.records import Trajectory

logger = logging.getLogger(__name__)

STRATEGIES: dict[str, Strategy] = {
    "greedy": greedy,           # CodeTool: the best candidate per step, episodes batched
    "best_of_n": best_of_n,     # n greedy episodes, the best-scored answer
    "beam": beam_search,        # B partial trajectories, k children each
    "lookahead": lookahead,     # each candidate valued by a depth-d rollout
    "dvts": dvts,               # n/w independent beams of width w (diverse verifier tree search)
    "compute_optimal": compute_optimal,  # per query, a strategy and a share of search.budget by difficulty
}
"""``search.strategy`` -> the strategy that runs it; each takes ``(tasks, parts, cfg, on_done)``
(:data:`codetool.search.episode.Strategy`) and returns the trajectories (search-and-learn's
``APPROACHES`` table is the model: the caller dispatches)."""

# The one table of judges (each a codetool.judge.records.Judge): make_judge builds an LLMJudge from
# a JudgeConfig; ScriptedJudge answers from a script (tests, replays) and no config names it. The
# other seams have theirs beside the function that chooses: models.backends.BACKENDS (policy),
# prm.scorer.SCORERS (PRM), tools.backends.BACKENDS (tools).
JUDGES: dict[str, Callable[..., Judge]] = {  # the type checker holds each class to the Judge seam
    "llm": LLMJudge,
    "scripted": ScriptedJudge,
}


def make_search(policy: LLMBackend, cfg: SearchConfig, make_executor: Callable[[SearchTask], StepExecutor],
                scorer: PRMScorer | None = None, config_hash: str = "",
                admit: Callable[[int], bool] | None = None,
                on_step: Callable[[SearchTask, Trajectory], None] | None = None) -> Search:
    """The search ``cfg`` describes: the parts bound to the settings and to ``STRATEGIES[cfg.strategy]``.

    Args:
        policy (`LLMBackend`): the policy.
        cfg (`SearchConfig`): the search settings (``cfg.strategy`` picks the strategy).
        make_executor (`Callable[[SearchTask], StepExecutor]`): a fresh executor for a task.
        scorer (`PRMScorer`, *optional*): the latent reward source when ``latent='prm'``.
        config_hash (`str`, *optional*): stored in every trajectory.
        admit (`Callable[[int], bool]`, *optional*): a cap on the queries in flight (a memory cap).
        on_step (`Callable[[SearchTask, Trajectory], None]`, *optional*): sees a greedy episode's
            trajectory after each step but the last, under continuous scheduling (``SearchParts``).
    Raises:
        ConfigError: settings the parts cannot run (``codetool.search.episode.check``).
    """
    return Search(SearchParts(policy, make_executor, scorer, config_hash, admit, on_step), cfg,
                  STRATEGIES[cfg.strategy])


def make_policy(spec: ModelSpec):
    """The policy backend of a parsed model spec (``policy_spec`` of a config's policy group, see
    :class:`~codetool.models.spec.PolicyGroup`; the spec carries its options: dtype, batch size,
    server name, key variable, client limits).

    Raises:
        TypeError: ``spec`` is not a :class:`ModelSpec` (parse the text where it enters).
        CodetoolError: what the backend raises (a missing model, a missing API key variable).
    """
    from codetool.models.backends import make_backend

    return make_backend(spec)


def make_scorer(spec: ModelSpec | None, device: str = "auto", client=None, share_prefix: str = "auto"):
    """``None`` for no spec, ``none`` or ``rollout``, else the PRM scorer of the parsed ``spec``
    (checkpoint folder, server URL(s) with the ``client`` limits (``prm_client``), ``vllm:``);
    ``share_prefix`` is a local scorer's prefix sharing (``LocalPRMScorer``)."""
    if spec is None or spec.kind in ("none", "rollout"):
        return None
    from codetool.prm.scorer import load_scorer

    options = {}
    if spec.kind == "server" and client:
        options["client"] = client
    if spec.kind == "local" and share_prefix != "auto":
        options["share_prefix"] = share_prefix
    return load_scorer(spec, device=device, **options)


def make_judge(cfg: JudgeConfig, cache_path: str | None = None) -> Judge | None:
    """The judge described by ``cfg`` (``None`` for ``model: none``). A local model is checked now
    and loaded on the first verdict that is not cached; a server is asked its model name unless
    ``remote_model`` is given. ``cache_path`` is used when ``cfg.cache`` is empty.

    Raises:
        ConfigError: ``cfg.prompts`` names a reference but no usable checkout was given.
        CodetoolError: what the backend raises (a missing default model, a server that is not
            reachable, a missing API key variable).
    """
    if not cfg.enabled:
        return None
    from functools import partial

    from codetool.judge.reference_prompts import load_reference_prompts
    from codetool.models.backends import make_backend
    from codetool.models.openai_backend import OpenAIBackend

    reference = load_reference_prompts(cfg.prompts, cfg.reference_dir, evaluator=cfg.stabletoolbench_evaluator,
                                       instruction=cfg.codetool_instruction)  # no checkout: fails before any model
    spec = cfg.model_spec  # parsed by JudgeConfig (an enabled judge has a model)
    assert spec is not None
    remote = spec.remote
    backend: LLMBackend | Callable[[], LLMBackend]
    if remote:
        backend = make_backend(spec)
        # The model's name is part of every cache key: ask the server once when it was not given.
        served = cfg.remote_model or (backend.resolved_model() if hasattr(backend, "resolved_model") else "")
        name = f"openai:{served or 'server-default'}@{cfg.model}"
        if cfg.mode == "options" and isinstance(backend, OpenAIBackend) and not backend.feature("logprobs"):
            raise ConfigError(f"judge.mode is 'options' (labels scored by log-probabilities), but the judge server "
                              f"{cfg.model} returns none ({backend.features.notes.get('logprobs', '')}); set "
                              "--judge.mode json or tools.")
    else:
        from codetool.models.loading import resolve_model

        resolve_model(cfg.model)  # a missing model fails now, with its fix; loading waits for a cache miss
        backend = partial(make_backend, spec)  # loaded on the first verdict that is not cached
        name = f"local:{cfg.model}"
    weak = (not remote) if cfg.weak is None else cfg.weak
    mode = cfg.mode
    if mode == "auto" and remote:  # both references force a function call (StableToolBench, CodeTool)
        mode = "tools"
    return JUDGES["llm"](backend, name=name, kind="openai" if remote else "local", weak=weak,
                    cache_path=cfg.cache or cache_path, mode=mode, temperature=cfg.temperature,
                    max_new_tokens=cfg.max_new_tokens, retries=cfg.retries,
                    batch_size=cfg.batch_size or (cfg.client.max_in_flight if remote else 8),
                    max_answer_chars=cfg.max_answer_chars,
                    max_trajectory_chars=cfg.max_trajectory_chars or 10**9, reference=reference)


def executor_factory(executor_cfg: ExecutorConfig) -> Callable[[SearchTask], StepExecutor]:
    """``task -> Executor`` with the task's tool functions; the executors of one factory share
    sandbox families (:class:`codetool.executor.FamilyPool`): a new one is a fork of a running
    root, not a new interpreter."""
    from codetool.executor import Executor, FamilyPool

    pool = FamilyPool(executor_cfg)
    return lambda task: Executor(executor_cfg, tools=task.env.functions(), pool=pool)


def make_task(query, backend, *, max_response_chars: int = 20000, tool_doc: str = "full") -> SearchTask:
    """A :class:`SearchTask` from a ``BenchmarkQuery`` and a tool backend."""
    from codetool.tools.environment import ToolEnvironment

    env = ToolEnvironment.from_query(query, backend, max_response_chars=max_response_chars, render_style=tool_doc)
    extra: dict[str, Any] = {"relevant_apis": [list(p) for p in query.relevant_apis]}
    if query.gold_path is not None:
        extra["gold_path"] = list(query.gold_path)
    if query.extra.get("missing_apis"):
        extra["missing_apis"] = [list(p) for p in query.extra["missing_apis"]]
    if "answer" in query.extra:  # the synthetic world's answer key: checks the outcome, never shown to the policy
        extra["answer"] = dict(query.extra["answer"])
    benchmark = "restbench-tmdb" if query.benchmark == "restbench" else query.benchmark
    return SearchTask(query_id=query.query_id, query=query.query, env=env, benchmark=benchmark,
                      group=query.group, extra=extra)


# The bearer token ``tools_backend: http`` sends to your API, when this variable is set (redacted
# everywhere like every *TOKEN* variable); TMDB's own token stays with the ``tmdb`` backend.
HTTP_TOKEN_ENV = "CODETOOL_TOOL_TOKEN"


def tool_backend_options(kind: str, server_url: str | None, cache_dir: str | None) -> dict[str, Any]:
    """Keyword options of ``make_tool_backend(kind)`` from the two settings runs and trees share.

    Raises:
        ConfigError: ``cache`` without a cache folder, or ``server`` without a URL.
    """
    options: dict[str, Any] = {}
    if kind == "http":  # your own REST API: the spec's server, or --tool_server_url; a token only if you set one
        return {"base_url": server_url, "token_env": HTTP_TOKEN_ENV}
    if kind in ("server", "stabletoolbench") and server_url:
        options["url"] = server_url
    elif kind == "server":
        raise ConfigError("tools_backend server needs --tool_server_url (e.g. http://127.0.0.1:8080/virtual).")
    if kind == "cache":
        if not cache_dir:
            raise ConfigError("tools_backend cache needs --tool_cache_dir (a StableToolBench response cache).")
        options["root"] = cache_dir
    elif kind == "stabletoolbench" and cache_dir:
        options["cache_dir"] = cache_dir
    return options


@contextlib.contextmanager
def tool_backend(kind: str, *, benchmark: str | None = None, data_dir: str | None = None,
                 server_url: str | None = None, cache_dir: str | None = None) -> Iterator[Any]:
    """The tool backend of a run, for the duration of the ``with`` block.

    ``auto`` is our TMDB mock on RestBench (``benchmark == "restbench-tmdb"``), the world's tools
    on the synthetic world (``benchmark == "world"``) and the simulator otherwise; ``mock-tmdb`` starts the mock (a guarded app, ``codetool.serving``) on a free
    loopback port and stops it when the block ends; ``world`` is the synthetic world's
    :class:`~codetool.world.WorldBackend`.

    Raises:
        ConfigError: see :func:`tool_backend_options`.
    """
    from codetool.tools.backends import make_tool_backend

    if kind == "auto":
        kind = {"restbench-tmdb": "mock-tmdb", "world": "world"}.get(benchmark or "", "simulator")
    if kind == "world":  # the synthetic world (codetool.world stands on tools: tools' table cannot name it)
        from codetool.world import WorldBackend

        yield WorldBackend()
        return
    if kind == "mock-tmdb":
        from codetool.serving import serve_in_background
        from codetool.tools.loaders import data_root
        from codetool.tools.mock_servers import build_tmdb_app
        from codetool.tools.openapi import load_openapi

        root = Path(data_dir) if data_dir else data_root()
        app = build_tmdb_app(load_openapi(root / "RestGPT" / "specs" / "tmdb_oas.json", tool="tmdb"))
        with serve_in_background(app) as url:
            port = int(url.rsplit(":", 1)[1])
            logger.info("TMDB mock serving on %s", url)
            yield make_tool_backend("mock-tmdb", port=port)
        return
    yield make_tool_backend(kind, **tool_backend_options(kind, server_url, cache_dir))


if TYPE_CHECKING:
    # The seams' other implementations, held to their Protocols by the type checker (make lint), as
    # the tables above hold theirs: a method whose signature drifts from its Protocol is an error.
    from codetool.executor import Executor
    from codetool.rewards import ConstantScorer
    from codetool.search.schedule import Serialized
    from codetool.tools.backends import FallbackBackend
    from codetool.tools.spec import ToolBackend

    SEAMS: tuple[type[StepExecutor], type[PRMScorer], type[PRMScorer], type[ToolBackend]] = (
        Executor, ConstantScorer, Serialized, FallbackBackend)
