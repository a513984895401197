"""The container pool of the embedded invoker (OpenWhisk ``ContainerPool``): a user-memory budget
that every container reserves its limit from (prewarmed ones too), warm reuse per action version,
eviction of idle containers when room is needed or after an idle timeout, and a FIFO queue of
activations that wait, never fail, while the pool is full.

An activation that finds no idle container of its action but a prewarmed one still warming takes
that one once it is ready instead of starting a cold container: what is left of a warm-up is
never longer than a whole cold start (Canary's replicas; OpenWhisk's pool cold-starts instead)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum

from faasdl.platform.local.container import Container, KillReason

log = logging.getLogger(__name__)


class State(Enum):
    WARMING = "warming"  # starting and initializing for prewarm: reserved, not assignable
    BUSY = "busy"
    IDLE = "idle"


@dataclass(eq=False)
class Work:
    """One queued activation. ``execute`` runs it on the container it is given and answers
    whether the container may stay warm."""

    activation_id: str
    action_key: str
    memory_mb: int
    execute: Callable[[Container], bool]
    enqueued: float = field(default_factory=time.monotonic)


class PoolClosed(Exception):
    pass


class ContainerPool:
    def __init__(
        self,
        *,
        memory_mb: int,
        idle_timeout_s: float,
        new_container: Callable[[str, int], Container],
        max_workers: int,
    ) -> None:
        self._budget = memory_mb
        self._idle_timeout_s = idle_timeout_s
        self._new_container = new_container
        self._max_workers = max_workers
        self._cond = threading.Condition()
        self._queue: deque[Work] = deque()
        self._containers: dict[str, tuple[Container, State]] = {}
        self._running: dict[str, Container] = {}
        self._awaiting: dict[str, Work] = {}  # by the id of the warming container promised
        self._reserved = 0
        self._peak_reserved = 0
        self._closed = False
        self._executor: ThreadPoolExecutor | None = None
        self._reaper: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        with self._cond:
            if self._executor is not None:
                return
            self._closed = False
            self._executor = ThreadPoolExecutor(
                max_workers=self._max_workers, thread_name_prefix="faasdl-invoker"
            )
            self._reaper = threading.Thread(
                target=self._reap_idle, name="faasdl-reaper", daemon=True
            )
            self._reaper.start()

    def close(self) -> list[Work]:
        """Kill every container, wait for running activations to wind up, and return the work
        that never started."""
        with self._cond:
            self._closed = True
            never_started = [*self._awaiting.values(), *self._queue]
            self._queue.clear()
            self._awaiting.clear()
            containers = [c for c, _ in self._containers.values()]
            self._cond.notify_all()
        for container in containers:
            container.kill(KillReason.SHUTDOWN)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._reaper is not None:
            self._reaper.join(timeout=5)
        with self._cond:
            leftovers = [c for c, _ in self._containers.values()]
            self._containers.clear()
            self._reserved = 0
            self._executor = None
        for container in leftovers:
            container.destroy()
        return never_started

    # -- queries ---------------------------------------------------------------------------

    def in_flight(self) -> int:
        """Queued plus running activations (what OpenWhisk's concurrency throttle counts)."""
        with self._cond:
            return len(self._queue) + len(self._awaiting) + len(self._running)

    def running_container(self, activation_id: str) -> Container | None:
        with self._cond:
            return self._running.get(activation_id)

    def stats(self) -> dict[str, int]:
        with self._cond:
            states = [s for _, s in self._containers.values()]
            return {
                "reserved_mb": self._reserved,
                "peak_reserved_mb": self._peak_reserved,
                "budget_mb": self._budget,
                "queued": len(self._queue) + len(self._awaiting),
                "busy": states.count(State.BUSY),
                "idle": states.count(State.IDLE),
                "warming": states.count(State.WARMING),
            }

    def container_pids(self) -> list[int]:
        with self._cond:
            return [c.pid for c, _ in self._containers.values() if c.pid is not None]

    # -- work ------------------------------------------------------------------------------

    def submit(self, work: Work) -> None:
        with self._cond:
            if self._closed or self._executor is None:
                raise PoolClosed("the container pool is not running")
            self._queue.append(work)
            self._pump()

    def cancel(self, activation_id: str) -> Work | None:
        """Take back the activation if it has not started (queued, or awaiting a warming
        container); the work taken back, or ``None``."""
        with self._cond:
            for work in self._queue:
                if work.activation_id == activation_id:
                    self._queue.remove(work)
                    self._pump()  # what waited behind it may fit now
                    return work
            for container_id, work in self._awaiting.items():
                if work.activation_id == activation_id:
                    del self._awaiting[container_id]  # the container warms on as a spare
                    return work
            return None

    def prewarm(
        self, action_key: str, memory_mb: int, count: int, warm: Callable[[Container], bool]
    ) -> int:
        """Make ``count`` spare initialized containers of ``action_key`` exist: prewarmed ones
        no activation has used yet (an activation that takes one uses it up; the containers
        that activations left warm are not spares). ``warm`` starts and initializes one and
        answers whether it worked. Returns how many are spare and ready; fewer when the pool has
        no room for more."""
        futures: list[Future[bool]] = []
        with self._cond:
            if self._closed or self._executor is None:
                raise PoolClosed("the container pool is not running")
            ready = sum(
                1
                for c, s in self._containers.values()
                if c.action_key == action_key and s is State.IDLE and c.prewarmed
            )
            for _ in range(max(0, count - ready - len(self._warming(action_key)))):
                if not self._make_room(memory_mb, keep_key=action_key):
                    break
                container = self._add(action_key, memory_mb, State.WARMING)
                futures.append(self._executor.submit(self._warm, container, warm))
        return ready + sum(future.result() for future in futures)

    def _warm(self, container: Container, warm: Callable[[Container], bool]) -> bool:
        """Warm ``container`` up; then hand it to the activation awaiting it, or keep it as a
        spare. Answers whether it became a spare."""
        ok = False
        try:
            ok = warm(container)
        except Exception:
            log.exception("warming container %s failed", container.container_id)
        with self._cond:
            work = self._awaiting.pop(container.container_id, None)
            spare = False
            if not ok or self._closed:
                if work is not None:
                    self._queue.appendleft(work)  # it goes first, as it would have
                self._remove(container, KillReason.EVICTED)
            elif work is not None:
                self._start(work, container)
            else:
                container.prewarmed = True
                container.last_used = time.monotonic()
                self._containers[container.container_id] = (container, State.IDLE)
                spare = True
            if not self._closed:
                self._pump()
            self._cond.notify_all()
            return spare

    def drop_spares(self) -> int:
        """Destroy the idle spares (prewarmed containers no activation has used), of every
        action; returns how many."""
        return self._drop_idle(lambda c: c.prewarmed)

    def drop(self, action_key: str) -> None:
        """Destroy the idle containers of an action version that will never be used again."""
        self._drop_idle(lambda c: c.action_key == action_key)

    def _drop_idle(self, which: Callable[[Container], bool]) -> int:
        with self._cond:
            idle = [c for c, s in self._containers.values() if s is State.IDLE and which(c)]
            for container in idle:
                self._remove(container, KillReason.EVICTED)
            self._pump()
        return len(idle)

    # -- internals (call with the lock held) ------------------------------------------------

    def _add(self, action_key: str, memory_mb: int, state: State) -> Container:
        container = self._new_container(action_key, memory_mb)
        self._containers[container.container_id] = (container, state)
        self._reserved += memory_mb
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        return container

    def _remove(self, container: Container, reason: KillReason) -> None:
        if self._containers.pop(container.container_id, None) is None:
            return
        self._reserved -= container.memory_mb
        container.kill(reason)
        if self._executor is not None and not self._closed:
            self._executor.submit(container.destroy)
        else:
            # Shutting down: reap here, so that close() returns with no process left behind.
            container.destroy()

    def _take_idle(self, action_key: str) -> Container | None:
        # The most recently used warm container first; prewarmed replicas are kept for last.
        candidates = [
            c
            for c, s in self._containers.values()
            if s is State.IDLE and c.action_key == action_key
        ]
        if not candidates:
            return None
        return max(candidates, key=lambda c: (not c.prewarmed, c.last_used))

    def _make_room(self, memory_mb: int, *, keep_key: str | None = None) -> bool:
        while self._reserved + memory_mb > self._budget:
            idle = [
                c
                for c, s in self._containers.values()
                if s is State.IDLE and c.action_key != keep_key
            ]
            if not idle:
                return False
            victim = min(idle, key=lambda c: (c.prewarmed, c.last_used))
            self._remove(victim, KillReason.EVICTED)
        return True

    def _pump(self) -> None:
        assert self._executor is not None
        while self._queue and not self._closed:
            work = self._queue[0]
            container = self._take_idle(work.action_key)
            if container is None:
                warming = self._warming(work.action_key)
                if warming:
                    self._queue.popleft()
                    self._awaiting[warming[0].container_id] = work
                    # An activation waits on it now: its warm-up is no background work any more.
                    warming[0].restore_priority()
                    continue
                if not self._make_room(work.memory_mb):
                    return  # FIFO: the head waits for memory, and everything behind it too
                container = self._add(work.action_key, work.memory_mb, State.BUSY)
            self._queue.popleft()
            self._start(work, container)

    def _warming(self, action_key: str) -> list[Container]:
        """The prewarmed containers of ``action_key`` still warming that no activation awaits."""
        return [
            c
            for c, s in self._containers.values()
            if s is State.WARMING
            and c.action_key == action_key
            and c.container_id not in self._awaiting
        ]

    def _start(self, work: Work, container: Container) -> None:
        assert self._executor is not None
        container.prewarmed = False  # a spare no more
        container.taken_at = time.time()
        self._containers[container.container_id] = (container, State.BUSY)
        self._running[work.activation_id] = container
        self._executor.submit(self._run, work, container)

    def _run(self, work: Work, container: Container) -> None:
        keep = False
        try:
            keep = work.execute(container)
        except Exception:  # the invoker must survive any bug in one activation's handling
            log.exception("activation %s failed in the invoker", work.activation_id)
        finally:
            with self._cond:
                self._running.pop(work.activation_id, None)
                if keep and not self._closed and container.alive():
                    container.last_used = time.monotonic()
                    self._containers[container.container_id] = (container, State.IDLE)
                else:
                    self._remove(container, container.kill_reason or KillReason.EVICTED)
                if not self._closed:
                    self._pump()
                self._cond.notify_all()

    def _reap_idle(self) -> None:
        interval = min(1.0, self._idle_timeout_s / 2)
        while True:
            with self._cond:
                if self._closed:
                    return
                self._cond.wait(interval)
                if self._closed:
                    return
                cutoff = time.monotonic() - self._idle_timeout_s
                for container, state in list(self._containers.values()):
                    if state is State.IDLE and container.last_used < cutoff:
                        self._remove(container, KillReason.EVICTED)
