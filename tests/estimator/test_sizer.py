"""What the sizer knows of a request's data set before anything is generated or staged."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from faasdl.config import ApiSettings
from faasdl.controller.datasets import store_upload, tenant_dir
from faasdl.errors import ValidationError
from faasdl.estimator.planner import DataFacts, EstimateRequest
from faasdl.estimator.sizer import checked_facts, facts_of, load_checked
from faasdl.training.datasets import DigitsSpec, NpzSpec, SyntheticSpec, load_dataset


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


def save_random_npz(path: Path, features: int) -> Path:
    """A 16 MB .npz of 4,000 examples (at 1,000 features) whose content no test saw before."""
    x = np.random.default_rng().random((4000, features), dtype=np.float32)
    y = np.arange(4000) % 10
    np.savez(path, x_train=x, y_train=y, x_test=x[:100], y_test=y[:100])
    return path


def facts_and_peak(request: EstimateRequest) -> tuple[DataFacts, int]:
    """The request's data facts, and the most memory Python allocated finding them."""
    tracemalloc.start()
    try:
        return checked_facts(request), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_users_file_is_loaded_once_for_its_content_and_again_once_it_changes(
    tmp_path: Path,
) -> None:
    # Arrange: a request naming a user's file.
    data = save_random_npz(tmp_path / "set.npz", 1000)
    request = EstimateRequest(model="mlp", dataset=NpzSpec(path=str(data)))
    loaded = facts_of(load_dataset(request.dataset))  # not kept for later requests

    # Execute: the facts of the file, of the same file again, and of it once replaced by one of
    # another shape.
    first, loading = facts_and_peak(request)
    again, hashing = facts_and_peak(request)
    save_random_npz(data, 500)
    changed, reloading = facts_and_peak(request)

    # Assert: the second request only hashed the file (the facts of its content were known);
    # the replaced file was loaded again and its facts are its own.
    assert again == first == loaded
    assert first.input_shape == (1000,)
    assert loading > data.stat().st_size
    assert hashing < 1 << 20
    assert changed.input_shape == (500,)
    assert changed.sha256 != first.sha256
    assert reloading > data.stat().st_size


def test_an_uploads_facts_are_known_to_the_first_job_that_names_it(tmp_path: Path) -> None:
    # Arrange: an upload of a file, sent in 1 MiB pieces as the API receives them.
    body = save_random_npz(tmp_path / "set.npz", 1000).read_bytes()
    api = ApiSettings(upload_dir=tmp_path / "uploads")

    async def pieces() -> AsyncIterator[bytes]:
        step = 1 << 20
        for start in range(0, len(body), step):
            yield body[start : start + step]

    # Execute
    uploaded = asyncio.run(store_upload(api, "alice", "mine", pieces()))
    spec = NpzSpec(path=str(tenant_dir(api, "alice") / uploaded.path))
    facts, peak = facts_and_peak(EstimateRequest(model="mlp", dataset=spec))

    # Assert: checking the upload kept its facts: the job's request only hashed the file.
    assert facts.sha256 == uploaded.sha256
    assert facts.input_shape == (1000,)
    assert peak < 1 << 20
