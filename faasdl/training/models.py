"""The model zoo: two small models and four Keras applications, all from random weights.

``check_model`` is pure (no TensorFlow) so that the controller validates a job without it;
``build_model``, ``profile_model`` and ``load_model`` import Keras when called.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from faasdl.errors import ValidationError
from faasdl.training.datasets import dims
from faasdl.training.tensors import decode

if TYPE_CHECKING:
    import keras


@dataclass(frozen=True)
class ModelInfo:
    """What a model needs of its input: images of at least ``min_side`` pixels, or anything."""

    description: str
    images: bool
    min_side: int = 1


MODELS: dict[str, ModelInfo] = {
    "mlp": ModelInfo("two hidden dense layers (128, 64)", images=False),
    "small_cnn": ModelInfo("two 3×3 convolutions with pooling, one dense layer", True, 4),
    "mobilenet_v2": ModelInfo("Keras MobileNetV2", images=True, min_side=32),
    "resnet50": ModelInfo("Keras ResNet50", images=True, min_side=32),
    "vgg16": ModelInfo("Keras VGG16", images=True, min_side=32),
    "inception_v3": ModelInfo("Keras InceptionV3", images=True, min_side=75),
}


@dataclass(frozen=True)
class ModelProfile:
    """The sizes the memory estimator needs, measured once per (model, input shape, classes)."""

    params: int
    trainable_params: int
    activations_per_example: int
    layers: int


def check_model(name: str, input_shape: tuple[int, ...], classes: int) -> ModelInfo:
    """The model's requirements, or ``ValidationError`` naming the field that does not fit."""
    info = MODELS.get(name)
    if info is None:
        raise ValidationError(
            f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}", field="model"
        )
    if classes < 2:
        raise ValidationError(
            f"a classifier needs at least 2 classes, got {classes}", field="dataset"
        )
    if info.images:
        if len(input_shape) != 3:
            raise ValidationError(
                f"{name} needs images (H, W, C); the dataset's examples are {list(input_shape)}"
                f" ({', '.join(n for n, m in MODELS.items() if not m.images)} takes any shape)",
                field="dataset",
            )
        if min(input_shape[:2]) < info.min_side:
            raise ValidationError(
                f"{name} needs images of at least {info.min_side}×{info.min_side}; "
                f"the dataset's are {input_shape[0]}×{input_shape[1]}",
                field="dataset",
            )
    return info


def build_model(name: str, input_shape: tuple[int, ...], classes: int, *, seed: int) -> keras.Model:
    """A freshly initialised model (weights drawn from ``seed``) that outputs logits."""
    check_model(name, input_shape, classes)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    try:
        return _BUILDERS[name](input_shape, classes)
    except tf.errors.ResourceExhaustedError as exc:
        # TensorFlow's allocator refused a weight outright (64 × 10⁹ floats for a billion
        # classes), before the action's memory limit could: its message is a graph node's name.
        found = re.search(r"tensor with shape\[([\d,]+)\]", str(exc))
        tensor = f" (a tensor of {found[1].replace(',', '×')} values)" if found else ""
        raise ValidationError(
            f"{name} for {dims(input_shape)} inputs and {classes:,} classes cannot be "
            f"allocated{tensor}: use a smaller model, fewer classes or smaller inputs",
            field="model",
        ) from exc


#: The safetensors metadata key of a trained model's architecture: its name, input shape and
#: classes as JSON. Trainers write it with their weights, aggregators keep it.
ARCHITECTURE = "faasdl.architecture"


def architecture(name: str, input_shape: tuple[int, ...], classes: int) -> dict[str, str]:
    """The metadata that lets :func:`load_model` build a model's weights' architecture."""
    shape = list(input_shape)
    return {ARCHITECTURE: json.dumps({"model": name, "input_shape": shape, "classes": classes})}


def load_model(path: str | os.PathLike[str]) -> keras.Model:
    """A job's trained model from the file ``faasdl model`` wrote: its architecture with the
    trained weights, outputting logits, for inputs prepared as the job's were (``uint8`` images
    scaled to [0, 1], booleans as 0 and 1, grey images with a channel axis). Raises
    ``ValidationError`` naming ``model`` when the file is not one. The file is mapped, not read
    into memory."""
    with open(path, "rb") as file:
        try:
            data = memoryview(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ))
        except ValueError as exc:  # an empty file
            raise ValidationError(f"{os.fspath(path)} is empty", field="model") from exc
    groups, metadata = decode(data, what="model")
    try:
        found = json.loads(metadata[ARCHITECTURE])
        name, input_shape, classes = found["model"], tuple(found["input_shape"]), found["classes"]
    except (KeyError, ValueError, TypeError) as exc:
        raise ValidationError(
            f"{os.fspath(path)} names no architecture: not a model a faasdl job trained",
            field="model",
        ) from exc
    model = build_model(name, input_shape, classes, seed=0)
    try:
        model.set_weights(groups.get("w", []))
    except ValueError as exc:
        raise ValidationError(
            f"{os.fspath(path)}: its weights do not fit {name} ({exc})", field="model"
        ) from exc
    return model


def profile_model(model: keras.Model) -> ModelProfile:
    """Parameter count and the activation elements one example produces in a forward pass."""
    activations = 0
    for layer in model.layers:
        for output in _flat(layer.output):
            activations += _elements(tuple(output.shape[1:]))
    trainable = sum(_elements(tuple(w.shape)) for w in model.trainable_weights)
    return ModelProfile(
        params=sum(_elements(tuple(w.shape)) for w in model.weights),
        trainable_params=trainable,
        activations_per_example=activations,
        layers=len(model.layers),
    )


def _flat(output: object) -> list[keras.KerasTensor]:
    return list(output) if isinstance(output, list | tuple) else [output]


def _elements(shape: tuple[int | None, ...]) -> int:
    return math.prod(int(dim or 1) for dim in shape)


def _mlp(input_shape: tuple[int, ...], classes: int) -> keras.Model:
    import keras

    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(classes),
        ],
        name="mlp",
    )


def _small_cnn(input_shape: tuple[int, ...], classes: int) -> keras.Model:
    import keras

    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(classes),
        ],
        name="small_cnn",
    )


def _application(name: str) -> Callable[[tuple[int, ...], int], keras.Model]:
    def build(input_shape: tuple[int, ...], classes: int) -> keras.Model:
        import keras

        constructor = {
            "mobilenet_v2": keras.applications.MobileNetV2,
            "resnet50": keras.applications.ResNet50,
            "vgg16": keras.applications.VGG16,
            "inception_v3": keras.applications.InceptionV3,
        }[name]
        model: keras.Model = constructor(
            weights=None, input_shape=input_shape, classes=classes, classifier_activation=None
        )
        return model

    return build


_BUILDERS: dict[str, Callable[[tuple[int, ...], int], keras.Model]] = {
    "mlp": _mlp,
    "small_cnn": _small_cnn,
    **{name: _application(name) for name in ("mobilenet_v2", "resnet50", "vgg16", "inception_v3")},
}
