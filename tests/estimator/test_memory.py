import pytest

from faasdl.errors import EstimationError
from faasdl.estimator.memory import (
    MIB,
    Coefficients,
    estimate_memory,
    plan_containers,
    round_to_class,
)
from faasdl.training.models import ModelProfile

PROFILE = ModelProfile(
    params=1_000_000, trainable_params=1_000_000, activations_per_example=10_000, layers=10
)


def test_the_estimate_adds_up_its_parts_and_grows_with_each_input() -> None:
    def estimate(batch: int = 32, shard_mib: int = 10, baseline: float = 600) -> float:
        return estimate_memory(
            PROFILE, batch_size=batch, shard_bytes=shard_mib * MIB, baseline_mb=baseline
        ).mb

    base = estimate_memory(PROFILE, batch_size=32, shard_bytes=10 * MIB, baseline_mb=600)

    assert base.mb == pytest.approx(sum(base.parts.values()))
    assert base.parts["runtime"] == 600
    assert estimate(batch=64) > base.mb
    assert estimate(shard_mib=20) > base.mb
    assert estimate(baseline=700) > base.mb


def test_the_coefficients_are_applied_as_documented() -> None:
    k = Coefficients(params=2, activations=3, shard=4, layer_mb=0.5, margin=1.0)

    estimate = estimate_memory(
        PROFILE, batch_size=8, shard_bytes=MIB, baseline_mb=100, coefficients=k
    )

    assert estimate.parts["parameters"] == pytest.approx(2 * 4_000_000 / MIB)
    assert estimate.parts["activations"] == pytest.approx(3 * 10_000 * 8 * 4 / MIB)
    assert estimate.parts["shard"] == 4
    assert estimate.parts["graph"] == 5
    assert estimate.parts["margin"] == 0


@pytest.mark.parametrize(("mb", "expected"), [(1.0, 128), (128.0, 128), (128.5, 192), (700.0, 704)])
def test_memory_rounds_up_to_a_class(mb: float, expected: int) -> None:
    assert round_to_class(mb, step_mb=64, min_mb=128, max_mb=2048) == expected


def test_memory_over_the_platforms_maximum_is_an_estimation_error() -> None:
    with pytest.raises(EstimationError, match="at most 2048 MB"):
        round_to_class(2049, step_mb=64, min_mb=128, max_mb=2048)


def test_containers_start_at_two_and_grow_by_the_excess_over_the_limit() -> None:
    # 600 MB of runtime plus 3,000 MB of data shared by the containers.
    def memory_for(containers: int) -> float:
        return 600 + 3000 / containers

    containers, needed = plan_containers(memory_for, limit_mb=1024, examples=10_000)

    # c=2: 2100 MB → +⌈1076/1024⌉ = 4: 1350 MB → +1 = 5: 1200 → +1 = 6: 1100 → +1 = 7: 1028.6
    # → +1 = 8: 975 ≤ 1024.
    assert (containers, needed) == (8, 975)


def test_a_model_larger_than_the_limit_on_any_split_is_refused() -> None:
    with pytest.raises(EstimationError, match="even with one example per shard"):
        plan_containers(lambda c: 3000 + 10 / c, limit_mb=2048, examples=100)
