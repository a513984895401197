"""What the experiments measure from a run: per failure, its recovery time.

Recovery time (the thesis' "failure recovery time") is measured per failure, from the moment the
fault hit an attempt to the moment a later attempt of the same invocation is back at the progress
the hit one had reached: the restart (detection, a container, a restore) plus the work redone
(from the last checkpoint, or from the start without one). How far the hit attempt had got is
read off its own progress marks (:class:`~.runner.Hit`): it had ended ``k`` steps and spent
``x`` seconds on the next; a later attempt is back there once it has ended step ``k`` (or
resumed from it) and spent ``x`` seconds on the next, so the recovery time is from the hit
attempt's end of step ``k`` to the later one's. The same for every strategy; a hit attempt
that was running slowly has less to redo, and one that was running fast more.
"""

from __future__ import annotations

from faasdl.experiments.runner import Hit, Outcome


def recovery_s(hit: Hit, outcome: Outcome) -> float | None:
    """The recovery time of one failure (see the module's doc); ``None`` when it cannot be read:
    the hit attempt left no mark before the hit (it had not begun its first step), or the
    committing attempt did not answer (it crashed after its commit)."""
    final = outcome.final
    before = [(done, at) for done, at in hit.marks if at <= hit.at]
    if not before or "step_ends" not in final:
        return None
    done, ended_at = before[-1]
    resumed = final.get("resumed_from") or 0
    if done <= resumed:
        back_at = float(final["first_step_at"])
    else:
        back_at = float(final["step_ends"][done - resumed - 1])
    return max(back_at - ended_at, 0.0)
