"""A job's fields as the validator reads them: what they work out to, round by round."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError as PydanticValidationError

from faasdl.controller.validator import JobSpec
from faasdl.errors import ValidationError

JOB = {"model": "mlp", "dataset": {"name": "digits"}, "epochs": 5, "workers": 4}


def test_a_learning_rate_schedule_gives_each_round_its_factor() -> None:
    cosine = JobSpec.model_validate({**JOB, "lr_schedule": "cosine", "lr_min_fraction": 0.1})
    exponential = JobSpec.model_validate({**JOB, "lr_schedule": "exponential"})
    one_shot = JobSpec.model_validate({**JOB, "lr_schedule": "cosine", "sync_every": 0})

    # Keras' CosineDecay over the rounds: 1 at the first, the floor at the last.
    factors = [cosine.round_factor(r) for r in range(5)]
    assert factors == pytest.approx(
        [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * r / 4)) for r in range(5)]
    )
    assert (factors[0], factors[-1]) == pytest.approx((1.0, 0.1))
    assert [exponential.round_factor(r) for r in range(3)] == pytest.approx([1, 0.9, 0.81])
    assert one_shot.round_factor(0) == 1.0  # a single round trains at the rate given
    # The workers' √4 and the round's factor, together.
    assert cosine.worker_learning_rate(4, 4) == pytest.approx(1e-3 * 2 * 0.1)
    assert JobSpec.model_validate(JOB).worker_learning_rate(4, 3) == pytest.approx(2e-3)


def test_a_validation_fraction_holds_its_share_of_the_training_examples_out() -> None:
    half = JobSpec.model_validate({**JOB, "validation_fraction": 0.5})
    tenth = JobSpec.model_validate({**JOB, "validation_fraction": 0.1})
    none = JobSpec.model_validate(JOB)

    assert [half.validation_examples(n) for n in (2, 3, 1437)] == [1, 2, 718]
    assert tenth.validation_examples(1437) == 144
    assert none.validation_examples(1437) == 0
    # One that rounds to no example is refused, naming the field and what would hold one out.
    with pytest.raises(ValidationError) as refused:
        tenth.validation_examples(4)
    assert str(refused.value) == (
        "validation_fraction: 0.1 of the 4 training examples holds none out: 0.25 holds one, 0 none"
    )
    assert refused.value.field == "validation_fraction"
    # Of one example, holding it out would leave none to train on (0.5 rounds to none).
    with pytest.raises(ValidationError) as alone:
        half.validation_examples(1)
    assert str(alone.value) == (
        "validation_fraction: 0.5 of the 1 training example holds none out, and one would leave "
        "none to train on: 0 holds none out"
    )
    # More than half is refused by the schema: the shards would train on less than they choose by.
    with pytest.raises(PydanticValidationError, match=r"less than or equal to 0\.5"):
        JobSpec.model_validate({**JOB, "validation_fraction": 0.6})
