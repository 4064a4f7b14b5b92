"""The Python API: score candidate steps with a PRM, run the search over your own tools, read the
trajectories. Everything here is also reachable from the command line; these are the few calls a
script or a notebook needs (docs/API.md has the examples, and a test runs each of them).

    from codetool.api import PRM, load_tools, read_trajectories, search

    prm = PRM("checkpoints/prm/quickstart")            # a train-prm folder, or a serve-prm URL
    tools = load_tools("examples/library/openapi.json")
    scores = prm.score_candidates("Is book 17 on the shelf?", tools,
                                  candidates=["print(get_books_book_id(book_id=17))", "finish('yes')"])
    trajectories = search("examples/library/queries.json", tools="examples/library/openapi.json",
                          output="runs/library/trajectories.jsonl")

Guarantees: the calls take the settings of the commands (``search`` takes any ``codetool run``
setting by its dotted name), so a result here is the result the CLI gives; nothing prints.
Limits: ``search`` runs in this process (one machine; ``--ray`` is the CLI's); a PRM loads once
per :class:`PRM` object, so keep the object for many calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from codetool.rewards import PRMItem
from codetool.search.records import Trajectory
from codetool.tools.files import load_queries, load_tools
from codetool.tools.render import render_tools
from codetool.tools.spec import APISpec

__all__ = ["PRM", "PRMItem", "Trajectory", "load_queries", "load_tools", "read_trajectories", "render_tools",
           "search"]


class PRM:
    """A process reward model to score candidate steps.

    Args:
        prm (`str`): a checkpoint folder written by ``codetool train-prm``, the URL of a ``codetool
            serve-prm`` server (``http://127.0.0.1:8600``), or ``vllm:FOLDER`` on a GPU.
        device (`str`, *optional*, defaults to `"auto"`): ``auto``, ``cpu`` or ``cuda`` for a folder.

    Raises:
        CodetoolError: the folder is not a PRM checkpoint (or ``prm`` is ``none``).
    """

    def __init__(self, prm: str, *, device: str = "auto"):
        from codetool import CodetoolError
        from codetool.models.spec import ModelSpec
        from codetool.prm.scorer import load_scorer

        spec = ModelSpec.parse(str(prm), role="prm")
        if spec.kind == "none":
            raise CodetoolError(f"PRM({prm!r}): pass a PRM checkpoint folder or a serve-prm URL.")
        self.name = str(prm)
        self.scorer = load_scorer(spec, device=device)

    def score(self, items: Sequence[PRMItem | Mapping[str, Any]]) -> list[float]:
        """Score items (:class:`~codetool.rewards.PRMItem`, or dicts with its fields: the body
        of ``POST /score``, docs/SERVING.md).

        Returns:
            `list[float]`: one probability in [0, 1] per item (higher: the more promising step).
        """
        batch = [item if isinstance(item, PRMItem) else PRMItem(**dict(item)) for item in items]
        return list(self.scorer.score(batch)) if batch else []

    def score_candidates(self, query: str, tools: str | Sequence[APISpec], candidates: Sequence[str], *,
                         history: Sequence[Mapping[str, str]] = (), tool_doc: str = "full") -> list[float]:
        """Score the K candidate snippets of one step.

        Args:
            query (`str`): the user request.
            tools (`str` or `list[APISpec]`): the tools as the policy saw them: rendered text, or the
                APIs (:func:`load_tools`), rendered here with ``tool_doc``.
            candidates (`list[str]`): each candidate's Python code.
            history (`list[dict]`, *optional*): earlier chosen steps, ``{"code", "output"}`` each.
            tool_doc (`str`, *optional*, defaults to `"full"`): ``full``, ``compact`` or ``brief``; use
                the setting the PRM was trained with.

        Returns:
            `list[float]`: one score per candidate, in order.
        """
        text = tools if isinstance(tools, str) else render_tools(list(tools), style=tool_doc)
        steps = [{"code": str(h.get("code", "")), "output": str(h.get("output", ""))} for h in history]
        return self.score([PRMItem(query=query, tools=text, history=steps, candidate=code) for code in candidates])


def search(queries: str | Path | None = None, *, tools: str | Path | None = None, query: str | None = None,
           policy: str = "default", prm: str = "none", output: str | Path = "runs/api/trajectories.jsonl",
           settings: Mapping[str, Any] | None = None) -> list[Trajectory]:
    """Run the stepwise search (``codetool run``) and return its trajectories.

    Args:
        queries (`str` or `Path`, *optional*): a query file or folder: ToolBench format, or RestGPT's
            layout (a list of ``{query, solution}``) with ``tools``.
        tools (`str` or `Path`, *optional*): the OpenAPI spec (or api_list) the queries may call.
        query (`str`, *optional*): one query instead of ``queries`` (needs ``tools``).
        policy (`str`, *optional*, defaults to `"default"`): the embedded model, a folder, a Hub id,
            or an OpenAI-compatible URL (``http://127.0.0.1:8001/v1``).
        prm (`str`, *optional*, defaults to `"none"`): the latent reward: a PRM folder, a serve-prm
            URL, ``rollout`` or ``none`` (on-the-spot reward only).
        output (`str` or `Path`, *optional*): the trajectory file (JSON Lines; a rerun resumes it).
        settings (`dict`, *optional*): any other ``codetool run`` setting by its dotted name, e.g.
            ``{"search.k": 2, "search.max_steps": 3, "tools_backend": "http"}``.

    Returns:
        `list[Trajectory]`: one per query, in the order of the queries.

    Raises:
        CodetoolError: a setting or file is wrong (the message says what to change).
    """
    from codetool.commands.run import execute_run
    from codetool.config import load_config
    from codetool.jobs.queries import RunConfig, load_benchmark, query_key, record_key, single_query

    overrides: dict[str, Any] = {"policy": policy, "prm": prm, "output": str(output), **dict(settings or {})}
    for name, value in (("queries", queries), ("tools", tools), ("query", query)):
        if value is not None:
            overrides[name] = str(value)
    cfg = load_config(RunConfig, overrides=overrides)
    path = execute_run(cfg, show_summary=False)

    wanted = [query_key(q) for q in ([single_query(cfg)] if cfg.query is not None else load_benchmark(cfg))]
    by_key = {record_key(t.to_dict()): t for t in read_trajectories(path)}
    return [by_key[k] for k in wanted if k in by_key]


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """The trajectories of a file written by ``codetool run``, ``search`` or the pipeline (a torn
    last line, from a killed writer, is skipped).

    Each :class:`~codetool.search.records.Trajectory` has ``query``, ``final_answer``,
    ``finish_type`` and ``steps``; a step's ``candidates`` each hold ``code``, the execution
    ``result`` (``ok``, ``stdout``, ``tool_calls``...), the rewards ``r_spot`` and ``r_latent``
    and the selection ``score``; ``step.chosen_candidate`` is the one the search kept.
    """
    from codetool.jsonl import read_jsonl

    return [Trajectory.from_dict(record) for record in read_jsonl(path)]
