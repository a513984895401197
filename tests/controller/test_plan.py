"""A job's plan around its training action's: what its evaluation is given, and what it costs."""

from __future__ import annotations

import pytest

from faasdl.controller.plan import JobPlan, make_plan
from faasdl.controller.validator import JobSpec
from faasdl.errors import ValidationError
from faasdl.estimator.memory import DEFAULT, MIB
from faasdl.estimator.planner import ActionPlan, DataFacts
from faasdl.platform.base import PlatformLimits

LIMITS = PlatformLimits(
    memory_min_mb=128, memory_max_mb=2048, memory_std_mb=256,
    timeout_min_ms=100, timeout_max_ms=300_000, timeout_std_ms=60_000,
)  # fmt: skip
SPEC = JobSpec.model_validate({"model": "mlp", "epochs": 2, "workers": 4})
PRICE = 0.000017
EXAMPLE = 3 * 32 * 32 * 4 + 4  # a 32×32×3 float32 image and its label
TRAIN = ActionPlan(
    containers=4,
    shard_examples=1_000,
    signature="mlp/32x32x3/c10/b32/n1000",
    memory_mb=768,
    memory_estimate_mb=700.0,
    memory_parts={"measured_peak": 648.1},
    memory_source="history",
    timeout_ms=60_000,
    timeout_source="history",
)


def plan_of(
    test_examples: int, validation_examples: int = 0, *, train: ActionPlan = TRAIN, fan_in: int = 8
) -> JobPlan:
    data = DataFacts(
        examples=4_000,
        example_bytes=EXAMPLE,
        input_shape=(32, 32, 3),
        classes=10,
        test_examples=test_examples,
        validation_examples=validation_examples,
    )
    return make_plan(
        SPEC,
        data,
        train,
        params=100_000,
        limits=LIMITS,
        step_mb=64,
        max_fan_in=fan_in,
        price_per_gb_s=PRICE,
    )


def planned(test_examples: int, validation_examples: int = 0) -> int | None:
    return plan_of(test_examples, validation_examples).evaluate_memory_mb


def test_an_evaluation_runs_on_the_trainers_memory_unless_its_largest_set_needs_more() -> None:
    # A set the size of a shard, or a little more that the trainers' class still holds: theirs.
    assert planned(1_000) is None
    assert planned(1_500, validation_examples=500) is None
    # 20,000 test examples, 19,000 more than a shard: that much more of the shard's part.
    more = 19_000 * EXAMPLE / MIB * DEFAULT.shard * DEFAULT.margin
    assert planned(20_000) == 64 * -(-(700.0 + more) // 64)
    # The validation set when it is the larger one.
    assert planned(1_000, validation_examples=20_000) == planned(20_000)
    # One no class holds is refused, naming what to change.
    with pytest.raises(ValidationError, match=r"its 80,000 test or validation examples needs"):
        planned(80_000)


def test_the_cost_with_cold_starts_counts_each_container_once() -> None:
    # Arrange: a signature with every median on record (a trainer's start 3 s and its build 1.2
    # s, an aggregator's start 0.4 s), in a tree of two aggregators then one.
    timed = TRAIN.model_copy(
        update={
            "median_overhead_ms": 500,
            "median_epoch_ms": 200,
            "median_aggregate_ms": 50,
            "median_evaluate_ms": 300,
            "median_cold_start_ms": 3_000,
            "median_build_ms": 1_200,
            "median_aggregate_cold_start_ms": 400,
        }
    )

    # Execute
    shared = plan_of(1_000, train=timed, fan_in=2)
    own = plan_of(20_000, train=timed, fan_in=2)
    unknown = plan_of(
        1_000, train=timed.model_copy(update={"median_aggregate_cold_start_ms": None}), fan_in=2
    )

    # Assert: four trainers' starts and builds, and the widest level's two aggregators' starts;
    # the evaluation's where it has a class of its own; an aggregator's start not on record
    # counts nothing.
    assert shared.tree == [[[0, 1], [2, 3]], [[0, 1]]]
    trainers = 4 * 768 * (3_000 + 1_200)
    aggregators = 2 * shared.aggregate_memory_mb * 400
    assert shared.expected_cost_usd is not None
    assert shared.expected_cost_cold_usd == pytest.approx(
        shared.expected_cost_usd + (trainers + aggregators) / 1024 / 1000 * PRICE
    )
    assert shared.cold_starts_said() == "4 trainer(s), 2 aggregator(s)"
    assert own.evaluate_memory_mb is not None
    assert own.expected_cost_usd is not None
    evaluation = own.evaluate_memory_mb * 3_000
    assert own.expected_cost_cold_usd == pytest.approx(
        own.expected_cost_usd + (trainers + aggregators + evaluation) / 1024 / 1000 * PRICE
    )
    assert own.cold_starts_said() == "4 trainer(s), 2 aggregator(s), its evaluation's"
    assert unknown.expected_cost_cold_usd == pytest.approx(
        shared.expected_cost_usd + trainers / 1024 / 1000 * PRICE
    )
