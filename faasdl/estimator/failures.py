"""What to change after a failed training activation, decided from its classified failure.

Pure: :func:`correct` takes the failure and the limits it ran under and returns the limits of the
next attempt; the caller persists the limits it failed under (:func:`.history.record_failure`),
and until a run of the same model signature succeeds the next job's plan starts where this
correction would (:func:`grown_memory_mb`, :func:`grown_timeout_ms`), not just above them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from faasdl.errors import EstimationError
from faasdl.platform.classify import Failure, FailureKind

#: Growth of the memory limit after an out-of-memory kill (at least one class).
MEMORY_GROWTH = 1.5
#: Growth of the timeout after an out-of-time kill.
TIMEOUT_GROWTH = 2.0


@dataclass(frozen=True)
class Limits:
    memory_mb: int
    timeout_ms: int


def correct(
    failure: Failure,
    limits: Limits,
    *,
    current: Limits | None = None,
    step_mb: int,
    max_memory_mb: int,
    max_timeout_ms: int,
) -> Limits:
    """The limits for the next attempt of a unit that failed with ``failure`` under ``limits``.

    Out of memory raises memory by half (rounded up to a class); out of time doubles the timeout;
    anything else keeps the limits (a crash or an application error is not a sizing problem).
    ``current``: the job's limits now, which a failure of another attempt under the same
    ``limits`` may have raised already: the result is never below them, so that attempts that
    failed together raise a limit once, not once each. Raises ``EstimationError`` when
    ``limits`` were the platform's maximum already.
    """
    fixed = _corrected(
        failure, limits, step_mb=step_mb, max_memory_mb=max_memory_mb, max_timeout_ms=max_timeout_ms
    )
    if current is None:
        return fixed
    return Limits(
        max(fixed.memory_mb, current.memory_mb), max(fixed.timeout_ms, current.timeout_ms)
    )


def _corrected(
    failure: Failure, limits: Limits, *, step_mb: int, max_memory_mb: int, max_timeout_ms: int
) -> Limits:
    if failure.kind is FailureKind.OUT_OF_MEMORY:
        if limits.memory_mb >= max_memory_mb:
            raise EstimationError(
                f"out of memory at the platform's largest limit, {max_memory_mb} MB"
            )
        memory = min(max_memory_mb, grown_memory_mb(limits.memory_mb, step_mb=step_mb))
        return Limits(memory_mb=memory, timeout_ms=limits.timeout_ms)
    if failure.kind is FailureKind.OUT_OF_TIME:
        if limits.timeout_ms >= max_timeout_ms:
            raise EstimationError(
                f"out of time at the platform's longest limit, {max_timeout_ms} ms; "
                "checkpointing resumes such units in a new activation"
            )
        timeout = min(max_timeout_ms, grown_timeout_ms(limits.timeout_ms))
        return Limits(memory_mb=limits.memory_mb, timeout_ms=timeout)
    return limits


def grown_memory_mb(memory_mb: int, *, step_mb: int) -> int:
    """The memory limit after an out-of-memory kill under ``memory_mb``: half as much again, at
    least one class more, in whole classes."""
    grown = max(memory_mb * MEMORY_GROWTH, memory_mb + step_mb)
    return math.ceil(grown / step_mb) * step_mb


def grown_timeout_ms(timeout_ms: int) -> int:
    """The time limit after an out-of-time kill under ``timeout_ms``."""
    return math.ceil(timeout_ms * TIMEOUT_GROWTH)
