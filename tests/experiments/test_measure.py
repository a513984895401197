"""A failure's recovery time is read off the hit attempt's own progress marks and the committing
attempt's step times (:mod:`faasdl.experiments.measure`)."""

from __future__ import annotations

from typing import Any

import pytest

from faasdl.experiments.measure import recovery_s
from faasdl.experiments.runner import Hit, Marks, Outcome


def hit(at: float, marks: Marks) -> Hit:
    return Hit(invocation=0, activation_id="a", kind="kill", at=at, started_at=0.0, marks=marks)


def final(resumed_from: int | None, first_step_at: float, step_ends: list[float]) -> Outcome:
    answer: dict[str, Any] = {
        "resumed_from": resumed_from,
        "first_step_at": first_step_at,
        "step_ends": step_ends,
    }
    return Outcome(0, final=answer)


#: Killed 0.3 s into its fourth step, having ended three (a step every second from t=10).
KILLED = hit(13.3, ((0, 10.0), (1, 11.0), (2, 12.0), (3, 13.0)))


def test_a_resumed_attempt_recovers_once_it_has_spent_as_long_on_the_lost_step() -> None:
    # Resumed from step 3 at t=14 (the restart took 0.7 s): it is back where the killed attempt
    # was at t=14.3, 1.0 s after the kill.
    resumed = final(3, 14.0, [15.0, 16.0])
    assert recovery_s(KILLED, resumed) == pytest.approx(1.0)


def test_an_attempt_resumed_from_an_older_checkpoint_also_redoes_the_steps_since() -> None:
    # Resumed from step 1 at t=14: it ends step 3 at t=16, and is back at t=16.3.
    resumed = final(1, 14.0, [15.0, 16.0, 17.0, 18.0])
    assert recovery_s(KILLED, resumed) == pytest.approx(3.0)


def test_a_restarted_attempt_redoes_every_step_the_killed_one_had_ended() -> None:
    restarted = final(None, 14.0, [14.5, 15.0, 15.5, 16.0, 16.5])
    assert recovery_s(KILLED, restarted) == pytest.approx(2.5)


def test_marks_written_after_the_kill_was_fired_do_not_count() -> None:
    # The step that ended as the kill was on its way is lost with the container's answer.
    late = hit(13.3, (*KILLED.marks, (4, 13.4)))
    assert recovery_s(late, final(3, 14.0, [15.0, 16.0])) == pytest.approx(1.0)


def test_a_recovery_is_not_measured_without_marks_before_the_hit_or_an_answer() -> None:
    resumed = final(3, 14.0, [15.0, 16.0])
    assert recovery_s(hit(9.0, ((0, 10.0),)), resumed) is None  # before its first step
    assert recovery_s(hit(13.3, ()), resumed) is None  # no marks kept
    assert recovery_s(KILLED, Outcome(0)) is None  # the committing attempt did not answer
