"""Memory limits that really kill: a memory cgroup per container where one can be made, else an
RSS watchdog. Either way an action over its limit dies and its record reads as OpenWhisk's
Docker invoker writes it ("The action exhausted its memory and was aborted.")."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from abc import ABC, abstractmethod
from pathlib import Path

import psutil

from faasdl.errors import ConfigError

log = logging.getLogger(__name__)

_V1_ROOT = Path("/sys/fs/cgroup/memory")
_V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
CGROUP_ROOTS = (_V1_ROOT, *_V2_ROOTS)


class MemoryGuard(ABC):
    """Enforces one memory limit per container process group."""

    name: str

    @abstractmethod
    def attach(self, container_id: str, pid: int, limit_mb: int) -> None:
        """Put the container's process under ``limit_mb``; call right after it starts."""

    @abstractmethod
    def oom_killed(self, container_id: str) -> bool:
        """Whether the container was killed for exceeding its limit."""

    @abstractmethod
    def detach(self, container_id: str) -> None:
        """Forget the container (its processes are already dead)."""

    def close(self) -> None:  # noqa: B027 - optional hook; most guards hold nothing
        """Release what the guard holds."""


class CgroupGuard(MemoryGuard):
    """One memory cgroup per container. v1 and v2 differ only in file names."""

    def __init__(self, base: Path, *, version: int) -> None:
        self._base = base
        self.name = f"cgroup-v{version}"
        # Optional files: their value, or None for "the limit itself".
        self._optional: dict[str, str | None]
        if version == 1:
            self._limit_files = ("memory.limit_in_bytes",)
            # Without swap accounting this file is absent or refuses writes; RAM is still capped.
            self._optional = {"memory.memsw.limit_in_bytes": None}
            self._events = ("memory.oom_control", "oom_kill")
        else:
            self._limit_files = ("memory.max",)
            self._optional = {"memory.swap.max": "0", "memory.oom.group": "1"}
            self._events = ("memory.events", "oom_kill")

    def _dir(self, container_id: str) -> Path:
        return self._base / container_id

    def attach(self, container_id: str, pid: int, limit_mb: int) -> None:
        group = self._dir(container_id)
        group.mkdir(parents=True, exist_ok=True)
        limit = str(limit_mb * 1024 * 1024)
        for name in self._limit_files:
            (group / name).write_text(limit)
        for name, value in self._optional.items():
            with contextlib.suppress(OSError):
                (group / name).write_text(limit if value is None else value)
        (group / "cgroup.procs").write_text(str(pid))

    def oom_killed(self, container_id: str) -> bool:
        events, counter = self._events
        try:
            text = (self._dir(container_id) / events).read_text()
        except OSError:
            return False
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == counter:
                return int(value) > 0
        return False

    def detach(self, container_id: str) -> None:
        with contextlib.suppress(OSError):
            self._dir(container_id).rmdir()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._base.rmdir()


class WatchdogGuard(MemoryGuard):
    """Samples each container's resident memory (its whole process tree) and kills the group the
    first time it is over the limit. Reaction time is one sampling period."""

    name = "rss-watchdog"

    def __init__(self, *, interval_s: float) -> None:
        self._interval = interval_s
        self._watched: dict[str, tuple[psutil.Process, int]] = {}
        self._killed: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, container_id: str, pid: int, limit_mb: int) -> None:
        with self._lock:
            self._watched[container_id] = (psutil.Process(pid), limit_mb * 1024 * 1024)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="faasdl-rss-watchdog", daemon=True
                )
                self._thread.start()

    def oom_killed(self, container_id: str) -> bool:
        with self._lock:
            return container_id in self._killed

    def detach(self, container_id: str) -> None:
        with self._lock:
            self._watched.pop(container_id, None)
            self._killed.discard(container_id)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                watched = [
                    (cid, p, lim)
                    for cid, (p, lim) in self._watched.items()
                    if cid not in self._killed
                ]
            for container_id, process, limit in watched:
                if _tree_rss(process) > limit:
                    with self._lock:
                        self._killed.add(container_id)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signal.SIGKILL)


def _tree_rss(process: psutil.Process) -> int:
    try:
        total = int(process.memory_info().rss)
        for child in process.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += int(child.memory_info().rss)
        return total
    except psutil.Error:
        return 0


def _probe_v1(base: Path) -> bool:
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / "probe"
        probe.mkdir(exist_ok=True)
        (probe / "memory.limit_in_bytes").write_text(str(64 * 1024 * 1024))
        probe.rmdir()
        return True
    except OSError:
        return False


def _probe_v2(root: Path, base: Path) -> bool:
    try:
        if "memory" not in (root / "cgroup.controllers").read_text().split():
            return False
        base.mkdir(parents=True, exist_ok=True)
        if "memory" not in (base / "cgroup.subtree_control").read_text().split():
            (base / "cgroup.subtree_control").write_text("+memory")
        probe = base / "probe"
        probe.mkdir(exist_ok=True)
        (probe / "memory.max").write_text(str(64 * 1024 * 1024))
        probe.rmdir()
        return True
    except OSError:
        return False


def make_guard(mode: str, *, watchdog_interval_s: float, tag: str) -> MemoryGuard:
    """The best guard this machine allows: ``mode`` is ``auto``, ``cgroup`` or ``watchdog``.

    ``cgroup`` insists on a memory cgroup and raises :class:`faasdl.errors.ConfigError` without one.
    """
    if mode in ("auto", "cgroup"):
        v1_base = _V1_ROOT / f"faasdl-{tag}"
        if _V1_ROOT.is_dir() and _probe_v1(v1_base):
            return CgroupGuard(v1_base, version=1)
        for root in _V2_ROOTS:
            v2_base = root / f"faasdl-{tag}"
            if (root / "cgroup.controllers").exists() and _probe_v2(root, v2_base):
                return CgroupGuard(v2_base, version=2)
        if mode == "cgroup":
            raise ConfigError(
                "memory_enforcement='cgroup' but no writable memory cgroup (v1 or v2) was found; "
                "use 'auto' or 'watchdog'"
            )
        log.info("no writable memory cgroup; enforcing memory limits with an RSS watchdog")
    return WatchdogGuard(interval_s=watchdog_interval_s)
