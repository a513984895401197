"""Typed records for Canary's five tables and the execution history, under DESIGN.md's prefixes:
``worker/`` (worker_info), ``job/`` (job_info), ``fn/`` (function_info, with its
checkpoint_info heads inside), ``replica/`` (replication_info), ``history/`` (execution history);
and the controller's own: ``ledger/`` (each activation's use and cost), ``idem/``
(Idempotency-Keys), ``apikey/`` (API keys, hashed)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from faasdl.errors import StoreError, Superseded
from faasdl.store.base import StateStore

R = TypeVar("R", bound="Record")
T = TypeVar("T")


class Record(BaseModel, ABC):
    """A record of one table; :meth:`key` is where it lives in the store."""

    model_config = ConfigDict(extra="forbid")

    @abstractmethod
    def key(self) -> str:
        """The record's key, under its table's prefix."""


class WorkerInfo(Record):
    """A worker (an invoker node; on one machine a simulated group of containers)."""

    worker_id: str
    host: str = ""
    memory_mb: int = 0
    used_mb: int = 0
    alive: bool = True
    heartbeat_ms: int = 0
    labels: dict[str, str] = Field(default_factory=dict)

    def key(self) -> str:
        return worker_key(self.worker_id)


#: A job's id: 16 hex digits (the controller makes it from a UUID).
JOB_ID_PATTERN = r"^[0-9a-f]{16}$"


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ActivationUse(Record):
    """What one activation of a job used and cost: a line of the job's ledger.

    Each is a record of its own (``ledger/{job}/{round}/{activation}``; ``ledger/{job}/
    {activation}`` in jobs from before lines were kept by round): booking an activation is one
    put-if-absent, done at most once however often a controller restarts, and the job record,
    rewritten at every step of the job, does not grow with every activation."""

    job_id: str
    activation_id: str
    kind: Literal["train", "aggregate", "evaluate"]
    round: int
    unit: int  # the shard of a trainer, the aggregator's index in its round, 0 for evaluation
    attempt: int = 1
    memory_mb: int
    start_ms: int
    duration_ms: int
    wait_ms: int = 0
    init_ms: int = 0
    peak_memory_mb: float | None = None
    outcome: str  # "success" or the failure's kind
    gb_s: float
    cost_usd: float

    def key(self) -> str:
        return ledger_key(self.job_id, self.activation_id, self.round)


class LedgerTotals(BaseModel):
    """What a job's ledger adds up to besides its count and cost (the record's
    ``activation_count`` and ``cost_usd``), kept with the job as each line is booked, so that
    its summary need not read the ledger (a 10,000-round job's is ~60,000 lines, ~18 MB)."""

    failed: int = 0  # outcomes other than success and stopped
    stopped: int = 0  # by a cancel, a finish or the job's failure
    gb_s: float = 0.0  # the activations' (the replicas' are the record's ``replica_gb_s``)

    def plus(self, outcome: str, gb_s: float) -> LedgerTotals:
        """With one more line, of ``outcome`` (an :class:`ActivationUse`'s) and ``gb_s``."""
        return LedgerTotals(
            failed=self.failed + (outcome not in ("success", "stopped")),
            stopped=self.stopped + (outcome == "stopped"),
            gb_s=self.gb_s + gb_s,
        )

    @classmethod
    def of(cls, lines: Iterable[tuple[str, float]]) -> LedgerTotals:
        """The totals of a ledger's lines, each its (outcome, GB·s)."""
        totals = cls()
        for outcome, gb_s in lines:
            totals = totals.plus(outcome, gb_s)
        return totals


class RoundResult(BaseModel):
    """One round: the training loss averaged over the shards, and the new global model's test
    loss and accuracy (and its validation set's, where the job holds one out)."""

    round: int
    epochs: int
    examples: int
    loss: float
    test_loss: float
    accuracy: float
    validation_loss: float | None = None
    validation_accuracy: float | None = None
    started_ms: int
    finished_ms: int

    @property
    def chosen_loss(self) -> float:
        """The loss a job chooses its best round by: the validation set's, else the test's."""
        return self.test_loss if self.validation_loss is None else self.validation_loss


class BestRound(BaseModel):
    """A job's round of the lowest validation loss so far (the test loss, without a validation
    set): its global model, and how it scored."""

    round: int  # rounds finished with it, as ``JobInfo.round`` counts them
    weights: str
    test_loss: float
    accuracy: float
    validation_loss: float | None = None

    @property
    def chosen(self) -> Literal["validation", "test"]:
        """Which loss chose it."""
        return "test" if self.validation_loss is None else "validation"

    @property
    def chosen_loss(self) -> float:
        return self.test_loss if self.validation_loss is None else self.validation_loss


class FailureReport(BaseModel):
    """One failed attempt as the job report shows it: what failed, how it was classified and
    noticed, the recovery taken, and what the failed attempt cost."""

    t_ms: int  # when the controller noticed it
    kind: Literal["train", "aggregate", "evaluate"]
    round: int
    unit: int
    attempt: int
    activation_id: str
    classification: str  # a FailureKind
    message: str
    detected_by: Literal["platform", "lease", "cluster"]
    recovery: str  # a Recovery: resume, restart, wait, fail
    resume_from: int | None = None  # the checkpoint position the next attempt starts from
    limits: str | None = None  # how the limits changed for the next attempt
    cost_usd: float = 0.0


class JobEvent(BaseModel):
    """A line of a job's log, as the events stream and ``--watch`` show it."""

    t_ms: int
    kind: str
    message: str
    round: int | None = None
    unit: int | None = None


#: Rounds a job's record keeps, the newest: a running job's record is rewritten at each of its
#: changes (several a round), and with every round in it a 10,000-round job's grew to 1.7 MB,
#: each change 75 ms on SQLite (3 ms with 100 rounds). Every round is also a record of its own
#: (:func:`round_key`), written as the round ends, which the API's view of the job reads back.
ROUNDS_KEPT = 100


class JobInfo(Record):
    job_id: str
    tenant: str = "default"
    state: JobState = JobState.QUEUED
    spec: dict[str, Any] = Field(default_factory=dict)
    plan: dict[str, Any] | None = None
    idempotency_key: str | None = None
    round: int = 0  # rounds finished
    created_ms: int = 0
    updated_ms: int = 0
    started_ms: int | None = None
    finished_ms: int | None = None
    rounds: list[RoundResult] = Field(default_factory=list)
    global_weights: str | None = None
    best: BestRound | None = None  # none before a round has finished, and in older records
    model: str | None = None
    stopped_early: bool = False
    # Why the runner stopped it before its last round (none where it was not, by request, or
    # in records from before the reasons were kept: those stopped at their target_loss).
    stopped_because: str | None = None
    activation_count: int = 0  # lines in the job's ledger
    # Its lines are kept by round (:func:`ledger_key`), so that its latest rounds' are read alone;
    # false in records from before, whose lines are kept by activation alone.
    ledger_by_round: bool = False
    # The rest of its totals; none in records from before they were kept (read the ledger).
    ledger_totals: LedgerTotals | None = None
    failures: list[FailureReport] = Field(default_factory=list)
    # Failure reports dropped from the start of ``failures`` to keep it short (``failures_kept``).
    failures_dropped: int = 0
    replica_gb_s: float = 0.0  # memory the job's warm replicas held
    cost_usd: float = 0.0  # activations and replicas
    events: list[JobEvent] = Field(default_factory=list)
    # Log lines dropped from the start of ``events`` to keep it short: ``events[i]`` is the job's
    # line number ``events_dropped + i`` (the events stream's ids; what ``--watch`` has printed).
    events_dropped: int = 0
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)

    @property
    def kept_best(self) -> BestRound | None:
        """Its round of the lowest test loss, where the job keeps that round's model
        (``keep_model: best``) and a round has finished."""
        return self.best if self.spec.get("keep_model") == "best" else None

    @property
    def kept_weights(self) -> str | None:
        """The model the job keeps if it ends now (none before a round has finished): its
        last finished round's, or its best round's (``keep_model: best``)."""
        return best.weights if (best := self.kept_best) else self.global_weights

    def with_event(self, event: JobEvent, *, kept: int, **update: Any) -> JobInfo:
        """The record with ``update`` applied and ``event`` added to its log, of which the
        ``kept`` newest lines stay."""
        events, dropped = _newest([*self.events, event], kept)
        numbered = {"events": events, "events_dropped": self.events_dropped + dropped}
        return self.model_copy(update={**update, **numbered})

    def with_round(self, result: RoundResult, **update: Any) -> JobInfo:
        """The record with ``update`` applied and ``result`` added to its rounds, of which the
        ``ROUNDS_KEPT`` newest stay (each is stored as a record of its own first): the first
        kept round's number is how many were dropped."""
        rounds, _ = _newest([*self.rounds, result], ROUNDS_KEPT)
        return self.model_copy(update={**update, "rounds": rounds})

    def with_failure(self, report: FailureReport, *, kept: int) -> JobInfo:
        """The record with ``report`` added to its failures, of which the ``kept`` newest stay."""
        failures, dropped = _newest([*self.failures, report], kept)
        return self.model_copy(
            update={"failures": failures, "failures_dropped": self.failures_dropped + dropped}
        )

    def key(self) -> str:
        return job_key(self.job_id)


def _newest(items: list[T], kept: int) -> tuple[list[T], int]:
    """The ``kept`` newest of ``items`` (the last ones), and how many older ones were dropped."""
    dropped = max(0, len(items) - kept)
    return items[dropped:], dropped


class IdempotencyRecord(Record):
    """An ``Idempotency-Key`` a tenant used, the job it created, and a digest of the request."""

    tenant: str
    idempotency_key: str
    job_id: str
    request_sha256: str

    def key(self) -> str:
        return idempotency_key(self.tenant, self.idempotency_key)


class ApiKeyInfo(Record):
    """An API key of the controller: whose it is, what it may do, and the SHA-256 of its secret
    (never the secret itself)."""

    key_id: str
    tenant: str
    admin: bool = False
    name: str = ""
    secret_sha256: str
    created_ms: int
    revoked_ms: int | None = None
    #: When it stops being valid (none: never; keys made before expiries had none).
    expires_ms: int | None = None

    def key(self) -> str:
        return apikey_key(self.key_id)

    def expired(self, now_ms: int) -> bool:
        return self.expires_ms is not None and now_ms >= self.expires_ms


class UnitState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMMITTED = "committed"
    FAILED = "failed"


class FunctionInfo(Record):
    """One unit of work (job, round, shard): the record every exactly-once step CASes."""

    job_id: str
    round: int
    shard: int
    state: UnitState = UnitState.PENDING
    owner_epoch: int = 0
    activation_id: str | None = None
    heads: list[CheckpointHead] = Field(
        default_factory=list, description="The latest checkpoints, oldest first."
    )
    heartbeat_ms: int | None = None  # the owning attempt's last heartbeat; None before its first
    host: str | None = None  # the owning attempt's container host name (a pod's name)
    claimed_ms: int | None = None  # when the owning attempt was claimed, before it was invoked
    committed_result: str | None = None
    attempts: int = 0
    memory_mb: int | None = None
    timeout_ms: int | None = None
    examples: int | None = None
    loss: float | None = None
    failures: list[str] = Field(default_factory=list)

    def key(self) -> str:
        return fn_key(self.job_id, self.round, self.shard)


class CheckpointHead(BaseModel):
    """One persisted checkpoint of a unit: Canary's checkpoint_info, kept inside the unit's ``fn/``
    record so that moving the head is the same compare-and-set as every other change of a unit."""

    blob: str
    owner_epoch: int
    position: int  # how far the function had got (a training step count, a file index, …)
    size: int
    created_ms: int


class ReplicationInfo(Record):
    """Warm replicas kept of one runtime (an action variant)."""

    runtime: str
    replicas: int = 0
    factor: float = 0.0
    workers: list[str] = Field(default_factory=list)
    updated_ms: int = 0

    def key(self) -> str:
        return replica_key(self.runtime)


class ExecutionHistory(Record):
    """Measured peak memory and durations of one model signature (model, shape, batch, shard).

    A run's duration is kept as its fixed part (load, build, save: ``overhead_ms``, without the
    cold start, which belongs to the runtime) and its time per epoch (``epoch_ms``), so that a
    round of any length can be timed from it.
    ``memory_floor_mb`` and ``timeout_floor_ms`` are limits a run failed under (out of memory,
    out of time): the next estimate for the signature must exceed them. ``timeout_ms`` is the time
    limit of the latest successful run: the next estimate keeps it while it is enough and not
    twice what is needed, so that jobs keep one action variant and its warm containers.
    ``runtime_id`` is the runtime whose runs measured the peak (:func:`.usage.runtime_id`; empty:
    one from before runtimes reported it): a run on another starts the peak and the memory floor
    again.
    """

    signature: str
    runs: int = 0
    runtime_id: str = ""
    peak_memory_mb: float = 0.0
    overhead_ms: list[int] = Field(default_factory=list)
    epoch_ms: list[int] = Field(default_factory=list)
    # A container's first run of the signature builds its trainer and traces its step (in the
    # run's overhead too, which a warm container's runs outnumber): none in records from before.
    build_ms: list[int] = Field(default_factory=list)
    # The jobs' other activations of each round, by the trainers' signature: an aggregation's
    # and an evaluation's time, without a cold start (none in records from before).
    aggregate_ms: list[int] = Field(default_factory=list)
    evaluate_ms: list[int] = Field(default_factory=list)
    # An aggregation's cold starts: its own action, NumPy only, so not the runtime's (a trainer's
    # imports TensorFlow).
    aggregate_init_ms: list[int] = Field(default_factory=list)
    memory_floor_mb: int = 0
    timeout_floor_ms: int = 0
    timeout_ms: int = 0

    def key(self) -> str:
        return history_key(self.signature)


class ProfileRecord(Record):
    """A model's sizes for the estimator, measured once per (model, input shape, classes)."""

    name: str
    params: int
    trainable_params: int
    activations_per_example: int
    layers: int

    def key(self) -> str:
        return profile_key(self.name)


class BaselineRecord(Record):
    """The training runtime itself: its peak memory with a tiny model trained (the floor of every
    memory estimate) and its cold starts' init times (OpenWhisk's time limit covers ``/init``).
    ``runtime_id`` is what measured them (:func:`.usage.runtime_id`; empty: a record from before
    runtimes reported it); ``stale``: a run has reported another since, so the next plan measures
    the runtime again."""

    runtime: str
    runtime_id: str = ""
    stale: bool = False
    peak_memory_mb: float
    init_ms: list[int] = Field(default_factory=list)
    # The same starts by how many trainers their job ran at once (the probe's: 1): on one node
    # those start side by side and each is slower; on a cluster they spread over its invokers.
    # Empty in a record from before they were kept by it.
    init_ms_by_trainers: dict[int, list[int]] = Field(default_factory=dict)
    measured_ms: int

    def starts_with(self, trainers: int) -> list[int]:
        """The cold starts to plan a job of ``trainers`` at once by: those of the most trainers
        at once on record up to its own; every start where none is (a record from before)."""
        fewer = [n for n in self.init_ms_by_trainers if n <= trainers]
        return self.init_ms_by_trainers[max(fewer)] if fewer else self.init_ms

    def key(self) -> str:
        return baseline_key(self.runtime)


def worker_key(worker_id: str) -> str:
    return f"worker/{worker_id}"


def job_key(job_id: str) -> str:
    return f"job/{job_id}"


def ledger_key(job_id: str, activation_id: str, round_: int | None) -> str:
    """An activation's line of the job's ledger, under its round; ``round_`` None: under the job
    alone, as in a job from before lines were kept by round (``JobInfo.ledger_by_round``)."""
    if round_ is None:
        return f"{ledger_prefix(job_id)}{activation_id}"
    return f"{ledger_prefix(job_id)}{round_:05d}/{activation_id}"


def ledger_prefix(job_id: str) -> str:
    """The prefix of the job's whole ledger."""
    return f"ledger/{job_id}/"


def round_key(job_id: str, round_: int) -> str:
    """A round's result (:class:`RoundResult`), kept beside the job's record."""
    return f"{round_prefix(job_id)}{round_:05d}"


def round_prefix(job_id: str) -> str:
    """The prefix of the job's round results."""
    return f"round/{job_id}/"


def idempotency_key(tenant: str, key: str) -> str:
    return f"idem/{tenant}/{key}"


def apikey_key(key_id: str) -> str:
    return f"apikey/{key_id}"


def fn_key(job_id: str, round_: int, shard: int) -> str:
    return f"{fn_round_prefix(job_id, round_)}{shard:05d}"


def fn_round_prefix(job_id: str, round_: int) -> str:
    """The prefix of the unit records of the job's round ``round_``."""
    return f"{fn_prefix(job_id)}{round_:05d}/"


def fn_prefix(job_id: str) -> str:
    """The prefix of the job's unit records."""
    return f"fn/{job_id}/"


def replica_key(runtime: str) -> str:
    return f"replica/{runtime}"


def history_key(signature: str) -> str:
    return f"history/{signature}"


def profile_key(name: str) -> str:
    return history_key(f"profile/{name}")


def baseline_key(runtime: str) -> str:
    return history_key(f"baseline/{runtime}")


def load(store: StateStore, key: str, model: type[R]) -> tuple[R, int] | None:
    """The record at ``key`` as ``model`` with its version, or ``None`` if absent.

    A stored value that does not fit ``model`` is a ``StoreError`` naming the key."""
    found = store.get(key)
    if found is None:
        return None
    try:
        return model.model_validate(found.value), found.version
    except PydanticValidationError as exc:
        raise StoreError(f"record {key!r} is not a valid {model.__name__}: {exc}") from exc


def ledger(store: StateStore, job: JobInfo, round_from: int = 0) -> list[ActivationUse]:
    """The job's ledger: every activation booked (of round ``round_from`` and later), in the
    order they started. A job's lines kept by round are read from that round's on; a job's from
    before, whole (a 10,000-round job's ~60,000 lines: ~0.6 s on SQLite)."""
    prefix = ledger_prefix(job.job_id)
    if job.ledger_by_round:
        found = store.scan(prefix, from_key=ledger_key(job.job_id, "", round_from))
    else:
        found = store.scan(prefix)
    entries = [
        ActivationUse.model_validate(v.value)
        for _, v in found
        if v.value.get("round", 0) >= round_from  # parsed only if wanted
    ]
    return sorted(entries, key=lambda a: (a.start_ms, a.activation_id))


def create(store: StateStore, record: Record) -> bool:
    """Create the record; ``False`` if its key already exists."""
    return store.put_if_absent(record.key(), record.model_dump(mode="json"))


def replace(store: StateStore, record: Record, expected_version: int) -> bool:
    """Compare-and-set the record over ``expected_version``; ``False`` on a lost race."""
    return store.compare_and_set(record.key(), expected_version, record.model_dump(mode="json"))


def update(
    store: StateStore,
    key: str,
    model: type[R],
    change: Callable[[R | None], R],
    *,
    attempts: int = 20,
) -> R:
    """Read-modify-write of one record by compare-and-set, retried when another writer wins.

    ``change`` gets the current record (``None`` when absent) and returns the new one; it may run
    several times and must not have side effects. Raises ``Superseded`` after ``attempts`` lost
    races in a row.
    """
    for _ in range(attempts):
        found = load(store, key, model)
        new = change(found[0] if found else None)
        won = replace(store, new, found[1]) if found else create(store, new)
        if won:
            return new
    raise Superseded(f"record {key!r} kept changing under {attempts} attempts to update it")
