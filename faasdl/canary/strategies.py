"""Recovery strategies: what a job's attempts do while they run and what happens when one fails.

Every strategy commits each unit exactly once (the fenced commit of :mod:`.checkpoint` is always
on); they differ in what they spend to recover faster:

=====================  ===========  ==========  ======  ====================  =====================
strategy               checkpoints  heartbeats  copies  warm replicas         after a failure
=====================  ===========  ==========  ======  ====================  =====================
``canary`` (default)   yes          yes         1       by failure rate       resume from the head
``retry``              no           no          1       none                  run again from zero
``request_replication`` no          no          k       none                  the other copies go
                                                                              on; all lost: again
``active_standby``     no           yes         1       one per active unit   run again from zero
``none``               no           no          1       none                  the job fails
=====================  ===========  ==========  ======  ====================  =====================
"""

from __future__ import annotations

import math
from abc import ABC
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Literal

from faasdl.platform.classify import Failure, FailureKind

ReplicationMode = Literal["dynamic", "aggressive", "lenient"]


class Recovery(StrEnum):
    RESUME = "resume"  # a new attempt from the unit's latest checkpoint (from zero if none)
    RESTART = "restart"  # a new attempt from zero
    WAIT = "wait"  # nothing: other copies of the unit are still running
    FAIL = "fail"  # the job fails


def replication_factor(
    mode: ReplicationMode, *, active: int, failures: int, attempts: int, overlap: float = 1.0
) -> int:
    """Warm replicas to keep for ``active`` running units of one runtime.

    aggressive: one per active unit; lenient: one; dynamic (Canary's default): the replicas the
    observed failure rate says will be needed before a used one is replaced, doubled for
    headroom — at least one. The rate is smoothed towards 10% while there are few attempts.
    ``overlap`` is how many attempts a unit runs while one replica warms up (a replica's warm-up
    time over an attempt's duration; 1 when shorter or unknown): a runtime that takes longer to
    warm up than its attempts take to run needs more replicas: at most one per active unit, two
    when a warm-up outlasts an attempt (more could not be warmed up in time where failures come
    faster than that).
    """
    if active <= 0:
        return 0
    if mode == "aggressive":
        return active
    if mode == "lenient":
        return 1
    overlap = max(1.0, overlap)
    rate = (failures + 1) / (attempts + 10)
    most = active * min(2, math.ceil(overlap))
    return max(1, min(most, math.ceil(2 * rate * active * overlap)))


@dataclass(frozen=True)
class RecoveryStrategy(ABC):
    """How a job's units run and recover; pure decisions, the job runner acts on them."""

    name: ClassVar[str]
    checkpoints: ClassVar[bool] = False
    heartbeats: ClassVar[bool] = False
    max_attempts: int = 4
    copies: int = 1
    replication: ReplicationMode = "dynamic"

    def replicas(self, *, active: int, failures: int, attempts: int, overlap: float = 1.0) -> int:
        """Warm replicas of the training runtime to keep while ``active`` units run (``overlap``:
        see :func:`replication_factor`)."""
        return 0

    def recover(self, failure: Failure, *, failures: int, live: int) -> Recovery:
        """What to do after an attempt of a unit failed with ``failure``.

        ``failures``: the unit's failures in a row that made no progress, this one included (an
        attempt that moved the unit's checkpoint head resets it: running out of time or being
        killed after checkpointing is how long work gets done); ``live``: other attempts of the
        unit still running (copies). An application error is never retried (the same input
        fails the same way).
        """
        if failure.kind is FailureKind.APPLICATION_ERROR:
            return Recovery.FAIL
        if live > 0:
            return Recovery.WAIT
        if failures >= self.max_attempts:
            return Recovery.FAIL
        return Recovery.RESUME if self.checkpoints else Recovery.RESTART


@dataclass(frozen=True)
class Canary(RecoveryStrategy):
    name: ClassVar[str] = "canary"
    checkpoints: ClassVar[bool] = True
    heartbeats: ClassVar[bool] = True

    def replicas(self, *, active: int, failures: int, attempts: int, overlap: float = 1.0) -> int:
        return replication_factor(
            self.replication,
            active=active,
            failures=failures,
            attempts=attempts,
            overlap=overlap,
        )


@dataclass(frozen=True)
class Retry(RecoveryStrategy):
    name: ClassVar[str] = "retry"


@dataclass(frozen=True)
class RequestReplication(RecoveryStrategy):
    name: ClassVar[str] = "request_replication"
    copies: int = 2


@dataclass(frozen=True)
class ActiveStandby(RecoveryStrategy):
    name: ClassVar[str] = "active_standby"
    heartbeats: ClassVar[bool] = True

    def replicas(self, *, active: int, failures: int, attempts: int, overlap: float = 1.0) -> int:
        return active


@dataclass(frozen=True)
class NoRecovery(RecoveryStrategy):
    name: ClassVar[str] = "none"

    def recover(self, failure: Failure, *, failures: int, live: int) -> Recovery:
        return Recovery.WAIT if live > 0 else Recovery.FAIL


STRATEGIES: dict[str, type[RecoveryStrategy]] = {
    s.name: s for s in (Canary, Retry, RequestReplication, ActiveStandby, NoRecovery)
}

StrategyName = Literal["canary", "retry", "request_replication", "active_standby", "none"]


def make_strategy(
    name: StrategyName, *, max_attempts: int, copies: int, replication: ReplicationMode
) -> RecoveryStrategy:
    """The strategy called ``name`` (see :data:`STRATEGIES`)."""
    cls = STRATEGIES[name]
    if cls is RequestReplication:
        return RequestReplication(max_attempts=max_attempts, copies=copies, replication=replication)
    return cls(max_attempts=max_attempts, replication=replication)
