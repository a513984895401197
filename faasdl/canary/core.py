"""Canary's core, the pure part: leases, the observed time between failures, and what a failure
report says. The job runner (:mod:`faasdl.controller.events`) does the I/O: it reads the units'
heartbeats, fences by claiming, and invokes the recovering attempt."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from faasdl.platform.classify import Failure, FailureKind
from faasdl.store.records import FunctionInfo, UnitState

#: A lease lapses after this many heartbeat periods without a beat or a checkpoint (attempts beat
#: twice a period, so one late beat is tolerated, and a hung attempt is caught within 1 to 1.5
#: periods).
LEASE_PERIODS = 1.5
#: The mean time between failures assumed before any failure was seen.
DEFAULT_MTBF_S = 3600.0


def lease_ms(heartbeat_s: float) -> int:
    return int(LEASE_PERIODS * heartbeat_s * 1000)


def hung(unit: FunctionInfo, token: int, *, now_ms: int, heartbeat_s: float) -> Failure | None:
    """The attempt ``token`` is hung if it owns the running unit, has beaten at least once (a
    cold start or a queued activation has not) and its last sign of life is older than the
    lease: its last beat or its newest checkpoint, whichever came later. Each is a write it
    landed as the unit's owner; under load (four trainers checkpointing every 20 ms into SQLite
    on two cores) an attempt landed checkpoints for over a lease without a beat."""
    if heartbeat_s <= 0 or unit.owner_epoch != token or unit.heartbeat_ms is None:
        return None
    if unit.state is not UnitState.RUNNING:
        return None
    checkpoints = (head.created_ms for head in unit.heads if head.owner_epoch == token)
    alive_ms = max([unit.heartbeat_ms, *checkpoints])
    silent, lease = now_ms - alive_ms, lease_ms(heartbeat_s)
    if silent <= lease:
        return None
    return Failure(
        FailureKind.HUNG, f"no heartbeat or checkpoint for {silent} ms (lease {lease} ms)"
    )


@dataclass(frozen=True)
class ContainerLoss:
    """A container the platform lost, as its cluster reports it (an OOM kill, a deleted or evicted
    pod): ``host`` is the host name the attempts in it ran under (on Kubernetes, the pod's name)."""

    host: str
    failure: Failure
    at_ms: int


def lost(unit: FunctionInfo, token: int, losses: Iterable[ContainerLoss]) -> Failure | None:
    """The attempt ``token`` is lost if it owns the running unit and its container is among
    ``losses``: sooner than its activation record or its lease say so."""
    if unit.owner_epoch != token or unit.state is not UnitState.RUNNING or unit.host is None:
        return None
    return next((loss.failure for loss in losses if loss.host == unit.host), None)


class ContainerLosses:
    """The containers lost lately, for every runner of a controller to read at its own pace
    (each keeps a cursor). Thread-safe; the oldest are forgotten past ``keep``."""

    def __init__(self, keep: int = 1024) -> None:
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self._log: deque[tuple[int, ContainerLoss]] = deque(maxlen=keep)

    def report(self, loss: ContainerLoss) -> None:
        with self._lock:
            self._log.append((next(self._seq), loss))

    @property
    def cursor(self) -> int:
        """The cursor of the latest loss (0: none yet)."""
        with self._lock:
            return self._log[-1][0] if self._log else 0

    def since(self, cursor: int) -> tuple[list[ContainerLoss], int]:
        """The losses reported after ``cursor``, and the cursor to read from next."""
        with self._lock:
            new = [(seq, loss) for seq, loss in self._log if seq > cursor]
        return [loss for _, loss in new], (new[-1][0] if new else cursor)


def mtbf_s(running_s: float, failures: int) -> float:
    """Observed mean time between failures: attempt time per failure (a prior of one failure
    per :data:`DEFAULT_MTBF_S` while there are few)."""
    return (running_s + DEFAULT_MTBF_S) / (failures + 1)
