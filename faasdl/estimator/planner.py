"""The sizing plan of a training job: how many actions, each with how much memory and time.

Pure: the model's profile, the runtime baseline and a history lookup come in as values, so that
the rules are tested on tiny inputs; :mod:`faasdl.estimator.sizer` fetches them.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from faasdl.errors import EstimationError, ValidationError, not_unicode
from faasdl.estimator.failures import grown_memory_mb, grown_timeout_ms
from faasdl.estimator.history import signature
from faasdl.estimator.memory import (
    DEFAULT,
    Coefficients,
    estimate_memory,
    plan_containers,
    round_to_class,
)
from faasdl.estimator.timeout import estimate_timeout
from faasdl.platform.base import PlatformLimits
from faasdl.store.records import ExecutionHistory
from faasdl.training.datasets import DatasetSpec, DigitsSpec
from faasdl.training.models import (
    CUSTOM,
    MODELS,
    ModelProfile,
    architecture_input,
    check_model,
    custom_name,
)

#: Slack over the largest peak on record for a signature.
HISTORY_MEMORY_SLACK = 1.1


class EstimateRequest(BaseModel):
    """What sizing needs of a job (the job's spec has these fields and more)."""

    # A cost or a loss must be finite: JSON has no infinity, so a stored job would read it
    # back as null.
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)

    model: str = Field(
        description="A model of the zoo (``faasdl.training.models.MODELS``), or ``custom``: "
        "the job's own ``architecture``.",
        json_schema_extra={"enum": [*MODELS, CUSTOM]},
    )
    architecture: dict[str, Any] | None = Field(
        None,
        validate_default=True,
        description="With ``model: custom``: a Keras model's config, as ``model.to_json()`` "
        "writes it, of Keras's own layers (no Lambda, no custom object), one input layer "
        "whose dimensions are the data set's examples', and one output of a logit a class; "
        "its weights start from random, drawn from the seed; at most 512 KiB of JSON.",
    )
    dataset: DatasetSpec = Field(default_factory=DigitsSpec)
    batch_size: int = Field(32, ge=1, le=65_536)
    epochs: int = Field(1, ge=1, le=10_000, description="Epochs each training action runs.")
    workers: int | None = Field(None, ge=1, le=1024, description="Actions; default: estimated.")
    expected_cost: float | None = Field(
        None, gt=0, description="What the user expects to pay, in the price unit (timeouts)."
    )

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any) -> Any:
        """Refuse text that is no Unicode anywhere in the request: pydantic checks a text field
        for it only where it measures or matches the text (a job's name), so a model's name with
        a lone surrogate passed, and the job's record could not be written (a 500)."""
        found = not_unicode(data)
        if found is not None:
            place, why = found
            raise PydanticCustomError(
                "string_unicode",
                "{place}: is not Unicode text ({why})",
                {"place": place or "the request", "why": why},
            )
        return data

    @field_validator("architecture")
    @classmethod
    def _architecture_for_custom(
        cls, architecture: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        """A job's own architecture with ``model: custom``, checked as it can be before its data
        set is read; none with a model of the zoo."""
        model = info.data.get("model")
        if model is None:  # refused already
            return architecture
        if architecture is None:
            if model == CUSTOM:
                raise PydanticCustomError(
                    "architecture",
                    "model {custom} needs one: a Keras model's config, as model.to_json() "
                    "writes it",
                    {"custom": repr(CUSTOM)},
                )
            return None
        if model != CUSTOM:
            raise PydanticCustomError(
                "architecture",
                "is for model {custom}, a job's own; {model} is the zoo's",
                {"custom": repr(CUSTOM), "model": repr(model)},
            )
        try:
            architecture_input(architecture)
        except ValidationError as exc:
            raise PydanticCustomError("architecture", "{why}", {"why": exc.message}) from exc
        return architecture

    @property
    def model_name(self) -> str:
        """The model as actions, plans and the history name it: a zoo model's name, or a job's
        own architecture's :func:`~faasdl.training.models.custom_name`."""
        return custom_name(self.architecture) if self.architecture is not None else self.model

    def model_args(self) -> dict[str, Any]:
        """The model as an action's arguments give it: its name, and a job's own architecture."""
        if self.architecture is None:
            return {"model": self.model}
        return {"model": self.model_name, "architecture": self.architecture}


@dataclass(frozen=True)
class DataFacts:
    """What sizing needs to know of a data set."""

    examples: int
    example_bytes: int
    input_shape: tuple[int, ...]
    classes: int
    test_examples: int = 0  # not used in sizing; a job's plan reports it
    validation_examples: int = 0  # held out of the training examples (a job's plan reports it)
    sha256: str | None = None  # a user's file's (Dataset.sha256); a job's plan keeps it


class ActionPlan(BaseModel):
    """How each training action of the job runs."""

    containers: int
    shard_examples: int
    signature: str
    memory_mb: int
    memory_estimate_mb: float
    memory_parts: dict[str, float]
    memory_source: Literal["model", "history"]
    timeout_ms: int
    timeout_source: Literal["history", "expected_cost", "platform_max"]
    # The medians of the signature's past runs (without cold starts): an action's fixed part and
    # its time per epoch; none without history (and in plans made before they were kept).
    median_overhead_ms: int | None = None
    median_epoch_ms: int | None = None
    # And of the rounds' aggregations and evaluations (jobs of the signature's).
    median_aggregate_ms: int | None = None
    median_evaluate_ms: int | None = None
    # The median of the runtime's cold starts on record (its /init; none before one) of as many
    # trainers at once (or the most up to as many), and of an aggregation's (its own action's,
    # the jobs of the signature's).
    median_cold_start_ms: int | None = None
    median_aggregate_cold_start_ms: int | None = None
    # A container's first run's building and tracing of its trainer (the signature's).
    median_build_ms: int | None = None


def check_workers(request: EstimateRequest, data: DataFacts) -> None:
    """What the data set refuses of the request's ``workers``, where it names them: known before
    anything is measured or sized (``ValidationError``)."""
    if request.workers is not None:
        _check_shards(request, data, request.workers)


def _check_shards(request: EstimateRequest, data: DataFacts, containers: int) -> None:
    if containers > data.examples:
        raise ValidationError(
            f"{containers} workers for {_examples(data.examples)}: a worker needs one at least",
            field="workers",
        )
    shard_examples = math.ceil(data.examples / containers)
    if request.batch_size > shard_examples:
        raise ValidationError(
            f"batch size {request.batch_size} is larger than a shard "
            f"({_examples(shard_examples)} with {containers} "
            f"worker{'s' if containers > 1 else ''})",
            field="batch_size",
        )


def _examples(count: int) -> str:
    return f"{count:,} training example{'s' if count != 1 else ''}"


def plan_training(
    request: EstimateRequest,
    data: DataFacts,
    *,
    profile: ModelProfile,
    baseline_mb: float,
    init_ms: int,
    limits: PlatformLimits,
    history: Callable[[str], ExecutionHistory | None],
    step_mb: int,
    price_per_gb_s: float,
    coefficients: Coefficients = DEFAULT,
    cold_starts_ms: Callable[[int], Sequence[int]] = lambda trainers: (),
) -> ActionPlan:
    """Containers, memory and timeout of one training action; raises ``ValidationError`` for a
    job that cannot run as asked and ``EstimationError`` for one no limit of the platform fits.
    ``cold_starts_ms(n)``: the runtime's cold starts to plan ``n`` trainers at once by."""
    check_model(request.model, data.input_shape, data.classes, request.architecture)
    model = request.model_name  # a job's own architecture's digest: once, not at each count

    # Cached: the container search and the final plan ask for the same counts, and each
    # answer reads the history once.
    @functools.cache
    def sized(containers: int) -> tuple[str, ExecutionHistory | None, float, dict[str, float]]:
        shard = math.ceil(data.examples / containers)
        sig = signature(model, data.input_shape, data.classes, request.batch_size, shard)
        past = history(sig)
        least = _least_memory_mb(past, step_mb=step_mb, max_mb=limits.memory_max_mb)
        if past is not None and past.runs:
            peak = past.peak_memory_mb * HISTORY_MEMORY_SLACK
            return sig, past, max(peak, least), {"measured_peak": past.peak_memory_mb}
        estimate = estimate_memory(
            profile,
            batch_size=min(request.batch_size, shard),
            shard_bytes=shard * data.example_bytes,
            baseline_mb=baseline_mb,
            coefficients=coefficients,
        )
        return sig, past, max(estimate.mb, least), estimate.parts

    if request.workers is not None:
        check_workers(request, data)
        containers = request.workers
    else:
        containers, _ = plan_containers(
            lambda c: sized(c)[2], limit_mb=limits.memory_max_mb, examples=data.examples
        )
        _check_shards(request, data, containers)
    sig, past, needed_mb, parts = sized(containers)
    from_history = past is not None and past.runs > 0
    shard_examples = math.ceil(data.examples / containers)
    try:
        memory_mb = round_to_class(
            needed_mb, step_mb=step_mb, min_mb=limits.memory_min_mb, max_mb=limits.memory_max_mb
        )
    except EstimationError as exc:
        if request.workers is None:
            raise
        raise EstimationError(f"{exc}; leave workers out to let faasdl choose") from exc
    timeout = estimate_timeout(
        overhead_ms=past.overhead_ms if past else [],
        epoch_ms=past.epoch_ms if past else [],
        epochs=request.epochs,
        init_ms=init_ms,
        least_ms=_least_timeout_ms(past),
        previous_ms=past.timeout_ms if past else 0,
        expected_cost=request.expected_cost,
        containers=containers,
        memory_mb=memory_mb,
        price_per_gb_s=price_per_gb_s,
        min_ms=limits.timeout_min_ms,
        max_ms=limits.timeout_max_ms,
    )
    return ActionPlan(
        containers=containers,
        shard_examples=shard_examples,
        signature=sig,
        memory_mb=memory_mb,
        memory_estimate_mb=round(needed_mb, 1),
        memory_parts={name: round(mb, 1) for name, mb in parts.items()},
        memory_source="history" if from_history else "model",
        timeout_ms=timeout.ms,
        timeout_source=timeout.source,
        median_overhead_ms=_median_ms(past.overhead_ms) if past else None,
        median_epoch_ms=_median_ms(past.epoch_ms) if past else None,
        median_aggregate_ms=_median_ms(past.aggregate_ms) if past else None,
        median_evaluate_ms=_median_ms(past.evaluate_ms) if past else None,
        median_cold_start_ms=_median_ms(cold_starts_ms(containers)),
        median_aggregate_cold_start_ms=_median_ms(past.aggregate_init_ms) if past else None,
        median_build_ms=_median_ms(past.build_ms) if past else None,
    )


def _median_ms(durations: Sequence[int]) -> int | None:
    return round(statistics.median(durations)) if durations else None


def _least_memory_mb(past: ExecutionHistory | None, *, step_mb: int, max_mb: int) -> int:
    """The least memory of a signature's next run: more than any limit a run failed under, and
    while no run has succeeded, what the failed job's own next attempt had
    (:func:`.failures.grown_memory_mb`, within the platform's largest limit): one class more
    would repeat the failure of a formula that fell short by more than a class."""
    if past is None or not past.memory_floor_mb:
        return 0
    above = past.memory_floor_mb + 1
    if past.runs:
        return above
    return max(above, min(max_mb, grown_memory_mb(past.memory_floor_mb, step_mb=step_mb)))


def _least_timeout_ms(past: ExecutionHistory | None) -> int:
    """The least time limit of a signature's next run, as :func:`_least_memory_mb` for memory."""
    if past is None or not past.timeout_floor_ms:
        return 0
    if past.runs:
        return past.timeout_floor_ms + 1
    return grown_timeout_ms(past.timeout_floor_ms)
