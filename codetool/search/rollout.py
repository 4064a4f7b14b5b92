"""Rollout values: a candidate step judged by short single-sample paths completed from it.

Used by ``search.latent: rollout`` (CodeTool's Monte Carlo alternative to a trained PRM) and by the
``lookahead`` strategy (:mod:`codetool.search.lookahead`). Each rollout starts from its own fork
of the candidate's executor state, so no tool call of the path is repeated.

``search.rollout_value`` says what a rollout is worth:

- ``success``: CodeTool's latent reward ``alpha^(1-LR) * beta^(tau/L)`` (Lu et al., ACL 2025, §3.2)
  with LR the rollouts' share of grounded successes and tau their mean length;
- ``prm``: the PRM's score of each rollout's last chosen step, averaged (the lookahead of HF
  search-and-learn, after Snell et al. 2024): at small depths most rollouts have not finished,
  so a success share is mostly 0 and cannot tell candidates apart, while a PRM score can;
- ``auto`` (default): ``prm`` when the search has a PRM scorer, else ``success``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from codetool.rewards import PRMItem, grounded_success, latent_reward, not_executed, score_items
from codetool.search.episode import Episode, Episodes, SearchParts, account, prm_tokens
from codetool.search.prompt import history_entry
from codetool.search.records import Trajectory

if TYPE_CHECKING:
    from codetool.search.expand import Expanded


def rollout_value(search: Episodes, ep: Episode, e: Expanded) -> float | None:
    """Latent reward in [0, 1] of candidate ``e`` of episode ``ep`` from ``search.rollouts`` rollouts.

    Rollouts are greedy single-sample searches of at most ``rollout_max_steps`` steps at
    ``rollout_temperature``; their generated tokens, tool calls and forks are added to ``ep``'s
    compute, and PRM-scored tokens too under ``rollout_value: prm``. A candidate without code is
    worth 0; one that ended the episode is its own leaf (its grounded success, or its PRM score).
    A candidate that was not executed, or whose every rollout was not (a failure of the machine),
    has no value (``None``); a rollout that was not executed is left out of the others' mean.
    """
    cfg = search.cfg
    if e.candidate.code is None:
        return 0.0
    if not_executed(e.result) or e.state is None:  # no state: the executor raised (the episode ends as an error)
        return None
    by_prm = search.scorer is not None and cfg.rollout_value in ("prm", "auto")  # prm without one: refused earlier
    names = [api.name for api in ep.task.env.apis]
    path_calls = ep.traj.executed_calls() + list(e.result.tool_calls)
    if e.ended and by_prm:
        return _mean_prm_score(search, ep, [search.prm_item(ep.task, ep.history, e.candidate, e.observation)])
    if e.ended:
        lr = float(e.ended == "finish" and bool(e.result.ok) and grounded_success(e.result.final_answer, path_calls, names,
                                                             query=ep.task.query))
        return latent_reward(lr, 0.0, alpha=cfg.alpha, beta=cfg.beta, max_len=cfg.max_len)
    sub_cfg = replace(cfg, k=1, latent="none", w_latent=0.0, max_steps=cfg.rollout_max_steps,
                      concurrency=cfg.rollouts, strategy="greedy",
                      temperature=cfg.temperature if cfg.rollout_temperature is None else cfg.rollout_temperature)
    history = ep.history + [history_entry(e.candidate, e.observation)]
    states = [e.state.fork() for _ in range(cfg.rollouts)]
    runner = Episodes(SearchParts(search.policy, make_executor=lambda task: states.pop()), sub_cfg)
    tasks = [replace(ep.task, query_id=f"{ep.task.query_id}#rollout{j}", history=history)
             for j in range(cfg.rollouts)]
    paths: list[Trajectory] = []
    runner.run(tasks, paths.append)
    successes, lengths, ends = [], [], []
    for traj in paths:
        account(ep.traj, traj)
        ep.traj.executor_forks += 1
        if traj.extra.get("not_executed"):  # the machine could not run it: no information
            continue
        successes.append(float(traj.finish_type == "finish" and grounded_success(
            traj.final_answer, path_calls + traj.executed_calls(), names, query=ep.task.query)))
        lengths.append(len(traj.steps))
        last = traj.steps[-1].chosen_candidate if traj.steps else None
        if by_prm and last is not None and last.code is not None:
            before = history + [history_entry(s.chosen_candidate, s.observation) for s in traj.steps[:-1]]
            ends.append(search.prm_item(ep.task, before, last, traj.steps[-1].observation))
        elif by_prm:  # the rollout made no step with code: the candidate is the last step scored
            ends.append(search.prm_item(ep.task, ep.history, e.candidate, e.observation))
    if by_prm:
        return _mean_prm_score(search, ep, ends) if ends else None
    if not successes:  # every rollout was not executed: no value (select gives it its siblings' mean)
        return None
    lr = sum(successes) / len(successes)
    tau = sum(lengths) / len(lengths)
    return latent_reward(lr, tau, alpha=cfg.alpha, beta=cfg.beta, max_len=cfg.max_len)


def _mean_prm_score(search: Episodes, ep: Episode, steps: list[PRMItem | None]) -> float:
    """Mean PRM score of ``steps``' items (each a step with code, so each has one); their tokens are
    counted on ``ep``'s trajectory."""
    assert search.scorer is not None  # by_prm: a scorer exists
    items = [item for item in steps if item is not None]
    assert len(items) == len(steps), "a step without code has no PRM item"
    values = score_items(search.scorer, items)  # one per item, else ScorerFault (the machine's failure)
    ep.traj.prm_scored_tokens += prm_tokens(search.scorer, items)
    return float(sum(values) / len(values))
