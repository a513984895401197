"""The runtime manager: warm replicas of the runtimes (action variants) that jobs train on.

Each job says how many replicas of its training runtime it wants (its strategy decides, from the
failures it has seen); a background thread keeps that many idle initialized containers of each
runtime (``Platform.prewarm``: real idle containers on the embedded platform, warm-up invocations
on OpenWhisk) and charges the job for the memory they hold while it wants them. A new replica
also gets the job's warm-up call, in which the training action builds and traces its trainer. A
recovering attempt then lands on a replica and skips both the cold start and the model's build.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from faasdl.errors import FaasdlError
from faasdl.platform.base import Platform

log = logging.getLogger(__name__)

#: A prewarm call that took longer than this warmed a replica up (one with nothing to do answers
#: at once); its duration is a warm-up time of the runtime.
WARMED_AFTER_S = 0.05

#: The warm-ups of a runtime whose shortest is its warm-up time (see
#: :meth:`RuntimeManager.warmup_s`).
WARMUPS_KEPT = 5


@dataclass
class _Want:
    runtime: str
    memory_mb: int
    replicas: int
    warmup: Mapping[str, Any] | None = field(default=None, compare=False)
    ready: int = 0
    mb_s: float = 0.0  # replica memory held for this job, in MB·s


class RuntimeManager:
    """Keeps the wanted replicas warm; thread-safe. ``start``/``close`` run its thread."""

    def __init__(self, platform: Platform, *, tick_s: float = 0.5) -> None:
        self.platform = platform
        self.tick_s = tick_s
        self._wants: dict[str, _Want] = {}  # by owner (a job id)
        self._warmups: dict[str, deque[float]] = {}  # by runtime: its latest warm-ups' times
        self._cond = threading.Condition()
        self._closed = False
        self._warming = False  # a prewarm call is in flight
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="canary-replicas", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop warming replicas. A warm-up in flight is not waited for: it may take up to the
        action's time limit (a replica starts at a lower priority, and beside busy trainers it
        gets little CPU), and it is no use to a controller that stops; the platform's close ends
        it, and the thread with it."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            warming = self._warming
        if self._thread is not None and not warming:
            self._thread.join()
        self._thread = None

    def want(
        self,
        owner: str,
        runtime: str,
        *,
        memory_mb: int,
        replicas: int,
        warmup: Mapping[str, Any] | None = None,
    ) -> None:
        """``owner`` wants ``replicas`` warm containers of ``runtime`` from now on; a new one gets
        the warm-up call ``warmup`` (see :meth:`Platform.prewarm`)."""
        with self._cond:
            current = self._wants.get(owner)
            if current is None or current.runtime != runtime:
                charged = current.mb_s if current else 0.0
                self._wants[owner] = _Want(runtime, memory_mb, replicas, warmup, mb_s=charged)
            elif current.replicas == replicas:
                return
            else:
                current.replicas = replicas
            self._cond.notify_all()

    def release(self, owner: str) -> float:
        """``owner`` wants no replicas any more; returns the GB·s its replicas held in all."""
        with self._cond:
            want = self._wants.pop(owner, None)
        return want.mb_s / 1024 if want else 0.0

    def held_gb_s(self, owner: str) -> float:
        with self._cond:
            want = self._wants.get(owner)
            return want.mb_s / 1024 if want else 0.0

    def replicas(self, owner: str) -> tuple[str, int, int] | None:
        """What ``owner`` wants now: its runtime, the replicas wanted and those warm and ready."""
        with self._cond:
            want = self._wants.get(owner)
            return (want.runtime, want.replicas, want.ready) if want else None

    def ready(self, owner: str) -> int:
        with self._cond:
            want = self._wants.get(owner)
            return want.ready if want else 0

    def warmup_s(self, runtime: str) -> float | None:
        """How long a replica of ``runtime`` takes to warm up: the shortest of its latest
        :data:`WARMUPS_KEPT` warm-ups; ``None`` before one has.

        Not the latest: a call that warmed several replicas at once beside a run's work took
        longer than one replica takes, and taking that for a replica's time made dynamic
        replication want more replicas, whose warm-ups took longer still (in a replication run
        at 25% failures on two cores, 1 replica wanted became 4 as the warm-up measured went
        from 0.4 to 3.4 s)."""
        with self._cond:
            found = self._warmups.get(runtime)
            return min(found) if found else None

    def wait_ready(self, owner: str, timeout_s: float) -> int:
        """Wait until the replicas ``owner`` wants are warm (or ``timeout_s`` passed); returns
        how many are."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                want = self._wants.get(owner)
                if want is None or want.ready >= want.replicas:
                    return want.ready if want else 0
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return want.ready
                self._cond.wait(left)

    def settle(self, timeout_s: float) -> bool:
        """Wait until no replica is warming up (or ``timeout_s`` passed); returns whether none
        is. A warm-up goes on after its job has released its replicas: an experiment waits for
        it, so that one run's warm-ups do not slow the next."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._warming or self._closed, timeout_s)

    def _loop(self) -> None:
        last = time.monotonic()
        while True:
            with self._cond:
                self._cond.wait(self.tick_s)
                if self._closed:
                    return
                now = time.monotonic()
                for want in self._wants.values():
                    want.mb_s += min(want.ready, want.replicas) * want.memory_mb * (now - last)
                last = now
                totals: dict[str, int] = {}
                warmups: dict[str, Mapping[str, Any] | None] = {}
                for want in self._wants.values():
                    totals[want.runtime] = totals.get(want.runtime, 0) + want.replicas
                    warmups.setdefault(want.runtime, want.warmup)
                self._warming = any(count > 0 for count in totals.values())
            try:
                self._prewarm(totals, warmups)
            finally:
                with self._cond:
                    self._warming = False
                    self._cond.notify_all()

    def _prewarm(
        self, totals: dict[str, int], warmups: dict[str, Mapping[str, Any] | None]
    ) -> None:
        for runtime, count in totals.items():
            if count <= 0:
                continue
            with self._cond:
                if self._closed:
                    return
            started = time.monotonic()
            try:
                ready = self.platform.prewarm(runtime, count, warmups[runtime])
            except FaasdlError as exc:  # a deleted variant, a platform shutting down
                log.debug("cannot prewarm %s: %s", runtime, exc)
                ready = 0
            took = time.monotonic() - started
            with self._cond:
                if ready > 0 and took > WARMED_AFTER_S:
                    kept = self._warmups.setdefault(runtime, deque(maxlen=WARMUPS_KEPT))
                    kept.append(took)
                for want in self._wants.values():
                    if want.runtime == runtime:
                        want.ready = min(ready, want.replicas)
                self._cond.notify_all()
