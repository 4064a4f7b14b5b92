"""The rows of ``codetool run``'s one-screen summary (``codetool.commands.run.print_summary``):
outcomes (the machine's failures counted apart, left out of every rate), both SCEPs with their
counts, steps, tokens, time and tool cost from the run's metrics, then how remote servers were
used (the client limits and adaptations the trajectories recorded, each live client's requests,
retries, failovers, timeouts and sequences in flight).
"""

from __future__ import annotations

from typing import Any

from codetool.jobs import client_rows


def summary_rows(m, trajs: list, clients: dict[str, Any]) -> list[tuple[str, Any]]:
    """The rows of ``codetool run``'s one-screen summary: outcomes, SCEP, steps, tokens, time and
    tool cost from the run's metrics ``m`` (:func:`codetool.eval.metrics.run_metrics` of ``trajs``),
    then how remote servers were used (:func:`serving_rows`)."""
    rows = [("finished", m.finish_types.get("finish", 0)), ("gave up", m.finish_types.get("give_up", 0)),
            ("hit max steps", m.finish_types.get("max_steps", 0)), ("errors", m.finish_types.get("error", 0)),
            ("  not executed (the machine's failure: left out of every rate)",
             f"{m.not_executed_trajectories} episodes, {m.not_executed_candidates} candidates"),
            # Two counts of one idea side by side, each with its n: the public code re-runs each
            # chosen step as its search would, and a reply without a ```python block counts as failed.
            ("SCEP (public code's count: a reply without ```python fails)", "n/a" if m.scep is None
             else f"{100 * m.scep:.1f}% ({m.reference_successful} of {m.reference_steps} steps)"),
            ("  chosen code steps that ran in the search (ours)", "n/a" if m.scep_code_steps is None
             else f"{100 * m.scep_code_steps:.1f}% ({round(m.scep_code_steps * m.executed_chosen)} of "
                  f"{m.executed_chosen} steps)"),
            ("  over all sampled candidates", "n/a" if m.scep_all_candidates is None
             else f"{100 * m.scep_all_candidates:.1f}%"),
            ("answers written after the search", m.answer_sources.get("generated", 0)),
            ("mean steps", f"{m.mean_steps:.2f}"),
            ("tokens in / out per query", f"{m.mean_prompt_tokens:.0f} / {m.mean_completion_tokens:.0f}"),
            ("seconds per query", f"{m.mean_seconds:.1f}"),
            *((f"  {phase} s/query", f"{s:.1f}") for phase, s in m.phase_seconds.items()),
            ("mean tool cost (LIT)", f"{m.mean_tool_cost:.2f}")]
    return rows + serving_rows(trajs, clients)


def serving_rows(trajs: list, clients: dict) -> list[tuple[str, str]]:
    """Summary rows for remote servers: the client limits and adaptations recorded in the
    trajectories (the last one that has them), and for each live client of this run its
    requests, retries (the faults retried, by kind), failovers, timeouts and sequences in flight
    (peak and effective) (:func:`codetool.jobs.client_rows`)."""
    rows: list[tuple[str, str]] = []
    record: dict = next((t.serving for t in reversed(trajs) if t.serving), {})
    for name in ("policy", "prm"):
        part = record.get(name)
        if not part:
            continue
        rows.append((f"{name} server", f"{', '.join(part.get('endpoints', []))}: {part.get('client', '')}"))
        rows += [(f"  {name} adapted", text) for text in part.get("adaptations", [])]
        if part.get("identical_samples"):
            rows.append((f"  {name} identical samples", part["identical_samples"]))
    if record.get("schedule"):
        rows.append(("schedule", record["schedule"]))
    return rows + client_rows(clients)
