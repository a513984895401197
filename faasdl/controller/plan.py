"""A job's plan: the training actions' sizing, the rounds, and the aggregation tree.

Made once at submission and stored in the job's record, so that admission can weigh the job and
a restarted controller runs the same plan. Limits corrected after a failure are written back.
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel

from faasdl.aggregation.tree import aggregator_memory_mb, fan_in, plan_tree
from faasdl.controller.validator import JobSpec
from faasdl.errors import EstimationError, ValidationError
from faasdl.estimator.memory import DEFAULT, MIB, round_to_class
from faasdl.estimator.planner import ActionPlan, DataFacts
from faasdl.estimator.sizer import Sizer
from faasdl.platform.base import PlatformLimits

#: Arrays per weight that a global model holds: the weight and the optimizer's slots.
STATE_COPIES = {"adam": 3, "sgd": 2}
#: Time limit of an aggregation action: reading and writing a few models.
AGGREGATE_TIMEOUT_MS = 60_000


class JobPlan(BaseModel):
    train: ActionPlan
    rounds: int
    epochs_per_round: int
    examples: int  # the training examples the shards hold
    test_examples: int
    validation_examples: int = 0  # held out of the training set (validation_fraction)
    input_shape: tuple[int, ...]
    classes: int
    data_sha256: str | None = None  # the .npz file's content when the job was planned
    model_mb: float  # one trained model with its optimizer state
    aggregate_memory_mb: int
    # What an aggregator holds, before the class (none in plans made before it was recorded).
    aggregate_memory_estimate_mb: float | None = None
    aggregate_timeout_ms: int
    # An evaluation's memory, where the larger of its two sets (test, validation) needs more
    # than a trainer holds for its shard; none: the trainers' (it runs on their containers).
    evaluate_memory_mb: int | None = None
    fan_in: int
    tree: list[list[list[int]]]
    # What its training actions would cost by the medians of past runs (none without history),
    # and all its actions, its rounds' aggregations and evaluations too (none until those are
    # on record as well), on warm containers; and that with each of its containers starting cold
    # once (none before a cold start is on record): its trainers (the runtime's start and the
    # build of a trainer), its aggregators (``aggregators_at_once``), and its evaluation where it
    # has a memory class of its own. Warm replicas come on top.
    train_cost_usd: float | None = None
    expected_cost_usd: float | None = None
    expected_cost_cold_usd: float | None = None

    @property
    def workers(self) -> int:
        return self.train.containers

    @property
    def evaluate_mb(self) -> int:
        """The memory an evaluation runs with: its own, or the trainers' where that is more (a
        failure may have raised theirs since)."""
        return max(self.evaluate_memory_mb or 0, self.train.memory_mb)

    @property
    def aggregations(self) -> int:
        """Aggregation actions a round runs: the tree's groups (none for one trainer)."""
        return sum(len(level) for level in self.tree)

    def merge_cost_usd(self, price_per_gb_s: float) -> float | None:
        """What its rounds' aggregations and evaluations would cost by the medians of past
        runs; none where one of them is not on record."""
        aggregate_ms, evaluate_ms = self.train.median_aggregate_ms, self.train.median_evaluate_ms
        if evaluate_ms is None or (aggregate_ms is None and self.aggregations):
            return None
        gb_ms = (
            self.aggregations * self.aggregate_memory_mb * (aggregate_ms or 0)
            + self.evaluate_mb * evaluate_ms
        ) / 1024
        return self.rounds * gb_ms / 1000 * price_per_gb_s

    @property
    def aggregators_at_once(self) -> int:
        """Aggregators a round runs at once: the tree's widest level (each level runs after the
        one before)."""
        return max((len(level) for level in self.tree), default=0)

    def cold_starts_said(self) -> str:
        """The containers whose cold starts ``expected_cost_cold_usd`` counts, in words."""
        aggregators = self.aggregators_at_once
        return ", ".join(
            [
                f"{self.workers} trainer(s)",
                *([f"{aggregators} aggregator(s)"] if aggregators else []),
                *(["its evaluation's"] if self.evaluate_memory_mb else []),
            ]
        )

    def cold_starts_gb_s(self) -> float | None:
        """The GB·s of starting each of its containers cold once, by the cold starts on record
        (the runtime's, a trainer's build, an aggregation's: none on record counts nothing);
        none before the runtime's first."""
        start_ms = self.train.median_cold_start_ms
        if start_ms is None:
            return None
        mb_ms = (
            self.workers * self.train.memory_mb * (start_ms + (self.train.median_build_ms or 0))
            + self.aggregators_at_once
            * self.aggregate_memory_mb
            * (self.train.median_aggregate_cold_start_ms or 0)
            + (self.evaluate_mb * start_ms if self.evaluate_memory_mb else 0)
        )
        return mb_ms / 1024 / 1000

    @property
    def demand_mb(self) -> int:
        """Pool memory the job holds while its trainers run."""
        return self.train.containers * self.train.memory_mb


def make_plan(
    spec: JobSpec,
    data: DataFacts,
    train: ActionPlan,
    *,
    params: int,
    limits: PlatformLimits,
    step_mb: int,
    max_fan_in: int,
    price_per_gb_s: float,
) -> JobPlan:
    """The whole job's plan around the training action's (pure); ``data``'s training examples
    are those left once the validation set is held out."""
    model_mb = STATE_COPIES[spec.optimizer] * params * 4 / MIB
    estimate = aggregator_memory_mb(model_mb)
    memory = round_to_class(
        estimate,
        step_mb=step_mb,
        min_mb=limits.memory_min_mb,
        max_mb=limits.memory_max_mb,
    )
    fan = fan_in(model_mb=model_mb, memory_mb=memory, max_fan_in=max_fan_in)
    tree = plan_tree(train.containers, fan)
    evaluate_mb = _evaluate_memory_mb(data, train, limits=limits, step_mb=step_mb)
    plan = JobPlan(
        train=train,
        rounds=spec.rounds,
        epochs_per_round=spec.epochs_per_round,
        examples=data.examples,
        test_examples=data.test_examples,
        validation_examples=data.validation_examples,
        input_shape=data.input_shape,
        classes=data.classes,
        data_sha256=data.sha256,
        model_mb=round(model_mb, 3),
        aggregate_memory_mb=memory,
        aggregate_memory_estimate_mb=round(estimate, 1),
        aggregate_timeout_ms=max(
            limits.timeout_min_ms, min(limits.timeout_max_ms, AGGREGATE_TIMEOUT_MS)
        ),
        evaluate_memory_mb=evaluate_mb if evaluate_mb > train.memory_mb else None,
        fan_in=fan,
        tree=[[list(group) for group in level] for level in tree.levels],
        train_cost_usd=_train_cost_usd(spec, train, price_per_gb_s),
    )
    merge = plan.merge_cost_usd(price_per_gb_s)
    if plan.train_cost_usd is None or merge is None:
        return plan
    warm = plan.train_cost_usd + merge
    starts = plan.cold_starts_gb_s()
    cold = None if starts is None else warm + starts * price_per_gb_s
    return plan.model_copy(update={"expected_cost_usd": warm, "expected_cost_cold_usd": cold})


def _evaluate_memory_mb(
    data: DataFacts, train: ActionPlan, *, limits: PlatformLimits, step_mb: int
) -> int:
    """The memory class of an evaluation: a trainer's estimate with its shard's part grown to
    the larger set it scores (the test set, or the validation set), as the sizing counts a
    shard (:mod:`faasdl.estimator.memory`); raises ``ValidationError`` where no class of the
    platform's holds it."""
    largest = max(data.test_examples, data.validation_examples)
    more = max(0, largest - train.shard_examples) * data.example_bytes / MIB
    needed = train.memory_estimate_mb + more * DEFAULT.shard * DEFAULT.margin
    try:
        return round_to_class(
            needed, step_mb=step_mb, min_mb=limits.memory_min_mb, max_mb=limits.memory_max_mb
        )
    except EstimationError as exc:
        raise ValidationError(
            f"an evaluation of its {largest:,} test or validation examples needs {needed:.0f} "
            f"MB, more than the platform allows an action ({limits.memory_max_mb} MB): a "
            "smaller test set, or validation_fraction, fits",
            field="dataset",
        ) from exc


def over_budget(spec: JobSpec, plan: JobPlan) -> str | None:
    """What a job whose ``max_cost_usd`` is below its plan's expected cost (its actions', or
    its training actions' where the others are not on record) is told; or below it with its
    containers' cold starts."""
    budget = spec.max_cost_usd
    expected, what = plan.expected_cost_usd, "its actions"
    if expected is None:
        expected, what = plan.train_cost_usd, "its training actions"
    if budget is None or expected is None:
        return None
    if expected > budget:
        return (
            f"its max_cost_usd ({budget:.6f}) is below what {what} cost by past runs "
            f"({expected:.6f}): it will stop before its last round"
        )
    cold = plan.expected_cost_cold_usd
    if cold is None or cold <= budget:
        return None
    return (
        f"its max_cost_usd ({budget:.6f}) is below what its actions cost by past runs with each "
        f"of its containers starting cold once ({plan.cold_starts_said()}: {cold:.6f}; "
        f"{expected:.6f} on warm ones): it may stop before its last round"
    )


def _train_cost_usd(spec: JobSpec, train: ActionPlan, price_per_gb_s: float) -> float | None:
    """Its training actions' cost by the medians of past runs: each round's fixed part and each
    epoch, on every container, at the plan's memory."""
    if train.median_overhead_ms is None or train.median_epoch_ms is None:
        return None
    ms = spec.rounds * train.median_overhead_ms + spec.epochs * train.median_epoch_ms
    return train.containers * train.memory_mb / 1024 * ms / 1000 * price_per_gb_s


def plan_job(sizer: Sizer, spec: JobSpec, data: DataFacts, *, max_fan_in: int) -> JobPlan:
    """Size the job on ``sizer``'s platform (measuring the model's profile the first time),
    its shards holding the training examples its validation set leaves."""
    data = held_out(spec, data)
    train = sizer.plan(spec.sizing(), data)
    profile = sizer.profile(spec, data.input_shape, data.classes)
    return make_plan(
        spec,
        data,
        train,
        params=profile.params,
        limits=sizer.platform.limits(),
        step_mb=sizer.settings.estimator.memory_step_mb,
        max_fan_in=max_fan_in,
        price_per_gb_s=sizer.settings.price_per_gb_s,
    )


def held_out(spec: JobSpec, data: DataFacts) -> DataFacts:
    """``data``'s facts as the job's shards see them: its training examples less those its
    ``validation_fraction`` holds out (``ValidationError`` where it holds out none)."""
    held = spec.validation_examples(data.examples)
    return dataclasses.replace(data, examples=data.examples - held, validation_examples=held)
