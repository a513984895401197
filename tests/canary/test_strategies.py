"""Recovery decisions, replication factors and leases: pure functions on tiny inputs."""

from __future__ import annotations

import pytest

from faasdl.canary.core import ContainerLoss, ContainerLosses, hung, lease_ms, lost, mtbf_s
from faasdl.canary.strategies import (
    Recovery,
    RecoveryStrategy,
    StrategyName,
    make_strategy,
    replication_factor,
)
from faasdl.platform.classify import Failure, FailureKind
from faasdl.store.records import CheckpointHead, FunctionInfo, UnitState

CRASH = Failure(FailureKind.CRASH, "killed")
APP = Failure(FailureKind.APPLICATION_ERROR, "bad input")


def strategy(name: StrategyName, *, copies: int = 2) -> RecoveryStrategy:
    return make_strategy(name, max_attempts=3, copies=copies, replication="dynamic")


@pytest.mark.parametrize(
    ("name", "failure", "failures", "live", "expected"),
    [
        ("canary", CRASH, 1, 0, Recovery.RESUME),
        ("canary", CRASH, 3, 0, Recovery.FAIL),  # three in a row without progress
        ("canary", APP, 1, 0, Recovery.FAIL),
        ("retry", CRASH, 1, 0, Recovery.RESTART),
        ("retry", CRASH, 3, 0, Recovery.FAIL),
        ("request_replication", CRASH, 1, 1, Recovery.WAIT),  # the other copy goes on
        ("request_replication", CRASH, 1, 0, Recovery.RESTART),
        ("active_standby", CRASH, 1, 0, Recovery.RESTART),
        ("none", CRASH, 1, 0, Recovery.FAIL),
    ],
)
def test_what_each_strategy_does_after_a_failure(
    name: StrategyName, failure: Failure, failures: int, live: int, expected: Recovery
) -> None:
    assert strategy(name).recover(failure, failures=failures, live=live) is expected


def test_what_each_strategy_runs() -> None:
    canary, retry = strategy("canary"), strategy("retry")
    assert (canary.checkpoints, canary.heartbeats, canary.copies) == (True, True, 1)
    assert (retry.checkpoints, retry.heartbeats) == (False, False)
    assert strategy("request_replication", copies=3).copies == 3
    assert strategy("active_standby").replicas(active=5, failures=0, attempts=0) == 5
    assert retry.replicas(active=5, failures=9, attempts=10) == 0


def test_replication_factors() -> None:
    assert replication_factor("aggressive", active=8, failures=0, attempts=0) == 8
    assert replication_factor("lenient", active=8, failures=50, attempts=60) == 1
    calm = replication_factor("dynamic", active=8, failures=0, attempts=100)
    stormy = replication_factor("dynamic", active=8, failures=50, attempts=100)
    assert calm == 1
    assert 1 < stormy <= 8
    assert replication_factor("dynamic", active=0, failures=5, attempts=5) == 0


def test_dynamic_replication_covers_failures_while_a_replica_warms_up() -> None:
    # One unit whose attempts take a tenth of a replica's warm-up: at a 10% failure rate, a
    # second failure is likely before the used replica is replaced.
    quick = replication_factor("dynamic", active=1, failures=0, attempts=0, overlap=0.5)
    slow = replication_factor("dynamic", active=1, failures=0, attempts=0, overlap=10)
    assert quick == 1
    assert slow == 2
    assert replication_factor("aggressive", active=1, failures=0, attempts=0, overlap=10) == 1
    capped = replication_factor("dynamic", active=2, failures=90, attempts=100, overlap=2.5)
    assert capped == 2 * 2


def test_a_lease_lapses_only_for_the_owner_after_its_first_beat() -> None:
    unit = FunctionInfo(
        job_id="j", round=0, shard=0, state=UnitState.RUNNING, owner_epoch=2, heartbeat_ms=1000
    )
    lapsed = 1000 + lease_ms(1.0) + 1

    assert hung(unit, 2, now_ms=lapsed, heartbeat_s=1.0) is not None
    assert hung(unit, 2, now_ms=1000 + lease_ms(1.0), heartbeat_s=1.0) is None
    assert hung(unit, 1, now_ms=lapsed, heartbeat_s=1.0) is None  # not the owner any more
    fresh = unit.model_copy(update={"heartbeat_ms": None})
    assert hung(fresh, 2, now_ms=lapsed, heartbeat_s=1.0) is None  # still starting
    done = unit.model_copy(update={"state": UnitState.COMMITTED})
    assert hung(done, 2, now_ms=lapsed, heartbeat_s=1.0) is None


def test_a_lease_is_renewed_by_the_attempts_checkpoints_as_by_its_beats() -> None:
    # A beat at 1000, then checkpoints while the store held the next beats back: the owner's at
    # 2000 counts, the one a fenced attempt left at 3000 does not.
    heads = [
        CheckpointHead(blob="b1", owner_epoch=2, position=10, size=1, created_ms=2000),
        CheckpointHead(blob="b0", owner_epoch=1, position=5, size=1, created_ms=3000),
    ]
    unit = FunctionInfo(
        job_id="j",
        round=0,
        shard=0,
        state=UnitState.RUNNING,
        owner_epoch=2,
        heartbeat_ms=1000,
        heads=heads,
    )

    assert hung(unit, 2, now_ms=1000 + lease_ms(1.0) + 1, heartbeat_s=1.0) is None
    failure = hung(unit, 2, now_ms=2000 + lease_ms(1.0) + 1, heartbeat_s=1.0)
    assert failure is not None
    assert (
        failure.message == f"no heartbeat or checkpoint for {lease_ms(1.0) + 1} ms (lease 1500 ms)"
    )


def test_a_lost_container_ends_only_the_attempt_that_owns_the_unit_in_it() -> None:
    unit = FunctionInfo(
        job_id="j", round=0, shard=0, state=UnitState.RUNNING, owner_epoch=2, host="pod-a"
    )
    gone = ContainerLoss("pod-a", CRASH, at_ms=5)
    other = ContainerLoss("pod-b", CRASH, at_ms=5)

    assert lost(unit, 2, [other, gone]) == CRASH
    assert lost(unit, 2, [other]) is None
    assert lost(unit, 1, [gone]) is None  # a fenced attempt: its successor may run elsewhere
    assert lost(unit.model_copy(update={"host": None}), 2, [gone]) is None  # not yet beaten
    assert lost(unit.model_copy(update={"state": UnitState.COMMITTED}), 2, [gone]) is None


def test_every_reader_of_container_losses_sees_each_loss_once_from_its_own_cursor() -> None:
    losses = ContainerLosses(keep=3)
    first = losses.cursor
    losses.report(ContainerLoss("a", CRASH, 1))
    second = losses.cursor
    losses.report(ContainerLoss("b", CRASH, 2))

    seen_first, first = losses.since(first)
    seen_second, second = losses.since(second)
    again, _ = losses.since(first)
    assert [x.host for x in seen_first] == ["a", "b"]
    assert [x.host for x in seen_second] == ["b"]
    assert again == []
    for host in "cdef":
        losses.report(ContainerLoss(host, CRASH, 3))
    late, _ = losses.since(first)
    assert [x.host for x in late] == ["d", "e", "f"]  # the oldest are forgotten past keep


def test_the_observed_time_between_failures() -> None:
    assert mtbf_s(0, 0) == 3600
    assert mtbf_s(400, 9) == pytest.approx(400.0)
