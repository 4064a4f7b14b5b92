"""The per-step reward plot of one example query (issue 16's one-screen report)."""

from __future__ import annotations

from codetool.eval.plots import example_query, example_step_rewards
from codetool.search.records import Candidate, Step, Trajectory


def traj(query_id: str, latent: bool, steps: int) -> Trajectory:
    out = []
    for s in range(steps):
        cands = [Candidate(i, "", "x = 1", r_spot=float(i == 0), r_latent=0.7 if latent else None,
                           score=1.7 if i == 0 else 0.7, chosen=i == 0) for i in range(2)]
        out.append(Step(index=s, candidates=cands, chosen=0))
    return Trajectory(query_id=query_id, query=f"query {query_id}", steps=out)


def test_example_query_prefers_latent_rewards_then_more_candidates(tmp_path):
    runs = {"spot-only": [traj("a", False, 3), traj("b", False, 1), traj("c", False, 1)],
            "spot+latent": [traj("a", False, 3), traj("b", True, 1), traj("d", True, 2)]}
    assert example_query(runs) == "b"  # "d" is not run by both methods; "b" has latent rewards
    runs["spot+latent"][1] = traj("b", False, 1)
    assert example_query(runs) == "a"  # no latent anywhere: the most candidates
    path = example_step_rewards(runs, tmp_path / "step_rewards.png")
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"
    assert example_step_rewards({"m": []}, tmp_path / "none.png") is None


def test_accuracy_curves_draw_one_panel_per_benchmark(tmp_path):
    from codetool.eval.plots import accuracy_curves

    panels = {"stabletoolbench": {"beam": [(200.0, 40.0, 10.0, 70.0), (100.0, 30.0, 0.0, 60.0)],
                                  "dvts": [(210.0, 50.0, 20.0, 80.0)]},
              "restbench-tmdb": {"beam": [(150.0, 20.0, 0.0, 50.0)], "empty": []}}
    path = accuracy_curves(panels, tmp_path / "curves.png", ylabels={"stabletoolbench": "grounded (%)"}, title="t")
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"
