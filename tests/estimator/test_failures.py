from typing import Any

import pytest

from faasdl.errors import EstimationError
from faasdl.estimator.failures import Limits, correct
from faasdl.platform.classify import Failure, FailureKind

MAXIMA: dict[str, Any] = {"step_mb": 64, "max_memory_mb": 2048, "max_timeout_ms": 300_000}


def failure(kind: FailureKind) -> Failure:
    return Failure(kind=kind, message="")


def test_out_of_memory_raises_memory_by_half_to_a_class() -> None:
    fixed = correct(failure(FailureKind.OUT_OF_MEMORY), Limits(700, 60_000), **MAXIMA)

    assert fixed == Limits(memory_mb=1088, timeout_ms=60_000)


def test_out_of_memory_never_passes_the_platforms_maximum() -> None:
    assert (
        correct(failure(FailureKind.OUT_OF_MEMORY), Limits(1600, 1000), **MAXIMA).memory_mb == 2048
    )
    with pytest.raises(EstimationError, match="largest limit, 2048 MB"):
        correct(failure(FailureKind.OUT_OF_MEMORY), Limits(2048, 1000), **MAXIMA)


def test_out_of_time_doubles_the_timeout() -> None:
    fixed = correct(failure(FailureKind.OUT_OF_TIME), Limits(512, 60_000), **MAXIMA)

    assert fixed == Limits(memory_mb=512, timeout_ms=120_000)
    with pytest.raises(EstimationError, match="longest limit"):
        correct(failure(FailureKind.OUT_OF_TIME), Limits(512, 300_000), **MAXIMA)


def test_attempts_that_failed_under_one_limit_raise_it_once() -> None:
    # Four trainers out of time together under 6 s: the first failure's correction doubles the
    # job's limit, the other three find it raised already (each had doubled it again: 96 s).
    ran = Limits(704, 6_000)
    current = ran
    for _ in range(4):
        current = correct(failure(FailureKind.OUT_OF_TIME), ran, current=current, **MAXIMA)

    assert current == Limits(704, 12_000)
    # Memory raised by another failure meanwhile stays raised.
    raised = correct(failure(FailureKind.OUT_OF_TIME), ran, current=Limits(1088, 6_000), **MAXIMA)
    assert raised == Limits(1088, 12_000)


@pytest.mark.parametrize(
    "kind", [FailureKind.CRASH, FailureKind.APPLICATION_ERROR, FailureKind.PLATFORM_ERROR]
)
def test_other_failures_are_not_a_sizing_problem(kind: FailureKind) -> None:
    assert correct(failure(kind), Limits(512, 60_000), **MAXIMA) == Limits(512, 60_000)
