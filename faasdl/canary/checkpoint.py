"""Canary's action-side API: ``restore``, ``checkpoint``, ``heartbeat`` and ``commit`` for any
stateful function, every write fenced by the attempt's token (DESIGN.md §3).

The controller claims a unit by moving its ``fn/`` record's ``owner_epoch`` from e to e+1 and
passes e+1 to the attempt as its token (:class:`CanaryArgs`). Each write of the attempt is one
compare-and-set of that record that succeeds only while ``owner_epoch`` still equals the token:
an attempt that has been superseded (a zombie: stopped, fenced, recovered elsewhere, then
resumed) learns it at its next write, gets :class:`~faasdl.errors.Superseded`, and stops.

Checkpoints: the blocking part is the snapshot the caller takes (a copy of its state); encoding
and persisting run in a background thread, the newest snapshot replacing one still waiting. The
data goes to a fresh blob first and the head moves after, so a crash between the two leaves the
previous head intact; the latest ``keep`` heads are kept (fewer for large checkpoints) and the
blobs of older ones deleted. A blob larger than the store's value limit goes to its spill tier
(the store does that for every blob). Implicit checkpoints come at Young's interval
T = √(2·C·M) from the measured checkpoint cost C and the observed mean time between failures M,
re-tuned as C drifts, and always before the activation's deadline.

The background writes are many short store calls, each of which gives up the GIL and must win it
back: next to a step of pure Python that holds the GIL, every win waits out the interpreter's
switch interval (5 ms), and a 7 ms persist took 150 ms or more, so most checkpoints were replaced
before they landed. While a background write runs, and while a checkpoint waits for the persist
thread to take it up (which took 5.5 ms, a kill's window to lose it in), the switch interval is
shortened (:data:`WRITE_SWITCH_INTERVAL_S`; 0.5 ms from the request to the write): the step gives
the GIL up sooner and loses only the write's own CPU time. That CPU time (2-3 ms of Python a
persist) still comes out of the function's steps; a function can hand its persists to a writer
process instead (``writer``: see :mod:`faasdl.canary.writer`), which does
:func:`write_checkpoint` on another core.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from faasdl.errors import BlobCorrupted, BlobNotFound, StoreError, Superseded
from faasdl.store.base import Pieces, StateStore
from faasdl.store.records import CheckpointHead, FunctionInfo, UnitState, load, update

log = logging.getLogger(__name__)

S = TypeVar("S")

#: The container's host name: the pod's name on Kubernetes; the embedded platform sets HOSTNAME to
#: the container's id (its containers share the machine's host name).
HOST = os.environ.get("HOSTNAME") or socket.gethostname()

#: Checkpoints kept per unit to start with; fewer when they are large (see :func:`heads_to_keep`).
KEEP_HEADS = 3
#: Bytes of checkpoints one unit may keep before it keeps fewer heads (never fewer than 1).
KEEP_BYTES = 512 * 1024 * 1024
#: Weight of the newest measurement in the running estimate of the checkpoint cost.
COST_SMOOTHING = 0.3
#: The GIL switch interval while a background write (a persist, a heartbeat) runs.
WRITE_SWITCH_INTERVAL_S = 0.0002

#: What an encoder may return instead of one ``bytes``: the checkpoint's pieces in order (a small
#: header, then a view of the state's large buffer). A writer process copies them into its shared
#: buffer one by one: a BFS's 2 MiB frontier joined to its header first took ~0.7 ms of the
#: function's thread a checkpoint, and was copied twice. The store writes them as they are
#: (:data:`~faasdl.store.base.Pieces`): a training state is not joined into a second copy either.
Encoded = bytes | Pieces


def as_pieces(data: Encoded) -> Pieces:
    """``data``'s pieces (``bytes`` is one)."""
    return (data,) if isinstance(data, bytes) else data


def encoded_size(data: Encoded) -> int:
    """How many bytes ``data`` holds (a view of wider items counted in bytes)."""
    return sum(memoryview(piece).nbytes for piece in as_pieces(data))


_writes_lock = threading.Lock()
_writes = 0
_switch_interval_s = sys.getswitchinterval()


def _eager_begin() -> None:
    """Shorten the process's GIL switch interval until the matching :func:`_eager_end` (see the
    module's doc); the interval it had comes back after the last one."""
    global _writes, _switch_interval_s
    with _writes_lock:
        if _writes == 0:
            _switch_interval_s = sys.getswitchinterval()
            sys.setswitchinterval(WRITE_SWITCH_INTERVAL_S)
        _writes += 1


def _eager_end() -> None:
    global _writes
    with _writes_lock:
        _writes -= 1
        if _writes == 0:
            sys.setswitchinterval(_switch_interval_s)


@contextlib.contextmanager
def _eager_gil() -> Iterator[None]:
    """A short GIL switch interval while a background write (a heartbeat) runs."""
    _eager_begin()
    try:
        yield
    finally:
        _eager_end()


class CanaryArgs(BaseModel):
    """What the controller passes an attempt (the ``canary`` parameter of an action)."""

    model_config = ConfigDict(extra="forbid")

    unit: str = Field(description="Key of the unit's fn/ record.")
    token: int = Field(ge=1, description="The attempt's owner epoch (its fencing token).")
    blobs: str = Field(description="Prefix of the unit's checkpoint blobs.")
    checkpoints: bool = Field(True, description="False: fenced commit and heartbeats only.")
    heartbeat_s: float = Field(
        1.0, ge=0, description="Heartbeat period (renewed twice per period); 0: no heartbeats."
    )
    interval_s: float | None = Field(
        None, gt=0, description="Fixed checkpoint interval; none: Young's from cost and MTBF."
    )
    mtbf_s: float = Field(3600.0, gt=0, description="Observed mean time between failures.")
    keep: int = Field(KEEP_HEADS, ge=1, le=16, description="Checkpoint heads to keep at most.")


def young_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval √(2·C·M)."""
    return math.sqrt(2 * max(cost_s, 0.0) * mtbf_s)


def heads_to_keep(keep: int, size: int, budget: int = KEEP_BYTES) -> int:
    """``keep`` heads, fewer when ``keep`` checkpoints of ``size`` bytes would pass ``budget``."""
    return max(1, min(keep, budget // max(size, 1)))


def deadline_s() -> float | None:
    """The activation's deadline (OpenWhisk's ``__OW_DEADLINE``, epoch ms) in epoch seconds."""
    raw = os.environ.get("__OW_DEADLINE")
    with contextlib.suppress(ValueError, TypeError):
        return int(raw) / 1000 if raw else None
    return None


class WriteCheckpoint(Protocol):
    """Persists one checkpoint of an attempt as :func:`write_checkpoint` does (here or in a
    writer process); raises ``Superseded`` when the attempt is fenced."""

    def __call__(
        self,
        args: CanaryArgs,
        blob: str,
        position: int,
        data: Encoded,
        probe: Callable[[str], None] | None,
    ) -> None: ...


@runtime_checkable
class SubmitCheckpoint(WriteCheckpoint, Protocol):
    """A :class:`WriteCheckpoint` that can also take a write without waiting for it (a writer
    process: :class:`~faasdl.canary.writer.ProcessWriter`), one at a time."""

    def ready(self) -> bool:
        """Whether :meth:`submit` hands writes over now."""
        ...

    def submit(self, args: CanaryArgs, blob: str, position: int, data: Encoded) -> bool:
        """Start persisting ``data`` (no crash points); ``False`` if it cannot take it now. The
        pieces of ``data`` are copied before it returns: the caller may change them after."""
        ...

    def collect(self, *, wait: bool) -> float | None:
        """The submitted write's answer: the seconds it took (``None``: not yet, not waiting);
        raises what a write through ``__call__`` raises."""
        ...


def write_checkpoint(
    store: StateStore,
    args: CanaryArgs,
    blob: str,
    position: int,
    data: Encoded,
    probe: Callable[[str], None] | None = None,
) -> None:
    """Store ``data`` as ``blob`` and make it the unit's newest head at ``position``, fenced by the
    attempt's token: the blob first, the head after (``probe("blob_written")`` in between), the
    heads beyond ``keep`` dropped with their blobs. A fenced attempt's blob is deleted again: a
    zombie's data never becomes a head. The blob is not forced to disk (``durable=False``): a
    machine crash that tears it leaves a head whose blob fails its checksum, and :meth:`restore
    <Checkpointer.restore>` falls back to the one before."""
    manifest = store.put_blob(blob, data, durable=False)
    if probe is not None:
        probe("blob_written")
    head = CheckpointHead(
        blob=blob,
        owner_epoch=args.token,
        position=position,
        size=manifest.size,
        created_ms=_now_ms(),
    )
    keep = heads_to_keep(args.keep, manifest.size)
    try:
        fenced_update(
            store, args, lambda u: u.model_copy(update={"heads": [*u.heads, head][-keep:]})
        )
    except Superseded:
        store.delete_blob(blob)
        raise


def fenced_update(
    store: StateStore,
    args: CanaryArgs,
    change: Callable[[FunctionInfo], FunctionInfo],
    *,
    keep_heads: bool = True,
) -> FunctionInfo:
    """Apply ``change`` to the unit while the attempt of ``args`` owns it and it is running; delete
    the blobs of the heads it drops (all of them unless ``keep_heads``). Raises ``Superseded``."""
    before: list[CheckpointHead] = []

    def apply(u: FunctionInfo | None) -> FunctionInfo:
        nonlocal before
        if u is None or u.owner_epoch != args.token or u.state is not UnitState.RUNNING:
            raise Superseded(fenced_message(args, u.owner_epoch if u else None))
        before = u.heads
        return change(u)

    unit = update(store, args.unit, FunctionInfo, apply)
    kept = {h.blob for h in unit.heads} if keep_heads else set()
    for dropped in before:
        if dropped.blob not in kept:
            with contextlib.suppress(StoreError):
                store.delete_blob(dropped.blob)
    return unit


def fenced_message(args: CanaryArgs, owner: int | None) -> str:
    now = "gone" if owner is None else f"owned by epoch {owner}"
    return f"attempt {args.token} of {args.unit} was superseded (the unit is {now})"


@dataclass
class _Pending:
    snapshot: Any
    encode: Callable[[Any], Encoded]
    position: int


class Checkpointer:
    """One attempt's handle on its unit. Use as a context manager: entering checks that the
    attempt still owns the unit and starts the heartbeat and persist threads; leaving stops them
    (a pending checkpoint is dropped: only :meth:`flush` or :meth:`commit` wait for one).

    Thread-safe; :meth:`check` is cheap enough to call after every step.

    ``writer`` persists the checkpoints (default: :func:`write_checkpoint` on ``store``, in the
    persist thread); heartbeats and the commit always go to ``store`` from this process. A
    writer process that is ready as the attempt starts (a :class:`SubmitCheckpoint`) is used
    without the persist thread unless the attempt has a ``probe``: the calling thread encodes
    each checkpoint and hands it over, and reads the answer at its next call (:meth:`check`,
    after every step, or :meth:`checkpoint`), handing over then the newest checkpoint that
    waited meanwhile. A function whose steps hold the GIL then never waits for it: the persist
    thread took it from a BFS's steps some seven times a checkpoint (its encoding, the copy into
    the shared buffer, each socket call), ~1 ms of CPU that the steps waited out.

    ``probe``, if given, is called with the name of each crash point the attempt passes (failure
    injection, :mod:`faasdl.experiments.inject`): ``before_checkpoint`` (a checkpoint is asked
    for, nothing of it written), ``blob_written`` (its data is stored, the head not moved yet;
    in the persist thread) and ``committed`` (the unit is committed, the activation has not
    answered yet).
    """

    def __init__(
        self,
        store: StateStore,
        args: CanaryArgs,
        *,
        probe: Callable[[str], None] | None = None,
        writer: WriteCheckpoint | None = None,
    ) -> None:
        self.store = store
        self.args = args
        self._probe = probe
        self._write: WriteCheckpoint = writer or functools.partial(write_checkpoint, store)
        self._cond = threading.Condition()
        self._pending: _Pending | None = None
        self._persisting = False
        self._stopped = False
        self._superseded: str | None = None
        self._error: Exception | None = None  # a persist that failed for another reason
        self._seq = 0
        self._threads: list[threading.Thread] = []
        self._last_checkpoint = time.monotonic()
        self.cost_s: float | None = None  # smoothed time to encode and persist one checkpoint
        self.stalls_s: list[float] = []  # the blocking part of each checkpoint
        self.persisted = 0
        self.heartbeats = 0
        # Without the persist thread (see the class's doc): whether a write is in flight, the
        # time its hand-over took, and the hand-over's lock (not the heartbeat thread's too).
        self._direct: SubmitCheckpoint | None = None
        self._in_flight = False
        self._handed_s = 0.0
        self._hand_over = threading.Lock()

    # ---- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> Checkpointer:
        unit = self._unit()
        if unit.owner_epoch != self.args.token:
            raise Superseded(fenced_message(self.args, unit.owner_epoch))
        self.heartbeat()
        if self.args.heartbeat_s > 0:
            self._start(self._beat, "heartbeat")
        if self.args.checkpoints:
            writer = self._write
            if self._probe is None and isinstance(writer, SubmitCheckpoint) and writer.ready():
                self._direct = writer
            else:
                self._start(self._persist_loop, "persist")
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._stopped = True
            self._queue(None)
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
        if self._direct is not None:
            # The write in flight is answered before the writer serves the next attempt.
            self._hand_over_newest(wait=True)

    def _start(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"canary-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    # ---- the four calls ---------------------------------------------------------------------

    def restore(self, decode: Callable[[bytearray], S]) -> tuple[S, CheckpointHead] | None:
        """The newest checkpoint that can be read, decoded, with its head; ``None`` if none.

        A head whose blob is gone or fails its checksum is skipped for the one before it.
        """
        return self._newest(lambda blob: decode(self.store.get_blob(blob)))

    def restore_streamed(
        self, load: Callable[[Iterator[bytes]], S]
    ) -> tuple[S, CheckpointHead] | None:
        """:meth:`restore`, each checkpoint handed to ``load`` a piece at a time as it is read
        (:meth:`StateStore.read_blob <faasdl.store.base.StateStore.read_blob>`), never held
        whole: a piece that fails its checksum raises from the iterator, mid-way through
        ``load``, and the one before is loaded in its place (so ``load`` must set everything
        each time)."""
        return self._newest(lambda blob: load(self.store.read_blob(blob)[1]))

    def _newest(self, read: Callable[[str], S]) -> tuple[S, CheckpointHead] | None:
        for head in reversed(self._unit().heads):
            try:
                return read(head.blob), head
            except (BlobNotFound, BlobCorrupted) as exc:
                log.warning("checkpoint %s unreadable, trying the one before: %s", head.blob, exc)
        return None

    def due(self) -> bool:
        """Whether an implicit checkpoint is due: Young's interval has passed since the last one,
        or the activation's deadline is closer than two checkpoint costs and a heartbeat."""
        if not self.args.checkpoints:
            return False
        now = time.monotonic()
        cost = self.cost_s if self.cost_s is not None else 0.05
        deadline = deadline_s()
        if deadline is not None:
            margin = 2 * cost + self.args.heartbeat_s + 0.5
            if deadline - time.time() < margin and now - self._last_checkpoint > margin:
                return True
        return now - self._last_checkpoint >= self.interval_s()

    def interval_s(self) -> float:
        if self.args.interval_s is not None:
            return self.args.interval_s
        cost = self.cost_s if self.cost_s is not None else 0.05
        return young_interval_s(cost, self.args.mtbf_s)

    def checkpoint(
        self, take: Callable[[], S], encode: Callable[[S], Encoded], position: int
    ) -> None:
        """Take a snapshot now (``take``, the blocking part) and persist ``encode(snapshot)`` in
        the background as the head at ``position``: ``bytes``, or its :data:`Pieces`. Raises
        ``Superseded`` if fenced."""
        self.check()
        if self._probe is not None:
            self._probe("before_checkpoint")
        started = time.perf_counter()
        snapshot = take()
        with self._cond:
            self._queue(_Pending(snapshot, encode, position))
            self._cond.notify_all()
        if self._direct is not None:
            self._hand_over_newest(wait=False)
        self._last_checkpoint = time.monotonic()
        self.stalls_s.append(time.perf_counter() - started)

    def flush(self) -> None:
        """Wait until the pending checkpoint (if any) is persisted or dropped."""
        if self._direct is not None:
            self._hand_over_newest(wait=True)
        with self._cond:
            self._cond.wait_for(lambda: self._stopped or not (self._pending or self._persisting))
        self.check()

    def heartbeat(self) -> None:
        """Renew the attempt's lease, naming the container it runs in (so that a cluster's report
        of a lost container finds it) and its activation where the unit lacks it. Raises
        ``Superseded`` if fenced."""
        now = _now_ms()
        self._fenced(
            lambda u: u.model_copy(update={"heartbeat_ms": now, "host": HOST, **_named(u)})
        )
        self.heartbeats += 1

    def commit(self, result: str, **fields: Any) -> None:
        """Commit the unit's result (a blob name) and ``fields`` of its record (examples, loss),
        exactly once: the unit is committed by the first attempt that gets here while owning it.
        Its checkpoints are deleted after. Raises ``Superseded`` if fenced."""
        with self._cond:
            self._queue(None)
        self.flush()
        self._fenced(
            lambda u: u.model_copy(
                update={
                    "state": UnitState.COMMITTED,
                    "committed_result": result,
                    "heads": [],
                    **_named(u),
                    **fields,
                }
            ),
            keep_heads=False,
        )
        if self._probe is not None:
            self._probe("committed")
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def check(self) -> None:
        """Raise ``Superseded`` if a write of this attempt was already refused, or the error a
        background persist failed with (other than the store's, which the next one retries).
        Without the persist thread it first reads the writer's answer if it has come (a poll of
        its socket) and hands the checkpoint that waited for it over."""
        if self._direct is not None:
            self._hand_over_newest(wait=False)
        if self._superseded is not None:
            raise Superseded(self._superseded)
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    @property
    def superseded(self) -> bool:
        return self._superseded is not None

    # ---- background ---------------------------------------------------------------------------

    def _beat(self) -> None:
        due = time.monotonic()  # the beat of __enter__
        while True:
            # Twice per period, on time however long the last write took: one late beat does
            # not let the lease lapse.
            due = next_beat_s(due, time.monotonic(), self.args.heartbeat_s)
            with self._cond:
                if self._cond.wait_for(
                    lambda: self._stopped, timeout=max(0.0, due - time.monotonic())
                ):
                    return
            try:
                with _eager_gil():
                    self.heartbeat()
            except Superseded:
                return
            except StoreError as exc:  # a store restart: the lease may lapse; the next beat tries
                log.warning("heartbeat of %s failed: %s", self.args.unit, exc)

    def _persist_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopped or self._pending is not None)
                if self._stopped:
                    return
                # The pending checkpoint's short switch interval goes with it (ended below).
                pending, self._pending = self._pending, None
                self._persisting = True
            assert pending is not None
            try:
                with self._outcome_kept():
                    self._persist(pending)
            finally:
                # Let the snapshot go now, not when the next one comes: the loop's name held it
                # between checkpoints, so the process held two as the next was taken (a VGG16
                # attempt checkpointing every 3 s peaked at 2326-2334 MB, now 1959-1966).
                del pending
                _eager_end()
                with self._cond:
                    self._persisting = False
                    self._cond.notify_all()

    def _queue(self, pending: _Pending | None) -> None:
        """Make ``pending`` the checkpoint to persist next (``None``: drop the one waiting), with
        ``self._cond`` held. While one waits the GIL switch interval is short, so that the persist
        thread takes it up at once rather than after the function's step has held the GIL for
        the interval (5 ms); the persist thread ends that when it is done with it. Without the
        persist thread the calling thread takes it up itself: the interval stays."""
        if self._direct is None:
            if pending is not None and self._pending is None:
                _eager_begin()
            elif pending is None and self._pending is not None:
                _eager_end()
        self._pending = pending

    def _persist(self, pending: _Pending) -> None:
        if self._superseded is not None:  # a heartbeat was refused: nothing more to write
            raise Superseded(self._superseded)
        started = time.perf_counter()
        blob, data = self._encoded(pending)
        try:
            self._write(self.args, blob, pending.position, data, self._probe)
        except Superseded as exc:
            self._superseded = str(exc)
            raise
        self._persisted(time.perf_counter() - started)

    def _encoded(self, pending: _Pending) -> tuple[str, Encoded]:
        """The checkpoint's blob name (new for each) and its data."""
        data = pending.encode(pending.snapshot)
        self._seq += 1
        return f"{self.args.blobs}/a{self.args.token:04d}-{self._seq:06d}", data

    def _persisted(self, cost: float) -> None:
        previous = cost if self.cost_s is None else self.cost_s
        self.cost_s = (1 - COST_SMOOTHING) * previous + COST_SMOOTHING * cost
        self.persisted += 1

    def _hand_over_newest(self, *, wait: bool) -> None:
        """Without the persist thread: read the answer of the write in flight (waiting for it
        if ``wait``), then hand the pending checkpoint over, and with ``wait`` see it through
        too. A refusal or failure is kept for :meth:`check`, as the persist thread keeps it."""
        assert self._direct is not None
        with self._hand_over:
            while True:
                if self._in_flight and not self._answer(wait=wait):
                    return  # still in flight: the pending checkpoint waits for the next call
                with self._cond:
                    pending, self._pending = self._pending, None
                if pending is None or self._superseded is not None:
                    return
                self._submit(pending)
                if not wait:
                    return

    def _submit(self, pending: _Pending) -> None:
        assert self._direct is not None
        started = time.perf_counter()
        try:
            blob, data = self._encoded(pending)
        except Exception as exc:  # the caller's encoder: raised at the next check
            self._error = exc
            return
        if self._direct.submit(self.args, blob, pending.position, data):
            self._in_flight = True
            self._handed_s = time.perf_counter() - started
            return
        with self._outcome_kept():  # the writer is gone: written here, as it does itself then
            self._direct(self.args, blob, pending.position, data, None)
            self._persisted(time.perf_counter() - started)

    def _answer(self, *, wait: bool) -> bool:
        """Whether the write in flight has been answered (its outcome booked)."""
        assert self._direct is not None
        assert self._in_flight
        with self._outcome_kept():  # a writer gone with it is a store error
            took = self._direct.collect(wait=wait)
            if took is None:
                return False
            # Its cost: the hand-over's and the writer's own time, not the wait for the answer
            # to be read (the steps in between).
            self._persisted(self._handed_s + took)
        self._in_flight = False
        return True

    @contextlib.contextmanager
    def _outcome_kept(self) -> Iterator[None]:
        """Keep a write's refusal or failure for :meth:`check` (the caller's encoder's too); a
        store's error is only logged: a store restart, and the next checkpoint tries again."""
        try:
            yield
        except Superseded as exc:
            self._superseded = str(exc)
        except StoreError as exc:
            log.warning("checkpoint of %s not persisted: %s", self.args.unit, exc)
        except Exception as exc:
            self._error = exc

    # ---- the fenced compare-and-set -----------------------------------------------------------

    def _unit(self) -> FunctionInfo:
        found = load(self.store, self.args.unit, FunctionInfo)
        if found is None:
            raise Superseded(f"unit {self.args.unit} has no record: the job is gone")
        return found[0]

    def _fenced(
        self, change: Callable[[FunctionInfo], FunctionInfo], *, keep_heads: bool = True
    ) -> FunctionInfo:
        """:func:`fenced_update` for this attempt; a refusal is remembered (:meth:`check`)."""
        if self._superseded is not None:
            raise Superseded(self._superseded)
        try:
            return fenced_update(self.store, self.args, change, keep_heads=keep_heads)
        except Superseded as exc:
            self._superseded = str(exc)
            raise


def next_beat_s(due_s: float, now_s: float, heartbeat_s: float) -> float:
    """When an attempt's next heartbeat is due (monotonic seconds), the one before having been due
    at ``due_s``: half a period after it, not half a period after its write ended, so that a
    slow write (a store busy with other writers) does not put the next beat off by its own time
    as well; at once if the write ran past that."""
    return max(due_s + heartbeat_s / 2, now_s)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _named(unit: FunctionInfo) -> dict[str, Any]:
    """The running activation's id (``__OW_ACTIVATION_ID``, set by the runtime for each run),
    where the unit lacks it: a controller killed between its invoke and recording the id left
    none, and its successor finds the attempt, or its commit's activation to book, by it."""
    activation = os.environ.get("__OW_ACTIVATION_ID")
    return {"activation_id": activation} if unit.activation_id is None and activation else {}
