"""What the experiments measure from a run: per failure, its recovery time; per run, totals.

Recovery time (the thesis' "failure recovery time") is measured per failure, from the moment the
fault hit an attempt to the moment a later attempt of the same invocation is back at the progress
the hit one had reached: the restart (detection, a container, a restore) plus the work redone
(from the last checkpoint, or from the start without one). The hit attempt's progress is read off
the failure-free run of the same invocation (its step times from its first heartbeat); the
recovering attempt's own step times say when it got back there. Both strategies are measured the
same way, so contention on the machine slows both alike.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from faasdl.experiments.runner import Hit, Outcome


def progress(
    elapsed_s: float, started_at: float, first_step_at: float, ends: Sequence[float]
) -> float:
    """Steps done (fractional) ``elapsed_s`` after ``started_at`` on the timeline of an attempt
    that started its first step at ``first_step_at`` and ended its steps at ``ends``."""
    marks = [first_step_at - started_at, *(t - started_at for t in ends)]
    if elapsed_s <= marks[0]:
        return 0.0
    j = bisect.bisect_right(marks, elapsed_s)
    if j >= len(marks):
        return float(len(ends))
    return j - 1 + (elapsed_s - marks[j - 1]) / max(marks[j] - marks[j - 1], 1e-9)


def reached_at(position: float, final: dict[str, Any]) -> float:
    """When the attempt that answered ``final`` reached ``position`` (fractional steps)."""
    resumed = final.get("resumed_from") or 0
    marks = [final["first_step_at"], *final["step_ends"]]
    at = max(position - resumed, 0.0)
    j = int(at)
    if j >= len(marks) - 1:
        return float(marks[-1])
    return float(marks[j] + (at - j) * (marks[j + 1] - marks[j]))


def recovery_s(hit: Hit, outcome: Outcome, ideal: dict[str, Any]) -> float | None:
    """The recovery time of one failure (see the module's doc); ``None`` when it cannot be read:
    the hit attempt's start is unknown, or the committing attempt did not answer (it crashed after
    its commit)."""
    final = outcome.final
    if hit.started_at is None or not final.get("step_ends") or not ideal.get("step_ends"):
        return None
    done = progress(
        hit.at - hit.started_at, ideal["started_at"], ideal["first_step_at"], ideal["step_ends"]
    )
    return max(reached_at(done, final) - hit.at, 0.0)
