"""Datasets for training jobs and their seeded IID split into shards.

Three sources: scikit-learn's digits (real, shipped with scikit-learn), synthetic image sets of any
shape and size with a learnable signal (for scale), and a user's ``.npz`` file. Every source gives
float32 images ``(N, H, W, C)`` (or feature vectors ``(N, D)``) and int32 labels. NumPy only: the
controller loads and shards data without TensorFlow.
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
import threading
import unicodedata
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from faasdl.errors import ValidationError
from faasdl.store.base import Buffer, Pieces
from faasdl.training.tensors import encode_tensors, unpack

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
#: Compression methods of a zip archive that zipfile reads and numpy does not write.
ZIP_METHODS = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "LZMA"}
#: How many input values the check for ones that are not finite looks at a time.
NONFINITE_CHECK_VALUES = 1 << 22
#: The largest label: shards hold labels as int32, and ``classes`` (the largest + 1) is one too.
MAX_LABEL = 2**31 - 2
#: Classes up to which :func:`untrained_classes` counts the labels of each (8 MB of counts).
COUNTED_CLASSES = 1 << 20
#: Inputs beyond ± this are noted as unscaled (see :func:`large_inputs`).
LARGE_INPUT = 100.0
#: Test inputs reaching this many times as far as the training inputs, or as far the other way
#: round, are noted as scaled otherwise (see :func:`unlike_scales`).
UNLIKE_SCALE = 10.0


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


#: The images in scikit-learn's digits.
DIGITS_IMAGES = 1797


class DigitsSpec(_Spec):
    """scikit-learn's 8×8 handwritten digits: 1,797 images, 10 classes."""

    name: Literal["digits"] = "digits"
    test_fraction: float = Field(0.2, gt=0, lt=1, description="Share of images held out for test.")

    @field_validator("test_fraction")
    @classmethod
    def _both_parts_have_images(cls, fraction: float) -> float:
        held_out = _held_out(fraction, DIGITS_IMAGES)
        if not 0 < held_out < DIGITS_IMAGES:
            part = "test" if held_out == 0 else "training"
            raise ValueError(
                f"{fraction} of the {DIGITS_IMAGES} images leaves no {part} images (about "
                "0.0003 to 0.9997 leaves some of both)"
            )
        return fraction


#: Bounds of a data set, generated or a user's, so that a request cannot exhaust the
#: controller's memory (it holds a data set as float32 while it cuts it into shards).
MAX_SIDE = 4096
MAX_DATASET_VALUES = 2**28


class SyntheticSpec(_Spec):
    """Generated images: one random pattern per class plus noise, so that a model can learn it."""

    name: Literal["synthetic"] = "synthetic"
    shape: tuple[int, ...] = Field((32, 32, 3), description="Shape of one example (H, W, C).")
    classes: int = Field(10, ge=2, le=1000, description="Number of classes.")
    train_size: int = Field(2048, ge=1, le=1_000_000, description="Training examples.")
    test_size: int = Field(512, ge=1, le=1_000_000, description="Test examples.")
    noise: float = Field(
        1.0, ge=0, le=1000, description="Standard deviation of the noise on each pattern."
    )
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed of the patterns and the noise.")

    @field_validator("shape")
    @classmethod
    def _image_shape(cls, shape: tuple[int, ...]) -> tuple[int, ...]:
        if not 1 <= len(shape) <= 3 or any(not 1 <= d <= MAX_SIDE for d in shape):
            raise ValueError(f"must be 1 to 3 dimensions of 1 to {MAX_SIDE}, not {list(shape)}")
        return shape

    @model_validator(mode="after")
    def _fits_in_memory(self) -> SyntheticSpec:
        values = (self.train_size + self.test_size) * math.prod(self.shape)
        if values > MAX_DATASET_VALUES:
            raise ValueError(
                f"train_size, test_size and shape make {values:,} values, more than the "
                f"{MAX_DATASET_VALUES:,} (1 GiB of float32) a data set may hold"
            )
        return self


class NpzSpec(_Spec):
    """A user's ``.npz`` file with ``x_train``, ``y_train``, ``x_test``, ``y_test`` (no pickle)."""

    name: Literal["npz"] = "npz"
    path: str = Field(description="Path of the .npz file.")

    @field_validator("path")
    @classmethod
    def _names_a_file(cls, path: str) -> str:
        if not path:
            raise ValueError("is empty: name an uploaded data set or a .npz file")
        if "\x00" in path:
            raise ValueError("contains a NUL character, which no file's name can")
        # A file's name may hold the others, but a terminal showing the job (`faasdl status`)
        # would act on them (an escape sequence), as it would on a job's name's.
        if control := next((c for c in path if unicodedata.category(c) == "Cc"), None):
            raise ValueError(
                f"holds {control!r} at {path.index(control)}: a data set's path holds no "
                "control characters (rename the file)"
            )
        return path


DatasetSpec = Annotated[DigitsSpec | SyntheticSpec | NpzSpec, Field(discriminator="name")]


@dataclass(frozen=True)
class Dataset:
    """A loaded data set: float32 inputs, int32 labels in ``[0, classes)``."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    #: The SHA-256 of the ``.npz`` file it was loaded from; ``None`` for the built-in data sets
    #: (their spec says what they hold).
    sha256: str | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def example_bytes(self) -> int:
        return int(self.x_train[0].nbytes) + int(self.y_train.itemsize)


@dataclass(frozen=True)
class Shard:
    """One worker's share of the training set; ``count`` weighs it in the global average."""

    index: int
    x: np.ndarray
    y: np.ndarray

    @property
    def count(self) -> int:
        return len(self.y)

    @property
    def nbytes(self) -> int:
        return int(self.x.nbytes + self.y.nbytes)

    def encode(self) -> Pieces:
        """Safetensors (``x``, ``y``), so that a shard crosses the store without pickle; pieces
        that view the arrays (see :func:`~faasdl.training.tensors.encode_tensors`)."""
        return encode_tensors({"x": self.x, "y": self.y})

    @classmethod
    def from_bytes(cls, data: Buffer, *, index: int) -> Shard:
        """The shard :meth:`encode` wrote; its arrays are views of ``data``."""
        groups = unpack(data, what="shard")
        try:
            [x], [y] = groups["x"], groups["y"]
        except (KeyError, ValueError) as exc:
            message = "not a shard: it needs one array x and one y"
            raise ValidationError(message, field="shard") from exc
        return cls(index=index, x=x, y=y)


#: Held while a data set is loaded, and by a controller while it stages one: a process holds one
#: data set at a time (up to 1 GiB, ~1.6 GB while it is staged), however many uploads arrive and
#: jobs start together. Re-entrant: staging loads under it.
ONE_DATA_SET = threading.RLock()


def load_dataset(spec: DigitsSpec | SyntheticSpec | NpzSpec) -> Dataset:
    """Load the data set ``spec`` names (holding :data:`ONE_DATA_SET`); raises
    ``ValidationError`` naming the field at fault."""
    with ONE_DATA_SET:
        if isinstance(spec, DigitsSpec):
            return _digits(spec)
        if isinstance(spec, SyntheticSpec):
            return _synthetic(spec)
        return _npz(spec)


def split_training_set(
    dataset: Dataset, shards: int, *, seed: int, held_out: int = 0
) -> tuple[Shard, Iterator[Shard]]:
    """Shuffle the training set once with ``seed``: its first ``held_out`` examples are the
    validation set (empty: none held out), the rest are cut into ``shards`` near-equal shards,
    each copied out as it is taken: a caller that stores one before it takes the next holds one
    beside the data set, not all of them (a second copy of the data set, 1 GB at the size
    limit)."""
    examples = len(dataset.y_train) - held_out
    if not 1 <= shards <= examples:
        raise ValidationError(
            f"cannot split {examples} examples into {shards} shards", field="workers"
        )
    order = np.random.default_rng(seed).permutation(len(dataset.y_train))
    held, rest = order[:held_out], order[held_out:]
    validation = Shard(index=0, x=dataset.x_train[held], y=dataset.y_train[held])
    return validation, (
        Shard(index=i, x=dataset.x_train[part], y=dataset.y_train[part])
        for i, part in enumerate(np.array_split(rest, shards))
    )


def split_shards(dataset: Dataset, shards: int, *, seed: int) -> Iterator[Shard]:
    """The training set in ``shards`` shards, none held out (:func:`split_training_set`)."""
    return split_training_set(dataset, shards, seed=seed)[1]


def preload() -> None:
    """Import the libraries the loaders use now rather than at a process's first job."""
    _digits_arrays()


@functools.cache
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, parsed once per process (its CSV takes ~100 ms each time); read-only,
    since every caller shares them."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[..., np.newaxis]
    y = bunch.target.astype(np.int32)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def _digits(spec: DigitsSpec) -> Dataset:
    x, y = _digits_arrays()
    # A fixed split, independent of the job's seed, so that test accuracy is comparable.
    order = np.random.default_rng(0).permutation(len(y))
    n_test = _held_out(spec.test_fraction, len(y))
    test, train = order[:n_test], order[n_test:]
    return Dataset(x[train], y[train], x[test], y[test], classes=10)


def _held_out(fraction: float, images: int) -> int:
    """How many of ``images`` a test fraction holds out."""
    return round(images * fraction)


def _synthetic(spec: SyntheticSpec) -> Dataset:
    rng = np.random.default_rng(spec.seed)
    patterns = rng.normal(size=(spec.classes, *spec.shape)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, spec.classes, size=n).astype(np.int32)
        x = patterns[y] + rng.normal(scale=spec.noise, size=(n, *spec.shape)).astype(np.float32)
        return x, y

    x_train, y_train = draw(spec.train_size)
    x_test, y_test = draw(spec.test_size)
    return Dataset(x_train, y_train, x_test, y_test, classes=spec.classes)


def npz_sha256(spec: NpzSpec) -> str:
    """The SHA-256 of the ``.npz`` file ``spec`` names (read, not loaded: ~0.5 s a GiB)."""
    try:
        with _open_npz(spec) as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as exc:
        raise _invalid(spec, exc) from exc


def _open_npz(spec: NpzSpec) -> io.BufferedReader:
    path = Path(spec.path)
    if not path.is_file():
        raise ValidationError(f"no such file: {spec.path}", field="dataset.path")
    return path.open("rb")


def _npz(spec: NpzSpec) -> Dataset:
    try:
        # Opened here so that the file is closed whatever np.load makes of it, and hashed from
        # the same handle that loads it: a file replaced meanwhile is not mixed in.
        with _open_npz(spec) as fh:
            if fh.read(4) != b"PK\x03\x04":
                raise ValidationError(f"{spec.path} is not a .npz archive", field="dataset.path")
            fh.seek(0)
            # The arrays' shapes and types are checked from their headers before any is read:
            # a deflated archive of 1 MB holds 2³⁰ zeros, which took 9 GB to load as float32.
            with zipfile.ZipFile(fh) as archive:
                _check_headers(spec, _npy_headers(spec, archive))
            fh.seek(0)
            sha256 = hashlib.file_digest(fh, "sha256").hexdigest()
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as archive:
                arrays = {key: archive[key] for key in NPZ_KEYS}
    except ValidationError:
        raise
    except ValueError as exc:
        raise _invalid(spec, exc) from exc
    # zlib.error: a damaged deflate stream; NotImplementedError: a zip feature zipfile cannot
    # read (a later zip version's, patched data): each was a 500.
    except (OSError, zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError) as exc:
        raise _invalid(spec, exc) from exc
    x_train, y_train = _inputs(arrays["x_train"], arrays["y_train"], "train")
    x_test, y_test = _inputs(arrays["x_test"], arrays["y_test"], "test")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ValidationError(
            f"x_test's examples are {dims(x_test.shape[1:])}, x_train's "
            f"{dims(x_train.shape[1:])}: a model takes one shape",
            field="dataset.path",
        )
    classes = _classes(arrays["y_train"], arrays["y_test"])
    return Dataset(x_train, y_train, x_test, y_test, classes=classes, sha256=sha256)


def _npy_headers(
    spec: NpzSpec, archive: zipfile.ZipFile
) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array's shape and type, read from its ``.npy`` header: nothing decompressed but
    the header's few bytes."""
    missing = [key for key in NPZ_KEYS if f"{key}.npy" not in archive.namelist()]
    if missing:
        raise ValidationError(
            f"{spec.path} lacks {', '.join(missing)} (needs {', '.join(NPZ_KEYS)})",
            field="dataset.path",
        )
    headers = {}
    for key in NPZ_KEYS:
        info = archive.getinfo(f"{key}.npy")
        if info.flag_bits & 0x1:  # zipfile raised RuntimeError for it: a 500
            raise ValidationError(
                f"{spec.path}: {key} is encrypted; an .npz holds arrays as np.savez saves them",
                field="dataset.path",
            )
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            # zipfile decompresses bzip2 and LZMA whole blocks at a time: a few bytes read of
            # one can be gigabytes of zeros.
            raise ValidationError(
                f"{spec.path}: {key} is compressed with "
                f"{ZIP_METHODS.get(info.compress_type, f'method {info.compress_type}')}; an .npz "
                "holds arrays stored or deflated (np.savez, np.savez_compressed)",
                field="dataset.path",
            )
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            read = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read(member)
        headers[key] = (tuple(shape), dtype)
    return headers


def _check_headers(spec: NpzSpec, headers: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
    values = 0
    for part in ("train", "test"):
        (x_shape, x_dtype), (y_shape, y_dtype) = headers[f"x_{part}"], headers[f"y_{part}"]
        if x_dtype.hasobject or y_dtype.hasobject:
            raise ValidationError(
                f"{spec.path} holds Python objects, which would need pickle to load; "
                "save plain numeric arrays",
                field="dataset.path",
            )
        real = np.issubdtype(x_dtype, np.number) and not np.issubdtype(x_dtype, np.complexfloating)
        if len(x_shape) not in (2, 3, 4) or not (real or np.issubdtype(x_dtype, np.bool_)):
            raise ValidationError(
                f"x_{part} must be real numbers (or booleans) with 2 to 4 dimensions, got "
                f"{x_dtype} {list(x_shape)}",
                field="dataset.path",
            )
        if 0 in x_shape:
            empty = " is empty" if x_shape[0] == 0 else "'s examples hold no values"
            raise ValidationError(f"x_{part}{empty} (shape {list(x_shape)})", field="dataset.path")
        _check_labels(part, x_shape[0], y_shape, y_dtype)
        values += math.prod(x_shape)
    if values > MAX_DATASET_VALUES:
        raise ValidationError(
            f"x_train and x_test hold {values:,} values, more than the {MAX_DATASET_VALUES:,} "
            "(1 GiB of float32) a data set may hold",
            field="dataset.path",
        )


def _check_labels(part: str, examples: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """``y_{part}`` must hold one class index per example: integers (or booleans), as a vector or
    a column. What else it holds is named with what to save instead."""
    integers = np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.bool_)
    if integers and shape in ((examples,), (examples, 1)):
        return
    if shape[:1] == (examples,) and len(shape) == 2 and shape[1] > 1:
        hint = ": one-hot? save each example's class index, y.argmax(axis=1)"
    elif shape[:1] != (examples,) or len(shape) > 2:
        hint = f": one per x_{part} example"
    elif np.issubdtype(dtype, np.floating):
        hint = (
            ": class indices saved as floats? save them as integers, y.astype(np.int64) "
            "(faasdl trains classifiers: a real-valued target is regression)"
        )
    elif dtype.kind in "US":
        hint = ": class names? save their indices, np.unique(y, return_inverse=True)[1]"
    else:
        hint = ""
    raise ValidationError(
        f"y_{part} must be {examples} integer labels, got {dtype} {list(shape)}{hint}",
        field="dataset.path",
    )


def dims(shape: Iterable[int]) -> str:
    """A shape as messages write it: ``32×32×3``."""
    return "×".join(map(str, shape))


def _invalid(spec: NpzSpec, exc: Exception) -> ValidationError:
    return ValidationError(f"{spec.path} is not a valid .npz: {exc}", field="dataset.path")


def _inputs(x: np.ndarray, y: np.ndarray, part: str) -> tuple[np.ndarray, np.ndarray]:
    """``x`` as float32 (``uint8`` scaled to [0, 1], booleans 0 and 1, a channel added to grey
    images) and ``y`` as int32, once :func:`_check_headers` has passed their shapes and types."""
    with np.errstate(over="ignore"):  # a float64 past float32's range: counted below
        scaled = x.astype(np.float32, copy=False)  # float32 already: not copied
    if x.dtype == np.uint8:
        scaled /= 255.0  # in place: not a second float32 copy of the data set
    # NaN or ±inf would make every loss NaN; counted a slice at a time, not with a mask as
    # large as the inputs.
    rows = max(1, NONFINITE_CHECK_VALUES // max(1, scaled[0].size))
    bad = sum(
        int(np.count_nonzero(~np.isfinite(scaled[i : i + rows])))
        for i in range(0, len(scaled), rows)
    )
    if bad:
        raise ValidationError(
            f"x_{part} holds {bad:,} value{'s' if bad > 1 else ''} not finite as float32 "
            "(NaN, ±inf or beyond ±3.4e38)",
            field="dataset.path",
        )
    if x.ndim == 3:  # grey images without a channel axis
        scaled = scaled[..., np.newaxis]
    return scaled, y.reshape(len(y)).astype(np.int32)  # a column of labels as a vector


def _classes(y_train: np.ndarray, y_test: np.ndarray) -> int:
    for part, y in (("train", y_train), ("test", y_test)):
        low, high = int(y.min()), int(y.max())
        if low < 0:
            raise ValidationError(
                f"y_{part}: labels must be ≥ 0 (class indices from 0), found {low}",
                field="dataset.path",
            )
        if high > MAX_LABEL:
            raise ValidationError(
                f"y_{part}: labels must be at most {MAX_LABEL:,} (they are stored as int32), "
                f"found {high:,}",
                field="dataset.path",
            )
    high = max(int(y_train.max()), int(y_test.max()))
    if high == 0:
        raise ValidationError(
            "every label is 0: a classifier needs at least two classes", field="dataset.path"
        )
    return high + 1


def data_notes(dataset: Dataset) -> list[str]:
    """What a user's data set holds that trains badly without being wrong: notes, not refusals."""
    notes = (untrained_classes(dataset), large_inputs(dataset), unlike_scales(dataset))
    return [note for note in notes if note]


def _reach(x: np.ndarray) -> float:
    """How far from 0 the values of ``x`` reach (two passes, no copy: the inputs may be a GiB)."""
    return max(float(x.max()), -float(x.min()))


def large_inputs(dataset: Dataset) -> str | None:
    """A note where the training inputs reach beyond ±:data:`LARGE_INPUT`: they are taken as
    given (only ``uint8`` is scaled), and inputs of that size train slowly or not at all (pixels
    saved as floats of 0-255, raw tabular features)."""
    reach = _reach(dataset.x_train)
    if reach <= LARGE_INPUT:
        return None
    return (
        f"x_train's values reach ±{reach:,.4g}: inputs are taken as given (only uint8 images are "
        "scaled to [0, 1]), and a model trains on values this large slowly if at all; scale "
        "them, pixels x / 255, features (x - x.mean(0)) / x.std(0) (the test set's with the "
        "training set's mean and deviation)"
    )


def unlike_scales(dataset: Dataset) -> str | None:
    """A note where the test inputs reach :data:`UNLIKE_SCALE` times as far as the training
    inputs or a tenth as far: scaled otherwise (the training set standardised and not the test
    set; one saved as ``uint8``, scaled as it loads, the other as floats of 0-255), a model
    scores the test set on values it never trained on."""
    train, test = _reach(dataset.x_train), _reach(dataset.x_test)
    if max(train, test) <= UNLIKE_SCALE * min(train, test):
        return None
    return (
        f"x_test's values reach ±{test:,.4g}, x_train's ±{train:,.4g}: scaled otherwise? Inputs "
        "are taken as given (only uint8 images are scaled to [0, 1]): scale the test set as the "
        "training set, and save both as one type"
    )


def untrained_classes(dataset: Dataset) -> str | None:
    """A note where a class below the highest label has no training example (labels counted from
    1, a class only the test set has): the model has an output for it, which training teaches it
    never to give."""
    if dataset.classes <= COUNTED_CLASSES:  # counted in one pass, no copy of the labels
        unseen = np.flatnonzero(np.bincount(dataset.y_train, minlength=dataset.classes) == 0)
        missing, first = len(unseen), unseen[:3]
    else:  # up to 2³¹ classes: the labels sorted instead of a count per class
        seen = np.unique(dataset.y_train)
        missing = dataset.classes - len(seen)
        # Among the first len(seen) + k indices at least k are missing.
        first = np.setdiff1d(np.arange(min(dataset.classes, len(seen) + 3)), seen)[:3]
    if missing == 0:
        return None
    named = ", ".join(map(str, first)) + (", …" if missing > len(first) else "")
    if missing == 1:
        which = f"class {named} has no example in y_train ("
    else:
        which = f"{missing:,} of {dataset.classes:,} classes have no example in y_train ({named}; "
    return (
        f"{which}labels are class indices from 0): a class without training examples is never "
        "predicted"
    )
