"""What the sizer knows of a request's data set before anything is generated or staged."""

from __future__ import annotations

import pytest

from faasdl.errors import ValidationError
from faasdl.estimator.planner import EstimateRequest
from faasdl.estimator.sizer import checked_facts, facts_of, load_checked
from faasdl.training.datasets import DigitsSpec, SyntheticSpec


@pytest.mark.parametrize(
    ("model", "dataset"),
    [
        ("mlp", SyntheticSpec(shape=(16,), classes=3, train_size=50, test_size=7)),
        ("mlp", SyntheticSpec(shape=(8, 8), train_size=20, test_size=30)),
        ("small_cnn", SyntheticSpec(shape=(32, 32, 3), train_size=64, test_size=16)),
        ("mlp", DigitsSpec(test_fraction=0.3)),
    ],
)
def test_a_generated_data_sets_facts_are_those_of_the_data_it_generates(
    model: str, dataset: SyntheticSpec | DigitsSpec
) -> None:
    request = EstimateRequest(model=model, dataset=dataset)

    assert checked_facts(request) == facts_of(load_checked(request))


def test_facts_are_checked_against_the_model_as_the_loaded_data_is() -> None:
    request = EstimateRequest(model="resnet50", dataset=SyntheticSpec(shape=(16, 16, 3)))

    with pytest.raises(ValidationError) as from_spec:
        checked_facts(request)
    with pytest.raises(ValidationError) as from_data:
        load_checked(request)

    assert str(from_spec.value) == str(from_data.value)
    assert from_spec.value.field == from_data.value.field == "dataset"
