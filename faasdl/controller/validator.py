"""What a training job may ask for: the job spec's schema and its semantic checks.

The schema refuses what is malformed (a 422 naming the field); the estimator's ``checked_facts``
and the sizing refuse what is well-formed but cannot run (an unknown model, a model that does not
fit the data's shape, more workers than examples, limits beyond the platform's) before anything
is stored or started. A ``JobSpec`` is an ``EstimateRequest``, so both take it as it is.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from faasdl.canary.strategies import (
    RecoveryStrategy,
    ReplicationMode,
    StrategyName,
    make_strategy,
)
from faasdl.errors import ValidationError
from faasdl.estimator.planner import EstimateRequest
from faasdl.store.records import JOB_ID_PATTERN

TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
#: Characters in a job's name at most.
NAME_MAX = 100


class FaultTolerance(BaseModel):
    """How a job survives failed activations (:mod:`faasdl.canary.strategies`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    policy: StrategyName = Field(
        "canary",
        description="canary: checkpoints, heartbeat leases and warm replicas, a failed unit "
        "resumes from its latest checkpoint; retry: run a failed unit again from zero (OpenWhisk "
        "style); request_replication: run `copies` of each unit, the first to commit wins; "
        "active_standby: a warm standby per running unit, no checkpoints; none: the first "
        "failure fails the job. Out of memory always raises the unit's memory class.",
    )
    max_attempts: int = Field(
        4, ge=1, le=20, description="Failures in a row without progress before the job fails."
    )
    copies: int = Field(2, ge=2, le=8, description="Copies per unit (request_replication).")
    replication: ReplicationMode = Field(
        "dynamic",
        description="Warm replicas (canary): dynamic (from the failure rate), aggressive (one "
        "per running unit) or lenient (one).",
    )
    heartbeat_s: float = Field(
        1.0,
        ge=0.1,
        le=60,
        description="Heartbeat period: an attempt renews its lease twice per period (and with "
        "each checkpoint), and one silent for 1.5 periods is hung (fenced and recovered).",
    )
    checkpoint_interval_s: float | None = Field(
        None,
        gt=0,
        le=3600,
        description="Fixed checkpoint interval; none: Young's √(2·cost·MTBF), re-tuned as the "
        "measured cost and the observed failures change.",
    )

    def strategy(self) -> RecoveryStrategy:
        return make_strategy(
            self.policy,
            max_attempts=self.max_attempts,
            copies=self.copies,
            replication=self.replication,
        )


class JobSpec(EstimateRequest):
    """A training job: the sizing request plus how it is trained, merged and kept alive."""

    name: str | None = Field(
        None,
        min_length=1,
        max_length=NAME_MAX,
        description="A name of your choosing, shown beside the job's id in the job list, its "
        "status and the dashboard; one line of text, need not be unique.",
    )
    epochs: int = Field(1, ge=1, le=10_000, description="Epochs of training in all.")
    sync_every: int = Field(
        1,
        ge=0,
        le=10_000,
        description="Epochs per round: each round trains every shard from the global model and "
        "averages the results. 0: one round of all epochs (DiSDeL's one-shot mode).",
    )
    target_loss: float | None = Field(
        None, ge=0, description="ε: stop once the round's mean training loss is at most this."
    )
    patience: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Stop once this many rounds have passed without a validation loss below "
        "the lowest before (Keras' EarlyStopping patience; the test loss without "
        "validation_fraction).",
    )
    keep_model: Literal["last", "best"] = Field(
        "last",
        description="The model the job keeps as it ends (done, finished, cancelled, failed or "
        "stopped by its budget): its last finished round's, or best: its round of the lowest "
        "validation loss (Keras' restore_best_weights; the test loss without "
        "validation_fraction).",
    )
    validation_fraction: float = Field(
        0.0,
        ge=0,
        le=0.5,
        description="Share of the training examples held out, drawn by the seed, to choose by: "
        "each round's model is scored on them as well as on the test set, and patience and "
        "keep_model: best go by their loss (Keras' validation_split). 0: none held out; those "
        "go by the test loss then, and the test set chooses the model it scores.",
    )
    max_cost_usd: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="A budget (USD): once the job has cost this much (its activations, those "
        "running by their memory and time so far, and its warm replicas' memory; looked at "
        "twice a second), the round in progress is stopped and the job ends done with its last "
        "finished round's model (or its best's: keep_model), or failed, with none, in its first "
        "round.",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seeds the split, the model, the order.")
    optimizer: Literal["adam", "sgd"] = "adam"
    learning_rate: float = Field(1e-3, gt=0, le=10)
    lr_scaling: Literal["sqrt", "none"] = Field(
        "sqrt",
        description="sqrt: in periodic rounds each of N workers trains with the learning rate "
        "× √N, since a round gives each worker 1/N of the steps one worker would take; none: "
        "as given.",
    )
    lr_schedule: Literal["constant", "cosine", "exponential"] = Field(
        "constant",
        description="The learning rate round by round: constant; cosine: from learning_rate "
        "at the first round down to lr_min_fraction of it at the last (Keras' CosineDecay, a "
        "step a round); exponential: × lr_decay_rate each round (Keras' ExponentialDecay, "
        "staircase, a step a round).",
    )
    lr_min_fraction: float = Field(
        0.0, ge=0, le=1, description="cosine: the last round's rate, a fraction of the first's."
    )
    lr_decay_rate: float = Field(
        0.9, gt=0, le=1, description="exponential: what the rate is multiplied by each round."
    )
    tenant: str = Field(
        "default", pattern=TENANT_PATTERN, description="Who the job belongs to (admission)."
    )
    fault_tolerance: FaultTolerance = Field(default_factory=FaultTolerance)
    init_model: str | None = Field(
        None,
        pattern=JOB_ID_PATTERN,
        description="An ended job of the tenant's to train on from (a done job, or one that "
        "failed or was cancelled after a round had finished: its last finished round's model): "
        "its model's weights and optimizer state start the first round, instead of weights "
        "drawn from the seed. Its model, input shape, classes and optimizer must be this job's.",
    )

    @field_validator("name")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if value != value.strip():
            raise ValueError("begins or ends with white space")
        if control := next((c for c in value if not c.isprintable()), None):
            raise ValueError(
                f"holds {control!r} at {value.index(control)}: a name is one line of text"
            )
        return value

    @field_validator("sync_every")
    @classmethod
    def _rounds_fit_epochs(cls, value: int, info: ValidationInfo) -> int:
        epochs = info.data.get("epochs")
        if epochs is not None and value > epochs:
            raise ValueError(f"is more epochs ({value}) than the job has ({epochs})")
        return value

    def validation_examples(self, examples: int) -> int:
        """How many of ``examples`` training examples ``validation_fraction`` holds out; raises
        ``ValidationError`` where it holds out none."""
        held = round(examples * self.validation_fraction)
        if self.validation_fraction and not held:
            if examples == 1:  # holding it out would leave none to train on
                raise ValidationError(
                    f"{self.validation_fraction} of the 1 training example holds none out, and "
                    "one would leave none to train on: 0 holds none out",
                    field="validation_fraction",
                )
            raise ValidationError(
                f"{self.validation_fraction} of the {examples:,} training examples holds none "
                f"out: {1 / examples:.3g} holds one, 0 none",
                field="validation_fraction",
            )
        return held

    @property
    def epochs_per_round(self) -> int:
        return self.sync_every or self.epochs

    @property
    def rounds(self) -> int:
        return math.ceil(self.epochs / self.epochs_per_round)

    def round_epochs(self, round_: int) -> int:
        """Epochs of round ``round_`` (the last may be shorter)."""
        return min(self.epochs_per_round, self.epochs - round_ * self.epochs_per_round)

    def worker_learning_rate(self, workers: int, round_: int = 0) -> float:
        """The rate each of ``workers`` trains at in round ``round_``: the job's, scaled for
        the workers (``lr_scaling``) and for the round (``lr_schedule``)."""
        rate = self.learning_rate * self.round_factor(round_)
        if self.lr_scaling == "sqrt" and self.sync_every and workers > 1:
            return rate * math.sqrt(workers)
        return rate

    def round_factor(self, round_: int) -> float:
        """What ``lr_schedule`` multiplies the learning rate by in round ``round_``."""
        if self.lr_schedule == "exponential":
            return float(self.lr_decay_rate**round_)
        if self.lr_schedule == "cosine" and self.rounds > 1:
            cosine = 0.5 * (1 + math.cos(math.pi * round_ / (self.rounds - 1)))
            return (1 - self.lr_min_fraction) * cosine + self.lr_min_fraction
        return 1.0

    def sizing(self) -> EstimateRequest:
        """What the estimator sizes: one action of one round."""
        return EstimateRequest.model_validate(
            {
                **self.model_dump(include=set(EstimateRequest.model_fields)),
                "epochs": self.epochs_per_round,
            }
        )


#: Longest ``Idempotency-Key`` accepted (the IETF draft sets none; Stripe's is 255).
IDEMPOTENCY_KEY_MAX = 255


def check_idempotency_key(key: str) -> None:
    """``ValidationError`` unless ``key`` is an ``Idempotency-Key`` a header carries as it is:
    printable ISO-8859-1 (a header's characters), no white space at either end (HTTP drops it),
    at most :data:`IDEMPOTENCY_KEY_MAX` characters. The controller checks it, and the client
    before it sends one (requests raised ``UnicodeEncodeError``, or refused a newline as if the
    controller were unreachable)."""
    fits = 0 < len(key) <= IDEMPOTENCY_KEY_MAX and max(map(ord, key)) <= 0xFF
    if not fits or not key.isprintable() or key != key.strip():
        raise ValidationError(
            f"must be 1 to {IDEMPOTENCY_KEY_MAX} printable characters of ISO-8859-1 (a header's), "
            "without white space at either end",
            field="Idempotency-Key",
        )
