"""Fair step selection (issue 15): seeded random ties, cost only when weighted, never over R_spot."""

from __future__ import annotations

from codetool.search.config import SearchConfig
from codetool.search.records import Candidate
from codetool.search.search import select

SPOT_ONLY = SearchConfig(w_spot=1.0, w_latent=0.0, w_cost=0.0, latent="none")


def _finish_and_tool_call(tool_ok=True, finish_ok=True):
    # an executable tool-free finish (LIT cost 0.5) and a tool call (cost 4.06)
    return [Candidate(0, "", "finish('x')", r_spot=float(finish_ok), cost=0.5),
            Candidate(1, "", "print(api())", r_spot=float(tool_ok), cost=4.06)]


def test_equal_scores_break_by_a_seeded_random_pick_not_by_cost():
    picks = {select(_finish_and_tool_call(), SPOT_ONLY, tie_key=f"q{i}|0") for i in range(40)}
    assert picks == {0, 1}  # both equally good candidates get chosen, the costlier one too
    # the same seed and key always give the same pick; the seed changes it somewhere
    again = [select(_finish_and_tool_call(), SPOT_ONLY, tie_key=f"q{i}|0") for i in range(40)]
    assert again == [select(_finish_and_tool_call(), SPOT_ONLY, tie_key=f"q{i}|0") for i in range(40)]
    other = SearchConfig(w_spot=1.0, w_latent=0.0, latent="none", seed=7)
    assert again != [select(_finish_and_tool_call(), other, tie_key=f"q{i}|0") for i in range(40)]
    first = SearchConfig(w_spot=1.0, w_latent=0.0, latent="none", tie_break="first")
    assert select(_finish_and_tool_call(), first) == 0


def test_a_clear_score_difference_is_never_random():
    assert all(select(_finish_and_tool_call(finish_ok=False), SPOT_ONLY, tie_key=str(i)) == 1 for i in range(20))


def test_cost_never_overturns_an_on_the_spot_difference():
    # w_cost 0.5: the working tool call scores 1 - 0.5 * 4.06 = -1.03, the failing finish 0 - 0.25
    cfg = SearchConfig(w_spot=1.0, w_latent=0.0, w_cost=0.5, latent="none")
    cands = _finish_and_tool_call(finish_ok=False)
    assert select(cands, cfg) == 1
    assert [round(c.score, 6) for c in cands] == [-0.25, -1.03]


def test_among_equally_good_candidates_the_cost_method_picks_the_cheapest():
    cfg = SearchConfig(w_spot=1.0, w_latent=0.0, w_cost=0.1, latent="none")
    assert all(select(_finish_and_tool_call(), cfg, tie_key=str(i)) == 0 for i in range(20))
    # equal scores after the cost term (1 + 0.6 - 0.2 == 1 + 0.5 - 0.1): the cheaper one
    cfg = SearchConfig(w_spot=1.0, w_latent=1.0, w_cost=0.1, latent="none")
    tie = [Candidate(0, "", "a", r_spot=1.0, r_latent=0.6, cost=2.0),
           Candidate(1, "", "b", r_spot=1.0, r_latent=0.5, cost=1.0)]
    assert all(select(tie, cfg, tie_key=str(i)) == 1 for i in range(20))
    # the cost still trades against the latent reward, as weighted: 1 + 0.5 - 0.4 < 1 + 0.45 - 0.05
    trade = [Candidate(0, "", "a", r_spot=1.0, r_latent=0.5, cost=4.0),
             Candidate(1, "", "b", r_spot=1.0, r_latent=0.45, cost=0.5)]
    assert select(trade, cfg) == 1


# ------------------------------------------------------------- not executed (issue 37)
def _lost(index, latent=0.9):
    from codetool.executor.result import ExecutionResult

    result = ExecutionResult(ok=False, outcome="not_executed", error_type="NotExecuted", attempts=3)
    return Candidate(index, "", "print(api())", result=result, r_spot=0.0, r_latent=latent)


def test_a_candidate_the_machine_could_not_run_is_never_chosen_for_its_other_rewards():
    from codetool.executor.result import ExecutionResult

    cfg = SearchConfig(w_spot=1.0, w_latent=1.0, latent="prm")
    def ran(index):
        return Candidate(index, "", "x = {}['k']", result=ExecutionResult(ok=False, outcome="runtime_error"),
                         r_spot=0.0, r_latent=0.3)

    # the lost candidate would score 0.9 > 0.3; it is no candidate at all: the one that ran is kept
    assert select([ran(0), _lost(1)], cfg) == 0
    assert select([_lost(0), ran(1)], cfg) == 1


def test_a_missing_latent_reward_beside_defined_ones_is_their_mean_not_zero():
    # a candidate whose every rollout was not executed has no latent value (None): it is neither
    # rejected (0) nor favoured; it gets the mean of its siblings' values
    cfg = SearchConfig(w_spot=1.0, w_latent=1.0, latent="rollout", tie_break="first")
    cands = [Candidate(0, "", "a", r_spot=1.0, r_latent=0.2), Candidate(1, "", "b", r_spot=1.0, r_latent=None),
             Candidate(2, "", "c", r_spot=1.0, r_latent=0.6)]
    assert select(cands, cfg) == 2
    assert [round(c.score, 6) for c in cands] == [1.2, 1.4, 1.6]


def test_a_tie_goes_to_the_candidate_whose_state_survived():
    """Both steps failed on the spot; one's code killed its worker (``state_lost``: the next step
    would start from nothing). Before: a random tie between them, so about half the seeds chose it."""
    from codetool.executor.result import ExecutionResult

    def pair():
        raised = ExecutionResult(ok=False, outcome="runtime_error", error_type="KeyError")
        killed = ExecutionResult(ok=False, outcome="worker_lost", error_type="WorkerLost", state_lost=True)
        return [Candidate(0, "", "import os; os._exit(3)", result=killed, r_spot=0.0),
                Candidate(1, "", "print(d['x'])", result=raised, r_spot=0.0)]

    assert {select(pair(), SPOT_ONLY, tie_key=f"q{i}|0") for i in range(40)} == {1}
    first = SearchConfig(w_spot=1.0, w_latent=0.0, latent="none", tie_break="first")
    assert select(pair(), first) == 1
    reference = SearchConfig(w_spot=1.0, w_latent=0.0, latent="none", tie_break="reference")
    assert select(pair(), reference) == 0  # the public code keeps candidate 1 of equals, whatever it did
