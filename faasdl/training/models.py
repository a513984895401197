"""The model zoo: two small models and four Keras applications, all from random weights; and a
job's own architecture (``model: custom``): a Keras model's config, as ``model.to_json()`` writes
it, built in Keras's safe mode.

``check_model`` and ``architecture_input`` are pure (no TensorFlow) so that the controller
validates a job without it; ``build_model``, ``profile_model`` and ``load_model`` import Keras
when called.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import mmap
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


#: The ``model`` of a job that brings its own architecture (its ``architecture``).
CUSTOM = "custom"
#: What the name of a job's own architecture starts with where actions, plans and the history
#: name a model: ``custom-`` and 16 hex digits of its canonical JSON's SHA-256
#: (:func:`custom_name`), so that the same architecture's runs teach the estimator together.
CUSTOM_PREFIX = "custom-"
#: The most an architecture's JSON may take: it travels in the arguments of its job's actions,
#: which OpenWhisk holds to 1 MiB (``whisk.activation.payload.max``); ResNet50's takes 165 KiB.
ARCHITECTURE_MAX_BYTES = 512 * 1024
#: The model classes an architecture's top may name.
MODEL_CLASSES = frozenset({"Sequential", "Functional", "Model"})
#: Layers that run code or read files of their own, which no architecture may hold (Keras's safe
#: mode refuses some of them too, as it builds).
CODE_LAYERS = frozenset(
    {"Lambda", "__lambda__", "TorchModuleWrapper", "TFSMLayer", "JaxLayer", "FlaxLayer"}
)
#: Architectures an action process has been given, by name (:func:`remember_architecture`).
_ARCHITECTURES: OrderedDict[str, Mapping[str, Any]] = OrderedDict()
ARCHITECTURES_KEPT = 16


@dataclass(frozen=True)
class ModelProfile:
    """The sizes the memory estimator needs, measured once per (model, input shape, classes)."""

    params: int
    trainable_params: int
    activations_per_example: int
    layers: int


def check_model(
    name: str,
    input_shape: tuple[int, ...],
    classes: int,
    architecture: Mapping[str, Any] | None = None,
) -> ModelInfo:
    """The model's requirements, or ``ValidationError`` naming the field that does not fit. A
    job's own model (``custom``, or its :func:`custom_name`) is checked against its
    ``architecture``."""
    custom = name == CUSTOM or name.startswith(CUSTOM_PREFIX)
    if name not in MODELS and not custom:
        raise ValidationError(
            f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}, or {CUSTOM!r} with "
            "an architecture of the job's own",
            field="model",
        )
    if classes < 2:
        raise ValidationError(
            f"a classifier needs at least 2 classes, got {classes}", field="dataset"
        )
    if custom:
        if architecture is None:
            raise ValidationError(
                f"model {CUSTOM!r} needs one: a Keras model's config, as model.to_json() writes it",
                field="architecture",
            )
        wanted = architecture_input(architecture)
        if wanted != tuple(input_shape):
            raise ValidationError(
                f"its input is {dims(wanted)}; the data set's examples are {dims(input_shape)}",
                field="architecture",
            )
        return ModelInfo("a Keras model of the job's own", images=len(input_shape) == 3)
    info = MODELS[name]
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
    """A freshly initialised model (weights drawn from ``seed``) that outputs logits. A job's
    own (a :func:`custom_name`) is built from the architecture this process was given under
    that name (:func:`remember_architecture`)."""
    known = _ARCHITECTURES.get(name) if name.startswith(CUSTOM_PREFIX) else None
    check_model(name, input_shape, classes, known)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    try:
        if known is not None:
            return _custom(known, classes)
        return _BUILDERS[name](input_shape, classes)
    except tf.errors.ResourceExhaustedError as exc:
        # TensorFlow's allocator refused a weight outright (64 × 10⁹ floats for a billion
        # classes), before the action's memory limit could: its message is a graph node's name.
        found = re.search(r"tensor with shape\[([\d,]+)\]", str(exc))
        tensor = f" (a tensor of {found[1].replace(',', '×')} values)" if found else ""
        raise ValidationError(
            f"{name} for {dims(input_shape)} inputs and {classes:,} classes cannot be "
            f"allocated{tensor}: use a smaller model, fewer classes or smaller inputs",
            field="model" if known is None else "architecture",
        ) from exc


def canonical(architecture: Mapping[str, Any]) -> bytes:
    """An architecture's JSON with its keys sorted and no spaces: what names and bounds it."""
    try:
        text = json.dumps(
            architecture, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (ValueError, TypeError) as exc:  # NaN or infinity (Python's JSON reads them), or no JSON
        raise ValidationError(f"is not JSON's: {exc}", field="architecture") from exc
    except RecursionError as exc:
        raise ValidationError("is nested too deep to write", field="architecture") from exc
    return text.encode()


def custom_name(architecture: Mapping[str, Any]) -> str:
    """The name a job's own architecture goes by where a zoo model's name would (see
    ``CUSTOM_PREFIX``)."""
    return CUSTOM_PREFIX + hashlib.sha256(canonical(architecture)).hexdigest()[:16]


def architecture_input(architecture: Mapping[str, Any]) -> tuple[int, ...]:
    """One example's shape as a Keras model's config takes it, the config checked with no
    TensorFlow: at most ``ARCHITECTURE_MAX_BYTES`` of JSON; a Sequential or Functional model of
    Keras's own layers (no module but Keras's, no custom object, no ``CODE_LAYERS``) with one
    input layer whose dimensions are all given. Raises ``ValidationError`` naming
    ``architecture``."""

    def refused(message: str) -> ValidationError:
        return ValidationError(message, field="architecture")

    size = len(canonical(architecture))
    if size > ARCHITECTURE_MAX_BYTES:
        raise refused(f"is {size:,} bytes of JSON; at most {ARCHITECTURE_MAX_BYTES:,}")
    config, top = architecture.get("config"), architecture.get("class_name")
    if not isinstance(top, str) or top not in MODEL_CLASSES or not isinstance(config, Mapping):
        raise refused(
            "is not a Keras model's config, as model.to_json() writes it: its class_name "
            f"{_shown(top)} is none of {', '.join(sorted(MODEL_CLASSES))}, or it has no config"
        )
    found: list[object] = [architecture]
    while found:
        item = found.pop()
        if isinstance(item, list):
            found.extend(item)
        if not isinstance(item, Mapping):
            continue
        kind, module = item.get("class_name"), item.get("module")
        registered = item.get("registered_name")
        if isinstance(kind, str) and kind in CODE_LAYERS:
            raise refused(f"holds a {kind} layer, which runs code of its own: none may")
        named = kind if isinstance(kind, str) and len(kind) <= 60 else _shown(kind)
        if module is not None and not (module == "keras" or str(module).startswith("keras.")):
            raise refused(
                f"{named}: its module {_shown(module)} is not Keras's; only Keras's own may be"
            )
        if registered not in (None, kind):
            raise refused(
                f"{named}: a custom object ({_shown(registered)}); only Keras's own may be"
            )
        found.extend(item.values())
    layers = config.get("layers")
    inputs = [
        layer.get("config")
        for layer in (layers if isinstance(layers, list) else [])
        if isinstance(layer, Mapping) and layer.get("class_name") == "InputLayer"
    ]
    if len(inputs) != 1:
        raise refused(f"has {len(inputs)} input layers (InputLayer); a job's model takes one")
    shape = inputs[0].get("batch_shape") if isinstance(inputs[0], Mapping) else None
    dims_given = shape[1:] if isinstance(shape, list) and len(shape) >= 2 else []
    if not dims_given or not all(type(d) is int and d >= 1 for d in dims_given):
        raise refused(
            f"its input layer's batch_shape is {_shown(shape)}; it must give each dimension of an "
            "example, as [null, 8, 8, 1] does"
        )
    return tuple(dims_given)


def model_called(model: str, architecture: object = None) -> str:
    """A job's model as people read it: a zoo model's name, or, for a job's own architecture,
    ``custom: `` and the name its Keras config gives the model (cut short past 60 characters;
    ``custom`` alone where the config gives none as text)."""
    config = architecture.get("config") if isinstance(architecture, Mapping) else None
    named = config.get("name") if isinstance(config, Mapping) else None
    if model != CUSTOM or not isinstance(named, str):
        return model
    return f"{CUSTOM}: {_clipped(named, 60)}"


def _shown(value: object) -> str:
    """A value of an architecture as a message shows it: its repr, cut short past 60 characters
    (a name may take the architecture's 512 KiB)."""
    return _clipped(repr(value), 60)


def _clipped(text: str, most: int) -> str:
    """``text``, cut short with an ellipsis past ``most`` characters."""
    return text if len(text) <= most else text[: most - 1] + "…"


def remember_architecture(name: str, architecture: Mapping[str, Any]) -> None:
    """Take ``architecture`` as the one ``name`` (its :func:`custom_name`) builds in this
    process; ``ValidationError`` where it is another's."""
    if custom_name(architecture) != name:
        raise ValidationError(
            f"is not the one {name!r} names (its name would be {custom_name(architecture)!r})",
            field="architecture",
        )
    _ARCHITECTURES[name] = architecture
    _ARCHITECTURES.move_to_end(name)
    while len(_ARCHITECTURES) > ARCHITECTURES_KEPT:
        _ARCHITECTURES.popitem(last=False)


#: The safetensors metadata key of a trained model's architecture: its name, input shape and
#: classes as JSON, and a job's own architecture's config. Trainers write it with their weights,
#: aggregators keep it.
ARCHITECTURE = "faasdl.architecture"


def architecture(name: str, input_shape: tuple[int, ...], classes: int) -> dict[str, str]:
    """The metadata that lets :func:`load_model` build a model's weights' architecture."""
    found: dict[str, Any] = {"model": name, "input_shape": list(input_shape), "classes": classes}
    if name in _ARCHITECTURES:
        found["architecture"] = _ARCHITECTURES[name]
    return {ARCHITECTURE: json.dumps(found)}


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
        if "architecture" in found:
            remember_architecture(name, found["architecture"])
    except (KeyError, ValueError, TypeError, ValidationError) as exc:
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


def _custom(architecture: Mapping[str, Any], classes: int) -> keras.Model:
    """A job's own model, built from its config in Keras's safe mode; ``ValidationError``
    naming ``architecture`` where Keras cannot build it or its output is not one logit a class."""
    import keras

    try:
        # A copy: Keras takes fields out of a Functional model's config as it builds it. Its
        # compile_config (a compiled model's) is left out: the job's optimizer and loss train it.
        config = copy.deepcopy({k: v for k, v in architecture.items() if k != "compile_config"})
        model = keras.saving.deserialize_keras_object(config, safe_mode=True)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValidationError(
            f"Keras cannot build it: {_keras_said(exc)}", field="architecture"
        ) from exc
    if not isinstance(model, keras.Model):
        raise ValidationError(f"builds a {type(model).__name__}, no model", field="architecture")
    outputs = [tuple(output.shape) for output in model.outputs]
    if outputs != [(None, classes)]:
        shown = ", ".join(str(list(shape)).replace("None", "null") for shape in outputs)
        raise ValidationError(
            f"its output is {shown}; the data set's {classes} classes need one of [null, "
            f"{classes}] (a logit a class, no softmax)",
            field="architecture",
        )
    return model


def _keras_said(exc: Exception) -> str:
    """What Keras said of a config it could not build, on one line and at most 500 characters:
    the layer's own error where Keras wraps it with the whole config ("Exception encountered:"),
    without a config it adds ("Full object config:", "Full config:") or its terminal's bold."""
    said = str(exc).rsplit("Exception encountered: ", 1)[-1]
    said = re.split(r"\s+Full (?:object )?config:", said)[0]
    said = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", said).split())
    return _clipped(said, 500)


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
