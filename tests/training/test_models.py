import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError as PydanticValidationError

from faasdl.controller.validator import JobSpec
from faasdl.errors import ValidationError
from faasdl.training.models import (
    ARCHITECTURE_MAX_BYTES,
    CUSTOM,
    MODELS,
    architecture,
    build_model,
    check_model,
    custom_name,
    load_model,
    model_called,
    remember_architecture,
)
from faasdl.training.tensors import pack
from tests.conftest import keras_architecture


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


def _with(architecture: dict[str, Any], at: int, **changes: Any) -> dict[str, Any]:
    """``architecture`` with its layer ``at`` changed."""
    changed = copy.deepcopy(architecture)
    changed["config"]["layers"][at].update(changes)
    return changed


def _bad_architectures() -> list[tuple[str, dict[str, Any], str]]:
    good = keras_architecture()
    lambda_layer = _with(good, 1, class_name="Lambda", config={"function": "x"})
    two_inputs = copy.deepcopy(good)
    two_inputs["config"]["layers"].insert(1, good["config"]["layers"][0])
    huge = copy.deepcopy(good)
    huge["config"]["name"] = "x" * ARCHITECTURE_MAX_BYTES
    deep: dict[str, Any] = {}
    for _ in range(3000):  # past Python's recursion limit, as a JSON encoder walks it
        deep = {"a": deep}
    nested = copy.deepcopy(good)
    nested["config"]["name"] = deep
    return [
        ("a layer", good["config"]["layers"][2], "its class_name 'Dense' is none of"),
        ("a listed name", {**good, "class_name": ["Sequential"]}, "class_name ['Sequential'] is"),
        ("no config", {"class_name": "Sequential"}, "or it has no config"),
        ("a Lambda", lambda_layer, "holds a Lambda layer, which runs code of its own"),
        ("another module", _with(good, 1, module="os"), "Flatten: its module 'os' is not Keras's"),
        ("a long module", _with(good, 1, module="x" * 100), f"module '{'x' * 58}… is not"),
        ("a custom object", _with(good, 2, registered_name="mine>Dense"), "custom object"),
        ("two inputs", two_inputs, "has 2 input layers (InputLayer)"),
        ("no input", _with(good, 0, class_name="Flatten"), "has 0 input layers"),
        ("an open size", _with(good, 0, config={"batch_shape": [None, None, 8, 1]}), "each dim"),
        ("no batch", _with(good, 0, config={"batch_shape": [8]}), "batch_shape is [8]"),
        ("too large", huge, f"at most {ARCHITECTURE_MAX_BYTES:,}"),
        ("not JSON's", _with(good, 2, config={"units": math.nan}), "is not JSON's"),
        ("nested too deep", nested, "is nested too deep to write"),
    ]


@pytest.mark.parametrize(
    ("architecture", "said"),
    [pytest.param(a, said, id=case) for case, a, said in _bad_architectures()],
)
def test_an_architecture_keras_should_not_build_is_refused_before_keras_sees_it(
    architecture: dict[str, Any], said: str
) -> None:
    # Execute: as a job's spec is validated, and as the model is checked against its data
    with pytest.raises(PydanticValidationError) as raised:
        JobSpec.model_validate({"model": "custom", "architecture": architecture})
    with pytest.raises(ValidationError, match=re.escape(said)) as checked:
        check_model(CUSTOM, (8, 8, 1), 10, architecture)

    # Assert: both name the field and say why
    refused = ValidationError.from_pydantic(raised.value, model=JobSpec)
    assert refused.field == checked.value.field == "architecture"
    assert said in str(refused)


def test_an_architecture_goes_with_model_custom_only_and_must_take_the_data_sets_examples() -> None:
    # Arrange
    good = keras_architecture()

    # Execute
    refused = {}
    for case, fields in {
        "none": {"model": "custom"},
        "a zoo model's": {"model": "mlp", "architecture": good},
    }.items():
        with pytest.raises(PydanticValidationError) as raised:
            JobSpec.model_validate(fields)
        refused[case] = ValidationError.from_pydantic(raised.value, model=JobSpec)
    spec = JobSpec.model_validate({"model": "custom", "architecture": good})
    with pytest.raises(ValidationError) as misfit:
        check_model(CUSTOM, (64,), 10, good)

    # Assert: the job goes by its architecture's digest, whatever the order of its keys
    assert str(refused["none"]).startswith("architecture: model 'custom' needs one")
    assert str(refused["a zoo model's"]) == (
        "architecture: is for model 'custom', a job's own; 'mlp' is the zoo's"
    )
    reordered = dict(reversed(list(good.items())))
    assert spec.model_name == custom_name(reordered) == spec.model_args()["model"]
    assert re.fullmatch(r"custom-[0-9a-f]{16}", spec.model_name)
    assert spec.model_args()["architecture"] == good
    assert custom_name(keras_architecture(classes=9)) != spec.model_name
    assert str(misfit.value) == ("architecture: its input is 8×8×1; the data set's examples are 64")
    assert check_model(CUSTOM, (8, 8, 1), 10, good).images


def test_an_architecture_that_is_not_the_one_its_name_names_is_refused() -> None:
    with pytest.raises(ValidationError, match="is not the one 'custom-0000000000000000' names"):
        remember_architecture("custom-0000000000000000", keras_architecture())


def test_a_model_is_called_by_its_zoo_name_or_by_the_name_its_own_keras_config_gives_it() -> None:
    # Arrange: configs that name their model in words, in a list, at length, or not at all
    good = keras_architecture()
    listed, long, unnamed = (copy.deepcopy(good) for _ in range(3))
    listed["config"]["name"] = ["tiny"]
    long["config"]["name"] = "x" * 100
    del unnamed["config"]["name"]

    # Execute
    called = [
        model_called(model, given)
        for model, given in [
            ("mlp", None),
            ("mlp", good),
            (CUSTOM, good),
            (CUSTOM, listed),
            (CUSTOM, long),
            (CUSTOM, unnamed),
            (CUSTOM, {"config": "tiny"}),
        ]
    ]

    # Assert
    clipped = f"custom: {'x' * 59}…"
    assert called == ["mlp", "mlp", "custom: tiny", "custom", clipped, "custom", "custom"]


@pytest.mark.tensorflow
def test_an_architecture_builds_from_its_seed_and_loads_back_from_a_models_file(
    tmp_path: Path,
) -> None:
    # Arrange
    from faasdl.training.loop import configure_runtime

    configure_runtime()  # as every test process that runs TensorFlow does, before it runs
    good, three = keras_architecture(), keras_architecture(classes=3)
    unknown = _with(good, 1, class_name="Flattened")
    negative = copy.deepcopy(good)
    negative["config"]["layers"][2]["config"]["units"] = -1
    for given in (good, three, unknown, negative):
        remember_architecture(custom_name(given), given)
    name = custom_name(good)

    # Execute
    first, again, other = (build_model(name, (8, 8, 1), 10, seed=s) for s in (1, 1, 2))
    refused = {}
    for case, given in {"outputs": three, "keras": unknown, "layer": negative}.items():
        with pytest.raises(ValidationError) as raised:
            build_model(custom_name(given), (8, 8, 1), 10, seed=0)
        refused[case] = raised.value
    path = tmp_path / "model.safetensors"
    weights = [w + 1 for w in first.get_weights()]
    path.write_bytes(b"".join(pack(weights, metadata=architecture(name, (8, 8, 1), 10))))
    _forget(name)
    loaded = load_model(path)

    # Assert: the same seed, the same weights; what Keras refuses or builds wrong is refused
    # naming the field; the file holds its architecture, so that it loads where no job ran
    drawn = first.get_weights()
    assert [w.shape for w in drawn] == [(64, 16), (16,), (16, 10), (10,)]
    assert all(np.array_equal(a, b) for a, b in zip(drawn, again.get_weights(), strict=True))
    assert not np.array_equal(drawn[0], other.get_weights()[0])
    assert {e.field for e in refused.values()} == {"architecture"}
    assert str(refused["outputs"]) == (
        "architecture: its output is [null, 3]; the data set's 10 classes need one of [null, 10]"
        " (a logit a class, no softmax)"
    )
    assert str(refused["keras"]).startswith("architecture: Keras cannot build it: ")
    assert "Flattened" in str(refused["keras"])
    # The layer's own words, not Keras's wrapping of them with the whole config
    assert str(refused["layer"]) == (
        "architecture: Keras cannot build it: Received an invalid value for `units`, expected a "
        "positive integer. Received: units=-1"
    )
    assert all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), weights, strict=True))


def _forget(name: str) -> None:
    """This process no longer knows the architecture ``name`` names (as a fresh one would)."""
    from faasdl.training import models

    del models._ARCHITECTURES[name]


@pytest.mark.tensorflow
@pytest.mark.parametrize("zoo", ["mobilenet_v2", None], ids=["MobileNetV2", "a residual block"])
def test_the_config_keras_writes_of_a_functional_model_builds_it_again(zoo: str | None) -> None:
    # Arrange: a model built with Keras's API, and its config as model.to_json() writes it (the
    # zoo's MobileNetV2's: 157 KiB; or a block whose input is added back to its output)
    import keras

    from faasdl.training.loop import configure_runtime

    configure_runtime()  # as every test process that runs TensorFlow does, before it runs
    shape = (32, 32, 3)
    if zoo is not None:
        made = build_model(zoo, shape, 10, seed=0)
    else:
        pixels = keras.Input(shape)
        conv = keras.layers.Conv2D(3, 3, padding="same", activation="relu")(pixels)
        added = keras.layers.Add()([pixels, conv])
        pooled = keras.layers.GlobalAveragePooling2D()(added)
        made = keras.Model(pixels, keras.layers.Dense(10)(pooled))
        made.compile(optimizer="rmsprop", loss="mse")  # its config then has its compile_config
    own = json.loads(made.to_json())
    name = custom_name(own)

    # Execute
    remember_architecture(name, own)
    built = build_model(name, shape, 10, seed=0)

    # Assert: left as it was given (Keras took fields out of the one it built: the name would
    # no longer be its digest), checked as the controller checks it, and the same layers and
    # weights' shapes; not compiled as its config said (the job's optimizer and loss train it)
    assert custom_name(own) == name
    assert bool(own.get("compile_config")) is (zoo is None)
    assert not built.compiled
    assert check_model(CUSTOM, shape, 10, own).images
    assert own["class_name"] == "Functional"
    assert [type(layer).__name__ for layer in built.layers] == [
        type(layer).__name__ for layer in made.layers
    ]
    assert [w.shape for w in built.get_weights()] == [w.shape for w in made.get_weights()]
