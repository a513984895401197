"""Failure injection into a running job on the embedded platform: kill its training attempts at
seeded random points, or freeze them (SIGSTOP) until they are fenced and recovered and then let
them go on (SIGCONT) as zombies. Used by the failure-injection tests and ``faasdl bench
recovery``; every injection is logged with its time so that detection and takeover can be
measured from it."""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from faasdl.canary.core import ContainerLoss, ContainerLosses
from faasdl.errors import ActivationNotFound
from faasdl.platform.classify import Failure, FailureKind
from faasdl.platform.local import LocalPlatform
from faasdl.store.base import StateStore
from faasdl.store.records import FunctionInfo, UnitState, fn_prefix, load

Mode = Literal["kill", "freeze"]


@dataclass(frozen=True)
class Injection:
    """One injected failure: which attempt, when (epoch seconds), and for a freeze when it was
    let go again."""

    activation_id: str
    unit: str
    token: int
    at: float
    released_at: float | None = None
    fenced: bool = False  # a freeze: a newer attempt owned the unit when it was let go


@dataclass
class Chaos:
    """A thread that injects ``count`` failures into job ``job_id``'s training attempts.

    An attempt becomes a target once it has beaten its first heartbeat (it has started, not
    waiting for a container); one of them, chosen at random, is hit after a random delay in
    ``delay_s``. ``kill`` SIGKILLs its container (and with ``cold``, first destroys the idle
    containers of its action, so that the next attempt starts a new one);
    ``freeze`` SIGSTOPs it, waits until a newer attempt owns the unit and has beaten (or the unit
    is committed), then SIGCONTs it. One target at a time, ``gap_s`` apart at least.

    With ``losses``, each frozen container is also reported lost there, as the Kubernetes pod
    watch reports a pod that vanished (:func:`faasdl.platform.kubernetes.container_loss`).
    """

    platform: LocalPlatform
    store: StateStore
    job_id: str
    count: int
    mode: Mode = "kill"
    seed: int = 0
    delay_s: tuple[float, float] = (0.0, 1.0)
    gap_s: float = 0.0  # least time between two injections
    cold: bool = False  # kills leave no idle container of the action behind
    when: Callable[[], bool] | None = None  # inject only while this holds
    losses: ContainerLosses | None = None  # where frozen containers are reported lost
    done: list[Injection] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Chaos:
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        rng = random.Random(self.seed)
        while len(self.done) < self.count and not self._stop.is_set():
            target = self._target(rng) if self.when is None or self.when() else None
            if target is None:
                self._stop.wait(0.02)
                continue
            key, unit = target
            assert unit.activation_id is not None
            self._stop.wait(rng.uniform(*self.delay_s))
            current = load(self.store, key, FunctionInfo)
            if current is None or current[0].owner_epoch != unit.owner_epoch:
                continue
            if current[0].state is not UnitState.RUNNING:
                continue
            injection = self._inject(key, unit.activation_id, unit.owner_epoch, unit.host)
            if injection is not None:
                self.done.append(injection)
                self._stop.wait(self.gap_s)

    def _target(self, rng: random.Random) -> tuple[str, FunctionInfo] | None:
        """One of the job's training attempts that has started and was not hit before, chosen
        at random. (A killed attempt's unit reads as running until the controller has seen the
        kill: hit again, as a loaded machine let happen, the one failure counted as two.)"""
        hit = {(i.unit, i.token) for i in self.done}
        candidates = []
        for key, found in self.store.scan(fn_prefix(self.job_id)):
            unit = FunctionInfo.model_validate(found.value)
            if (
                unit.state is UnitState.RUNNING
                and unit.activation_id is not None
                and unit.heartbeat_ms is not None
                and (key, unit.owner_epoch) not in hit
            ):
                candidates.append((key, unit))
        return rng.choice(candidates) if candidates else None

    def _inject(
        self, key: str, activation_id: str, token: int, host: str | None
    ) -> Injection | None:
        at = time.time()
        try:
            if self.mode == "kill":
                if self.cold:
                    self.platform.drop_idle_like(activation_id)
                self.platform.kill(activation_id)
                return Injection(activation_id, key, token, at)
            self.platform.signal(activation_id, signal.SIGSTOP)
        except ActivationNotFound:
            return None  # it ended before the blow landed
        if self.losses is not None and host is not None:
            self.losses.report(
                ContainerLoss(
                    host, Failure(FailureKind.CRASH, f"pod {host} deleted"), int(at * 1000)
                )
            )
        try:
            fenced = self._wait_superseded(key, token)
        finally:
            with contextlib.suppress(ActivationNotFound):
                self.platform.signal(activation_id, signal.SIGCONT)
        return Injection(activation_id, key, token, at, released_at=time.time(), fenced=fenced)

    def _wait_superseded(self, key: str, token: int) -> bool:
        """Wait until a newer attempt owns the unit and has beaten (or committed it): ``True``;
        ``False`` if the frozen attempt had committed already, or the job is gone."""
        while not self._stop.is_set():
            found = load(self.store, key, FunctionInfo)
            if found is None:
                return False
            unit = found[0]
            if unit.owner_epoch == token and unit.state is UnitState.COMMITTED:
                return False  # frozen between its commit and its reply: no zombie
            if unit.owner_epoch > token and (
                unit.heartbeat_ms is not None or unit.state is UnitState.COMMITTED
            ):
                return True
            self._stop.wait(0.02)
        return False
