"""Sizing at the edge: the estimator's inputs fetched from the platform and the store.

The controller has no TensorFlow, so a model's profile and the runtime's baseline are measured by
the training action itself (``mode: profile`` / ``mode: baseline``) and kept in the store's
history; each is measured once (the baseline once per runtime). After a run, :meth:`Sizer.learn`
records what it really used.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from dataclasses import fields
from typing import Any, Literal

from faasdl.actions import TRAIN, deploy_variant
from faasdl.config import Settings
from faasdl.errors import EstimationError, ValidationError
from faasdl.estimator import history
from faasdl.estimator.planner import ActionPlan, DataFacts, EstimateRequest, plan_training
from faasdl.platform.base import Activation, Platform
from faasdl.platform.classify import Failure, FailureKind, classify
from faasdl.store import action_environment
from faasdl.store.base import StateStore
from faasdl.store.records import BaselineRecord
from faasdl.training.datasets import (
    Dataset,
    DigitsSpec,
    NpzSpec,
    dims,
    load_dataset,
    npz_sha256,
)
from faasdl.training.models import ModelProfile, check_model

log = logging.getLogger(__name__)

#: Time limit of a profiling activation (building InceptionV3 takes a few seconds).
PROBE_TIMEOUT_MS = 120_000


def load_checked(request: EstimateRequest) -> Dataset:
    """The request's data set, checked against its model: what can be refused with no I/O but
    reading the data is refused here, before anything is opened or written."""
    dataset = load_dataset(request.dataset)
    check_model(request.model, dataset.input_shape, dataset.classes, request.architecture)
    return dataset


def checked_facts(request: EstimateRequest) -> DataFacts:
    """What sizing needs of the request's data set, checked against its model as
    :func:`load_checked` does. A generated data set's facts follow from its spec: generating it
    (up to 1 GiB; ~12 s for 49,000 images of 32×32×3 here) is the job's work when it stages its
    shards, not a request's; the digits are loaded once per process, and a user's file is hashed
    and loaded the first time its content is seen (:func:`npz_facts`)."""
    spec = request.dataset
    if isinstance(spec, NpzSpec):
        facts = npz_facts(spec)
        check_model(request.model, facts.input_shape, facts.classes, request.architecture)
        return facts
    if isinstance(spec, DigitsSpec):
        return facts_of(load_checked(request))
    check_model(request.model, spec.shape, spec.classes, request.architecture)
    return DataFacts(
        examples=spec.train_size,
        # float32 inputs and an int32 label, as the generator makes them
        example_bytes=4 * math.prod(spec.shape) + 4,
        input_shape=spec.shape,
        classes=spec.classes,
        test_examples=spec.test_size,
    )


#: The facts of the ``.npz`` contents checked lately, by SHA-256: loading a file to check it
#: takes up to ~1.3 GB and ~3 s at the size limit, hashing it ~0.5 s and no memory.
_NPZ_FACTS: OrderedDict[str, DataFacts] = OrderedDict()
_NPZ_FACTS_LOCK = threading.Lock()
NPZ_FACTS_KEPT = 64


def npz_facts(spec: NpzSpec) -> DataFacts:
    """The facts of the ``.npz`` file ``spec`` names: those of the same content checked before
    (an upload, another job's submission or estimate), or the file loaded and checked now."""
    sha256 = npz_sha256(spec)
    with _NPZ_FACTS_LOCK:
        known = _NPZ_FACTS.get(sha256)
        if known is not None:
            _NPZ_FACTS.move_to_end(sha256)
    return known or remember_facts(load_dataset(spec))


def remember_facts(dataset: Dataset) -> DataFacts:
    """The facts of a loaded data set, kept for :func:`npz_facts` if it came from a file."""
    facts = facts_of(dataset)
    if dataset.sha256 is not None:
        with _NPZ_FACTS_LOCK:
            _NPZ_FACTS[dataset.sha256] = facts
            _NPZ_FACTS.move_to_end(dataset.sha256)
            while len(_NPZ_FACTS) > NPZ_FACTS_KEPT:
                _NPZ_FACTS.popitem(last=False)
    return facts


def facts_of(dataset: Dataset) -> DataFacts:
    """What sizing needs of a loaded data set."""
    return DataFacts(
        examples=len(dataset.y_train),
        example_bytes=dataset.example_bytes,
        input_shape=dataset.input_shape,
        classes=dataset.classes,
        test_examples=len(dataset.y_test),
        sha256=dataset.sha256,
    )


class Sizer:
    """Plans training actions for jobs on one platform, learning from their runs."""

    def __init__(self, *, platform: Platform, store: StateStore, settings: Settings) -> None:
        self.platform = platform
        self.store = store
        self.settings = settings
        # The runtime id the stored baseline was last read or written with: a run that reports
        # it needs no read of the record to tell it is the same runtime.
        self._baseline_id: str | None = None

    def plan(self, request: EstimateRequest, facts: DataFacts | None = None) -> ActionPlan:
        """The plan for ``request``, whose data set's facts are ``facts`` (by default those
        :func:`checked_facts` finds); nothing trained, nothing staged."""
        facts = facts or checked_facts(request)
        runtime = self.baseline()
        return plan_training(
            request,
            facts,
            profile=self.profile(request, facts.input_shape, facts.classes),
            baseline_mb=runtime.peak_memory_mb,
            init_ms=max(runtime.init_ms, default=0),
            cold_starts_ms=runtime.starts_with,
            limits=self.platform.limits(),
            history=lambda sig: history.read(self.store, sig),
            step_mb=self.settings.estimator.memory_step_mb,
            price_per_gb_s=self.settings.price_per_gb_s,
        )

    def profile(
        self, request: EstimateRequest, input_shape: tuple[int, ...], classes: int
    ) -> ModelProfile:
        """The sizes of the request's model for these inputs and classes: those on record, or
        measured by a probe now (which builds a job's own architecture first: what Keras refuses
        of it is refused here, ``ValidationError`` naming ``architecture``)."""
        model = request.model_name
        name = history.profile_name(model, input_shape, classes)
        known = history.read_profile(self.store, name)
        if known is not None:
            return known
        params = {
            "mode": "profile",
            **request.model_args(),
            "input_shape": list(input_shape),
            "classes": classes,
        }
        record = self._probe_record(params)
        # The model refused as it was built: a job's own architecture Keras cannot build, or
        # weights TensorFlow cannot allocate.
        said = str((record.response.result or {}).get("error", ""))
        field, _, why = said.partition(": ")
        if not record.success and field in ("model", "architecture") and why:
            raise ValidationError(why, field=field)
        failure = classify(record)
        if failure is not None and failure.kind is FailureKind.OUT_OF_MEMORY:
            raise ValidationError(
                f"{model} for {dims(input_shape)} inputs and {classes} classes runs out of "
                "memory as it is built, in the platform's largest action memory "
                f"({self.platform.limits().memory_max_mb} MB): use a smaller model or smaller "
                "inputs",
                field="model" if request.architecture is None else "architecture",
            )
        result = self._checked(record, params)
        profile = ModelProfile(**{f.name: int(result[f.name]) for f in fields(ModelProfile)})
        history.write_profile(self.store, name, profile)
        return profile

    def baseline(self) -> BaselineRecord:
        """The runtime's memory floor and cold-start times, measured by a probe the first time and
        again once a run has reported another runtime than the one measured (``stale``)."""
        runtime = self.settings.estimator.baseline_runtime
        known = history.read_baseline(self.store, runtime)
        if known is not None and not known.stale:
            self._baseline_id = known.runtime_id
            return known
        params = {"mode": "baseline"}
        record = self._probe_record(params)
        result = self._checked(record, params)
        measured = history.write_baseline(
            self.store,
            runtime,
            peak_memory_mb=float(result["peak_rss_mb"]),
            init_ms=record.init_time,
            runtime_id=str(result.get("runtime_id", "")),
            earlier=known,
        )
        self._baseline_id = measured.runtime_id
        if known is not None:
            log.info(
                "runtime %s measured again, its runs having reported another than the one "
                "measured: %.1f MB (%s), was %.1f MB (%s)",
                runtime,
                measured.peak_memory_mb,
                measured.runtime_id or "unnamed",
                known.peak_memory_mb,
                known.runtime_id or "unnamed",
            )
        return measured

    def learn_merge_step(
        self, plan: ActionPlan, kind: Literal["aggregate", "evaluate"], activation: Activation
    ) -> None:
        """Record how long a successful aggregation or evaluation of a job whose trainers run
        ``plan`` took, its cold start aside, and an aggregation's cold start (what its plans'
        expected cost is made of; an evaluation's is the runtime's, as a trainer's)."""
        init_ms = activation.init_time or 0
        ms = max(0, (activation.duration or 0) - init_ms)
        history.record_merge_step(self.store, plan.signature, kind, ms, init_ms)

    def learn(self, plan: ActionPlan, activation: Activation, failure: Failure | None) -> None:
        """Record what a training activation of ``plan`` used, or the limits it failed under."""
        init_ms = activation.init_time or 0
        runtime = self.settings.estimator.baseline_runtime
        # A cold start that ran out of time measured its limit, not itself (a hung or frozen
        # start, or one slower than any on record): the signature's floor keeps that lesson
        # (below); kept with the starts, it would raise the next limit of every signature past
        # it, and again at each such failure.
        if 0 < init_ms < plan.timeout_ms:
            history.record_init(self.store, runtime, init_ms, trainers=plan.containers)
        if failure is None:
            result: dict[str, Any] = activation.response.result or {}
            runtime_id = str(result.get("runtime_id", ""))
            if runtime_id != self._baseline_id:
                history.note_runtime(self.store, runtime, runtime_id)
            phases = result.get("phases_s", {})
            epochs = max(1, len(result.get("epochs", [])))
            train_ms = 1000 * float(phases.get("train", 0.0))
            # A container's first run of the signature built and traced its trainer, and its
            # first step ran the step's graph for the first time: its one-off part, counted with
            # its start and end (as its build is: the slowest is what a limit covers), not with
            # the epochs a warm container's run takes.
            built = not result.get("trainer_reused", True)
            first_run_ms = 1000 * float(result.get("first_step_extra_s") or 0.0) if built else 0.0
            train_ms -= first_run_ms
            history.record_run(
                self.store,
                plan.signature,
                peak_memory_mb=float(result["peak_rss_mb"]),
                overhead_ms=max(0, int((activation.duration or 0) - init_ms - train_ms)),
                epoch_ms=math.ceil(train_ms / epochs),
                timeout_ms=plan.timeout_ms,
                runtime_id=runtime_id,
                build_ms=round(1000 * float(phases.get("build", 0.0)) + first_run_ms)
                if built
                else None,
            )
        elif failure.kind is FailureKind.OUT_OF_MEMORY:
            history.record_failure(self.store, plan.signature, memory_floor_mb=plan.memory_mb)
        elif failure.kind is FailureKind.OUT_OF_TIME:
            history.record_failure(self.store, plan.signature, timeout_floor_ms=plan.timeout_ms)

    def _probe_record(self, params: dict[str, Any]) -> Activation:
        """A probe's activation at the platform's largest limits (:meth:`_checked` says whether
        it failed)."""
        limits = self.platform.limits()
        variant = deploy_variant(
            self.platform,
            TRAIN,
            memory_mb=limits.memory_max_mb,
            timeout_ms=min(limits.timeout_max_ms, PROBE_TIMEOUT_MS),
            environment=action_environment(self.settings.store),
        )
        return self.platform.call(variant, params)

    @staticmethod
    def _checked(record: Activation, params: dict[str, Any]) -> dict[str, Any]:
        """A probe's result; one that failed raises ``EstimationError``."""
        result: dict[str, Any] = record.response.result or {}
        if not record.success:
            raise EstimationError(
                f"measuring {params.get('mode')} failed: {record.error or result.get('error')}"
            )
        return result
