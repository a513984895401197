"""A checkpoint writer process beside a function: it persists the function's checkpoints
(:func:`~faasdl.canary.checkpoint.write_checkpoint`) on another core.

A persist is some thirty short store calls (a chunk file, the blob's manifest, the head's
compare-and-set, the old blob's deletion) with 2-3 ms of Python between them. In the
function's own process that Python takes the GIL from the function's steps: checkpoints after
every step of a BFS (pure Python, 18 ms a step) made it 13% slower, and each store call waited to
win the GIL back, so a 4 ms persist took 13. From a writer process the function only encodes its
snapshot and hands the bytes over: the BFS ran 6% slower and a persist took 3 ms.

The checkpoint's bytes do not go through the socket: the function copies them into a buffer it
shares with the writer (a ``memfd``, passed to the writer at its start; grown to the largest
checkpoint yet) and sends only their length. Pickled through the socket, a 1 MiB frontier cost
the function 1.5 ms of CPU a checkpoint (the pickle's copy, and the send's copy in some fifty
wake-ups while the writer drained the socket's buffer); copied into the buffer, 0.55 ms (0.2 of
them the encoding). Writes go one at a time, and the writer has copied the bytes out
before it answers, so one buffer serves them all.

The writer is a child of the function's process (``python -m faasdl.canary.writer``), in its
container: a kill of the container's process group kills it too, and its memory counts against
the container's limit. It ends when the function's process does (the socket closes). It takes
about half a second to start (imports, opening the store); until it says it is ready, and if it
dies, writes are done in the function's own process. Writes go to the writer one at a time.

The function's thread that checkpoints hands each write over itself (:meth:`ProcessWriter.submit`)
and reads the answer at its next step (:meth:`ProcessWriter.collect`): a persist thread in the
function's process took the GIL from the steps some seven times a write (the encoding, the copy,
each socket call), and a BFS's steps waited out ~1 ms of it each checkpoint. Writes whose crash
points the function must see (failure injection) go through the persist thread and
:meth:`ProcessWriter.__call__`, which waits for the answer.

Protocol (pickled tuples over a socket pair): the writer says ``("ready",)`` (or ``("failed",
message)``); each ``("write", args, blob, position, size, probing)`` (the data: the first
``size`` bytes of the shared buffer) is answered ``("ok", seconds)`` (the write's time),
``("superseded", message)``, ``("store_error", message)`` or ``("error", message)``, after a
``("point", "blob_written")`` that the function answers ``("go",)`` (or ``("stop",)``, its probe
raised) when it asked to be probed (failure injection: the function may kill its container
there).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from faasdl.canary.checkpoint import (
    CanaryArgs,
    Encoded,
    WriteCheckpoint,
    as_pieces,
    encoded_size,
    write_checkpoint,
)
from faasdl.errors import StoreError, StoreUnavailable, Superseded

log = logging.getLogger(__name__)


class ProcessWriter:
    """Writes checkpoints through a writer process for the store at ``store_url`` (started at
    once); ``fallback`` writes them in the calling thread while it is not ready, or once it is
    gone. A :class:`~faasdl.canary.checkpoint.WriteCheckpoint`."""

    def __init__(self, store_url: str, fallback: WriteCheckpoint) -> None:
        self.store_url = store_url
        self._fallback = fallback
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair()
        self._shared = SharedBuffer.create()
        with theirs:
            fds = [theirs.fileno(), self._shared.fd]
            self._process = subprocess.Popen(
                [sys.executable, "-m", "faasdl.canary.writer", *map(str, fds), store_url],
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
            )
        self._conn = Connection(ours.detach())
        self._ready = False
        self._gone = False
        self._submitted = False  # a write of submit() is in flight

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """The writer process's exit status; ``None`` while it runs."""
        return self._process.poll()

    def ready(self) -> bool:
        """Whether writes go to the writer process now (it has started and not died)."""
        with self._lock:
            return self._usable()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until the writer process has said it is ready (or has failed to start, or
        ``timeout_s`` has passed); whether writes go to it now. A replica's warm-up waits for it:
        a writer still starting takes a core for half a second, from a function that meanwhile
        writes its checkpoints itself."""
        with self._lock:
            if not self._ready and not self._gone:
                with contextlib.suppress(OSError):  # closed: _usable says it is gone
                    self._conn.poll(timeout_s)
            return self._usable()

    def __call__(
        self,
        args: CanaryArgs,
        blob: str,
        position: int,
        data: Encoded,
        probe: Callable[[str], None] | None,
    ) -> None:
        with self._lock:
            self._drop_stale_answer()
            if self._usable():
                raw = args.model_dump(mode="json")
                try:
                    size = self._shared.put(data)
                    self._exchange(("write", raw, blob, position, size, bool(probe)), probe)
                    return
                except (EOFError, OSError) as exc:
                    self._lost(f"it stopped answering ({exc!r})")
        self._fallback(args, blob, position, data, probe)

    def submit(self, args: CanaryArgs, blob: str, position: int, data: Encoded) -> bool:
        """Hand a write (without crash points) to the writer process and return at once; its
        answer is :meth:`collect`'s. ``data``, or each of its pieces in turn, is copied into the
        shared buffer. ``False`` (nothing sent) while the writer is not ready, or once it is
        gone: write it another way. One write is in flight at a time (one whose answer was never
        collected is waited for first, and its answer dropped)."""
        with self._lock:
            self._drop_stale_answer()
            if not self._usable():
                return False
            try:
                size = self._shared.put(data)
                raw = args.model_dump(mode="json")
                self._conn.send(("write", raw, blob, position, size, False))
            except OSError as exc:
                self._lost(f"it stopped answering ({exc!r})")
                return False
            self._submitted = True
            return True

    def collect(self, *, wait: bool) -> float | None:
        """The answer to the submitted write: the seconds the writer took to persist it, or
        ``None`` while it has not come and ``wait`` is false. Raises ``Superseded``,
        ``StoreUnavailable`` or ``RuntimeError`` as a write through :meth:`__call__` does
        (``StoreUnavailable`` too when the writer died with the write: it may have landed)."""
        with self._lock:
            if not self._submitted:
                raise RuntimeError("no write has been submitted")
            try:
                if not wait and not self._conn.poll(0):
                    return None
                reply = self._conn.recv()
            except (EOFError, OSError) as exc:
                self._submitted = False
                self._lost(f"it stopped answering ({exc!r})")
                raise StoreUnavailable(
                    f"checkpoint writer {self.pid} died with a write in flight"
                ) from exc
            self._submitted = False
            return _answered(reply)

    def close(self) -> None:
        """End the writer process (it finishes the write it is doing)."""
        with self._lock:
            self._gone = True
            self._conn.close()
        self._process.wait()
        self._shared.close()

    def _usable(self) -> bool:
        if self._gone:
            return False
        if not self._ready:
            try:
                if not self._conn.poll(0):
                    return False
                said = self._conn.recv()
            except (EOFError, OSError) as exc:
                self._lost(f"it did not start ({exc!r})")
                return False
            if said[0] != "ready":
                self._lost(f"it could not open the store: {said[1]}")
                return False
            self._ready = True
        return True

    def _exchange(self, request: tuple[Any, ...], probe: Callable[[str], None] | None) -> None:
        """Send one write and see it through its crash point to the writer's answer."""
        self._conn.send(request)
        while True:
            reply = self._conn.recv()
            match reply:
                case ("point", point):
                    assert probe is not None
                    try:
                        probe(point)
                    except BaseException:
                        self._conn.send(("stop",))  # the write ends here, as it would in-thread
                        self._conn.recv()
                        raise
                    self._conn.send(("go",))
                case _:
                    _answered(reply)
                    return

    def _drop_stale_answer(self) -> None:
        """Read and drop the answer to a submitted write that nobody collected (its attempt
        ended without waiting for it), so that the next exchange is in step."""
        if not self._submitted:
            return
        self._submitted = False
        try:
            self._conn.recv()
        except (EOFError, OSError) as exc:
            self._lost(f"it stopped answering ({exc!r})")

    def _lost(self, why: str) -> None:
        self._gone = True
        self._conn.close()
        log.warning(
            "checkpoint writer %s for %s is gone (%s): writing in this process",
            self._process.pid,
            self.store_url,
            why,
        )


def _answered(reply: tuple[Any, ...]) -> float:
    """The writer's answer to a write: the seconds it took, or the error it stands for."""
    match reply:
        case ("ok", seconds):
            return float(seconds)
        case ("superseded", message):
            raise Superseded(message)
        case ("store_error", message):
            raise StoreUnavailable(message)
        case (_, message):
            raise RuntimeError(f"the checkpoint writer failed: {message}")
    raise RuntimeError(f"the checkpoint writer answered {reply!r}")


class SharedBuffer:
    """A file in memory that two processes map: an anonymous ``memfd`` on Linux (a deleted
    temporary file elsewhere), grown by the function's process to fit what it puts in."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map: mmap.mmap | None = None

    @classmethod
    def create(cls) -> SharedBuffer:
        if hasattr(os, "memfd_create"):
            return cls(os.memfd_create("faasdl-checkpoint"))
        with tempfile.TemporaryFile() as fh:
            return cls(os.dup(fh.fileno()))

    def put(self, data: Encoded) -> int:
        """Copy ``data`` (its pieces one after another) to the start of the buffer, growing it
        to twice what it was at least; returns how many bytes it copied."""
        size = encoded_size(data)
        if not size:
            return 0
        mapped = len(self._map) if self._map is not None else 0  # the file's size: we grow it
        if mapped < size:
            os.ftruncate(self.fd, max(size, 2 * mapped, mmap.PAGESIZE))
        target = self._mapped(size)
        at = 0
        for piece in as_pieces(data):
            flat = memoryview(piece).cast("B")
            target[at : at + flat.nbytes] = flat
            at += flat.nbytes
        return size

    def get(self, size: int) -> bytes:
        """A copy of the buffer's first ``size`` bytes."""
        return self._mapped(size)[:size] if size else b""

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
        os.close(self.fd)

    def _mapped(self, size: int) -> mmap.mmap:
        """The mapping, remapped if it is shorter than ``size`` (the file has grown since)."""
        if self._map is None or len(self._map) < size:
            if self._map is not None:
                self._map.close()
            self._map = mmap.mmap(self.fd, os.fstat(self.fd).st_size)
        return self._map


def serve(conn: Connection, shared: SharedBuffer, store_url: str) -> None:
    """The writer process: open the store, say so, then write until the socket closes."""
    from faasdl.store import action_store_settings, make_store

    try:
        # Its commits need not reach the disk one by one: a checkpoint lost to a machine crash
        # costs the work since the one before (its blob is not forced to disk either). SQLite's
        # log keeps them in order, and the next commit forced to disk (any process's) forces
        # them too. Forced, the three commits of each checkpoint made a BFS's steps about a
        # point slower on 2 cores (+3.0% and +4.0% over no checkpoints, against +2.3% and +2.1%).
        settings = action_store_settings().model_copy(update={"sqlite_synchronous": "NORMAL"})
        store = make_store(settings, store_url)
        store.open()
    except (StoreError, PydanticValidationError) as exc:
        conn.send(("failed", str(exc)))
        return
    conn.send(("ready",))
    while True:
        try:
            request: tuple[Any, ...] = conn.recv()
        except EOFError:
            return
        _, raw, blob, position, size, probing = request
        probe = _remote_probe(conn) if probing else None
        started = time.perf_counter()
        try:
            data = shared.get(size)
            write_checkpoint(store, CanaryArgs.model_validate(raw), blob, position, data, probe)
        except Superseded as exc:
            conn.send(("superseded", str(exc)))
        except StoreError as exc:
            conn.send(("store_error", str(exc)))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        else:
            conn.send(("ok", time.perf_counter() - started))


class _Stopped(Exception):
    """The function's probe raised at a crash point: the write stops there."""


def _remote_probe(conn: Connection) -> Callable[[str], None]:
    def probe(point: str) -> None:
        conn.send(("point", point))
        if conn.recv() != ("go",):  # the function passed the point, or killed us with it
            raise _Stopped(point)

    return probe


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])), SharedBuffer(int(sys.argv[2])), sys.argv[3])
