from typing import Any

import pytest

from faasdl.estimator.timeout import estimate_timeout, time_class_ms

LIMITS: dict[str, Any] = {"min_ms": 100, "max_ms": 300_000}
NO_HISTORY: dict[str, Any] = {"overhead_ms": [], "epoch_ms": [], "epochs": 3, "init_ms": 0}


def test_history_comes_first_and_covers_a_cold_start_and_every_epoch() -> None:
    timeout = estimate_timeout(
        overhead_ms=[400, 500],
        epoch_ms=[1000, 1200],
        epochs=3,
        init_ms=3000,
        expected_cost=1.0,
        containers=2,
        memory_mb=1024,
        price_per_gb_s=0.000017,
        **LIMITS,
    )

    # (3000 + 500 + 3 × 1200) × 1.3 = 9230 ms, rounded up to the 10 s class.
    assert (timeout.ms, timeout.source) == (10_000, "history")


@pytest.mark.parametrize("slowest_epoch_ms", [12_000, 13_000, 14_000, 15_000])
def test_a_history_that_drifts_a_little_keeps_its_time_class(slowest_epoch_ms: int) -> None:
    # One variant, one set of warm containers: 15.6 s to 19.5 s all land in the 20 s class.
    timeout = estimate_timeout(
        overhead_ms=[0], epoch_ms=[slowest_epoch_ms], epochs=1, init_ms=0, expected_cost=None,
        containers=1, memory_mb=512, price_per_gb_s=1e-5, **LIMITS,
    )  # fmt: skip

    assert timeout.ms == 20_000


@pytest.mark.parametrize(
    ("ms", "expected"),
    [(1, 1000), (1000, 1000), (1001, 1200), (9940, 10_000), (10_001, 12_000), (81_000, 100_000)],
)
def test_time_classes_round_up_at_most_a_third(ms: int, expected: int) -> None:
    assert time_class_ms(ms) == expected
    assert expected < max(1000, ms) * 4 / 3 + 1


def test_a_timeout_a_run_failed_under_is_exceeded() -> None:
    timeout = estimate_timeout(
        overhead_ms=[100], epoch_ms=[100], epochs=1, init_ms=0, least_ms=20_001,
        expected_cost=None, containers=2, memory_mb=512, price_per_gb_s=1e-5, **LIMITS,
    )  # fmt: skip

    assert timeout.ms > 20_000


def test_without_history_the_expected_cost_gives_e_time() -> None:
    # e_time = (e_cost / c_d) / (μ · mₑ) = (0.0017 / 2) / (0.000017 · 0.5 GB) = 100 s
    timeout = estimate_timeout(
        expected_cost=0.0017, containers=2, memory_mb=512, price_per_gb_s=0.000017,
        **NO_HISTORY, **LIMITS,
    )  # fmt: skip

    assert (timeout.ms, timeout.source) == (100_000, "expected_cost")


@pytest.mark.parametrize(("cost", "expected"), [(1.0, 300_000), (1e-9, 1000)])
def test_the_expected_cost_is_clamped_to_the_platforms_limits(cost: float, expected: int) -> None:
    timeout = estimate_timeout(
        expected_cost=cost, containers=2, memory_mb=512, price_per_gb_s=0.000017,
        **NO_HISTORY, **LIMITS,
    )  # fmt: skip

    assert timeout.ms == expected


def test_with_neither_the_platform_maximum_is_used() -> None:
    timeout = estimate_timeout(
        expected_cost=None, containers=2, memory_mb=512, price_per_gb_s=0.000017,
        **NO_HISTORY, **LIMITS,
    )  # fmt: skip

    assert (timeout.ms, timeout.source) == (300_000, "platform_max")


@pytest.mark.parametrize(("cost", "price"), [(1e308, 0.000017), (1.0, 0.0)])
def test_a_lavish_cost_or_a_free_platform_gets_the_platform_maximum(
    cost: float, price: float
) -> None:
    estimate = estimate_timeout(
        overhead_ms=[],
        epoch_ms=[],
        epochs=1,
        init_ms=0,
        expected_cost=cost,
        containers=1,
        memory_mb=1024,
        price_per_gb_s=price,
        min_ms=100,
        max_ms=300_000,
    )

    assert estimate.ms == 300_000


@pytest.mark.parametrize(
    ("previous_ms", "expected"),
    [(25_000, 25_000), (20_000, 20_000), (15_000, 20_000), (40_000, 20_000), (0, 20_000)],
)
def test_the_latest_runs_limit_is_kept_while_it_is_enough_and_not_twice_too_much(
    previous_ms: int, expected: int
) -> None:
    # 12 s × 1.3 = 15.6 s: the 20 s class, unless the limit the latest run had still fits.
    timeout = estimate_timeout(
        overhead_ms=[0], epoch_ms=[12_000], epochs=1, init_ms=0, previous_ms=previous_ms,
        expected_cost=None, containers=1, memory_mb=512, price_per_gb_s=1e-5, **LIMITS,
    )  # fmt: skip

    assert timeout.ms == expected
