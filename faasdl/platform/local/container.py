"""A container of the embedded platform: one OS process running ``runtime.py``, its memory guard,
its log pipes, and the invoker's side of the ``/init`` and ``/run`` protocol."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import http.client
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import IO, Any

from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_fixed

from faasdl.platform.base import parse_json
from faasdl.platform.local.memory import MemoryGuard
from faasdl.platform.messages import ACTIVATION_LOG_SENTINEL

log = logging.getLogger(__name__)

RUNTIME_PATH = Path(__file__).with_name("runtime.py")
#: Linux's process_mrelease(2) (5.15 and later; one number on every architecture).
_NR_PROCESS_MRELEASE = 448


class ContainerStartError(Exception):
    """The container process did not come up (provisioning failure)."""


class KillReason(Enum):
    TIMEOUT = "timeout"
    INJECTED = "injected"
    EVICTED = "evicted"
    SHUTDOWN = "shutdown"


class CallResult(Enum):
    OK = "ok"
    TIMED_OUT = "timed_out"
    CONNECTION_LOST = "connection_lost"


@dataclass
class Reply:
    """What one ``/init`` or ``/run`` call gave: the HTTP status and body, or how it broke."""

    outcome: CallResult
    status: int = 0
    body: bytes = b""
    started_ms: int = 0
    ended_ms: int = 0

    def json(self) -> Any:
        return parse_json(self.body)


#: The one ``FAASDL_`` variable a container takes from the platform's environment: it belongs to
#: the action (its threads), as a variable of an action image would.
ACTION_VARIABLES = frozenset({"FAASDL_ACTION_THREADS"})


def container_environment(platform: Mapping[str, str]) -> dict[str, str]:
    """A container's environment: the platform process's (this machine stands for the action
    image) without faasdl's settings, which are the controller's and the platform's, its keys and
    the store's password among them. As an OpenWhisk container gets none of its invoker's, an
    action gets its settings from its init parameters (the controller's store settings:
    :func:`faasdl.store.action_environment`) or not at all; inherited, they had stood beside the
    init parameters (a CA bundle's file beside its text: refused as given twice)."""
    return {
        name: value
        for name, value in platform.items()
        if not name.startswith("FAASDL_") or name in ACTION_VARIABLES
    }


def _log_timestamp() -> str:
    now = time.time_ns()
    seconds, nanos = divmod(now, 1_000_000_000)
    stamp = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{nanos:09d}Z"


@dataclass
class _LogBuffer:
    lines: list[str] = field(default_factory=list)
    sentinels: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    closed: dict[str, bool] = field(default_factory=lambda: {"stdout": False, "stderr": False})
    cond: threading.Condition = field(default_factory=threading.Condition)


class Container:
    """One container process. Not thread-safe: the pool gives it to one activation at a time;
    only :meth:`kill` may be called from another thread."""

    def __init__(
        self,
        *,
        container_id: str,
        action_key: str,
        memory_mb: int,
        guard: MemoryGuard,
        workdir_root: Path,
        start_timeout_s: float,
        nice: int = 0,
    ) -> None:
        self.container_id = container_id
        self.action_key = action_key
        self.memory_mb = memory_mb
        self.initialized = False
        self.prewarmed = False
        self.last_used = time.monotonic()
        self.taken_at: float | None = None  # when its activation was handed to it (unix time)
        self.kill_reason: KillReason | None = None
        self._guard = guard
        self._workdir_root = workdir_root
        self._start_timeout_s = start_timeout_s
        self._nice = nice
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._workdir: str | None = None
        self._logs = _LogBuffer()
        self._readers: list[threading.Thread] = []
        self._kill_lock = threading.Lock()
        self._releasing = False  # a thread frees the killed process's memory (once)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def started(self) -> bool:
        return self._process is not None

    def start(self, *, lower_by: int = 0) -> None:
        """Spawn the process, put it under its memory limit, and wait for its port. ``lower_by``:
        the process starts with a priority lower than the container's by that much (a replica's
        warm-up, background work); :meth:`restore_priority` lifts it back."""
        self._workdir = tempfile.mkdtemp(prefix=f"{self.container_id}-", dir=self._workdir_root)
        # The container's own temporary directory, removed with it as a container's /tmp is: a
        # killed process's exit hooks never run (TensorFlow leaves a file per traced function).
        own_tmp = os.path.join(self._workdir, "tmp")
        os.mkdir(own_tmp)
        read_fd, write_fd = os.pipe()
        env = container_environment(os.environ)
        env["TMPDIR"] = own_tmp
        env["FAASDL_READY_FD"] = str(write_fd)
        env["FAASDL_PARENT_PID"] = str(os.getpid())
        env["HOSTNAME"] = self.container_id  # as a container engine names a container's host
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-u", str(RUNTIME_PATH)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self._workdir,
                env=env,
                pass_fds=(write_fd,),
                start_new_session=True,
            )
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            raise ContainerStartError(f"cannot start a container process: {exc}") from exc
        os.close(write_fd)
        try:
            if self._nice or lower_by:
                # Set while the interpreter is still starting, before the runtime has made a
                # thread: every thread it makes inherits the priority.
                os.setpriority(
                    os.PRIO_PROCESS, self._process.pid, min(self._priority() + lower_by, 19)
                )
            if lower_by:
                self._lower_session(lower_by)
            self._guard.attach(self.container_id, self._process.pid, self.memory_mb)
            port = self._read_port(read_fd)
        except BaseException as exc:  # nothing left running behind any error
            self.kill(KillReason.SHUTDOWN)
            self.destroy()
            if isinstance(exc, OSError | ContainerStartError):
                raise ContainerStartError(str(exc)) from exc
            raise
        finally:
            os.close(read_fd)
        for name, stream in (("stdout", self._process.stdout), ("stderr", self._process.stderr)):
            assert stream is not None
            reader = threading.Thread(
                target=self._read_logs,
                args=(name, stream),
                daemon=True,
                name=f"faasdl-logs-{self.container_id}-{name}",
            )
            reader.start()
            self._readers.append(reader)
        self._conn = http.client.HTTPConnection("127.0.0.1", port)
        if self.kill_reason is not None:
            # Killed while it was starting, before there was a process to signal.
            self.kill(self.kill_reason)

    def _read_port(self, read_fd: int) -> int:
        deadline = time.monotonic() + self._start_timeout_s
        data = b""
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ContainerStartError("the container did not report its port in time")
            ready, _, _ = select.select([read_fd], [], [], remaining)
            if ready:
                chunk = os.read(read_fd, 64)
                if not chunk:
                    raise ContainerStartError("the container exited before it was ready")
                data += chunk
        return int(data)

    def _read_logs(self, stream_name: str, stream: IO[bytes]) -> None:
        buf = self._logs
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip("\n")
            with buf.cond:
                if text == ACTIVATION_LOG_SENTINEL:
                    buf.sentinels[stream_name] += 1
                else:
                    buf.lines.append(f"{_log_timestamp()} {stream_name}: {text}")
                buf.cond.notify_all()
        with buf.cond:
            buf.closed[stream_name] = True
            buf.cond.notify_all()

    def take_logs(self, *, expect_sentinel: bool, wait_s: float = 2.0) -> list[str]:
        """The log lines since the last call. With ``expect_sentinel`` it waits (briefly) for both
        streams' end-of-activation sentinel; otherwise for both pipes to close."""
        buf = self._logs
        deadline = time.monotonic() + wait_s

        def done() -> bool:
            if expect_sentinel:
                return all(buf.sentinels[s] > 0 or buf.closed[s] for s in buf.sentinels)
            return all(buf.closed.values())

        with buf.cond:
            while not done():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                buf.cond.wait(remaining)
            lines, buf.lines = buf.lines, []
            for s in buf.sentinels:
                buf.sentinels[s] = max(0, buf.sentinels[s] - 1)
            return lines

    def call(self, path: str, message: dict[str, Any], timeout_s: float) -> Reply:
        """POST ``message`` to ``path``; a dead process or a missed deadline is an outcome."""
        assert self._conn is not None
        body = json.dumps(message).encode("utf-8")
        started = time.time()
        self._conn.timeout = timeout_s
        try:
            if self._conn.sock is None:
                self._conn.connect()
            sock: socket.socket = self._conn.sock
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(timeout_s)
            self._conn.request("POST", path, body, {"Content-Type": "application/json"})
            response = self._conn.getresponse()
            payload = response.read()
            return Reply(CallResult.OK, response.status, payload, _ms(started), _ms(time.time()))
        except TimeoutError:
            return Reply(CallResult.TIMED_OUT, started_ms=_ms(started), ended_ms=_ms(time.time()))
        except (OSError, http.client.HTTPException):
            return Reply(
                CallResult.CONNECTION_LOST, started_ms=_ms(started), ended_ms=_ms(time.time())
            )

    def _lower_session(self, by: int) -> None:
        """Lower the container's session against the platform's (see
        :func:`_session_priority`): best effort, a warm-up the kernel keeps at its session's
        priority is only slower to stand aside."""
        assert self._process is not None
        own = _session_priority(os.getpid())
        if own is None:
            return
        try:
            _set_session_priority(self._process.pid, min(own + by, 19))
        except OSError as exc:  # EPERM, EAGAIN, EINVAL (a session in no group), or it ended
            log.debug("container %s warms up at its session's priority: %s", self.container_id, exc)

    def _priority(self) -> int:
        return min(os.getpriority(os.PRIO_PROCESS, 0) + self._nice, 19)

    def restore_priority(self) -> None:
        """Give every thread of every process of the container (its process group: a checkpoint
        writer it started too) the container's own priority again (Linux keeps one per thread).
        Lifting a priority needs CAP_SYS_NICE: without it the container keeps the lower one,
        which only matters while the cores are contended."""
        if self._process is None:
            return
        try:
            os.setpriority(os.PRIO_PGRP, self._process.pid, self._priority())
            if (own := _session_priority(os.getpid())) is not None:
                _set_session_priority(self._process.pid, own)
        except ProcessLookupError:
            return  # it has ended
        except OSError as exc:  # EPERM, EAGAIN, EINVAL (a session in no group)
            log.debug("container %s keeps its lower priority: %s", self.container_id, exc)

    def oom_killed(self) -> bool:
        return self._guard.oom_killed(self.container_id)

    def kill(self, reason: KillReason) -> None:
        """SIGKILL the container's process group; the first reason given sticks. Its process's
        memory is then freed by a thread of the platform's (:func:`release_memory`) as the
        kernel tears the process down: the two together take some 40% less than its exit
        alone (a TensorFlow container's ~650 MB: 27 ms against 45), and its activation's end,
        which the invoker sees as its connection closes after the memory is gone, comes as much
        sooner."""
        with self._kill_lock:
            if self.kill_reason is None:
                self.kill_reason = reason
            if self._process is not None and self._process.poll() is None:
                # destroy() kills again: the signal is sent again, the memory freed once.
                pidfd = None if self._releasing else _pidfd(self._process.pid)
                try:
                    os.killpg(self._process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    if pidfd is not None:
                        os.close(pidfd)
                    return
                if pidfd is not None:
                    self._releasing = True
                    threading.Thread(
                        target=_release_and_close, args=(pidfd,), name="release", daemon=True
                    ).start()

    def destroy(self) -> None:
        """Kill and reap the process, close pipes and connection, free the memory guard."""
        self.kill(self.kill_reason or KillReason.SHUTDOWN)
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5)
            for reader in self._readers:
                reader.join(timeout=2)
            for stream in (self._process.stdout, self._process.stderr):
                if stream is not None:
                    stream.close()
        self._guard.detach(self.container_id)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None


def _pidfd(pid: int) -> int | None:
    """A file descriptor that names process ``pid`` (``None`` where there are none, or it has
    ended)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux (5.3+), or the process is gone
        return None


def release_memory(pidfd: int) -> bool:
    """Free the memory of the killed process ``pidfd`` names, in the calling thread (Linux's
    process_mrelease(2), as Android's low-memory killer uses it), while the process's own exit
    frees the rest. ``False`` where nothing was freed: the kernel has no such call, the process
    is not dying (not killed, or already gone)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_NR_PROCESS_MRELEASE, pidfd, 0) == 0:
            return True
    except (AttributeError, OSError):  # no C library with a syscall() to load
        return False
    if ctypes.get_errno() not in (errno.ENOSYS, errno.EINVAL, errno.ESRCH):
        log.debug("process_mrelease: %s", os.strerror(ctypes.get_errno()))
    return False


def _release_and_close(pidfd: int) -> None:
    try:
        release_memory(pidfd)
    finally:
        os.close(pidfd)


def _session_priority(pid: int) -> int | None:
    """The nice value of the session group ``pid`` is in; ``None`` where the kernel has no such
    groups or ``pid`` is in none (a platform in none leaves its containers' sessions as they are).

    Linux schedules each session as a group (autogrouping: on by default in most distributions,
    and here): sessions share the cores by their group's nice value, a process's own counting only
    against the others in its session. A container starts a session of its own: its processes'
    nice value (``container_nice``) orders them inside it, and against the platform its session
    competes as an equal, so the platform keeps its share of the cores however busy the
    containers are. A replica's warm-up is background work: its session's nice value is lowered
    too (``warmup_nice``), or it takes as much of the cores as a running activation. (With running
    containers' sessions lowered by ``container_nice`` too, checkpoints made a BFS +4.5% and +5.5%
    slower than its failure-free run in two runs of 20 pairs of invocations, every pass over +4%;
    with them equal, as they were in effect before, +1.3% and +6.4%, passes from -4.8% to +16%.)"""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text()
    except FileNotFoundError:
        if os.path.exists(f"/proc/{pid}"):
            return None  # a kernel without autogroups
        raise ProcessLookupError(pid) from None
    return _parse_session_priority(text)


def _parse_session_priority(text: str) -> int | None:
    """The nice value in ``/proc/PID/autogroup`` (``/autogroup-12 nice 10``); ``None`` where it
    is empty, as it is for a process of the first session (the one init's children share, as a
    CI job's may): such a process competes in no session group."""
    match = re.fullmatch(r"/autogroup-\d+ nice (-?\d+)\s*", text)
    return int(match.group(1)) if match else None


@retry(
    retry=retry_if_exception_type(BlockingIOError),
    wait=wait_fixed(0.1),
    stop=stop_after_delay(1.0),
    reraise=True,
)
def _set_session_priority(pid: int, nice: int) -> None:
    """Give the session group ``pid`` is in the nice value ``nice`` (see
    :func:`_session_priority`). Linux takes one such change a tenth of a second from a process
    without CAP_SYS_ADMIN (EAGAIN for the others): retried for a second."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
