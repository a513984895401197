"""What every faasdl action shares (faasdl.actionkit), run as actions on the embedded platform."""

from __future__ import annotations

from collections.abc import Callable

from faasdl.platform.base import ActionSpec
from faasdl.platform.local import LocalPlatform
from tests.platform import actions

STACK_HEADER = "most recent call first"


def test_an_action_killed_at_its_time_limit_leaves_every_threads_stack_in_its_logs(
    make_local: Callable[..., LocalPlatform],
) -> None:
    # Arrange
    platform = make_local()
    platform.deploy(ActionSpec(name="stuck", code=actions.FAASDL_STUCK, timeout_ms=2000))

    # Execute
    stuck = platform.call("stuck", {"seconds": 30})
    finished = platform.call("stuck", {"seconds": 0})

    # Assert: the dump names where it waited; one that finishes in time dumps nothing (no dump
    # armed to go off at once).
    assert stuck.timed_out, stuck.error
    dumped = "\n".join(stuck.logs)
    assert STACK_HEADER in dumped
    assert "in stuck_waiting" in dumped
    assert finished.success, finished.error
    assert not any(STACK_HEADER in line for line in finished.logs)


def test_the_stack_dump_comes_while_every_thread_is_busy_in_python_and_leaves_it_timed_out(
    make_local: Callable[..., LocalPlatform],
) -> None:
    # Arrange: four threads calling and returning all the time (their frames never still), in
    # an action with 10 s: its dump comes 1 s before the limit (STACK_DUMP_BEFORE_DEADLINE_S),
    # as in any action of 10 s or more. (Its timer's thread waits for the GIL behind three busy
    # ones, each hand-over a draw: with 3 s, 0.3 s before, a loaded CI machine killed it first
    # in a5def54's run; with 1 s, 0.1 s before, in an earlier one.)
    platform = make_local()
    platform.deploy(ActionSpec(name="busy", code=actions.FAASDL_BUSY, timeout_ms=10_000))

    # Execute
    busy = platform.call("busy", {"seconds": 30})

    # Assert: killed at its limit (not crashed by the dump), every thread's stack in its logs.
    assert busy.timed_out, busy.error
    dumped = "\n".join(busy.logs)
    assert "in busy_churning" in dumped
    assert dumped.count("in churning") >= 4
