"""The controller's core, under the REST API: submission, admission, the job runners, and the
queries. All job state is in the store; what is in memory (runner threads) is rebuilt from it when
a controller starts, so a restarted controller carries on with the jobs it finds.

One controller per store: two would both run the same job's rounds.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator

from pydantic import BaseModel, Field
from pydantic import ValidationError as PydanticValidationError

from faasdl.canary.runtime import RuntimeManager
from faasdl.config import Settings
from faasdl.controller.admission import (
    Capacity,
    Demand,
    TenantQuota,
    admission,
    admit,
    queue_positions,
)
from faasdl.controller.datasets import (
    confine,
    delete_upload,
    fill_digests,
    shown_path,
    sweep_partials,
    upload_path,
)
from faasdl.controller.events import (
    JOB_BLOBS,
    JobRunner,
    Runtime,
    delete_job,
    delete_job_data,
    global_blob,
    init_model_of,
    kept_model,
    log_written,
    lowest,
    no_model,
    now_ms,
    test_blob,
)
from faasdl.controller.lease import ControllerLease
from faasdl.controller.metrics import Metrics
from faasdl.controller.plan import JobPlan, over_budget, plan_job
from faasdl.controller.validator import JobSpec, check_idempotency_key
from faasdl.errors import (
    AccessError,
    DatasetNotFound,
    JobError,
    JobNotFound,
    LimitExceeded,
    PlatformError,
    StoreError,
    StoreUnavailable,
)
from faasdl.estimator.sizer import Sizer, checked_facts
from faasdl.platform.base import Platform
from faasdl.platform.local import LocalPlatform
from faasdl.store import make_store, shown_url
from faasdl.store.base import BlobManifest, StateStore, Versioned
from faasdl.store.records import (
    ActivationUse,
    FunctionInfo,
    IdempotencyRecord,
    JobEvent,
    JobInfo,
    JobState,
    LedgerTotals,
    RoundResult,
    create,
    fn_prefix,
    idempotency_key,
    job_key,
    ledger,
    load,
    round_key,
    round_prefix,
    update,
)
from faasdl.training.models import model_called

log = logging.getLogger(__name__)

#: Parsed job records kept, by job and version: status reads, event streams and admission passes
#: parse a record again only when it has changed.
PARSED_JOBS_KEPT = 1024
#: How long a deletion waits for the job's runner to wrap an ended job up (its data released, the
#: activations it stopped booked) before it refuses: seconds where the platform answers.
DELETE_WAIT_S = 10.0


class Submitted(BaseModel):
    job: JobInfo
    created: bool  # false: an Idempotency-Key replay answered with the job it created before


class Replicas(BaseModel):
    """Canary's warm replicas a running job wants now, of its training action variant."""

    runtime: str
    wanted: int
    ready: int


#: What a job's view and its line in a listing say ``model_called`` is.
MODEL_CALLED = (
    "Its model as people read it: model, or for a job's own architecture (model custom) "
    "'custom: ' and the name its Keras config gives the model."
)


class JobView(BaseModel):
    """A job as the API shows it: its record, its place in the admission queue (while queued),
    the units of its current round with their state and attempts, and its warm replicas."""

    job: JobInfo
    queue_position: int | None
    waiting_for: str | None = Field(
        None,
        description="While queued, what the job waits for: the platform's pool memory or "
        "concurrency, its tenant's quota, or the job first in line.",
    )
    units: list[FunctionInfo]
    replicas: Replicas | None = None
    model_called: str | None = Field(None, description=MODEL_CALLED)


class JobLine(BaseModel):
    """A job in a listing."""

    job_id: str
    name: str | None = Field(None, description="The name the job was submitted with, if any.")
    tenant: str
    state: JobState
    model: str | None
    model_called: str | None = Field(None, description=MODEL_CALLED)
    round: int
    rounds: int
    workers: int
    loss: float | None = Field(description="Its last round's mean training loss.")
    accuracy: float | None = Field(
        description="Its last round's test accuracy; an ended job's that keeps its best round "
        "(keep_model: best), that round's: its model's."
    )
    cost_usd: float
    created_ms: int


class Controller:
    """Accepts, admits and runs training jobs on one platform with one store.

    Constructed with no I/O; :meth:`start` expects the platform and the store open and starts the
    scheduler (which also resumes the running jobs found in the store); :meth:`close` stops it and
    every runner, leaving their jobs as they are in the store for the next controller.
    """

    def __init__(
        self, *, settings: Settings, platform: Platform, store: StateStore, store_url: str
    ) -> None:
        # The store's settings name the store the controller was given, so that its actions are
        # deployed with that store's password (store.action_environment) and called with its URL
        # without it.
        settings = settings.model_copy(
            update={"store": settings.store.model_copy(update={"url": store_url})}
        )
        self.settings = settings
        self.platform = platform
        self.store = store
        self.metrics = Metrics()
        self.sizer = Sizer(platform=platform, store=store, settings=settings)
        self.runtime = Runtime(
            platform=platform,
            store=store,
            store_url=shown_url(store_url),
            sizer=self.sizer,
            settings=settings,
            metrics=self.metrics,
            runtimes=RuntimeManager(platform),
        )
        self._runners: dict[str, tuple[JobRunner, threading.Thread]] = {}
        self._lock = threading.Lock()
        self._parsed_jobs: OrderedDict[str, tuple[int, JobInfo]] = OrderedDict()
        self._heads: dict[str, tuple[int, JobInfo]] = {}  # by key: version, head (_all_jobs)
        self._parsed_lock = threading.Lock()
        self._wake = threading.Event()
        self._scheduler: threading.Thread | None = None
        self._housekeeper: threading.Thread | None = None
        self.lease = ControllerLease(store, lease_s=settings.controller.lease_s)
        #: Set, the controller stops waiting for running activations as it stops (drain).
        self.stop_draining = threading.Event()
        self._renewer: threading.Thread | None = None

    # ---- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Hold the store's lease (see :mod:`~faasdl.controller.lease`: it may wait for a dead
        controller's to lapse, and raises ``AnotherController`` where one runs) and start."""
        if self._scheduler is not None:
            return
        self.runtime.shutdown.clear()
        self.runtime.draining.clear()
        self.stop_draining.clear()
        self.lease.acquire(self.runtime.shutdown)
        self._renewer = threading.Thread(target=self._renew_lease, name="faasdl-lease", daemon=True)
        self._renewer.start()
        self.runtime.runtimes.start()
        self._scheduler = threading.Thread(
            target=self._schedule, name="faasdl-scheduler", daemon=True
        )
        self._scheduler.start()
        self._housekeeper = threading.Thread(
            target=self._housekeep, name="faasdl-housekeeping", daemon=True
        )
        self._housekeeper.start()
        if self.settings.kubernetes.watch:
            threading.Thread(target=self._watch_pods, name="faasdl-pod-watch", daemon=True).start()

    def _renew_lease(self) -> None:
        """Renew the store's lease until the controller closes; a lease another controller took
        stops this one's scheduler and runners, as closing does."""
        while not self.runtime.shutdown.wait(self.lease.lease_s / 3):
            if not self.lease.renew():
                self.runtime.shutdown.set()
                self._wake.set()
                return

    def _housekeep(self) -> None:
        """Delete what the store and the upload directory hold for nothing, and keep the digests
        uploads lack, as the controller starts and then every ``housekeeping_interval_s`` until
        it closes (a controller closing at once still runs the first pass: ``close`` waits for
        it)."""
        controller = self.settings.controller
        metrics = self.metrics
        while True:
            try:
                expired = self._delete_expired_jobs()
                metrics.housekept.labels(what="expired_jobs").inc(expired)
                deleted = self._delete_ended_jobs_data()
                metrics.housekept.labels(what="ended_job_blobs").inc(deleted)
                collected = self.store.collect_garbage(grace_s=controller.garbage_grace_s)
                metrics.housekept.labels(what="unpublished_pieces").inc(collected)
                swept = sweep_partials(self.settings.api, controller.garbage_grace_s)
                metrics.housekept.labels(what="upload_partials").inc(swept)
                if digests := fill_digests(self.settings.api):
                    log.info("the digests of %d uploads kept", digests)
            except StoreError as exc:  # a store restart: the next pass tries again
                log.warning("housekeeping pass stopped: %s", exc)
            except Exception:  # the housekeeper must outlive a bad pass
                log.exception("housekeeping pass failed")
            else:
                metrics.housekeeping_done.set_to_current_time()
                if collected:
                    log.info("%d chunks and spill files of unpublished writes deleted", collected)
                if swept:
                    log.info("%d files of uploads cut short deleted", swept)
            if self.runtime.shutdown.wait(controller.housekeeping_interval_s):
                return

    def _delete_expired_jobs(self) -> int:
        """Delete whole the jobs that ended longer than ``job_retention_days`` ago (0: none),
        but those whose model a job that has not staged it yet is to start from (``init_model``:
        a later pass deletes them); returns how many."""
        days = self.settings.controller.job_retention_days
        if not days:
            return 0
        oldest_kept = now_ms() - days * 86_400_000
        jobs = self._all_jobs()
        expired = []
        for job in jobs:
            if not job.finished or job.finished_ms is None or job.finished_ms >= oldest_kept:
                continue
            if waiting := self._awaiting(jobs, needs=_trains_on_from(job), staged=_staged_model):
                log.info(
                    "job %s, ended over %g days ago, is kept until job(s) %s have staged its "
                    "model (init_model)",
                    job.job_id,
                    days,
                    ", ".join(waiting),
                )
                continue
            expired.append(job)
        for job in expired:
            delete_job(self.store, job)
        if expired:
            log.info("%d jobs ended over %g days ago deleted", len(expired), days)
        return len(expired)

    def _delete_ended_jobs_data(self) -> int:
        """What ended jobs left in the store but their models: a job's runner deletes it as the
        job ends; a controller that stopped in between, or a cancelled job's killed attempt
        publishing after it, leaves some (``keep_job_data`` keeps it all). One listing of the
        jobs' blobs, not one a job. Returns how many were deleted."""
        if self.settings.controller.keep_job_data:
            return 0
        by_job: dict[str, list[str]] = {}
        for name in self.store.blob_names(JOB_BLOBS):
            by_job.setdefault(name.removeprefix(JOB_BLOBS).split("/")[0], []).append(name)
        deleted = sum(
            delete_job_data(self.store, job, by_job[job.job_id])
            for job in self._all_jobs()
            if job.finished and job.job_id in by_job
        )
        if deleted:
            log.info("%d blobs of ended jobs' data deleted", deleted)
        return deleted

    def _watch_pods(self) -> None:
        """Feed Canary the action pods the cluster loses, until the controller closes (a daemon:
        its watch ends at its next event or renewal, within 30 s of closing)."""
        from faasdl.platform.kubernetes import KubernetesCluster

        k8s, shutdown = self.settings.kubernetes, self.runtime.shutdown
        cluster = KubernetesCluster(
            namespace=k8s.namespace,
            release=k8s.release,
            kubeconfig=str(k8s.kubeconfig) if k8s.kubeconfig else None,
            request_timeout_s=k8s.request_timeout_s,
        )
        while not shutdown.is_set():
            try:
                cluster.open()
                cluster.report_losses(self.runtime.losses, shutdown, clock_ms=now_ms)
            except PlatformError as exc:  # unreachable, or refused (RBAC): said, and tried again
                log.warning("watching action pods: %s; again in %g s", exc, k8s.retry_s)
                shutdown.wait(k8s.retry_s)

    def close(self) -> None:
        """Stop: drain (see :meth:`drain`), then stop the scheduler, housekeeping and runners
        (the attempts still running go on where the platform outlives the controller, and a
        restarted controller resumes the jobs) and release the store's lease."""
        self.drain()
        self.runtime.shutdown.set()
        self._wake.set()
        if self._scheduler is not None:
            self._scheduler.join()
            self._scheduler = None
        if self._housekeeper is not None:
            self._housekeeper.join()
            self._housekeeper = None
        with self._lock:
            runners = list(self._runners.values())
            self._runners.clear()
        for _, thread in runners:
            thread.join()
        self.runtime.runtimes.close()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        self.lease.release()

    def drain(self) -> None:
        """On a platform that kills what runs as it closes (the embedded one), start nothing
        more and wait up to ``FAASDL_CONTROLLER__DRAIN_S`` for the runners' activations to end
        and be booked: their work is kept, where the next controller would resume them from
        their checkpoints and miss their cost. ``stop_draining`` set cuts the wait short."""
        drain_s = self.settings.controller.drain_s
        if self._scheduler is None or drain_s <= 0 or not self.platform.kills_on_close:
            return
        if self.runtime.shutdown.is_set():
            return  # its runners stopped already (another controller took the store's lease)
        self.runtime.draining.set()
        self._wake.set()
        self._scheduler.join()  # admits nothing more
        self.runtime.runtimes.close()  # no replica is of use to what starts nothing more
        with self._lock:
            runners = [(r, t) for r, t in self._runners.values() if t.is_alive()]
        running = sum(runner.running for runner, _ in runners)
        if not running:
            return
        log.info(
            "stopping: waiting up to %g s (FAASDL_CONTROLLER__DRAIN_S) for %d running "
            "activation(s) to end; a second Ctrl-C stops waiting",
            drain_s,
            running,
        )
        deadline = time.monotonic() + drain_s
        for _, thread in runners:
            while thread.is_alive() and not self.stop_draining.is_set():
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    break
                thread.join(min(0.1, left_s))  # a tenth of a second: a second Ctrl-C is heard
        left = sum(runner.running for runner, _ in runners)  # one the store stopped left its own
        if left:
            log.warning(
                "stopping: %d activation(s) still running are killed; the next controller "
                "resumes them from their checkpoints",
                left,
            )
        else:
            log.info("stopping: every activation started has ended and is booked")

    def __enter__(self) -> Controller:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- requests ---------------------------------------------------------------------------

    def estimate(self, spec: JobSpec) -> JobPlan:
        """The plan the job would run with; nothing stored but what sizing measures once. A
        ``.npz`` path outside what the spec's tenant may read is refused before it is opened, and
        an ``init_model`` the job could not start from as :meth:`submit` refuses it."""
        return self._plan(confine(spec, self.settings.api))

    def _plan(self, spec: JobSpec) -> JobPlan:
        """The plan of a spec whose data set is confined already, its ``init_model`` checked."""
        data = checked_facts(spec)
        plan = plan_job(self.sizer, spec, data, max_fan_in=self.settings.controller.max_fan_in)
        quota = self.settings.api.tenant_max_memory_mb
        if quota and plan.demand_mb > quota:
            raise AccessError(
                f"workers: the job holds {plan.demand_mb} MB of action memory at once, more than "
                f"tenant {spec.tenant!r} may ({quota} MB); ask for fewer workers"
            )
        init_model_of(self.store, spec, plan)
        return plan

    def submit(self, spec: JobSpec, *, idempotency: str | None = None) -> Submitted:
        """Validate, plan and queue a job. With an ``Idempotency-Key``, a replay of the same
        request returns the job the first one created; the key with another request is refused.
        A refused job leaves nothing behind."""
        spec = confine(spec, self.settings.api)  # the job keeps the path that was checked
        digest = hashlib.sha256(spec.model_dump_json().encode()).hexdigest()
        job_id = uuid.uuid4().hex[:16]
        if idempotency is not None:
            check_idempotency_key(idempotency)
            known = load(self.store, idempotency_key(spec.tenant, idempotency), IdempotencyRecord)
            if known is not None:
                replay = self._replay(known[0], digest)
                if replay is not None:
                    return replay
                job_id = known[0].job_id  # the first request died between the two writes
        self._check_queue_quota(spec.tenant)
        plan = self._plan(spec)
        if idempotency is not None:
            record = IdempotencyRecord(
                tenant=spec.tenant,
                idempotency_key=idempotency,
                job_id=job_id,
                request_sha256=digest,
            )
            if not create(self.store, record):
                # Another request with this key got there first: its job is this one.
                found = load(self.store, record.key(), IdempotencyRecord)
                if found is not None and found[0].job_id != job_id:
                    replay = self._replay(found[0], digest)
                    if replay is not None:
                        return replay
                    job_id = found[0].job_id
        created = now_ms()
        job = JobInfo(
            job_id=job_id,
            tenant=spec.tenant,
            spec=spec.model_dump(mode="json"),
            plan=plan.model_dump(mode="json"),
            idempotency_key=idempotency,
            created_ms=created,
            updated_ms=created,
            ledger_totals=LedgerTotals(),
            ledger_by_round=True,
            events=[
                JobEvent(
                    t_ms=created,
                    kind="submitted",
                    message=f"{plan.workers} worker(s) of {plan.train.memory_mb} MB, "
                    f"{plan.rounds} round(s), {len(plan.tree)} aggregation level(s)"
                    + (f"; named {spec.name!r}" if spec.name else "")
                    + (f"; {short}" if (short := over_budget(spec, plan)) else ""),
                )
            ],
        )
        if not create(self.store, job):
            return Submitted(job=self.job(job_id), created=False)
        log_written(job, job.events[0])
        self.metrics.jobs_submitted.labels(tenant=spec.tenant).inc()
        self._wake.set()
        return Submitted(job=job, created=True)

    def _check_queue_quota(self, tenant: str) -> None:
        most = self.settings.api.tenant_max_queued_jobs
        if (
            most
            and sum(j.tenant == tenant and j.state is JobState.QUEUED for j in self._all_jobs())
            >= most
        ):
            raise LimitExceeded(
                f"tenant {tenant!r} has {most} jobs queued already, its quota; submit when one "
                "has started",
                retry_after_s=30.0,
            )

    def _replay(self, known: IdempotencyRecord, digest: str) -> Submitted | None:
        if known.request_sha256 != digest:
            raise JobError(
                f"Idempotency-Key {known.idempotency_key!r} was used for a different request "
                f"(job {known.job_id})"
            )
        found = load(self.store, job_key(known.job_id), JobInfo)
        return Submitted(job=found[0], created=False) if found else None

    def jobs(
        self, *, tenant: str | None = None, state: JobState | None = None, name: str | None = None
    ) -> list[JobInfo]:
        """Jobs, newest first (of ``tenant``, in ``state``, whose name holds ``name``): their
        records without log or failure reports and with their last round only (as
        :meth:`_all_jobs` reads them)."""
        found = [
            j
            for j in self._all_jobs()
            if (tenant is None or j.tenant == tenant)
            and (state is None or j.state is state)
            and (name is None or name in (j.spec.get("name") or ""))
        ]
        return sorted(found, key=lambda j: (j.created_ms, j.job_id), reverse=True)

    def view(self, job_id: str, job: JobInfo | None = None, round_from: int = 0) -> JobView:
        """The job as the API shows it (``job``: its record, if just read), with its rounds from
        round ``round_from`` on."""
        job = job or self.job(job_id)
        position = waiting_for = None
        if job.state is JobState.QUEUED:
            queued, running = self._demands(self._all_jobs())
            position = queue_positions(queued).get(job_id)
            _, waits = admission(queued, running, self._capacity(), self._quota())
            waiting_for = waits.get(job_id)
        # The round running, or the last one once all have run.
        current = min(job.round, JobPlan.model_validate(job.plan).rounds - 1)
        prefix = f"{fn_prefix(job_id)}{current:05d}/"
        units = [FunctionInfo.model_validate(v.value) for _, v in self.store.scan(prefix)]
        wanted = self.runtime.runtimes.replicas(job_id)
        replicas = None
        if wanted is not None:
            replicas = Replicas(runtime=wanted[0], wanted=wanted[1], ready=wanted[2])
        return JobView(
            job=self._shown(self._rounds_from(job, round_from)),
            queue_position=position,
            waiting_for=waiting_for,
            units=units,
            replicas=replicas,
            model_called=_model_called(job),
        )

    def _rounds_from(self, job: JobInfo, round_from: int) -> JobInfo:
        """The record with its rounds from ``round_from`` on: those it no longer keeps (before
        its first: rounds are numbered from 0) read back from their own records."""
        kept = [r for r in job.rounds if r.round >= round_from]
        first = job.rounds[0].round if job.rounds else 0
        if round_from >= first:
            return job if len(kept) == len(job.rounds) else job.model_copy(update={"rounds": kept})
        found = [
            RoundResult.model_validate(v.value)
            for _, v in self.store.scan(
                round_prefix(job.job_id), from_key=round_key(job.job_id, round_from)
            )
        ]
        earlier = sorted((r for r in found if round_from <= r.round < first), key=lambda r: r.round)
        return job.model_copy(update={"rounds": [*earlier, *kept]})

    def _shown(self, job: JobInfo) -> JobInfo:
        """The record as its tenant sees it: an upload named as the job may name it."""
        dataset = job.spec.get("dataset", {})
        path = dataset.get("path")
        if path is None or (shown := shown_path(path, self.settings.api, job.tenant)) == path:
            return job
        return job.model_copy(update={"spec": {**job.spec, "dataset": {**dataset, "path": shown}}})

    def cancel(self, job_id: str) -> JobInfo:
        """Cancel a queued or running job: its activations are killed, its record kept, and the
        model of its last finished round if it has one."""

        lines: list[JobEvent] = []  # the last try's line (a compare-and-set may try again)

        def change(job: JobInfo | None) -> JobInfo:
            if job is None:
                raise JobNotFound(job_id)
            if job.state in (JobState.DONE, JobState.FAILED):
                raise JobError(f"job {job_id} has already ended ({job.state}): nothing to cancel")
            if job.state is JobState.CANCELLED:
                return job
            message = f"cancelled by request{kept_model(job)}"
            lines.append(JobEvent(t_ms=now_ms(), kind="cancelled", message=message))
            return job.with_event(
                lines[-1],
                kept=self.settings.controller.events_kept,
                state=JobState.CANCELLED,
                model=job.kept_weights,  # none before a round has finished
                finished_ms=lines[-1].t_ms,
                updated_ms=lines[-1].t_ms,
            )

        was = self.job(job_id).state
        job = update(self.store, job_key(job_id), JobInfo, change)
        if lines:
            log_written(job, lines[-1])
        self._stop_runner(job_id)
        if was is not JobState.CANCELLED:
            self.metrics.jobs_finished.labels(state="cancelled").inc()
        return job

    def finish(self, job_id: str) -> JobInfo:
        """End a running job now, done, with the model of its last finished round (an early
        stop the user calls): the round in progress is stopped and dropped, as a cancel stops
        it. Raises ``JobError`` where no round has finished (nothing to keep) or the job has
        ended."""
        lines: list[JobEvent] = []

        def change(job: JobInfo | None) -> JobInfo:
            if job is None:
                raise JobNotFound(job_id)
            if job.finished:
                raise JobError(f"job {job_id} has already ended ({job.state}): nothing to finish")
            if job.global_weights is None or not job.rounds:
                raise JobError(
                    f"job {job_id} has finished no round yet ({job.state}): there is no model "
                    "to keep; cancel it, or finish it once a round has ended"
                )
            rounds = JobPlan.model_validate(job.plan).rounds if job.plan else job.round
            best = job.kept_best
            its_model = (
                f"round {best.round}'s{lowest(best)}"
                if best
                else f"that round's (test accuracy {job.rounds[-1].accuracy:.4f})"
            )
            t = now_ms()
            lines[:] = [
                JobEvent(
                    t_ms=t,
                    kind=str(JobState.DONE),
                    message=f"finished by request after round {job.round}/{rounds}: its model "
                    f"is {its_model}",
                )
            ]
            return job.with_event(
                lines[0],
                kept=self.settings.controller.events_kept,
                state=JobState.DONE,
                model=job.kept_weights,
                stopped_early=job.round < rounds,
                finished_ms=t,
                updated_ms=t,
            )

        job = update(self.store, job_key(job_id), JobInfo, change)
        log_written(job, lines[0])
        self._stop_runner(job_id)
        self.metrics.jobs_finished.labels(state=str(JobState.DONE)).inc()
        return job

    def delete(self, job_id: str, *, wait_s: float = DELETE_WAIT_S) -> None:
        """Delete an ended job whole, as housekeeping deletes one past ``job_retention_days``
        (:func:`delete_job`): its ``Idempotency-Key``, its blobs (its model too), ledger, unit
        and round records, and its record last. Waits up to ``wait_s`` for its runner here, if
        it has one, to have wrapped it up. Raises ``JobNotFound``, and ``JobError`` for a job
        that has not ended, whose model a job that has not copied it yet is to start from
        (``init_model``), or whose runner is still booking what it stopped."""
        job = self.job(job_id)
        if not job.finished:
            raise JobError(
                f"job {job_id} is {job.state}: only an ended job can be deleted; cancel it first"
            )
        self._refuse_while_unstaged(
            f"job {job_id}'s model (init_model)", needs=_trains_on_from(job), staged=_staged_model
        )
        if not self.wait_stopped(job_id, wait_s):
            raise JobError(
                f"job {job_id} has ended, but the activations it could not stop are not booked "
                "yet (they are once they have ended and the platform answers): delete it then"
            )
        delete_job(self.store, job)
        log.info("job %s deleted whole by request", job_id)

    def delete_dataset(self, tenant: str, name: str) -> None:
        """Delete the tenant's upload ``name`` and its digest. Raises ``DatasetNotFound``, and
        ``JobError`` while a job that trains on it has not staged it yet."""
        path = str(upload_path(self.settings.api, tenant, name))
        self._refuse_while_unstaged(
            f"data set {name!r}",
            needs=lambda j: (
                isinstance(j.spec.get("dataset"), dict) and j.spec["dataset"].get("path") == path
            ),
            staged=test_blob,
        )
        if not delete_upload(self.settings.api, tenant, name):
            raise DatasetNotFound(name)

    def _refuse_while_unstaged(
        self, what: str, *, needs: Callable[[JobInfo], bool], staged: Callable[[str], str]
    ) -> None:
        """Raise ``JobError`` naming the jobs awaiting ``what`` (see :meth:`_awaiting`), which a
        deletion would take from them."""
        waiting = self._awaiting(self._all_jobs(), needs=needs, staged=staged)
        if len(waiting) == 1:
            raise JobError(
                f"{what} is needed by job {waiting[0]}, which has not staged it yet: delete it "
                "once the job has started training, or cancel the job"
            )
        if waiting:
            raise JobError(
                f"{what} is needed by jobs {', '.join(waiting)}, which have not staged it yet: "
                "delete it once they have started training, or cancel them"
            )

    def _awaiting(
        self, jobs: list[JobInfo], *, needs: Callable[[JobInfo], bool], staged: Callable[[str], str]
    ) -> list[str]:
        """Of ``jobs``, those ``needs`` picks that have not staged what they need yet: queued, or
        running without the blob ``staged(job_id)`` (a job stages as it starts, and would fail
        then without it)."""
        return [
            j.job_id
            for j in jobs
            if needs(j)
            and (
                j.state is JobState.QUEUED
                or (
                    j.state is JobState.RUNNING
                    and self.store.blob_manifest(staged(j.job_id)) is None
                )
            )
        ]

    def _stop_runner(self, job_id: str) -> None:
        """Have the job's runner, if it has one here, stop its activations and end; then admit
        the next jobs into the memory they held."""
        with self._lock:
            running = self._runners.get(job_id)
        if running is not None:
            running[0].cancelled.set()
        self._wake.set()

    def wait_stopped(self, job_id: str, timeout_s: float) -> bool:
        """Wait until the job's runner (if any) has stopped; whether it has."""
        with self._lock:
            running = self._runners.get(job_id)
        if running is None:
            return True
        running[1].join(timeout_s)
        return not running[1].is_alive()

    def wait(self, job_id: str, *, timeout_s: float, poll_s: float = 0.1) -> JobInfo:
        """The job's record once it has ended. Raises ``JobError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if job.finished:
                return job
            if time.monotonic() > deadline:
                raise JobError(f"job {job_id} is still {job.state} after {timeout_s:g} s")
            time.sleep(poll_s)

    def model(self, job_id: str) -> tuple[BlobManifest, Iterator[bytes]]:
        """The model (safetensors) an ended job kept: a done job's, or the last finished round's
        of one that failed or was cancelled; its manifest, and its bytes as they are read from
        the store, each piece checked (:meth:`StateStore.read_blob`: nothing is read until
        they are; :meth:`StateStore.blob_part` reads a part of it instead)."""
        job = self.job(job_id)
        if job.model is None:
            raise JobError(no_model(job))
        return self.store.read_blob(job.model)

    def ledger(self, job_id: str, round_from: int = 0) -> list[ActivationUse]:
        """The job's ledger: each activation it has run (in round ``round_from`` and later),
        what it used and cost, in the order they started. Raises ``JobNotFound``."""
        return ledger(self.store, self.job(job_id), round_from)

    # ---- scheduling -------------------------------------------------------------------------

    def _schedule(self) -> None:
        while not (self.runtime.shutdown.is_set() or self.runtime.draining.is_set()):
            try:
                self.admit()
            except StoreUnavailable as exc:  # a store restart: the next pass tries again
                log.warning("admission pass skipped: %s", exc)
            except Exception:  # the scheduler must outlive a bad pass
                log.exception("admission pass failed")
            self._wake.wait(self.settings.controller.scheduler_tick_s)
            self._wake.clear()

    def admit(self) -> list[str]:
        """One admission pass: start the queued jobs that fit, and a runner for every running
        job that has none (a restarted controller). Returns the jobs started."""
        jobs = self._all_jobs()
        self._count(jobs)
        with self._lock:
            self._runners = {k: v for k, v in self._runners.items() if v[1].is_alive()}
            orphans = [
                j.job_id
                for j in jobs
                if j.state is JobState.RUNNING and j.job_id not in self._runners
            ]
        for job_id in orphans:
            self._start_runner(job_id)
        chosen = admit(*self._demands(jobs), self._capacity(), self._quota())
        started = [job_id for job_id in chosen if self._mark_running(job_id)]
        for job_id in started:
            self._start_runner(job_id)
        self.metrics.admission_done.set_to_current_time()
        return started

    @staticmethod
    def _demands(jobs: list[JobInfo]) -> tuple[list[Demand], list[Demand]]:
        """What the queued jobs and the running ones hold."""
        queued = [_demand(j) for j in jobs if j.state is JobState.QUEUED]
        return queued, [_demand(j) for j in jobs if j.state is JobState.RUNNING]

    def _capacity(self) -> Capacity:
        limits = self.platform.limits()
        return Capacity(memory_mb=limits.pool_memory_mb, actions=limits.concurrent_invocations)

    def _quota(self) -> TenantQuota:
        api = self.settings.api
        return TenantQuota(
            jobs=api.tenant_max_running_jobs or None, memory_mb=api.tenant_max_memory_mb or None
        )

    def _mark_running(self, job_id: str) -> bool:
        lines: list[JobEvent] = []  # the last try's line (a compare-and-set may try again)

        def change(job: JobInfo | None) -> JobInfo:
            if job is None:
                raise JobNotFound(job_id)
            if job.state is not JobState.QUEUED:
                return job
            t = now_ms()
            waited = (t - job.created_ms) / 1000
            lines.append(
                JobEvent(t_ms=t, kind="admitted", message=f"after {waited:.1f} s in the queue")
            )
            return job.with_event(
                lines[-1],
                kept=self.settings.controller.events_kept,
                state=JobState.RUNNING,
                updated_ms=t,
            )

        job = update(self.store, job_key(job_id), JobInfo, change)
        if lines:
            log_written(job, lines[-1])
        return job.state is JobState.RUNNING

    def _start_runner(self, job_id: str) -> None:
        runner = JobRunner(job_id=job_id, runtime=self.runtime)

        def body() -> None:
            runner.run()
            self._wake.set()  # its pool memory is free: admit the next job

        thread = threading.Thread(target=body, name=f"faasdl-job-{job_id}", daemon=True)
        with self._lock:
            if self.runtime.shutdown.is_set():
                return
            self._runners[job_id] = (runner, thread)
        thread.start()

    def _count(self, jobs: list[JobInfo]) -> None:
        for state in JobState:
            self.metrics.jobs.labels(state=str(state)).set(sum(j.state is state for j in jobs))

    def _all_jobs(self) -> list[JobInfo]:
        """Every job's record without its log and failure reports (``events`` and ``failures``
        empty) and with its last round only (what the job list shows of them; a record keeps
        up to ``ROUNDS_KEPT``, ~120 KB in memory): what admission passes, the job list and
        housekeeping read, every second for every job the store holds. A record is read and
        parsed again only once its version has changed (one scan of versions finds which); the
        heads of the rest are kept."""
        versions = self.store.scan_versions("job/")
        with self._parsed_lock:
            kept = {key: self._heads.get(key) for key, _ in versions}
        heads = {}
        for key, version in versions:
            hit = kept[key]
            if hit is not None and hit[0] == version:
                heads[key] = hit
                continue
            found = self.store.get_raw(key)
            if found is not None:  # else deleted since the scan
                job = self._parsed(key, found)
                head = {"events": [], "failures": [], "rounds": job.rounds[-1:]}
                heads[key] = (found.version, job.model_copy(update=head))
        with self._parsed_lock:
            self._heads = heads
        return [head for _, head in heads.values()]

    def job(self, job_id: str) -> JobInfo:
        """The job's record (shared: never change it in place). Raises ``JobNotFound``."""
        key = job_key(job_id)
        found = self.store.get_raw(key)
        if found is None:
            raise JobNotFound(job_id)
        return self._parsed(key, found)

    def _parsed(self, key: str, found: Versioned) -> JobInfo:
        """The record ``found`` (as stored, not decoded) parsed, from the cache if its version
        has been parsed before: admission passes and list calls read every job record."""
        with self._parsed_lock:
            hit = self._parsed_jobs.get(key)
            if hit is not None and hit[0] == found.version:
                self._parsed_jobs.move_to_end(key)
                return hit[1]
        try:
            job = JobInfo.model_validate_json(found.value)
        except PydanticValidationError as exc:
            raise StoreError(f"record {key!r} is not a valid JobInfo: {exc}") from exc
        with self._parsed_lock:
            self._parsed_jobs[key] = (found.version, job)
            while len(self._parsed_jobs) > PARSED_JOBS_KEPT:
                self._parsed_jobs.popitem(last=False)
        return job


def _trains_on_from(source: JobInfo) -> Callable[[JobInfo], bool]:
    """Whether a job trains on from ``source``'s model (``init_model``)."""
    return lambda j: j.spec.get("init_model") == source.job_id and j.tenant == source.tenant


def _staged_model(job_id: str) -> str:
    """The blob a job that trains on from another's model holds once it has copied that model
    (its global model before round 1)."""
    return global_blob(job_id, 0)


def _demand(job: JobInfo) -> Demand:
    plan = JobPlan.model_validate(job.plan)
    return Demand(
        job_id=job.job_id,
        tenant=job.tenant,
        created_ms=job.created_ms,
        memory_mb=plan.demand_mb,
        actions=plan.workers,
    )


def _model_called(job: JobInfo) -> str | None:
    """The job's model as people read it (:func:`~faasdl.training.models.model_called`)."""
    model = job.spec.get("model")
    return model and model_called(model, job.spec.get("architecture"))


def job_line(job: JobInfo) -> JobLine:
    plan = JobPlan.model_validate(job.plan)
    last = job.rounds[-1] if job.rounds else None
    kept = job.kept_best if job.finished else None
    return JobLine(
        job_id=job.job_id,
        name=job.spec.get("name"),
        tenant=job.tenant,
        state=job.state,
        model=job.spec.get("model"),
        model_called=_model_called(job),
        round=job.round,
        rounds=plan.rounds,
        workers=plan.workers,
        loss=last.loss if last else None,
        accuracy=kept.accuracy if kept else last.accuracy if last else None,
        cost_usd=job.cost_usd,
        created_ms=job.created_ms,
    )


@contextlib.contextmanager
def embedded_controller(settings: Settings) -> Iterator[tuple[Controller, LocalPlatform]]:
    """A started controller on a fresh embedded platform and the settings' store (the demo and
    the benchmarks); all three are closed on leaving."""
    with (
        LocalPlatform(settings=settings.local) as platform,
        make_store(settings.store) as store,
        Controller(
            settings=settings, platform=platform, store=store, store_url=settings.store.url
        ) as controller,
    ):
        yield controller, platform
