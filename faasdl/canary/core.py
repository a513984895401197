"""Canary's core, the pure part: leases, the observed time between failures, and what a failure
report says. The job runner (:mod:`faasdl.controller.events`) does the I/O: it reads the units'
heartbeats, fences by claiming, and invokes the recovering attempt."""

from __future__ import annotations

from faasdl.platform.classify import Failure, FailureKind
from faasdl.store.records import FunctionInfo, UnitState

#: A lease lapses after this many heartbeat periods without a beat (attempts beat twice a period,
#: so one late beat is tolerated, and a hung attempt is caught within 1 to 1.5 periods).
LEASE_PERIODS = 1.5
#: The mean time between failures assumed before any failure was seen.
DEFAULT_MTBF_S = 3600.0


def lease_ms(heartbeat_s: float) -> int:
    return int(LEASE_PERIODS * heartbeat_s * 1000)


def hung(unit: FunctionInfo, token: int, *, now_ms: int, heartbeat_s: float) -> Failure | None:
    """The attempt ``token`` is hung if it owns the running unit, has beaten at least once (a
    cold start or a queued activation has not) and its last beat is older than the lease."""
    if heartbeat_s <= 0 or unit.owner_epoch != token or unit.heartbeat_ms is None:
        return None
    if unit.state is not UnitState.RUNNING:
        return None
    silent, lease = now_ms - unit.heartbeat_ms, lease_ms(heartbeat_s)
    if silent <= lease:
        return None
    return Failure(FailureKind.HUNG, f"no heartbeat for {silent} ms (lease {lease} ms)")


def mtbf_s(running_s: float, failures: int) -> float:
    """Observed mean time between failures: attempt time per failure (a prior of one failure
    per :data:`DEFAULT_MTBF_S` while there are few)."""
    return (running_s + DEFAULT_MTBF_S) / (failures + 1)
