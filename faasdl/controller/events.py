"""The event manager: runs one admitted job, round by round, keeping all of its state in the store.

A round invokes one training action per shard from the previous round's global model; as soon as
every input of an aggregator has committed, that aggregator starts, and the levels above follow
until the root writes the next global model, which one evaluation action then scores on the test
set. Every unit (job, round, shard) is a ``fn/`` record whose state changes by compare-and-set, so
a controller that restarts finds the committed units of the round it was in and runs only the
rest. A failed activation is classified and, within the job's fault-tolerance policy, run again:
out of memory raises the memory class, out of time doubles the time limit (both learnt by the
execution history), a crash reruns as it was; an application error fails the job.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from faasdl.actions import AGGREGATE, TRAIN, deploy_variant
from faasdl.canary.checkpoint import CanaryArgs
from faasdl.canary.core import ContainerLosses, hung, lost, mtbf_s
from faasdl.canary.runtime import RuntimeManager
from faasdl.canary.strategies import Recovery, RecoveryStrategy
from faasdl.config import Settings
from faasdl.controller.metrics import Metrics
from faasdl.controller.plan import JobPlan
from faasdl.controller.validator import JobSpec
from faasdl.errors import (
    DIVERGED,
    ActivationNotFound,
    ActivationTimeout,
    EstimationError,
    FaasdlError,
    JobFailed,
    PlatformError,
    PlatformUnavailable,
    StoreError,
    StoreUnavailable,
    Throttled,
    Unsupported,
    ValidationError,
)
from faasdl.estimator.failures import Limits, correct
from faasdl.estimator.planner import DataFacts
from faasdl.estimator.sizer import Sizer, facts_of, load_checked
from faasdl.platform.base import (
    WHISK_ERROR,
    Activation,
    ActivationResponse,
    Platform,
    retries_told,
)
from faasdl.platform.classify import Failure, FailureKind, classify
from faasdl.store import action_environment
from faasdl.store.base import StateStore
from faasdl.store.records import (
    ActivationUse,
    BestRound,
    FailureReport,
    FunctionInfo,
    IdempotencyRecord,
    JobEvent,
    JobInfo,
    JobState,
    LedgerTotals,
    RoundResult,
    UnitState,
    fn_key,
    fn_prefix,
    fn_round_prefix,
    idempotency_key,
    job_key,
    ledger,
    ledger_key,
    ledger_prefix,
    load,
    round_key,
    round_prefix,
    update,
)
from faasdl.training.datasets import (
    ONE_DATA_SET,
    NpzSpec,
    Shard,
    dims,
    split_training_set,
)

log = logging.getLogger(__name__)

#: Longest wait for an activation record before looking at cancellation and deadlines again.
TICK_S = 0.5

#: Longest wait for the record of an attempt that committed while the controller was down.
UNSEEN_WAIT_S = 10.0

#: Longest wait for the records of the activations a cancelled or failed job's runner stopped
#: (a platform that stops one records it at once: ~50 ms for a TensorFlow container here).
STOPPED_WAIT_S = 10.0

#: How often a job paused by a platform outage asks whether the platform answers again.
PLATFORM_PROBE_S = 1.0

#: How often an ended job's runner, waiting for activations it could not stop to end, looks
#: whether the controller stops: each look starts OpenWhisk's polling for their records over from
#: its shortest delay (at half a second, about ten requests a second an activation).
UNSTOPPED_LOOK_S = 5.0

#: Attempts of a unit in a row that ran out of time (or memory) at the platform's largest limit
#: without progress before the job fails for want of a larger one: one such attempt may have lost
#: its time to a cold start or a slow node; two show that the unit does not fit (checkpointing
#: resumes a unit from what an attempt saved, so a unit longer than the limit fits if each attempt
#: saves something). One that ran out of time as its container started is not counted: it never
#: ran the unit (a loaded node's cold start; ``max_attempts`` bounds those).
FRUITLESS_AT_MAX = 2


def stuck_at_max(failure: Failure, *, progressed: bool, before: int) -> int:
    """A unit's attempts in a row at the platform's largest limits without progress, the one
    that failed with ``failure`` included (``before``: those before it): none once an attempt
    progressed; one out of time as its container started never ran the unit, and is not counted
    (see :data:`FRUITLESS_AT_MAX`)."""
    if progressed:
        return 0
    return before if failure.starting else before + 1


Kind = Literal["train", "aggregate", "evaluate"]


class Stopped(Exception):
    """The runner was told to stop: the job was cancelled, or the controller is shutting down."""


class BudgetSpent(FaasdlError):
    """The job's activations cost its ``max_cost_usd`` while a round was in progress: how much,
    of how much."""


@dataclass
class Runtime:
    """What every runner of one controller shares."""

    platform: Platform
    store: StateStore
    store_url: str  # as the actions reach it: absolute (their folder differs), no password
    sizer: Sizer
    settings: Settings
    metrics: Metrics
    runtimes: RuntimeManager
    shutdown: threading.Event = field(default_factory=threading.Event)
    #: Set as the controller stops on a platform that kills what runs as it closes: runners
    #: start nothing more and stop once what they started has ended (:meth:`Controller.close`).
    draining: threading.Event = field(default_factory=threading.Event)
    #: Containers the cluster reports lost (fed by the Kubernetes pod watch when it runs).
    losses: ContainerLosses = field(default_factory=ContainerLosses)


@dataclass
class _Task:
    kind: Kind
    round: int
    level: int  # 0: a trainer; k: an aggregator of level k; -1: the evaluation
    index: int
    params: dict[str, Any]
    attempt: int = 1
    owner_epoch: int = 0
    deadline: float = 0.0
    fruitless: int = 0  # failures in a row without progress before this attempt
    stuck_at_max: int = 0  # of those, the latest in a row at the platform's largest limit
    position: int = -1  # the unit's checkpoint position when the attempt was claimed
    #: The limits the attempt runs with: the job's may have been raised since, by a failure of
    #: another attempt that ran with these (one cause, one raise).
    limits: Limits | None = None
    done: bool = False
    launched: float = 0.0  # time.monotonic() as it was started (or found running, resumed)


@dataclass
class _Ended:
    """An attempt the runner is done waiting for: its record, or the failure that ended it."""

    task: _Task
    activation_id: str
    record: Activation | None
    failure: Failure | None = None
    detected_by: Literal["platform", "lease", "cluster"] = "platform"
    unit: FunctionInfo | None = None  # a trainer's unit as read when it was settled


def now_ms() -> int:
    return int(time.time() * 1000)


#: What every job's blobs are named under: ``jobs/<job id>/…``.
JOB_BLOBS = "jobs/"


def job_blobs(job_id: str) -> str:
    """The prefix of the blobs of job ``job_id``."""
    return f"{JOB_BLOBS}{job_id}/"


def delete_job_data(store: StateStore, job: JobInfo, names: list[str] | None = None) -> int:
    """Delete the blobs ``job`` wrote (``names`` of them, or all) but its model; how many were."""
    if names is None:
        names = store.blob_names(job_blobs(job.job_id))
    doomed = [name for name in names if name != job.model]
    for name in doomed:
        store.delete_blob(name)
    return len(doomed)


def init_model_of(store: StateStore, spec: JobSpec, plan: JobPlan) -> str | None:
    """The model blob the job's ``init_model`` names, checked: an ended job of the same tenant
    that kept a model (done, or failed or cancelled after a round had finished) whose model,
    input shape, classes and optimizer are the job's. Raises ``ValidationError`` naming
    ``init_model``; ``None`` without one."""
    if spec.init_model is None:
        return None
    found = load(store, job_key(spec.init_model), JobInfo)
    source = found[0] if found and found[0].tenant == spec.tenant else None
    if source is None:  # another tenant's job is as unknown as one that is not there
        raise ValidationError(
            f"no job {spec.init_model!r} of tenant {spec.tenant!r}", field="init_model"
        )
    if source.model is None or source.plan is None:
        raise ValidationError(no_model(source), field="init_model")
    trained = JobSpec.model_validate(source.spec)
    had = JobPlan.model_validate(source.plan)
    theirs = (trained.model_name, had.input_shape, had.classes)
    ours = (spec.model_name, plan.input_shape, plan.classes)
    if theirs != ours:
        raise ValidationError(
            f"job {source.job_id} trained {_architecture(*theirs)}; this job is "
            f"{_architecture(*ours)}: they must be the same",
            field="init_model",
        )
    if trained.optimizer != spec.optimizer:
        raise ValidationError(
            f"job {source.job_id} trained with {trained.optimizer}, whose state its model "
            f"carries; this job's optimizer is {spec.optimizer}: use {trained.optimizer}",
            field="init_model",
        )
    if store.blob_manifest(source.model) is None:
        raise ValidationError(
            f"job {source.job_id}'s model is gone from the store (deleted with its job, or past "
            "its retention)",
            field="init_model",
        )
    return source.model


def kept_model(job: JobInfo) -> str:
    """What a job that fails or is cancelled now says of the model it keeps (its last finished
    round's, or its best round's), after its log line's words; nothing before a round has
    finished."""
    if best := job.kept_best:
        return f"; the model of round {best.round} is kept{lowest(best)}"
    return f"; the model of round {job.round} is kept" if job.global_weights else ""


def lowest(best: BestRound) -> str:
    """What a job that keeps its best round's model says of it."""
    return (
        f", of its lowest {best.chosen} loss ({best.chosen_loss:.4f}, test accuracy "
        f"{best.accuracy:.4f})"
    )


def no_model(job: JobInfo) -> str:
    """Why ``job`` has no model (to download, or to train on)."""
    if not job.finished:
        return f"job {job.job_id} has no model yet: it is {job.state}"
    return f"job {job.job_id} has no model: it ended ({job.state}) before a round had finished"


def _architecture(model: str, input_shape: tuple[int, ...], classes: int) -> str:
    return f"{model} for {dims(input_shape)} inputs and {classes} classes"


def fence_units(store: StateStore, job: JobInfo) -> int:
    """Take an ended job's running units from the attempts that may still run them (ones its
    platform could not stop: an OpenWhisk whose API is down, an activation it lost sight of):
    each unit's owner epoch moves on, so that the attempt's next heartbeat, checkpoint or commit
    is refused (``Superseded``) and it ends, deleting the checkpoint it had just written. Only
    the round in progress has running units (a round ends once all its units commit). The units
    stay ``running`` to their readers. Returns how many were fenced."""
    fenced = 0

    def change(u: FunctionInfo | None) -> FunctionInfo:
        assert u is not None, "a unit record is deleted with its job alone"
        return u.model_copy(update={"owner_epoch": u.owner_epoch + 1})

    for key, found in store.scan(fn_round_prefix(job.job_id, job.round)):
        if FunctionInfo.model_validate(found.value).state is UnitState.RUNNING:
            update(store, key, FunctionInfo, change)
            fenced += 1
    return fenced


def delete_job(store: StateStore, job: JobInfo) -> None:
    """Delete an ended job whole: its ``Idempotency-Key`` first (a replay of its request must
    not bring it back under its id), its blobs, ledger and unit records, and its record last
    (what a deletion that stopped half-way leaves, the next one finds)."""
    if job.idempotency_key is not None:
        key = idempotency_key(job.tenant, job.idempotency_key)
        found = load(store, key, IdempotencyRecord)
        if found is not None and found[0].job_id == job.job_id:
            store.delete(key, found[1])
    for name in store.blob_names(job_blobs(job.job_id)):
        store.delete_blob(name)
    for prefix in (ledger_prefix(job.job_id), fn_prefix(job.job_id), round_prefix(job.job_id)):
        for key, version in store.scan_versions(prefix):
            store.delete(key, version)
    store.delete(job_key(job.job_id))


def shard_blob(job_id: str, shard: int) -> str:
    return f"{job_blobs(job_id)}data/shard-{shard:05d}"


def test_blob(job_id: str) -> str:
    return f"{job_blobs(job_id)}data/test"


def validation_blob(job_id: str) -> str:
    """The training examples held out to choose by (``validation_fraction``)."""
    return f"{job_blobs(job_id)}data/validation"


def global_blob(job_id: str, round_: int) -> str:
    """The global model after ``round_`` rounds."""
    return f"{job_blobs(job_id)}global/{round_:05d}"


class JobRunner:
    """Runs one job to its end; :meth:`run` is the body of the job's thread."""

    def __init__(self, *, job_id: str, runtime: Runtime) -> None:
        self.job_id = job_id
        self.rt = runtime
        self.cancelled = threading.Event()
        self._in_flight: dict[str, _Task] = {}
        # Attempts fenced out (hung, or copies that lost): their records are still booked.
        self._abandoned: dict[str, _Task] = {}
        # Activations of an ended job that the platform could not be asked to stop (OpenWhisk
        # without faasdl's admin endpoint, or not answering): booked once they have ended.
        self._unstopped: dict[str, _Task] = {}
        self._loss_cursor = runtime.losses.cursor  # containers lost before the runner are not its
        # The runner is the only writer of its job's plan: it reads spec and plan once and keeps
        # the plan in step with the store when it corrects limits.
        self.spec: JobSpec
        self._model_args: dict[str, Any]  # the spec's: a job's own architecture's digest once
        self.plan: JobPlan
        self.strategy: RecoveryStrategy
        self._ledger_by_round: bool  # how its lines are kept: read with the spec
        self._variants: dict[tuple[str, int, int], tuple[str, float]] = {}
        self._train_s = 0.0  # training activations' time, for the observed MTBF
        self._train_attempts = 0
        self._train_failures = 0
        self._cost_usd = 0.0  # the job's cost as its record says (what its ledger has booked)
        # Its round of the lowest validation (or test) loss so far.
        self._best: BestRound | None = None

    # ---- the job ----------------------------------------------------------------------------

    def run(self) -> None:
        try:
            with retries_told(self._retried):
                self._run()
        except Stopped:
            self._kill_in_flight()
            if not self._ended(None):
                return
        except StoreUnavailable as exc:
            # Everything the job has done is in the store, which is down: leave its attempts
            # running and end this runner; the scheduler starts another once the store answers,
            # and that one re-attaches to them like a restarted controller.
            log.warning("job %s paused, the store is unavailable: %s", self.job_id, exc)
            return
        except PlatformUnavailable as exc:
            # Everything the job has done is in the store: leave its attempts as they are (an
            # OpenWhisk whose API is down runs them on; one restarted lost them, as their leases
            # and lost-deadlines will tell) and wait for the platform; then end this runner, and
            # the scheduler starts another, which re-attaches to them as a restarted
            # controller's does. A job cancelled meanwhile ends here: what it ran cannot be
            # stopped through the platform; its units are fenced as its data is released, its
            # attempts end at their next heartbeat, and they are booked once the platform
            # answers again.
            self._pause(exc)
            if not self.cancelled.is_set():
                return
            self._unstopped |= self._in_flight | self._abandoned
            self._in_flight.clear()
            self._abandoned.clear()
            if not self._ended(None):
                return
        except FaasdlError as exc:
            self._kill_in_flight()
            if not self._ended(str(exc)):
                return
        except Exception as exc:  # a bug must still end the job visibly, not leave it running
            self._kill_in_flight()
            log.exception("job %s crashed", self.job_id)
            if not self._ended(f"internal error: {exc!r}"):
                return
        self._release_data()
        self._book_unstopped()

    def _pause(self, outage: PlatformUnavailable) -> None:
        """Say the job waits for the platform, and wait until it answers, the job is cancelled
        or the controller stops."""
        with self.rt.metrics.paused.track_inprogress():
            log.warning("job %s paused, the platform is unavailable: %s", self.job_id, outage)
            with contextlib.suppress(StoreError, Stopped):
                self._event(
                    _line(
                        "paused",
                        f"the platform is unavailable ({outage}): the job waits for it, what it "
                        "has done kept in the store",
                    )
                )
            since = time.monotonic()
            if self._platform_answers(self.cancelled):
                log.info(
                    "job %s: the platform answers again after %.0f s; the job carries on",
                    self.job_id,
                    time.monotonic() - since,
                )

    def _retried(self, line: str) -> None:
        """A platform call failed and is asked again: the job's log says so at once (it pauses
        only once every try has failed, a minute or more later)."""
        with contextlib.suppress(StoreError, Stopped):
            self._event(_line("platform_retried", line))

    def _platform_answers(self, cancelled: threading.Event | None = None) -> bool:
        """Wait until the platform answers; false where the controller stops first (or the
        job is ``cancelled``)."""
        stop = self.rt.shutdown
        while not (stop.is_set() or self.rt.draining.is_set()):
            if cancelled is not None and cancelled.is_set():
                return False
            try:
                self.rt.platform.ping()
            except PlatformError:
                stop.wait(PLATFORM_PROBE_S)
                continue
            return True
        return False

    def _ended(self, error: str | None) -> bool:
        """Book the replicas' memory and, given an ``error``, record that the job failed of it;
        false where the store refused (full, or gone): the job's record still says it runs, and
        the runner the scheduler starts for it next ends it again."""
        try:
            self._charge_replicas()
            if error is not None:
                self._finish(JobState.FAILED, error=error)
        except StoreError as exc:
            log.warning(
                "job %s: its end (%s) was not recorded, the store refused: %s",
                self.job_id,
                "failed: " + error if error is not None else "stopped",
                exc,
            )
            return False
        return True

    def _release_data(self) -> None:
        """Once the job has ended, fence its units that still run (:func:`fence_units`) and
        delete what it wrote to the store but its model (unless ``keep_job_data``): its shards
        and test set, each round's trained and merged weights, checkpoints of attempts that never
        committed. Its record and ledger stay."""
        try:
            job = self._job()
            if not job.finished:  # the controller is shutting down: another resumes the job
                return
            # What still runs of it (where the platform could not stop it) must not write again.
            if fenced := fence_units(self.rt.store, job):
                log.info("job %s: %d running unit(s) fenced", self.job_id, fenced)
            if self.rt.settings.controller.keep_job_data:
                return
            deleted = delete_job_data(self.rt.store, job)
        except (StoreError, Stopped) as exc:
            log.warning("job %s: its data was not all deleted: %s", self.job_id, exc)
        else:
            log.info("job %s: %d blobs of its data deleted", self.job_id, deleted)

    def _run(self) -> None:
        job = self._job()
        self.spec = JobSpec.model_validate(job.spec)
        self._model_args = self.spec.model_args()
        self.plan = JobPlan.model_validate(job.plan)
        self.strategy = self.spec.fault_tolerance.strategy()
        self._ledger_by_round = job.ledger_by_round
        self._best = job.best
        train = [a for a in self._settle_totals() if a.kind == "train"]
        self._train_s = sum(a.duration_ms for a in train) / 1000
        self._train_attempts = len(train)
        self._train_failures = sum(a.outcome != "success" for a in train)
        if job.started_ms is None:
            self._change(lambda j: j.model_copy(update={"started_ms": now_ms()}))
        else:  # a controller that started (or a store that came back) carries on
            self._event(
                _line(
                    "resumed",
                    f"carried on from the store at round {job.round + 1}/{self.plan.rounds} "
                    f"({self._train_attempts} training activations booked before)",
                )
            )
        self._stage()
        weights = job.global_weights if job.round else self._initial_model()
        # A job stopped early whose end was not recorded (its controller stopped in between)
        # trains no more rounds.
        first = self.plan.rounds if job.stopped_early else job.round
        for round_ in range(first, self.plan.rounds):
            try:
                result = self._round(round_, weights)
            except BudgetSpent as spent:
                self._stop_round(round_, spent)
                break
            weights = global_blob(self.job_id, round_ + 1)
            if self._best is None or result.chosen_loss < self._best.chosen_loss:
                self._best = BestRound(
                    round=round_ + 1,
                    weights=weights,
                    test_loss=result.test_loss,
                    accuracy=result.accuracy,
                    validation_loss=result.validation_loss,
                )
            stop = self._stop_after(result)
            # The round's own record first: the job's keeps only the newest rounds.
            self.rt.store.put(round_key(self.job_id, round_), result.model_dump(mode="json"))
            self._change(
                functools.partial(
                    _finish_round, result, stop=stop, rounds=self.plan.rounds, best=self._best
                ),
                event=_line(
                    "round_finished",
                    f"round {result.round + 1}/{self.plan.rounds}: loss {result.loss:.4f}, "
                    + (
                        f"validation loss {result.validation_loss:.4f}, "
                        if result.validation_loss is not None
                        else ""
                    )
                    + f"test accuracy {result.accuracy:.4f}",
                    result.round,
                ),
            )
            if stop is not None:
                break
        self._charge_replicas()
        self._finish(JobState.DONE)

    def _stop_after(self, result: RoundResult) -> str | None:
        """Why the job stops after the round of ``result`` before its last, if it does: its
        ``target_loss`` reached, its ``patience`` run out, or its ``max_cost_usd``."""
        target, budget = self.spec.target_loss, self.spec.max_cost_usd
        if target is not None and result.loss <= target:
            return "the mean loss reached target_loss"
        patience, best = self.spec.patience, self._best
        if patience is not None and best is not None and result.round + 1 - best.round >= patience:
            return (
                f"its {best.chosen} loss has not fallen below round {best.round}'s "
                f"({best.chosen_loss:.4f}) for {patience} round(s) (patience)"
            )
        if budget is not None and (spent := self._spent_usd()) >= budget:
            return (
                f"its cost reached max_cost_usd ({spent:.6f} of {budget:.6f} USD as round "
                f"{result.round + 1} ended)"
            )
        return None

    def _spent_usd(self) -> float:
        """What the job has cost so far: its activations booked, those running by their memory
        and their time so far (the platform bills a little less: their duration, without the
        time to start them and report them), and the memory its warm replicas have held."""
        now = time.monotonic()
        running_gb_s = sum(
            (task.limits or self._limits(task)).memory_mb / 1024 * max(0.0, now - task.launched)
            for task in [*self._in_flight.values(), *self._abandoned.values()]
        )
        held_gb_s = running_gb_s + self.rt.runtimes.held_gb_s(self.job_id)
        return self._cost_usd + held_gb_s * self.rt.settings.price_per_gb_s

    def _check_budget(self) -> None:
        """Raise ``BudgetSpent`` once the job has cost its ``max_cost_usd``."""
        budget = self.spec.max_cost_usd
        if budget is not None and (spent := self._spent_usd()) >= budget:
            raise BudgetSpent(
                f"{spent:.6f} of {budget:.6f} USD, its running activations and replicas counted"
            )

    def _stop_round(self, round_: int, spent: BudgetSpent) -> None:
        """Stop the round in progress, whose activations passed the job's budget: the job ends
        done with the model it keeps (``keep_model``), as a ``finish`` leaves it (its record says
        so once what ran is stopped and booked), or fails, with no model, in its first round."""
        self._kill_in_flight()
        if not round_:
            raise JobFailed(
                f"its cost reached max_cost_usd before its first round ended ({spent}): the "
                "round was stopped, and no model is kept; a larger max_cost_usd lets a round end"
            ) from None
        why = (
            f"its cost reached max_cost_usd during round {round_ + 1}/{self.plan.rounds} "
            f"({spent}): that round was stopped"
            + ("" if self.spec.keep_model == "best" else f", the model is round {round_}'s")
        )
        self._change(lambda j: j.model_copy(update={"stopped_early": True, "stopped_because": why}))

    def _stage(self) -> None:
        """Shards, the validation set and the test set go to the store before any action starts
        (once: a restarted controller finds them there; the split is seeded, so it would be the
        same anyway)."""
        store = self.rt.store
        workers = self.plan.workers
        names = [shard_blob(self.job_id, i) for i in range(workers)]
        held = [validation_blob(self.job_id)] if self.plan.validation_examples else []
        if all(store.blob_manifest(n) is not None for n in [*names, *held, test_blob(self.job_id)]):
            return
        dataset_spec = self.spec.dataset
        if isinstance(dataset_spec, NpzSpec) and not Path(dataset_spec.path).is_file():
            raise ValidationError(
                "the data set's file is gone since the job was planned (an upload deleted, "
                "a file moved): upload it again and submit the job again",
                field="dataset.path",
            )
        # Jobs that start together stage one at a time, and uploads are checked in turn.
        if not ONE_DATA_SET.acquire(blocking=False):
            waiting = "another job's data set or an upload is being loaded: staging waits its turn"
            self._event(_line("staging_waits", waiting))
            ONE_DATA_SET.acquire()
        try:
            self._put_data(names)  # its data set freed as it returns, before another's loads
        finally:
            ONE_DATA_SET.release()
        validation = ", the validation set," if held else ""
        self._event(
            _line("staged", f"{workers} shards{validation} and the test set are in the store")
        )

    def _initial_model(self) -> str | None:
        """The first round's global model: ``init_model``'s, copied into the job's blobs (so that
        it outlives the other job's deletion), once; none: the trainers draw weights from the
        seed."""
        if self.spec.init_model is None:
            return None
        blob = global_blob(self.job_id, 0)
        if self.rt.store.blob_manifest(blob) is not None:  # a restarted controller's copy
            return blob
        source = init_model_of(self.rt.store, self.spec, self.plan)
        assert source is not None, "a job with init_model has a model to start from"
        self.rt.store.copy_blob(source, blob)
        self._event(
            _line("staged", f"the first round starts from job {self.spec.init_model}'s model")
        )
        return blob

    def _put_data(self, names: list[str]) -> None:
        """Load the job's data set and store it as the validation set, the shards ``names`` and
        the test set (the last: its presence says all are there)."""
        dataset = load_checked(self.spec)
        _check_as_planned(facts_of(dataset), self.plan)
        seed, held = self.spec.seed, self.plan.validation_examples
        validation, shards = split_training_set(dataset, len(names), seed=seed, held_out=held)
        if held:
            self.rt.store.put_blob(validation_blob(self.job_id), validation.encode())
        del validation  # a copy of up to half the training set: not held beside the shards
        for name, shard in zip(names, shards, strict=True):
            self._check_stop()
            self.rt.store.put_blob(name, shard.encode())
        test = Shard(index=0, x=dataset.x_test, y=dataset.y_test)
        self.rt.store.put_blob(test_blob(self.job_id), test.encode())

    # ---- one round --------------------------------------------------------------------------

    def _round(self, round_: int, weights_in: str | None) -> RoundResult:
        self._check_stop()  # a draining controller starts no new round
        plan = self.plan
        epochs = self.spec.round_epochs(round_)
        units = [self._unit(round_, shard) for shard in range(plan.workers)]
        begun = {
            "committed": sum(u.state is UnitState.COMMITTED for u in units),
            "running": sum(u.state is UnitState.RUNNING for u in units),
        }
        before = ", ".join(f"{n} {state}" for state, n in begun.items() if n)
        job = self._event(
            _line(
                "round_started",
                f"round {round_ + 1}/{plan.rounds}: {plan.workers} trainers × {epochs} epoch(s)"
                + (
                    f" at learning rate {self.spec.worker_learning_rate(plan.workers, round_):.6g}"
                    if self.spec.lr_schedule != "constant"
                    else ""
                )
                + (f" ({before} already)" if before else ""),
                round_,
            )
        )
        # Timed from its first start, which a runner before this one may have logged (a
        # restarted controller, a platform outage): not from its resumption.
        started = next(
            e.t_ms for e in job.events if e.kind == "round_started" and e.round == round_
        )
        done: dict[tuple[int, int], tuple[str, int]] = {}  # (level, index) → (weights, examples)
        losses: dict[int, tuple[float, int]] = {}
        queue: deque[_Task] = deque()
        for shard, unit in enumerate(units):
            task = self._train_task(round_, shard, epochs, unit.attempts + 1, weights_in)
            if unit.state is UnitState.COMMITTED and unit.committed_result and unit.examples:
                done[(0, shard)] = (unit.committed_result, unit.examples)
                losses[shard] = (unit.loss or 0.0, unit.examples)
                if unit.activation_id is not None and not self._booked(unit.activation_id, round_):
                    self._book_unseen(task, unit, unit.activation_id)
                continue
            if unit.state is UnitState.RUNNING and unit.activation_id is not None:
                self._reattach(task, unit, unit.activation_id)
            else:
                queue.append(task)
        root = (len(plan.tree), 0)
        launched: set[tuple[int, int]] = set()
        while root not in done:
            self._check_stop()
            for level, groups in enumerate(plan.tree, start=1):
                for index, inputs in enumerate(groups):
                    ready = all((level - 1, i) in done for i in inputs)
                    if ready and (level, index) not in launched:
                        launched.add((level, index))
                        queue.append(self._aggregate_task(plan, round_, level, index, inputs, done))
            for task, result in self._step(queue):
                done[(task.level, task.index)] = (str(result["weights"]), int(result["examples"]))
                if task.kind == "train":
                    losses[task.index] = (float(result["loss"]), int(result["examples"]))
        weights, examples = done[root]
        final = global_blob(self.job_id, round_ + 1)
        if weights != final:  # a single trainer is its own root: publish its weights as global
            self.rt.store.copy_blob(weights, final)
        score = self._evaluate(round_, final)
        return RoundResult(
            round=round_,
            epochs=epochs,
            examples=examples,
            loss=sum(loss * n for loss, n in losses.values()) / sum(n for _, n in losses.values()),
            test_loss=float(score["loss"]),
            accuracy=float(score["accuracy"]),
            validation_loss=score.get("validation_loss"),
            validation_accuracy=score.get("validation_accuracy"),
            started_ms=started,
            finished_ms=now_ms(),
        )

    def _reattach(self, task: _Task, unit: FunctionInfo, activation_id: str) -> None:
        """A resumed job (a restarted controller's, or one that waited for its store or platform)
        waits for the attempt started before (its record, its lease or its lost-deadline decide)
        instead of starting another."""
        _, lost_after_s = self._variant(task)
        task.attempt = unit.attempts
        task.owner_epoch = unit.owner_epoch
        if unit.memory_mb and unit.timeout_ms:  # as claimed
            task.limits = Limits(unit.memory_mb, unit.timeout_ms)
        task.position = unit.heads[-1].position if unit.heads else -1
        task.launched = time.monotonic()  # started before: it costs more than the budget sees
        where = f"shard {task.index} of round {task.round + 1}"
        if self.rt.platform.forgot(activation_id):
            # The platform that ran it went with the controller before (an embedded one): it is
            # lost now, not at its deadline.
            task.deadline = time.monotonic()
            message = (
                f"{where}: attempt {task.attempt} ({activation_id}) was lost with the platform "
                "of the controller before this one"
            )
        else:
            task.deadline = time.monotonic() + lost_after_s
            message = (
                f"{where}: waiting for attempt {task.attempt} ({activation_id}), started before "
                "the job was resumed"
            )
        self._in_flight[activation_id] = task
        self._event(_line("reattached", message, task.round, task.index))

    def _book_unseen(self, task: _Task, unit: FunctionInfo, activation_id: str) -> None:
        """Book the attempt that committed a unit while no controller watched (the last one
        died): its cost belongs to the job, where the platform still has its record (an
        embedded platform that died with that controller took it along: not booked)."""
        task.attempt, task.owner_epoch = unit.attempts, unit.owner_epoch
        record = None
        if not self.rt.platform.forgot(activation_id):
            with contextlib.suppress(ActivationTimeout):
                record = self.rt.platform.wait([activation_id], timeout_s=UNSEEN_WAIT_S)[
                    activation_id
                ]
        if record is None:
            log.warning(
                "no record of %s, which committed shard %d of round %d: not booked",
                activation_id,
                task.index,
                task.round + 1,
            )
            return
        self._settle(_Ended(task, activation_id, record))

    def _evaluate(self, round_: int, weights: str) -> dict[str, Any]:
        queue = deque(
            [
                _Task(
                    kind="evaluate",
                    round=round_,
                    level=-1,
                    index=0,
                    params={
                        "mode": "evaluate",
                        "store_url": self.rt.store_url,
                        **self._model_args,
                        "classes": self.plan.classes,
                        "weights": weights,
                        "data": test_blob(self.job_id),
                        "validation": (
                            validation_blob(self.job_id) if self.plan.validation_examples else None
                        ),
                        "batch_size": self.spec.batch_size,
                    },
                )
            ]
        )
        while True:
            for _, result in self._step(queue):
                return result

    def _step(self, queue: deque[_Task]) -> Iterator[tuple[_Task, dict[str, Any]]]:
        """Start what is queued, wait a little, and yield the tasks that succeeded with their
        results; a failed task is recovered as the job's strategy says (its next attempt goes
        back on the queue)."""
        self._check_stop()
        self._check_budget()
        self._launch(queue)
        self._want_replicas()  # draining, the runtime manager is closed: a want warms nothing
        for ended in self._collect():
            task = ended.task
            failure = self._settle(ended)
            if task.done:
                continue  # a copy of a unit another copy already committed
            if failure is None:
                task.done = True
                self._drop_copies(task)
                yield task, self._result(task, ended)
            else:
                retry = self._recover(ended, failure)
                if retry is not None:
                    queue.append(retry)

    # ---- tasks ------------------------------------------------------------------------------

    def _train_task(
        self, round_: int, shard: int, epochs: int, attempt: int, weights_in: str | None
    ) -> _Task:
        spec = self.spec
        return _Task(
            kind="train",
            round=round_,
            level=0,
            index=shard,
            attempt=attempt,
            params={
                "mode": "train",
                "store_url": self.rt.store_url,
                **self._model_args,
                "classes": self.plan.classes,
                "shard": shard_blob(self.job_id, shard),
                "weights_in": weights_in,
                "batch_size": spec.batch_size,
                "epochs": epochs,
                # Round 0 builds the same initial model on every shard; later rounds start from
                # the global model, and a fresh seed gives each round its own data order.
                "seed": _seed(spec.seed, round_),
                "optimizer": spec.optimizer,
                "learning_rate": spec.worker_learning_rate(self.plan.workers, round_),
                "target_loss": spec.target_loss,
            },
        )

    def _attempt_params(self, task: _Task) -> dict[str, Any]:
        """A training attempt's parameters: its own output blob (a zombie can never overwrite
        the committed one) and its Canary arguments with its fencing token."""
        ft = self.spec.fault_tolerance
        where = f"{job_blobs(self.job_id)}r{task.round:05d}"
        canary = CanaryArgs(
            unit=fn_key(self.job_id, task.round, task.index),
            token=task.owner_epoch,
            blobs=f"{where}/ckpt-{task.index:05d}",
            checkpoints=self.strategy.checkpoints,
            heartbeat_s=ft.heartbeat_s if self.strategy.heartbeats else 0.0,
            interval_s=ft.checkpoint_interval_s,
            mtbf_s=mtbf_s(self._train_s, self._train_failures),
        )
        return {
            **task.params,
            "weights_out": f"{where}/trained-{task.index:05d}-a{task.owner_epoch:04d}",
            "canary": canary.model_dump(mode="json"),
        }

    def _aggregate_task(
        self,
        plan: JobPlan,
        round_: int,
        level: int,
        index: int,
        inputs: list[int],
        done: dict[tuple[int, int], tuple[str, int]],
    ) -> _Task:
        is_root = level == len(plan.tree)
        output = (
            global_blob(self.job_id, round_ + 1)
            if is_root
            else f"{job_blobs(self.job_id)}r{round_:05d}/agg-{level}-{index:05d}"
        )
        return _Task(
            kind="aggregate",
            round=round_,
            level=level,
            index=index,
            params={
                "store_url": self.rt.store_url,
                "inputs": [
                    {"weights": done[(level - 1, i)][0], "examples": done[(level - 1, i)][1]}
                    for i in inputs
                ],
                "output": output,
            },
        )

    def _limits(self, task: _Task) -> Limits:
        if task.kind == "aggregate":
            return Limits(self.plan.aggregate_memory_mb, self.plan.aggregate_timeout_ms)
        if task.kind == "evaluate":
            return Limits(self.plan.evaluate_mb, self.plan.train.timeout_ms)
        return Limits(self.plan.train.memory_mb, self.plan.train.timeout_ms)

    def _variant(self, task: _Task) -> tuple[str, float]:
        """The action variant ``task`` runs on, with the job's current limits, and how long to
        wait for one of its activations; deployed once per runner, not once per activation."""
        limits = self._limits(task)
        name = AGGREGATE if task.kind == "aggregate" else TRAIN
        key = (name, limits.memory_mb, limits.timeout_ms)
        if key not in self._variants:
            variant = deploy_variant(
                self.rt.platform,
                name,
                memory_mb=limits.memory_mb,
                timeout_ms=limits.timeout_ms,
                environment=action_environment(self.rt.settings.store),
            )
            self._variants[key] = (variant, self.rt.platform.lost_deadline_s(variant))
        return self._variants[key]

    def _launch(self, queue: deque[_Task]) -> None:
        """Start the queued tasks; a throttled platform leaves the rest queued for the next pass,
        a draining controller all of them."""
        while queue and not self.rt.draining.is_set():
            task = queue[0]
            variant, lost_after_s = self._variant(task)
            task.limits = self._limits(task)  # the variant's
            params, copies = task.params, 1
            if task.kind == "train":
                task.owner_epoch, task.position = self._claim(task)
                params, copies = self._attempt_params(task), self.strategy.copies
            started: list[str] = []
            with contextlib.suppress(Throttled):
                for _ in range(copies):
                    started.append(self.rt.platform.invoke(variant, params))
            if not started:
                return
            queue.popleft()
            task.launched = time.monotonic()
            task.deadline = task.launched + lost_after_s
            for activation_id in started:
                self._in_flight[activation_id] = task
            if task.kind == "train":
                self._train_attempts += 1
                self._unit_change(task, _running_as(started[0]))

    def _collect(self) -> list[_Ended]:
        """Wait a little for records; return the attempts that ended: recorded, lost past their
        deadline, or hung (their heartbeat lease lapsed; they are fenced by the next claim)."""
        watched = [*self._in_flight, *self._abandoned]
        if not watched:
            return []
        self.rt.platform.wait_any(watched, timeout_s=self._tick_s())
        for activation_id, task in list(self._abandoned.items()):
            record = self.rt.platform.get_activation(activation_id)
            if record is not None:
                del self._abandoned[activation_id]
                self._book(task, record, classify(record))
        ended: list[_Ended] = []
        for activation_id, task in list(self._in_flight.items()):
            record = self.rt.platform.get_activation(activation_id)
            if record is None and time.monotonic() > task.deadline:
                record = _lost(activation_id, task)
            if record is not None:
                del self._in_flight[activation_id]
                ended.append(_Ended(task, activation_id, record))
        ended.extend(self._silenced())
        return ended

    def _silenced(self) -> list[_Ended]:
        """Training attempts whose container the cluster reports lost (an OOM-killed or deleted
        pod), or whose lease lapsed; their activations are watched as abandoned, their records
        still booked when they come."""
        losses, self._loss_cursor = self.rt.losses.since(self._loss_cursor)
        heartbeat_s = self.spec.fault_tolerance.heartbeat_s if self.strategy.heartbeats else 0.0
        if not losses and heartbeat_s <= 0:
            return []
        ended: list[_Ended] = []
        tasks = {id(t): t for t in self._in_flight.values() if t.kind == "train"}
        for task in tasks.values():
            found = load(self.rt.store, fn_key(self.job_id, task.round, task.index), FunctionInfo)
            if found is None:
                continue
            unit = found[0]
            by: Literal["cluster", "lease"] = "cluster"
            failure = lost(unit, task.owner_epoch, losses)
            if failure is None:
                by = "lease"
                failure = hung(unit, task.owner_epoch, now_ms=now_ms(), heartbeat_s=heartbeat_s)
            if failure is None:
                continue
            ids = [i for i, t in self._in_flight.items() if t is task]
            for activation_id in ids:
                self._abandoned[activation_id] = self._in_flight.pop(activation_id)
            ended.append(_Ended(task, ids[0], None, failure, detected_by=by))
        return ended

    def _tick_s(self) -> float:
        """How long one wait for records lasts: short enough to catch a lapsed lease in time."""
        if self.strategy.heartbeats:
            return min(TICK_S, self.spec.fault_tolerance.heartbeat_s / 4)
        return TICK_S

    def _settle(self, ended: _Ended) -> Failure | None:
        """Book the activation and learn from it; the attempt's failure, if any. A training
        attempt succeeded exactly when its unit is committed under its token, whatever the
        activation says (it may have crashed after committing, before replying)."""
        task, record = ended.task, ended.record
        failure = ended.failure
        if record is not None:
            failure = classify(record)
            self._book(task, record, failure)
            if task.kind == "train":
                self._train_s += (record.duration or 0) / 1000
                ran = task.limits or self._limits(task)
                self.rt.sizer.learn(
                    self.plan.train.model_copy(
                        update={"memory_mb": ran.memory_mb, "timeout_ms": ran.timeout_ms}
                    ),
                    record,
                    failure,
                )
            elif failure is None:
                self.rt.sizer.learn_merge_step(self.plan.train, task.kind, record)
        if task.kind != "train" or task.done:
            return failure
        unit = ended.unit = self._read_unit(task)
        if unit.state is UnitState.COMMITTED and unit.owner_epoch == task.owner_epoch:
            return None
        if failure is None:  # a success that did not commit: only a fenced attempt does that
            return Failure(FailureKind.PLATFORM_ERROR, "the attempt ended without committing")
        return failure

    def _result(self, task: _Task, ended: _Ended) -> dict[str, Any]:
        """What a finished task gives the round: a trainer's committed result from its unit."""
        if task.kind != "train":
            assert ended.record is not None
            result: dict[str, Any] = ended.record.response.result
            return result
        unit = ended.unit or self._read_unit(task)
        return {
            "weights": unit.committed_result,
            "examples": unit.examples,
            "loss": unit.loss if unit.loss is not None else float("nan"),
        }

    def _drop_copies(self, task: _Task) -> None:
        """The other copies of a committed unit are cancelled (their records are still booked)."""
        for activation_id in [i for i, t in self._in_flight.items() if t is task]:
            self._abandoned[activation_id] = self._in_flight.pop(activation_id)
            with contextlib.suppress(ActivationNotFound, Unsupported):
                self.rt.platform.stop(activation_id)

    def _recover(self, ended: _Ended, failure: Failure) -> _Task | None:
        """Report the failure and act on the strategy's decision: the next attempt to queue, or
        ``None`` while copies of the unit still run; raises ``JobFailed`` when it gives up."""
        task = ended.task
        live = sum(1 for t in self._in_flight.values() if t is task)
        progressed, resume_from = False, None
        if task.kind == "train":
            self._train_failures += 1
            unit = ended.unit or self._read_unit(task)
            head = unit.heads[-1].position if unit.heads else -1
            progressed = head > task.position
            resume_from = head if head >= 0 else None
            if live == 0:
                self._unit_change(
                    task,
                    lambda u: u.model_copy(
                        update={"state": UnitState.FAILED, "failures": [*u.failures, failure.kind]}
                    ),
                )
        fruitless = 0 if progressed else task.fruitless + 1
        decision = self.strategy.recover(failure, failures=fruitless, live=live)
        limits, stuck_at_max = None, 0
        if decision in (Recovery.RESUME, Recovery.RESTART):
            try:
                limits, stuck_at_max = self._correct_limits(task, failure, progressed=progressed)
            except JobFailed:
                self._report(ended, failure, Recovery.FAIL, resume_from, None)
                raise
        self._report(ended, failure, decision, resume_from, limits)
        what = _describe(task)
        if decision is Recovery.FAIL:
            if failure.kind is FailureKind.APPLICATION_ERROR:
                raise JobFailed(
                    f"{what} failed: {failure.message}{self._rate_said(failure, task.round)}"
                )
            raise JobFailed(
                f"{what} failed {fruitless} time(s) in a row without progress, last with "
                f"{failure.kind}: {failure.message} (fault_tolerance: policy "
                f"{self.strategy.name}, max_attempts {self.strategy.max_attempts})"
            )
        if decision is Recovery.WAIT:
            return None
        self.rt.metrics.recoveries.labels(kind=str(failure.kind)).inc()
        return _Task(
            kind=task.kind,
            round=task.round,
            level=task.level,
            index=task.index,
            params=task.params,
            attempt=task.attempt + 1,
            fruitless=fruitless,
            stuck_at_max=stuck_at_max,
        )

    def _rate_said(self, failure: Failure, round_: int) -> str:
        """Where training diverged at a learning rate scaled for the workers or the round, how
        it relates to the job's (the action's message names the rate it trained at)."""
        spec, workers = self.spec, self.plan.workers
        by = []
        if spec.worker_learning_rate(workers) != spec.learning_rate:
            by.append(f"√{workers} workers: lr_scaling sqrt")
        if (factor := spec.round_factor(round_)) != 1:
            by.append(f"{factor:g} in round {round_ + 1}: lr_schedule {spec.lr_schedule}")
        if not (by and failure.message.startswith(DIVERGED)):
            return ""
        return f" (the action's rate is the job's learning_rate {spec.learning_rate:g} × " + (
            " × ".join(by) + ")"
        )

    def _report(
        self,
        ended: _Ended,
        failure: Failure,
        decision: Recovery,
        resume_from: int | None,
        limits: str | None,
    ) -> None:
        task = ended.task
        booked = self._booked(ended.activation_id, task.round)
        report = FailureReport(
            t_ms=now_ms(),
            kind=task.kind,
            round=task.round,
            unit=task.index,
            attempt=task.attempt,
            activation_id=ended.activation_id,
            classification=str(failure.kind),
            message=failure.message,
            detected_by=ended.detected_by,
            recovery=str(decision),
            resume_from=resume_from if decision is Recovery.RESUME else None,
            limits=limits,
            cost_usd=booked.cost_usd if booked else 0.0,
        )
        how = {
            Recovery.RESUME: "resumes"
            + (f" from checkpoint position {resume_from}" if resume_from is not None else ""),
            Recovery.RESTART: "restarts from the beginning",
            Recovery.WAIT: "waits for its other copies",
            Recovery.FAIL: "cannot be recovered",
        }[decision]
        self._change(
            lambda j: j.with_failure(report, kept=self.rt.settings.controller.failures_kept),
            event=_line(
                "recovery",
                f"{_describe(task)}, attempt {task.attempt}: {failure.kind} "
                f"(seen by the {ended.detected_by}); it {how}",
                task.round,
                task.index if task.kind == "train" else None,
            ),
        )

    def _correct_limits(
        self, task: _Task, failure: Failure, *, progressed: bool
    ) -> tuple[str | None, int]:
        """Raise the limits a failure calls for: what changed, if anything, and how many
        attempts in a row have now failed at the platform's largest limit without progress. At
        :data:`FRUITLESS_AT_MAX` of those the job fails; until then the next attempt runs with
        the same limits."""
        limits = self.rt.platform.limits()
        current = self._limits(task)
        try:
            # From the limits the attempt ran with: attempts that failed together under one
            # limit raise it once, not once each (four out of time had made 6 s into 96 s).
            fixed = correct(
                failure,
                task.limits or current,
                current=current,
                step_mb=self.rt.settings.estimator.memory_step_mb,
                max_memory_mb=limits.memory_max_mb,
                max_timeout_ms=limits.timeout_max_ms,
            )
        except EstimationError as exc:
            stuck = stuck_at_max(failure, progressed=progressed, before=task.stuck_at_max)
            if stuck < FRUITLESS_AT_MAX:
                return None, stuck
            raise JobFailed(
                f"{_describe(task)} made no progress in {stuck} attempts in a row: {exc}"
            ) from exc
        if fixed == current:
            return None, 0
        plan = self.plan.model_copy(deep=True)
        if task.kind == "aggregate":
            plan.aggregate_memory_mb, plan.aggregate_timeout_ms = fixed.memory_mb, fixed.timeout_ms
        elif task.kind == "evaluate":  # its memory its own, its time limit the trainers'
            plan.evaluate_memory_mb, plan.train.timeout_ms = fixed.memory_mb, fixed.timeout_ms
        else:
            plan.train.memory_mb, plan.train.timeout_ms = fixed.memory_mb, fixed.timeout_ms
        self.plan = plan
        change = (
            f"{task.kind} actions now run with {fixed.memory_mb} MB and "
            f"{fixed.timeout_ms / 1000:g} s (were {current.memory_mb} MB, "
            f"{current.timeout_ms / 1000:g} s)"
        )
        self._change(
            lambda j: j.model_copy(update={"plan": plan.model_dump(mode="json")}),
            event=_line("limits_raised", change),
        )
        return change, 0

    def _ledger_key(self, activation_id: str, round_: int) -> str:
        return ledger_key(self.job_id, activation_id, round_ if self._ledger_by_round else None)

    def _booked(self, activation_id: str, round_: int) -> ActivationUse | None:
        found = load(self.rt.store, self._ledger_key(activation_id, round_), ActivationUse)
        return found[0] if found else None

    def _book(
        self, task: _Task, record: Activation, failure: Failure | None, *, stopped: bool = False
    ) -> None:
        """Add the activation to the job's ledger, its cost to the job's, and to the metrics:
        once, whoever books it again (a controller restarted after booking it). One the runner
        ``stopped`` (its job cancelled or failed) is booked as such, with no line in the job's
        log, and its cost is added to an ended job's too."""
        memory = record.memory_mb or 0
        duration = record.duration or 0
        gb_s = memory / 1024 * duration / 1000
        cost = gb_s * self.rt.settings.price_per_gb_s
        result = record.response.result if isinstance(record.response.result, dict) else {}
        outcome = "success" if failure is None else "stopped" if stopped else str(failure.kind)
        use = ActivationUse(
            job_id=self.job_id,
            activation_id=record.activationId,
            kind=task.kind,
            round=task.round,
            unit=task.index,
            attempt=task.attempt,
            memory_mb=memory,
            start_ms=record.start,
            duration_ms=duration,
            wait_ms=record.wait_time,
            init_ms=record.init_time or 0,
            peak_memory_mb=result.get("peak_rss_mb"),
            outcome=outcome,
            gb_s=round(gb_s, 6),
            cost_usd=cost,
        )
        if not self.rt.store.put_if_absent(
            self._ledger_key(use.activation_id, use.round), use.model_dump(mode="json")
        ):
            return
        m = self.rt.metrics
        m.activations.labels(kind=task.kind, outcome=outcome).inc()
        m.activation_seconds.labels(kind=task.kind).observe(duration / 1000)
        m.gb_seconds.inc(gb_s)
        m.cost.inc(cost)
        event = None
        if task.kind == "train" and not task.done and not stopped:
            event = _line(
                "unit_committed" if failure is None else "unit_failed",
                f"shard {task.index} of round {task.round + 1}: "
                + (
                    f"loss {result.get('loss', float('nan')):.4f} in {duration / 1000:.2f} s"
                    if failure is None
                    else f"{failure.kind}: {failure.message}"
                ),
                task.round,
                task.index,
            )
        # A controller that dies here leaves the line booked and the job's totals short: the
        # next one settles them from the ledger (_settle_totals) before it goes on.
        job = self._change(
            lambda j: j.model_copy(
                update={
                    "activation_count": j.activation_count + 1,
                    "cost_usd": j.cost_usd + cost,
                    "ledger_totals": (
                        j.ledger_totals.plus(use.outcome, use.gb_s)
                        if j.ledger_totals is not None
                        else None
                    ),
                }
            ),
            event=event,
            ended_too=stopped,
        )
        self._cost_usd = job.cost_usd

    def _settle_totals(self) -> list[ActivationUse]:
        """Set the job's totals (activations, cost, ``ledger_totals``) to what its ledger says
        (they are added to line by line, and a controller may have died between a line and its
        addition; a record from before ``ledger_totals`` has none); the ledger."""
        job = self._job()
        entries = ledger(self.rt.store, job)
        self._cost_usd = job.cost_usd
        if job.activation_count != len(entries) or job.ledger_totals is None:
            cost = sum(a.cost_usd for a in entries)
            price = self.rt.settings.price_per_gb_s
            self._cost_usd = self._change(
                lambda j: j.model_copy(
                    update={
                        "activation_count": len(entries),
                        "cost_usd": cost + j.replica_gb_s * price,
                        "ledger_totals": LedgerTotals.of((a.outcome, a.gb_s) for a in entries),
                    }
                )
            ).cost_usd
        return entries

    # ---- warm replicas ----------------------------------------------------------------------

    def _want_replicas(self) -> None:
        """Tell the runtime manager how many replicas of the training runtime this job wants now:
        the strategy's number for the units running (none between rounds' training)."""
        active = len({id(t) for t in self._in_flight.values() if t.kind == "train"})
        wanted = self.strategy.replicas(
            active=active, failures=self._train_failures, attempts=self._train_attempts
        )
        if wanted == 0 and self.rt.runtimes.ready(self.job_id) == 0:
            return
        variant, _ = self._variant(_Task(kind="train", round=0, level=0, index=0, params={}))
        spec = self.spec
        prime = {
            **self._model_args,
            "input_shape": list(self.plan.input_shape),
            "classes": self.plan.classes,
            "batch_size": spec.batch_size,
            "optimizer": spec.optimizer,
            "learning_rate": spec.worker_learning_rate(self.plan.workers),
        }
        self.rt.runtimes.want(
            self.job_id,
            variant,
            memory_mb=self.plan.train.memory_mb,
            replicas=wanted,
            warmup={"warmup": True, "prime": prime},
        )

    def _charge_replicas(self) -> None:
        """Book the memory the job's replicas held (a cost like any activation's)."""
        gb_s = self.rt.runtimes.release(self.job_id)
        if gb_s <= 0:
            return
        cost = gb_s * self.rt.settings.price_per_gb_s
        with contextlib.suppress(Stopped):
            self._change(
                lambda j: j.model_copy(
                    update={"replica_gb_s": j.replica_gb_s + gb_s, "cost_usd": j.cost_usd + cost}
                ),
                ended_too=True,  # a cancelled job's replicas were held for it too
            )

    # ---- units (fn/ records) ----------------------------------------------------------------

    def _unit(self, round_: int, shard: int) -> FunctionInfo:
        def change(u: FunctionInfo | None) -> FunctionInfo:
            return u or FunctionInfo(job_id=self.job_id, round=round_, shard=shard)

        return update(self.rt.store, fn_key(self.job_id, round_, shard), FunctionInfo, change)

    def _read_unit(self, task: _Task) -> FunctionInfo:
        """The claimed unit of a training task, read (``_unit`` creates, and so writes)."""
        found = load(self.rt.store, fn_key(self.job_id, task.round, task.index), FunctionInfo)
        assert found is not None, "a claimed unit has a record"
        return found[0]

    def _claim(self, task: _Task) -> tuple[int, int]:
        """Take the unit for a new attempt: ``owner_epoch`` e → e+1, which fences the old one.
        Returns the new epoch and the unit's checkpoint position (-1: none)."""
        limits = self._limits(task)

        def change(u: FunctionInfo | None) -> FunctionInfo:
            u = u or FunctionInfo(job_id=self.job_id, round=task.round, shard=task.index)
            return u.model_copy(
                update={
                    "state": UnitState.RUNNING,
                    "activation_id": None,
                    "owner_epoch": u.owner_epoch + 1,
                    "attempts": u.attempts + 1,
                    "memory_mb": limits.memory_mb,
                    "timeout_ms": limits.timeout_ms,
                    "heartbeat_ms": None,  # the lease starts with the attempt's first beat
                    "host": None,  # and its container is known from that beat on
                    "claimed_ms": now_ms(),
                }
            )

        key = fn_key(self.job_id, task.round, task.index)
        unit = update(self.rt.store, key, FunctionInfo, change)
        return unit.owner_epoch, unit.heads[-1].position if unit.heads else -1

    def _unit_change(self, task: _Task, change: Callable[[FunctionInfo], FunctionInfo]) -> None:
        """Change the unit while ``task`` still owns it (a superseded attempt writes nothing)."""

        def fenced(u: FunctionInfo | None) -> FunctionInfo:
            assert u is not None, "a claimed unit has a record"
            return change(u) if u.owner_epoch == task.owner_epoch else u

        update(self.rt.store, fn_key(self.job_id, task.round, task.index), FunctionInfo, fenced)

    # ---- the job record ---------------------------------------------------------------------

    def _job(self) -> JobInfo:
        found = load(self.rt.store, job_key(self.job_id), JobInfo)
        if found is None:
            raise Stopped(f"job {self.job_id} is gone")
        return found[0]

    def _change(
        self,
        change: Callable[[JobInfo], JobInfo],
        *,
        event: JobEvent | None = None,
        ended_too: bool = False,
    ) -> JobInfo:
        """One compare-and-set of the job record; a cancelled job is left as it is and stops,
        but for a change of its totals (``ended_too``: what it used after it was cancelled)."""
        kept = self.rt.settings.controller.events_kept

        def apply(j: JobInfo | None) -> JobInfo:
            if j is None:
                raise Stopped(f"job {self.job_id} is gone")
            if j.state is not JobState.RUNNING:
                return change(j) if ended_too else j
            new = change(j)
            if event is not None:
                return new.with_event(event, kept=kept, updated_ms=now_ms())
            return new.model_copy(update={"updated_ms": now_ms()})

        job = update(self.rt.store, job_key(self.job_id), JobInfo, apply)
        if event is not None:
            log_written(job, event)
        if job.state is not JobState.RUNNING:
            self.cancelled.set()
        return job

    def _event(self, event: JobEvent) -> JobInfo:
        return self._change(lambda j: j, event=event)

    def _finish(self, state: JobState, *, error: str | None = None) -> None:
        finished = now_ms()

        def change(j: JobInfo) -> JobInfo:
            return j.model_copy(
                update={
                    "state": state,
                    "finished_ms": finished,
                    "error": error,
                    # A failed job keeps its model too (none before a round has finished).
                    "model": j.kept_weights,
                }
            )

        before = self._job()
        if error is not None:
            message = f"{error}{kept_model(before)}"
        elif before.stopped_early:
            # a record from before the reasons were kept stopped at its target_loss
            message = (
                f"stopped early: {before.stopped_because or 'the mean loss reached target_loss'}"
            )
        else:
            message = "all rounds done"
        if error is None and (best := before.kept_best):
            message += f"; its model is round {best.round}'s{lowest(best)}"
        job = self._change(change, event=_line(str(state), message))
        if job.state is state:
            self.rt.metrics.jobs_finished.labels(state=str(state)).inc()

    @property
    def running(self) -> int:
        """Activations the runner started and waits for."""
        return len(self._in_flight)

    def _check_stop(self) -> None:
        if self.rt.shutdown.is_set():
            raise Stopped("the controller is shutting down")
        if self.cancelled.is_set():
            raise Stopped(f"job {self.job_id} was cancelled")
        if self.rt.draining.is_set() and not self._in_flight:
            raise Stopped("the controller is shutting down, and what it started has ended")

    def _kill_in_flight(self) -> None:
        """Stop the job's running activations (where the platform can kill one), the abandoned
        too: an attempt whose lease lapsed (its heartbeats refused by a full store, say) may run
        on, and with no claim after it to fence it, it would write checkpoints after the job's
        data was deleted."""
        stopping = self.rt.shutdown.is_set() or self.rt.draining.is_set()
        if stopping and not self.cancelled.is_set():
            return  # a controller restart resumes them; only a cancel kills
        stopped: dict[str, _Task] = {}
        for activation_id, task in [*self._in_flight.items(), *self._abandoned.items()]:
            try:
                self.rt.platform.stop(activation_id)
            except Unsupported:
                self._unstopped[activation_id] = task  # booked once its unit is fenced
                continue
            except ActivationNotFound:
                if self.rt.platform.forgot(activation_id):
                    continue  # run by a platform gone with a controller before: no record
                # else it has just ended: booked as the stopped ones are
            stopped[activation_id] = task
        self._in_flight.clear()
        self._abandoned.clear()
        try:
            self._book_stopped(stopped)
        except (StoreError, Stopped) as exc:  # the store refused, or the job was deleted
            log.warning("job %s: its stopped activations were not all booked: %s", self.job_id, exc)

    def _book_stopped(
        self, stopped: dict[str, _Task], *, wait_s: float = STOPPED_WAIT_S, patient: bool = False
    ) -> None:
        """Book what the activations the runner stopped used, waiting up to ``wait_s`` for their
        records: a cancelled or failed job's cost counts them, as the platform's bill would.
        ``patient``: a long wait, which the controller's stop cuts short (within
        ``UNSTOPPED_LOOK_S``)."""
        deadline = time.monotonic() + wait_s
        while stopped and (left := deadline - time.monotonic()) > 0:
            if patient and (self.rt.shutdown.is_set() or self.rt.draining.is_set()):
                break
            self.rt.platform.wait_any(
                list(stopped), timeout_s=min(left, UNSTOPPED_LOOK_S) if patient else left
            )
            for activation_id in list(stopped):
                record = self.rt.platform.get_activation(activation_id)
                if record is not None:
                    self._book(stopped.pop(activation_id), record, classify(record), stopped=True)
        if stopped:
            log.warning(
                "job %s: %d stopped activation(s) left no record in %.0f s: not booked",
                self.job_id,
                len(stopped),
                wait_s - max(0.0, deadline - time.monotonic()),
            )

    def _book_unstopped(self) -> None:
        """Book what the activations of the ended job that the platform could not be asked to
        stop used, once they have ended: their units fenced (:meth:`_release_data`), a training
        attempt ends at its next heartbeat, any other by its time limit. A platform that does not
        answer (the job cancelled during an outage) is waited for until it does, or until the
        controller stops: then they are left unbooked, saying so."""
        if not self._unstopped:
            return
        unstopped, self._unstopped = self._unstopped, {}
        log.info(
            "job %s: %d activation(s) the platform could not be asked to stop are booked once "
            "they have ended",
            self.job_id,
            len(unstopped),
        )
        if not self._platform_answers():
            log.warning(
                "job %s: %d activation(s) not booked: the controller stopped before the platform "
                "answered",
                self.job_id,
                len(unstopped),
            )
            return
        longest_s = max(self._limits(task).timeout_ms for task in unstopped.values()) / 1000
        try:
            self._book_stopped(unstopped, wait_s=max(STOPPED_WAIT_S, longest_s), patient=True)
        except (StoreError, PlatformError, Stopped) as exc:
            log.warning("job %s: its stopped activations were not all booked: %s", self.job_id, exc)


def _running_as(activation_id: str) -> Callable[[FunctionInfo], FunctionInfo]:
    def change(unit: FunctionInfo) -> FunctionInfo:
        return unit.model_copy(update={"activation_id": activation_id})

    return change


def _seed(seed: int, round_: int) -> int:
    if round_ == 0:
        return seed
    digest = hashlib.sha256(f"{seed}/{round_}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _short(sha256: str | None) -> str:
    return "none" if sha256 is None else f"{sha256[:12]}…"


def _check_as_planned(data: DataFacts, plan: JobPlan) -> None:
    """The data set is the one the job was planned for: a file replaced since it was submitted
    (an upload of the same name) would train a model of another shape, or labels it lacks
    outputs for, and fail inside TensorFlow; one of the same shapes would train on other data
    than the job's submitter checked."""
    facts = [
        ("input shape", dims(plan.input_shape), dims(data.input_shape)),
        ("classes", plan.classes, data.classes),
        ("training examples", plan.examples + plan.validation_examples, data.examples),
        ("test examples", plan.test_examples, data.test_examples),
    ]
    if plan.data_sha256 is not None:  # a plan made before plans kept it has none
        facts.append(("content SHA-256", _short(plan.data_sha256), _short(data.sha256)))
    changed = [f"{name} {was} → {now}" for name, was, now in facts if was != now]
    if changed:
        raise ValidationError(
            f"the data set changed after the job was planned ({', '.join(changed)}): submit the "
            "job again to plan it for this one",
            field="dataset.path",
        )


def _finish_round(
    result: RoundResult, job: JobInfo, *, stop: str | None, rounds: int, best: BestRound
) -> JobInfo:
    """``job`` with the round of ``result`` finished (``best``: its round of the lowest
    validation, or test, loss now); ``stop``: why it stops after it, if it does (before its last
    round: stopped early)."""
    early = stop is not None and result.round + 1 < rounds
    return job.with_round(
        result,
        round=result.round + 1,
        global_weights=global_blob(job.job_id, result.round + 1),
        best=best,
        stopped_early=early,
        stopped_because=stop if early else None,
    )


def log_written(job: JobInfo, event: JobEvent) -> None:
    """Write ``event`` to the controller's log too, where the change of ``job`` (as written) that
    added it to the job's log was written: an operator reads every job's lines in one place."""
    if job.events and job.events[-1] == event:
        level = logging.WARNING if event.kind == JobState.FAILED else logging.INFO
        log.log(level, "job %s %s: %s", job.job_id, event.kind, event.message)


def _line(kind: str, message: str, round_: int | None = None, unit: int | None = None) -> JobEvent:
    return JobEvent(t_ms=now_ms(), kind=kind, message=message, round=round_, unit=unit)


def _describe(task: _Task) -> str:
    where = f" of round {task.round + 1}"
    if task.kind == "train":
        return f"training shard {task.index}{where}"
    if task.kind == "aggregate":
        return f"aggregator {task.level}.{task.index}{where}"
    return f"evaluation{where}"


def _lost(activation_id: str, task: _Task) -> Activation:
    """A stand-in record for an activation the platform never reported (OpenWhisk loses some)."""
    return Activation(
        activationId=activation_id,
        namespace="",
        name=task.kind,
        start=0,
        response=ActivationResponse(
            status=WHISK_ERROR,
            success=False,
            result={"error": "the activation was never recorded: lost"},
        ),
    )
