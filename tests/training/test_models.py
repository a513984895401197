from pathlib import Path

import numpy as np
import pytest

from faasdl.errors import ValidationError
from faasdl.training.models import MODELS, architecture, build_model, check_model, load_model
from faasdl.training.tensors import pack


def test_the_zoo_has_the_small_models_and_four_keras_applications() -> None:
    assert {"mlp", "small_cnn", "mobilenet_v2", "resnet50", "vgg16", "inception_v3"} <= set(MODELS)


@pytest.mark.parametrize(
    ("model", "shape", "classes", "field", "message"),
    [
        ("transformer", (8, 8, 1), 10, "model", "unknown model 'transformer'"),
        (
            "small_cnn",
            (64,),
            10,
            "dataset",
            r"needs images \(H, W, C\); the dataset's examples are \[64\] \(mlp takes any shape\)",
        ),
        ("mobilenet_v2", (8, 8, 1), 10, "dataset", "at least 32×32"),
        ("inception_v3", (64, 64, 3), 10, "dataset", "at least 75×75"),
        ("mlp", (8, 8, 1), 1, "dataset", "at least 2 classes"),
    ],
)
def test_a_model_that_does_not_fit_the_data_is_refused_naming_the_field(
    model: str, shape: tuple[int, ...], classes: int, field: str, message: str
) -> None:
    with pytest.raises(ValidationError, match=message) as caught:
        check_model(model, shape, classes)
    assert caught.value.field == field


def test_a_dense_model_takes_any_shape() -> None:
    assert not check_model("mlp", (3,), 2).images


@pytest.mark.tensorflow
def test_a_model_whose_weights_cannot_be_allocated_is_refused_naming_the_field() -> None:
    from faasdl.training.loop import configure_runtime

    configure_runtime()  # as every test process that runs TensorFlow does, before it runs
    # A last layer of 64 × 2³¹ floats: TensorFlow's allocator refuses its 550 GB outright.
    with pytest.raises(ValidationError, match=r"a tensor of 64×2147483647 values\): use") as caught:
        build_model("mlp", (8, 8, 1), 2**31 - 1, seed=0)
    assert caught.value.field == "model"


def test_a_file_that_is_not_a_trained_model_is_refused_naming_the_field(tmp_path: Path) -> None:
    # Arrange: an empty file, weights that name no architecture, and weights that do not fit
    # the architecture they name
    empty = tmp_path / "empty.safetensors"
    empty.touch()
    unnamed = tmp_path / "unnamed.safetensors"
    unnamed.write_bytes(b"".join(pack([np.zeros((64, 128), np.float32)])))
    misfit = tmp_path / "misfit.safetensors"
    misfit.write_bytes(
        b"".join(pack([np.zeros((3, 3), np.float32)], metadata=architecture("mlp", (64,), 10)))
    )

    for path, said in ((empty, "is empty"), (unnamed, "names no architecture"), (misfit, "fit")):
        with pytest.raises(ValidationError) as raised:
            load_model(path)

        assert raised.value.field == "model"
        assert str(path) in str(raised.value)
        assert said in str(raised.value)
