"""Canary's action-side API on every store: fencing, heads, restore, exactly-once commit."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from faasdl.canary.checkpoint import (
    WRITE_SWITCH_INTERVAL_S,
    CanaryArgs,
    Checkpointer,
    heads_to_keep,
    next_beat_s,
    young_interval_s,
)
from faasdl.errors import Superseded
from faasdl.store import StateStore
from faasdl.store.records import FunctionInfo, UnitState, fn_key, load, update
from tests.conftest import eventually

UNIT = fn_key("job", 0, 0)


def claim(store: StateStore, activation_id: str | None = None) -> int:
    """The controller's claim: owner_epoch e → e+1 on a running unit, whose activation is not
    known yet (or is ``activation_id``, recorded since); the new token."""

    def change(u: FunctionInfo | None) -> FunctionInfo:
        u = u or FunctionInfo(job_id="job", round=0, shard=0)
        return u.model_copy(
            update={
                "owner_epoch": u.owner_epoch + 1,
                "state": UnitState.RUNNING,
                "activation_id": activation_id,
            }
        )

    return update(store, UNIT, FunctionInfo, change).owner_epoch


def unit(store: StateStore) -> FunctionInfo:
    found = load(store, UNIT, FunctionInfo)
    assert found is not None
    return found[0]


def attempt(store: StateStore, token: int, **more: object) -> Checkpointer:
    args = CanaryArgs.model_validate(
        {"unit": UNIT, "token": token, "blobs": "ckpt/job", "heartbeat_s": 0} | more
    )
    return Checkpointer(store, args)


def save(ck: Checkpointer, value: int) -> None:
    ck.checkpoint(lambda: value, lambda v: str(v).encode(), position=value)
    ck.flush()


def test_a_superseded_attempt_gets_no_checkpoint_heartbeat_or_commit_accepted(
    store: StateStore,
) -> None:
    first = claim(store)
    with attempt(store, first) as zombie:
        save(zombie, 1)
        second = claim(store)  # the controller recovers the unit elsewhere
        with attempt(store, second) as successor:
            save(successor, 2)
            before = unit(store)

            zombie.checkpoint(lambda: 3, lambda v: str(v).encode(), position=3)
            with pytest.raises(Superseded):
                zombie.flush()
            with pytest.raises(Superseded):
                zombie.heartbeat()
            with pytest.raises(Superseded):
                zombie.commit("zombie/result")

            assert unit(store) == before
            assert [h.owner_epoch for h in before.heads] == [first, second]
            assert store.blob_manifest(f"ckpt/job/a{first:04d}-000002") is None  # no orphan
            successor.commit("result", examples=10)
    done = unit(store)
    assert (done.state, done.committed_result, done.examples) == (
        UnitState.COMMITTED,
        "result",
        10,
    )


def test_an_attempt_that_starts_after_being_fenced_is_refused(store: StateStore) -> None:
    old = claim(store)
    claim(store)

    with pytest.raises(Superseded, match="superseded"):
        attempt(store, old).__enter__()


def test_the_latest_heads_are_kept_and_older_checkpoints_deleted(store: StateStore) -> None:
    with attempt(store, claim(store), keep=3) as ck:
        for value in range(1, 6):
            save(ck, value)

        heads = unit(store).heads
        assert [h.position for h in heads] == [3, 4, 5]
        assert all(store.blob_manifest(h.blob) is not None for h in heads)
        assert store.blob_manifest("ckpt/job/a0001-000001") is None
        assert store.blob_manifest("ckpt/job/a0001-000002") is None
        restored = ck.restore(lambda b: int(b))
        assert restored is not None
        assert restored[0] == 5


def test_restore_falls_back_to_the_previous_head_when_the_newest_is_unreadable(
    store: StateStore,
) -> None:
    with attempt(store, claim(store)) as ck:
        save(ck, 1)
        save(ck, 2)
        store.delete_blob(unit(store).heads[-1].blob)

        restored = ck.restore(lambda b: int(b))

    assert restored is not None
    assert (restored[0], restored[1].position) == (1, 1)


def test_a_checkpoint_that_fails_to_persist_leaves_the_previous_head(store: StateStore) -> None:
    def broken(value: int) -> bytes:
        raise OSError("disk full")

    with attempt(store, claim(store)) as ck:
        save(ck, 1)
        ck.checkpoint(lambda: 2, broken, position=2)
        with pytest.raises(OSError, match="disk full"):
            ck.flush()

        assert [h.position for h in unit(store).heads] == [1]


def test_a_persist_runs_with_a_short_gil_switch_interval_and_restores_it(
    store: StateStore,
) -> None:
    seen: list[float] = []
    before = sys.getswitchinterval()

    def probe(point: str) -> None:
        if point == "blob_written":  # in the persist thread, mid-persist
            seen.append(sys.getswitchinterval())

    args = CanaryArgs(unit=UNIT, token=claim(store), blobs="ckpt/job", heartbeat_s=0)
    with Checkpointer(store, args, probe=probe) as ck:
        save(ck, 1)

    assert seen == [pytest.approx(WRITE_SWITCH_INTERVAL_S)]
    assert sys.getswitchinterval() == before


def test_a_waiting_checkpoint_has_the_short_switch_interval_until_taken_up_or_dropped(
    store: StateStore,
) -> None:
    before = sys.getswitchinterval()
    args = CanaryArgs(unit=UNIT, token=claim(store), blobs="ckpt/job", heartbeat_s=0)
    with Checkpointer(store, args) as ck:
        with ck._cond:  # the persist thread cannot take the checkpoint up yet
            ck.checkpoint(lambda: 1, lambda v: str(v).encode(), position=1)
            waiting = sys.getswitchinterval()
        ck.flush()
        persisted = sys.getswitchinterval()
        heads = [h.position for h in unit(store).heads]
        with ck._cond:  # dropped by the commit, never taken up
            ck.checkpoint(lambda: 2, lambda v: str(v).encode(), position=2)
            ck.commit("done")

    assert waiting == pytest.approx(WRITE_SWITCH_INTERVAL_S)
    assert persisted == before
    assert heads == [1]
    assert sys.getswitchinterval() == before
    assert unit(store).committed_result == "done"


def test_a_persisted_snapshot_is_let_go_before_the_next_is_taken(store: StateStore) -> None:
    # A training state's snapshot is its parameters three times over: kept by the persist thread
    # until the next checkpoint came, the process held two as that one was taken.
    taken: list[weakref.ref[Snapshot]] = []

    def take() -> Snapshot:
        snapshot = Snapshot(len(taken))
        taken.append(weakref.ref(snapshot))
        return snapshot

    with attempt(store, claim(store)) as ck:
        for position in (1, 2):
            ck.checkpoint(take, lambda s: str(s.value).encode(), position=position)
            ck.flush()

            assert [ref() for ref in taken] == [None] * position
        assert [h.position for h in unit(store).heads] == [1, 2]


@dataclass
class Snapshot:
    value: int


def test_the_resumed_attempt_sees_its_predecessors_checkpoint_and_commits_once(
    store: StateStore,
) -> None:
    with attempt(store, claim(store)) as first:
        save(first, 7)
    with attempt(store, claim(store)) as second:
        restored = second.restore(lambda b: int(b))
        copy = attempt(store, second.args.token).__enter__()  # a second copy, same token
        second.commit("winner")
        with pytest.raises(Superseded):
            copy.commit("loser")
        copy.__exit__(None, None, None)

    assert restored is not None
    assert restored[0] == 7
    done = unit(store)
    assert done.committed_result == "winner"
    assert done.heads == []
    assert store.blob_manifest("ckpt/job/a0001-000001") is None


def test_heartbeats_renew_the_lease_in_the_background(store: StateStore) -> None:
    with attempt(store, claim(store), heartbeat_s=0.05) as ck:
        first = unit(store).heartbeat_ms
        eventually(lambda: ck.heartbeats >= 3, timeout_s=10)
        assert first is not None
        assert (unit(store).heartbeat_ms or 0) >= first


def test_a_beat_is_due_half_a_period_after_the_one_before_however_long_its_write_took() -> None:
    # A write that ended within the half period: the next beat when it was due, not half a
    # period after that write ended (which the lease's silence counted twice).
    assert next_beat_s(10.0, 10.1, heartbeat_s=1.0) == 10.5
    assert next_beat_s(10.0, 10.45, heartbeat_s=1.0) == 10.5
    # A write that ran past it: the next at once.
    assert next_beat_s(10.0, 10.8, heartbeat_s=1.0) == 10.8


def test_an_attempt_names_its_activation_where_the_controller_left_none(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller killed between its invoke and recording the activation's id left the unit
    without one; the attempt names itself (the runtime's ``__OW_ACTIVATION_ID``), by its first
    beat or its commit, so that the next controller finds it. A recorded id is kept."""
    monkeypatch.setenv("__OW_ACTIVATION_ID", "a" * 32)
    with attempt(store, claim(store)) as beating:
        beating.heartbeat()
        beaten = unit(store).activation_id
    with attempt(store, claim(store)) as committing:
        committing.commit("result")
        committed = unit(store).activation_id
    with attempt(store, claim(store, activation_id="b" * 32)) as recorded:
        recorded.heartbeat()

    assert (beaten, committed) == ("a" * 32, "a" * 32)
    assert unit(store).activation_id == "b" * 32


def test_young_interval_and_heads_kept() -> None:
    assert young_interval_s(0.5, 3600) == pytest.approx(60.0)
    assert young_interval_s(0.0, 3600) == 0.0
    assert heads_to_keep(3, 10 * 2**20) == 3
    assert heads_to_keep(3, 300 * 2**20) == 1
    assert heads_to_keep(3, 2**40) == 1


def test_an_implicit_checkpoint_is_due_at_the_interval_and_before_the_deadline(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    with attempt(store, claim(store), interval_s=3600) as ck:
        assert not ck.due()
        monkeypatch.setenv("__OW_DEADLINE", str(int((time.time() + 0.2) * 1000)))
        ck._last_checkpoint -= 5  # as if the last checkpoint was 5 s ago
        assert ck.due()
    with attempt(store, unit(store).owner_epoch, checkpoints=False) as plain:
        assert not plain.due()


def test_a_streamed_restore_that_meets_a_bad_chunk_mid_way_loads_the_one_before(
    store: StateStore,
) -> None:
    # Arrange: two checkpoints of three chunks each; the newest's second chunk damaged.
    size = 3 * store.chunk_bytes

    def save_chunks(ck: Checkpointer, value: int) -> None:
        ck.checkpoint(lambda: value, lambda v: bytes([v]) * size, position=value)
        ck.flush()

    with attempt(store, claim(store)) as ck:
        save_chunks(ck, 1)
        save_chunks(ck, 2)
        newest = store.blob_manifest(unit(store).heads[-1].blob)
        assert newest is not None
        damaged = store._chunk_key(newest.name, newest.write_id, 1)
        store._write_chunks([(damaged, b"x" * store.chunk_bytes)])
        loads: list[list[int]] = []  # the first byte of each piece each load read

        def load(pieces: Iterator[bytes]) -> int:
            loads.append([])
            for piece in pieces:
                loads[-1].append(piece[0])
            return loads[-1][0]

        # Execute
        restored = ck.restore_streamed(load)

    # Assert: the newest was read up to its bad chunk, then the one before whole.
    assert restored is not None
    assert (restored[0], restored[1].position) == (1, 1)
    assert loads == [[2], [1, 1, 1]]
