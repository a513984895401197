"""The checkpoint writer process: checkpoints persisted from another process of the function's
container, fenced the same way, with the function's crash points, and written in the function's
own process while the writer is not there. Without crash points the function hands each
checkpoint over itself (no persist thread) and reads the answer at its next call."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from faasdl.canary.checkpoint import CanaryArgs, Checkpointer, write_checkpoint
from faasdl.canary.writer import ProcessWriter
from faasdl.errors import Superseded
from faasdl.store import StateStore
from tests.canary.test_checkpoint import UNIT, claim, save, unit
from tests.conftest import eventually


class Fallback:
    """The in-process writer, counting its calls."""

    def __init__(self, store: StateStore) -> None:
        self.calls = 0
        self._write = functools.partial(write_checkpoint, store)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        self._write(*args, **kwargs)


@pytest.fixture
def fallback(store: StateStore) -> Fallback:
    return Fallback(store)


@pytest.fixture
def writer(store_url: str, fallback: Fallback) -> Iterator[ProcessWriter]:
    process = ProcessWriter(store_url, fallback)
    assert process.wait_ready(timeout_s=60)
    yield process
    process.close()


def attempt(
    store: StateStore,
    token: int,
    writer: ProcessWriter,
    probe: Callable[[str], None] | None = None,
) -> Checkpointer:
    args = CanaryArgs(unit=UNIT, token=token, blobs="ckpt/job", heartbeat_s=0)
    return Checkpointer(store, args, probe=probe, writer=writer)


def test_checkpoints_are_persisted_by_the_writer_process_and_restored(
    store: StateStore, writer: ProcessWriter, fallback: Fallback
) -> None:
    with attempt(store, claim(store), writer) as ck:
        save(ck, 1)
        save(ck, 2)
        assert ck.persisted == 2
    with attempt(store, claim(store), writer) as successor:
        restored = successor.restore(lambda b: int(b))

    assert restored is not None
    assert restored[0] == 2
    assert [h.position for h in unit(store).heads] == [1, 2]
    assert fallback.calls == 0


@contextlib.contextmanager
def stopped(writer: ProcessWriter) -> Iterator[None]:
    """The writer process stopped (SIGSTOP): what it is handed stays in flight."""
    os.kill(writer.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(writer.pid, signal.SIGCONT)


def test_a_ready_writer_takes_the_checkpoints_from_the_function_without_a_persist_thread(
    store: StateStore, writer: ProcessWriter, fallback: Fallback
) -> None:
    with attempt(store, claim(store), writer) as ck:
        threads = {t.name for t in threading.enumerate()}
        save(ck, 1)
        persisted, cost_s = ck.persisted, ck.cost_s

    assert "canary-persist" not in threads
    assert persisted == 1
    assert cost_s is not None
    assert cost_s > 0
    assert [h.position for h in unit(store).heads] == [1]
    assert fallback.calls == 0


def test_while_a_checkpoint_is_in_flight_the_newest_waits_and_the_ones_between_are_dropped(
    store: StateStore, writer: ProcessWriter
) -> None:
    with attempt(store, claim(store), writer) as ck:
        with stopped(writer):
            for value in (1, 2, 3):  # 1 is handed over; 2 waits, then 3 in its place
                take = functools.partial(int, value)
                ck.checkpoint(take, lambda v: str(v).encode(), position=value)
                ck.check()  # does not wait for the writer
            heads_meanwhile = unit(store).heads
        ck.flush()
        persisted = ck.persisted

    assert heads_meanwhile == []
    assert persisted == 2
    assert [h.position for h in unit(store).heads] == [1, 3]


def test_the_write_in_flight_is_answered_before_the_writer_serves_the_next_attempt(
    store: StateStore, writer: ProcessWriter, fallback: Fallback
) -> None:
    with attempt(store, claim(store), writer) as ck, stopped(writer):
        ck.checkpoint(lambda: 1, lambda v: str(v).encode(), position=1)
    # Leaving waited for the answer (and booked it): the next attempt's exchange is in step.
    with attempt(store, claim(store), writer) as successor:
        restored = successor.restore(lambda b: int(b))
        save(successor, 2)

    assert ck.persisted == 1
    assert restored is not None
    assert restored[0] == 1
    assert [h.position for h in unit(store).heads] == [1, 2]
    assert fallback.calls == 0


def test_an_answer_nobody_collected_is_dropped_before_the_next_write(
    store: StateStore, writer: ProcessWriter, fallback: Fallback
) -> None:
    token = claim(store)
    args = CanaryArgs(unit=UNIT, token=token, blobs="ckpt/job", heartbeat_s=0)
    assert writer.submit(args, "ckpt/job/stale", 1, b"1")  # and never collected

    with attempt(store, token, writer) as ck:
        save(ck, 2)
        persisted = ck.persisted
    claim(store)  # fences the token: a write with it now is refused, if the answers are in step
    with pytest.raises(Superseded):
        writer(args, "ckpt/job/late", 3, b"3", None)

    assert persisted == 1
    heads = unit(store).heads
    assert [h.position for h in heads] == [1, 2]
    assert heads[0].blob == "ckpt/job/stale"
    assert fallback.calls == 0


def test_a_writer_that_dies_with_a_write_in_flight_leaves_the_next_to_the_function(
    store: StateStore, writer: ProcessWriter, fallback: Fallback
) -> None:
    with attempt(store, claim(store), writer) as ck:
        os.kill(writer.pid, signal.SIGSTOP)  # checkpoint 1 cannot land before the kill
        ck.checkpoint(lambda: 1, lambda v: str(v).encode(), position=1)
        os.kill(writer.pid, signal.SIGKILL)
        eventually(lambda: writer.returncode is not None, what="the writer dead")
        save(ck, 2)  # checkpoint 1 is lost with the writer (a warning); 2 is written here
        persisted = ck.persisted

    assert persisted == 1
    assert fallback.calls == 1
    assert [h.position for h in unit(store).heads] == [2]


def test_checkpoints_of_any_size_pass_through_the_shared_buffer_whole(
    store: StateStore, writer: ProcessWriter, fallback: Fallback
) -> None:
    # Growing (small, then 3 MiB: the buffer grows; the writer maps it anew), shrinking (the
    # end of the larger one must not leak into the smaller), empty.
    sizes = [10, 3 * 1024 * 1024 + 7, 100, 0]
    restored: list[bytes] = []
    for i, size in enumerate(sizes):
        data = os.urandom(size)
        with attempt(store, claim(store), writer) as ck:
            ck.checkpoint(functools.partial(bytes, data), bytes, position=i + 1)
            ck.flush()
            assert ck.persisted == 1
        with attempt(store, claim(store), writer) as successor:
            found = successor.restore(bytes)
        assert found is not None
        assert found[0] == data
        restored.append(found[0])

    assert [len(r) for r in restored] == sizes
    assert fallback.calls == 0


@pytest.mark.parametrize("through", ["writer process", "persist thread"])
def test_a_checkpoint_in_pieces_is_persisted_as_their_bytes_joined(
    store: StateStore, writer: ProcessWriter, fallback: Fallback, through: str
) -> None:
    # A header and a byte view of 4-byte items (a BFS's frontier), copied once each into the
    # writer's shared buffer, or joined where the function writes its checkpoints itself.
    frontier = array("I", range(300_000))
    pieces = (b"head", memoryview(frontier)[1000:250_000].cast("B"))
    token = claim(store)
    ck = (
        attempt(store, token, writer)
        if through == "writer process"
        else Checkpointer(
            store, CanaryArgs(unit=UNIT, token=token, blobs="ckpt/job", heartbeat_s=0)
        )
    )
    with ck:
        ck.checkpoint(lambda: pieces, lambda p: p, position=1)
        ck.flush()
        assert ck.persisted == 1
    with attempt(store, claim(store), writer) as successor:
        found = successor.restore(bytes)

    assert found is not None
    assert found[0] == b"head" + frontier[1000:250_000].tobytes()
    assert fallback.calls == 0


def test_a_fenced_attempt_gets_superseded_from_the_writer_and_leaves_no_blob(
    store: StateStore, writer: ProcessWriter
) -> None:
    first = claim(store)
    with attempt(store, first, writer) as zombie:
        save(zombie, 1)
        claim(store)  # recovered elsewhere
        zombie.checkpoint(lambda: 2, lambda v: str(v).encode(), position=2)
        with pytest.raises(Superseded):
            zombie.flush()

    assert [h.position for h in unit(store).heads] == [1]
    assert store.blob_manifest(f"ckpt/job/a{first:04d}-000002") is None


def test_the_blob_written_crash_point_runs_in_the_function_and_can_stop_the_write(
    store: StateStore, writer: ProcessWriter
) -> None:
    seen: list[int] = []  # the heads there were at each blob_written

    def probe(point: str) -> None:
        if point != "blob_written":
            return
        seen.append(len(unit(store).heads))
        if len(seen) == 2:
            raise RuntimeError("crashed at blob_written")

    with attempt(store, claim(store), writer, probe) as ck:
        save(ck, 1)
        ck.checkpoint(lambda: 2, lambda v: str(v).encode(), position=2)
        with pytest.raises(RuntimeError, match="crashed at blob_written"):
            ck.flush()
        save(ck, 3)  # the writer is in step with the function again

    assert seen == [0, 1, 1]  # each before its head moved
    assert [h.position for h in unit(store).heads] == [1, 3]


def test_writes_are_done_in_the_function_once_the_writer_is_gone(
    store: StateStore, writer: ProcessWriter, fallback: Fallback
) -> None:
    os.kill(writer.pid, signal.SIGKILL)
    eventually(lambda: writer.returncode is not None, what="the writer dead")

    with attempt(store, claim(store), writer) as ck:
        save(ck, 1)

    assert not writer.ready()
    assert fallback.calls == 1
    assert [h.position for h in unit(store).heads] == [1]


def test_a_writer_that_cannot_open_its_store_leaves_the_writes_to_the_function(
    store: StateStore, fallback: Fallback
) -> None:
    broken = ProcessWriter("redis://127.0.0.1:1/0", fallback)  # nothing listens on port 1
    try:
        eventually(lambda: broken.returncode is not None, what="the writer gave up")
        with attempt(store, claim(store), broken) as ck:
            save(ck, 1)
    finally:
        broken.close()

    assert fallback.calls == 1
    assert [h.position for h in unit(store).heads] == [1]


def test_waiting_for_a_writer_that_cannot_start_ends_when_it_says_so(
    fallback: Fallback,
) -> None:
    broken = ProcessWriter("redis://127.0.0.1:1/0", fallback)
    try:
        started = time.monotonic()
        assert not broken.wait_ready(timeout_s=60)
        assert time.monotonic() - started < 60  # told, not timed out
        assert not broken.ready()
    finally:
        broken.close()


def test_the_writer_ends_with_its_socket(store_url: str, fallback: Fallback) -> None:
    process = ProcessWriter(store_url, fallback)
    assert process.wait_ready(timeout_s=60)

    process.close()

    assert process.returncode == 0
