"""Runs many invocations of one workload as Canary units on a platform, injects a failure plan, and
recovers as a strategy says: the controller's side of an experiment.

Each invocation is a unit (``fn/<run>/00000/<index>``) claimed by compare-and-set for each attempt
(DESIGN.md §3), exactly as the job runner claims a shard; its attempts run the workload action
with their fencing token. At most ``concurrency`` invocations are in flight; a recovering one goes
before those not started. A failure is seen in the activation record (a killed container), or
through a lapsed heartbeat lease (a frozen one), whichever comes first; the strategy then resumes
the unit from its checkpoint, restarts it, waits for its other copies, or gives up. Warm replicas
of the workload's runtime are kept by the :class:`~faasdl.canary.runtime.RuntimeManager`.

Given a folder for them, every attempt appends its progress marks to a file of its own there
(``marks`` of :mod:`.action`); a hit attempt's are read back into its :class:`Hit` once the run
has ended, and the files removed.
"""

from __future__ import annotations

import contextlib
import signal
import statistics
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from faasdl.actions import deploy_variant
from faasdl.canary.checkpoint import CanaryArgs
from faasdl.canary.core import hung
from faasdl.canary.runtime import RuntimeManager
from faasdl.canary.strategies import (
    Recovery,
    ReplicationMode,
    StrategyName,
    make_strategy,
)
from faasdl.errors import ActivationNotFound, JobFailed, Throttled
from faasdl.experiments.inject import FailurePlan, Fault
from faasdl.experiments.workloads import workload
from faasdl.platform.base import Activation
from faasdl.platform.classify import Failure, FailureKind, classify
from faasdl.platform.local import LocalPlatform
from faasdl.store.base import StateStore
from faasdl.store.records import FunctionInfo, UnitState, fn_key, load, update

#: The experiments' action (``openwhisk_actions/workload``).
WORKLOAD = "workload"

#: How often the runner looks for the first heartbeat of an attempt a fault waits for (and for
#: the checkpoint an ``after_checkpoint`` fault waits for): a blow timed into an invocation of a
#: few milliseconds must find it started before it has ended.
FAULT_POLL_S = 0.001


@dataclass(frozen=True)
class RunSpec:
    """One run: ``invocations`` of ``workload`` (its parameters, the seed varied per invocation)
    under ``strategy``, with ``plan``'s faults. The invocations are numbered from ``first``: a
    run can be one block of a longer sequence (its seeds and faults those of its indices)."""

    run_id: str
    workload: str
    params: dict[str, Any]
    invocations: int
    strategy: StrategyName
    plan: FailurePlan = field(default_factory=FailurePlan)
    concurrency: int = 2
    replication: ReplicationMode = "dynamic"
    copies: int = 2  # request replication's copies
    heartbeat_s: float = 0.5
    memory_mb: int | None = None  # none: the workload's
    timeout_s: int = 60
    max_attempts: int = 6
    #: Per invocation, how long its work takes without failures (for the faults' timing).
    expected_s: dict[int, float] = field(default_factory=dict)
    first: int = 0

    @property
    def indices(self) -> range:
        return range(self.first, self.first + self.invocations)


@dataclass
class Attempt:
    index: int  # the invocation
    token: int
    fault: Fault | None = None
    started_ms: int | None = None  # its first heartbeat (see InvocationRunner._started_ms)
    frozen: bool = False


def _waiting(attempt: Attempt) -> Fault | None:
    """The fault the runner is to fire at ``attempt`` when due (a crash point fires itself)."""
    fault = attempt.fault
    if fault is None or fault.kind == "crash_point" or attempt.frozen:
        return None
    return fault


#: An attempt's progress: (steps done, unix time), as its first step starts and each step ends.
Marks = tuple[tuple[int, float], ...]


@dataclass
class Outcome:
    """What happened to one invocation."""

    index: int
    first_invoked_at: float = 0.0
    committed_at: float | None = None
    attempts: int = 0
    failures: list[str] = field(default_factory=list)
    detected_by: list[str] = field(default_factory=list)
    result: str | None = None
    final: dict[str, Any] = field(default_factory=dict)  # the committing attempt's answer
    #: The activation whose end settled the invocation (none when a lapsed lease did): when it
    #: started (epoch ms), how long it had waited for a container before (``waitTime``, ms), and
    #: its ``/init`` time (ms) if it had to start one.
    final_start_ms: int | None = None
    final_wait_ms: int = 0
    final_init_ms: int | None = None

    @property
    def final_invoked_at(self) -> float | None:
        """When the activation that settled the invocation was invoked (unix time)."""
        if self.final_start_ms is None:
            return None
        return (self.final_start_ms - self.final_wait_ms) / 1000

    @property
    def latency_s(self) -> float:
        assert self.committed_at is not None
        return self.committed_at - self.first_invoked_at


@dataclass(frozen=True)
class Hit:
    """One attempt a fault hit: when, when that attempt had started (its first heartbeat), and
    its progress marks (none unless the runner had a folder for them)."""

    invocation: int
    activation_id: str
    kind: str
    at: float
    started_at: float | None
    marks: Marks = ()


@dataclass
class RunReport:
    spec: RunSpec
    started_at: float
    ended_at: float
    outcomes: list[Outcome]
    activation_gb_s: float
    replica_gb_s: float
    activations: int
    injected: list[Hit]

    @property
    def makespan_s(self) -> float:
        return self.ended_at - self.started_at

    def outcome(self, index: int) -> Outcome:
        return self.outcomes[index - self.spec.first]


class InvocationRunner:
    """Runs one :class:`RunSpec` to its end (:meth:`run`)."""

    def __init__(
        self,
        platform: LocalPlatform,
        store: StateStore,
        store_url: str,
        runtimes: RuntimeManager,
        spec: RunSpec,
        *,
        environment: dict[str, str],
        restart_store: Callable[[], None] | None = None,
        tick_s: float = 0.01,
        marks_dir: Path | None = None,
    ) -> None:
        self.platform = platform
        self.environment = environment  # the workload action's init parameters
        self.store = store
        self.store_url = store_url
        self.runtimes = runtimes
        self.spec = spec
        self.restart_store = restart_store
        self.tick_s = tick_s
        self.marks_dir = marks_dir
        self.strategy = make_strategy(
            spec.strategy,
            max_attempts=spec.max_attempts,
            copies=spec.copies,
            replication=spec.replication,
        )
        self.memory_mb = spec.memory_mb or workload(spec.workload).memory_mb
        self.faults = spec.plan.by_attempt()
        extra = [f for f in spec.plan.faults if f.copy_index >= self.strategy.copies]
        if extra:
            raise ValueError(
                f"plan: a fault hits copy {extra[0].copy_index} of invocation "
                f"{extra[0].invocation}, but {spec.strategy} runs only {self.strategy.copies} "
                "(copies are numbered from 0)"
            )
        if any(f.kind == "store_restart" for f in spec.plan.faults) and restart_store is None:
            raise ValueError("plan: a store_restart fault needs a store the runner can restart")
        self.outcomes = [Outcome(i) for i in spec.indices]
        self._queue: deque[int] = deque(spec.indices)
        self._in_flight: dict[str, Attempt] = {}
        self._abandoned: dict[str, Attempt] = {}  # fenced out: their records are still booked
        self._fruitless: dict[int, int] = {}
        self._position: dict[int, int] = {}
        self._done: set[int] = set()
        self._failures = 0
        self._attempts = 0
        self._gb_s = 0.0
        self._activations = 0
        self._succeeded = 0  # activations that succeeded, and their seconds
        self._succeeded_s = 0.0
        self._injected: list[Hit] = []
        self._marks: dict[str, Path] = {}  # every attempt's marks file, by activation
        self._next_lease_check = 0.0

    # ---- the run ------------------------------------------------------------------------

    def run(self) -> RunReport:
        spec = self.spec
        variant = deploy_variant(
            self.platform,
            WORKLOAD,
            memory_mb=self.memory_mb,
            timeout_ms=spec.timeout_s * 1000,
            environment=self.environment,
        )
        self.variant = variant
        self._deploy_replicas()
        started = time.time()
        try:
            while len(self._done) < spec.invocations:
                self._launch()
                self._want_replicas()
                self._inject()
                self._collect()
            self._drain()
        finally:
            replica_gb_s = self.runtimes.release(spec.run_id)
            injected = [replace(h, marks=self._read_marks(h.activation_id)) for h in self._injected]
            for path in self._marks.values():
                path.unlink(missing_ok=True)
        return RunReport(
            spec=spec,
            started_at=started,
            ended_at=max(o.committed_at or started for o in self.outcomes),
            outcomes=self.outcomes,
            activation_gb_s=self._gb_s,
            replica_gb_s=replica_gb_s,
            activations=self._activations,
            injected=injected,
        )

    def _read_marks(self, activation_id: str) -> Marks:
        path = self._marks.get(activation_id)
        if path is None or not path.exists():
            return ()
        marks = []
        for line in path.read_text().splitlines():
            done, _, at = line.partition(" ")
            with contextlib.suppress(ValueError):  # a line cut short by the kill
                marks.append((int(done), float(at)))
        return tuple(marks)

    def _key(self, index: int) -> str:
        return fn_key(self.spec.run_id, 0, index)

    def _outcome(self, index: int) -> Outcome:
        return self.outcomes[index - self.spec.first]

    def _active(self) -> int:
        return len({a.index for a in self._in_flight.values()})

    def _launch(self) -> None:
        spec = self.spec
        while self._queue and self._active() < spec.concurrency:
            index = self._queue[0]
            token, position = self._claim(index)
            outcome = self._outcome(index)
            # A fault hits one copy of an invocation's first attempt.
            faults = [
                self.faults.get((index, copy)) if outcome.attempts == 0 else None
                for copy in range(self.strategy.copies)
            ]
            canary = CanaryArgs(
                unit=self._key(index),
                token=token,
                blobs=f"runs/{spec.run_id}/ckpt-{index:05d}",
                checkpoints=self.strategy.checkpoints,
                heartbeat_s=spec.heartbeat_s if self.strategy.heartbeats else 0.0,
            )
            params = {
                "workload": spec.workload,
                "params": {**spec.params, "seed": index},
                "store_url": self.store_url,
                "canary": canary.model_dump(mode="json"),
            }
            started: list[tuple[str, Fault | None, Path | None]] = []
            with contextlib.suppress(Throttled):
                for fault in faults:
                    args = dict(params)
                    if fault is not None and fault.point is not None:  # crash_point's only
                        args["crash"] = {"point": fault.point}
                    marks = None
                    if self.marks_dir is not None:
                        marks = self.marks_dir / f"{index:05d}-{uuid.uuid4().hex}"
                        args["marks"] = str(marks)
                    started.append((self.platform.invoke(self.variant, args), fault, marks))
            if not started:
                return
            self._queue.popleft()
            now = time.time()
            if outcome.attempts == 0:
                outcome.first_invoked_at = now
            outcome.attempts += 1
            self._attempts += 1
            self._position[index] = position
            for activation_id, fault, marks in started:
                self._in_flight[activation_id] = Attempt(index, token, fault)
                if marks is not None:
                    self._marks[activation_id] = marks

    def _claim(self, index: int) -> tuple[int, int]:
        """A new attempt owns the unit (fencing the old); its token and checkpoint position."""

        def change(u: FunctionInfo | None) -> FunctionInfo:
            u = u or FunctionInfo(job_id=self.spec.run_id, round=0, shard=index)
            return u.model_copy(
                update={
                    "state": UnitState.RUNNING,
                    "owner_epoch": u.owner_epoch + 1,
                    "attempts": u.attempts + 1,
                    "heartbeat_ms": None,
                    "host": None,
                }
            )

        unit = update(self.store, self._key(index), FunctionInfo, change)
        return unit.owner_epoch, unit.heads[-1].position if unit.heads else -1

    def _unit(self, index: int) -> FunctionInfo | None:
        found = load(self.store, self._key(index), FunctionInfo)
        return found[0] if found else None

    def _deploy_replicas(self) -> None:
        """Canary prepares a job's replicas as it deploys it: the run starts once the replicas
        its first invocations want are warm (their warm-up is not the run's time). Once the
        first has warmed up, its warm-up time may call for more."""
        first = min(self.spec.concurrency, self.spec.invocations)
        ready = 0
        while (wanted := self._want_replicas(active=first)) > ready:
            ready = self.runtimes.wait_ready(self.spec.run_id, timeout_s=self.spec.timeout_s)
            if ready < wanted:
                return  # no room for more in the pool, or they take too long

    def _want_replicas(self, active: int | None = None) -> int:
        """Tell the runtime manager how many replicas the strategy wants now; returns that."""
        wanted = self.strategy.replicas(
            active=self._active() if active is None else active,
            failures=self._failures,
            attempts=self._attempts,
            overlap=self._overlap(),
        )
        if wanted == 0 and self.runtimes.ready(self.spec.run_id) == 0:
            return 0
        prime: dict[str, Any] = {"workload": self.spec.workload, "params": self.spec.params}
        if self.strategy.checkpoints:  # the replica's checkpoint writer starts as it warms up
            prime["store_url"] = self.store_url
        self.runtimes.want(
            self.spec.run_id,
            self.variant,
            memory_mb=self.memory_mb,
            replicas=wanted,
            warmup={"warmup": True, "prime": prime},
        )
        return wanted

    def _overlap(self) -> float:
        """Attempts an invocation runs while one replica warms up: the runtime's warm-up time
        over an attempt's mean duration (the expected one until attempts have ended)."""
        warmup_s = self.runtimes.warmup_s(self.variant)
        if self._succeeded:
            attempt_s = self._succeeded_s / self._succeeded
        elif self.spec.expected_s:
            attempt_s = statistics.median(self.spec.expected_s.values())
        else:
            return 1.0
        return warmup_s / attempt_s if warmup_s is not None and attempt_s > 0 else 1.0

    # ---- faults ---------------------------------------------------------------------------

    def _inject(self) -> None:
        """Fire the faults that are due: an attempt's fault comes ``at`` × its expected
        duration after its first heartbeat, or once it has checkpointed ``after_checkpoint``
        steps."""
        for activation_id, attempt in list(self._in_flight.items()):
            fault = _waiting(attempt)
            if fault is None or not self._due(activation_id, attempt, fault):
                continue
            attempt.fault = None  # fired (or moot): once
            self._fire(activation_id, attempt, fault)

    def _wait_s(self) -> float:
        """How long :meth:`_collect` waits for an activation to end: the tick, or less while a
        fault waits for its attempt: until the blow is due once the attempt's start is seen,
        :data:`FAULT_POLL_S` until then. (With the tick alone, a blow aimed into the first
        milliseconds of a short invocation came after it had ended: in a scale run of ~8 ms
        invocations one in flight, none of 150 landed.)"""
        wait = self.tick_s
        for attempt in self._in_flight.values():
            fault = _waiting(attempt)
            if fault is None:
                continue
            if attempt.started_ms is None or fault.after_checkpoint is not None:
                return min(wait, FAULT_POLL_S)
            wait = min(wait, max(0.0, self._due_ms(attempt, fault) / 1000 - time.time()))
        return wait

    def _due_ms(self, attempt: Attempt, fault: Fault) -> float:
        """When a timed blow is due: ``at`` × the attempt's expected duration after its start."""
        assert attempt.started_ms is not None
        return attempt.started_ms + fault.at * 1000 * self.spec.expected_s.get(attempt.index, 1.0)

    def _due(self, activation_id: str, attempt: Attempt, fault: Fault) -> bool:
        if attempt.started_ms is None or fault.after_checkpoint is not None:
            unit = self._unit(attempt.index)
            if unit is None or unit.owner_epoch != attempt.token or unit.heartbeat_ms is None:
                return False  # not started yet
            if attempt.started_ms is None:
                attempt.started_ms = self._started_ms(activation_id, unit.heartbeat_ms)
                if attempt.started_ms is None:
                    return False
            if fault.after_checkpoint is not None:
                return bool(unit.heads) and unit.heads[-1].position >= fault.after_checkpoint
        return time.time() * 1000 >= self._due_ms(attempt, fault)

    def _started_ms(self, activation_id: str, heartbeat_ms: int) -> int | None:
        """An attempt's start: its unit's first heartbeat. Request replication's copies share
        one unit, which the first copy to run heartbeats alone while another waits for a
        container (cold, or for room): a copy starts at the later of that heartbeat and its
        container taking it, and not before (on a slow machine a copy's blow, timed from its
        twin's heartbeat, came while it waited, and missed)."""
        if self.strategy.copies == 1:
            return heartbeat_ms
        taken = self.platform.running_since(activation_id)
        return None if taken is None else max(heartbeat_ms, round(taken * 1000))

    def _fire(self, activation_id: str, attempt: Attempt, fault: Fault) -> None:
        at = time.time()
        targets = [activation_id]
        if fault.kind == "node_loss":
            targets = list(self._in_flight)
        if fault.kind == "store_restart":
            assert self.restart_store is not None
            self.restart_store()
            targets = []
        for target in targets:
            victim = self._in_flight[target]
            try:
                if fault.kind == "zombie":
                    self.platform.signal(target, signal.SIGSTOP)
                    victim.frozen = True
                else:
                    self.platform.kill(target)
            except ActivationNotFound:
                continue  # it ended before the blow landed
            started = victim.started_ms / 1000 if victim.started_ms is not None else None
            self._injected.append(Hit(victim.index, target, fault.kind, at, started))
        if not targets:
            self._injected.append(Hit(attempt.index, activation_id, fault.kind, at, None))

    def _thaw(self) -> None:
        """Let frozen attempts go on once a newer attempt owns their unit: zombies."""
        for activation_id, attempt in [*self._in_flight.items(), *self._abandoned.items()]:
            if not attempt.frozen:
                continue
            unit = self._unit(attempt.index)
            owned = unit is not None and unit.owner_epoch == attempt.token
            if owned and unit is not None and unit.state is not UnitState.COMMITTED:
                continue
            attempt.frozen = False
            with contextlib.suppress(ActivationNotFound):
                self.platform.signal(activation_id, signal.SIGCONT)

    # ---- ends -------------------------------------------------------------------------------

    def _collect(self) -> None:
        watched = [*self._in_flight, *self._abandoned]
        if watched:
            self.platform.wait_any(watched, timeout_s=self._wait_s())
        self._thaw()
        for activation_id in list(self._abandoned):
            record = self.platform.get_activation(activation_id)
            if record is not None:
                del self._abandoned[activation_id]
                self._book(record)
        for activation_id in list(self._in_flight):
            attempt = self._in_flight.get(activation_id)
            if attempt is None:
                continue  # a copy of a unit committed in this pass: abandoned, booked later
            record = self.platform.get_activation(activation_id)
            if record is not None:
                del self._in_flight[activation_id]
                self._book(record)
                self._settle(attempt, record, classify(record), "platform")
        self._leases()

    def _leases(self) -> None:
        """Attempts whose heartbeat lease lapsed are ended as hung (their activations watched as
        abandoned); the next claim fences them. Read four times per heartbeat period."""
        now = time.monotonic()
        if not self.strategy.heartbeats or now < self._next_lease_check:
            return
        self._next_lease_check = now + self.spec.heartbeat_s / 4
        now_ms = int(time.time() * 1000)
        for attempt in list({a.index: a for a in self._in_flight.values()}.values()):
            unit = self._unit(attempt.index)
            if unit is None:
                continue
            failure = hung(unit, attempt.token, now_ms=now_ms, heartbeat_s=self.spec.heartbeat_s)
            if failure is None:
                continue
            for other in [i for i, a in self._in_flight.items() if a.index == attempt.index]:
                self._abandoned[other] = self._in_flight.pop(other)
            self._settle(attempt, None, failure, "lease")

    def _settle(
        self, attempt: Attempt, record: Activation | None, failure: Failure | None, by: str
    ) -> None:
        index = attempt.index
        if index in self._done:
            return  # another copy committed the unit
        unit = self._unit(index)
        if unit is not None and unit.state is UnitState.COMMITTED:
            # Committed (by this attempt, or by a copy with the same token): whatever the
            # activation says, the invocation is done exactly once.
            outcome = self._outcome(index)
            outcome.committed_at = time.time() if record is None else record.end / 1000
            outcome.result = unit.committed_result
            if record is not None:
                outcome.final_start_ms = record.start
                outcome.final_wait_ms = record.wait_time
                outcome.final_init_ms = record.init_time
                if isinstance(record.response.result, dict):
                    outcome.final = record.response.result if record.response.success else {}
            self._done.add(index)
            self._drop_copies(index)
            return
        if failure is None:
            failure = Failure(FailureKind.CRASH, "the attempt answered without committing")
        live = sum(1 for a in self._in_flight.values() if a.index == index)
        self._failures += 1
        outcome = self._outcome(index)
        outcome.failures.append(str(failure.kind))
        outcome.detected_by.append(by)
        head = unit.heads[-1].position if unit and unit.heads else -1
        progressed = head > self._position.get(index, -1)
        fruitless = 0 if progressed else self._fruitless.get(index, 0) + 1
        self._fruitless[index] = fruitless
        decision = self.strategy.recover(failure, failures=fruitless, live=live)
        if decision is Recovery.FAIL:
            raise JobFailed(
                f"invocation {index} failed {fruitless} time(s) without progress, last with "
                f"{failure.kind}: {failure.message} (strategy {self.strategy.name})"
            )
        if decision is not Recovery.WAIT:
            self._queue.appendleft(index)

    def _drop_copies(self, index: int) -> None:
        """Stop the other copies of a committed invocation, those still waiting for a container
        too (a kill refuses one: it would run later, to no purpose, and be booked)."""
        for activation_id in [i for i, a in self._in_flight.items() if a.index == index]:
            self._abandoned[activation_id] = self._in_flight.pop(activation_id)
            with contextlib.suppress(ActivationNotFound):
                self.platform.stop(activation_id)

    def _book(self, record: Activation) -> None:
        memory_mb = record.memory_mb or self.memory_mb
        self._gb_s += (record.duration or 0) / 1000 * memory_mb / 1024
        self._activations += 1
        if record.success and record.duration:
            self._succeeded += 1
            self._succeeded_s += record.duration / 1000

    def _drain(self) -> None:
        """Wait for the abandoned attempts (fenced zombies, dropped copies) to end and book them."""
        deadline = time.monotonic() + self.spec.timeout_s + 5
        while self._abandoned and time.monotonic() < deadline:
            self._collect()
