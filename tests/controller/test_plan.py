"""A job's plan around its training action's: what its evaluation is given, and what it costs."""

from __future__ import annotations

import pytest

from faasdl.controller.plan import make_plan
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


def planned(test_examples: int, validation_examples: int = 0) -> int | None:
    data = DataFacts(
        examples=4_000,
        example_bytes=EXAMPLE,
        input_shape=(32, 32, 3),
        classes=10,
        test_examples=test_examples,
        validation_examples=validation_examples,
    )
    plan = make_plan(
        SPEC,
        data,
        TRAIN,
        params=100_000,
        limits=LIMITS,
        step_mb=64,
        max_fan_in=8,
        price_per_gb_s=0.000017,
    )
    return plan.evaluate_memory_mb


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
