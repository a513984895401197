import collections
import random
import threading
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError as PydanticValidationError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from faasdl.errors import ValidationError
from faasdl.training import datasets
from faasdl.training.datasets import (
    DIGITS_IMAGES,
    MAX_LABEL,
    Dataset,
    DigitsSpec,
    NpzSpec,
    Shard,
    SyntheticSpec,
    data_notes,
    load_dataset,
    split_shards,
    split_training_set,
    unlike_scales,
    untrained_classes,
)


def test_digits_are_scikit_learns_images_with_a_fixed_test_split() -> None:
    data = load_dataset(DigitsSpec())

    assert data.input_shape == (8, 8, 1)
    assert data.classes == 10
    assert len(data.y_train) + len(data.y_test) == 1797
    assert data.x_train.min() >= 0.0
    assert data.x_train.max() <= 1.0
    assert np.array_equal(load_dataset(DigitsSpec()).y_test, data.y_test)


def test_synthetic_data_has_the_asked_shape_and_a_learnable_signal() -> None:
    data = load_dataset(SyntheticSpec(shape=(16, 16, 3), classes=4, train_size=400, noise=0.5))

    assert data.x_train.shape == (400, 16, 16, 3)
    assert data.x_train.dtype == np.float32
    # Nearest class mean on the training set classifies the test set: there is signal to learn.
    means = np.stack([data.x_train[data.y_train == c].mean(axis=0) for c in range(4)])
    distances = ((data.x_test[:, None] - means[None]) ** 2).sum(axis=(2, 3, 4))
    assert (distances.argmin(axis=1) == data.y_test).mean() > 0.9


def test_shards_cover_the_training_set_once_and_depend_only_on_the_seed() -> None:
    data = load_dataset(DigitsSpec())

    shards = list(split_shards(data, 3, seed=7))

    assert sum(s.count for s in shards) == len(data.y_train)
    assert max(s.count for s in shards) - min(s.count for s in shards) <= 1
    rows = np.concatenate([s.x.reshape(s.count, -1) for s in shards])
    assert len(np.unique(rows, axis=0)) == len(np.unique(data.x_train.reshape(-1, 64), axis=0))
    again = split_shards(data, 3, seed=7)
    assert all(np.array_equal(a.y, b.y) for a, b in zip(shards, again, strict=True))
    assert not np.array_equal(next(split_shards(data, 3, seed=8)).y, shards[0].y)


def test_a_validation_set_is_held_out_of_the_shards_by_the_seed() -> None:
    # Arrange: 100 training examples, each its own value.
    values = np.arange(100, dtype=np.float32)[:, None]
    labels = np.arange(100, dtype=np.int32) % 2
    data = Dataset(values, labels, values[:2], labels[:2], classes=2)

    # Execute
    held, parts = split_training_set(data, 3, seed=5, held_out=20)
    shards = list(parts)
    other, _ = split_training_set(data, 3, seed=6, held_out=20)

    # Assert: the shards and the validation set part the training set between them; the same
    # seed holds the same examples out, another other ones.
    trained = np.concatenate([s.x[:, 0] for s in shards])
    assert sorted(s.count for s in shards) == [26, 27, 27]
    assert held.count == 20
    assert sorted([*trained, *held.x[:, 0]]) == list(range(100))
    assert np.array_equal(held.y, held.x[:, 0].astype(np.int32) % 2)
    assert np.array_equal(split_training_set(data, 3, seed=5, held_out=20)[0].x, held.x)
    assert split_training_set(data, 3, seed=5)[0].count == 0
    assert not np.array_equal(np.sort(other.x[:, 0]), np.sort(held.x[:, 0]))
    with pytest.raises(ValidationError, match="cannot split 2 examples into 3 shards"):
        split_training_set(data, 3, seed=5, held_out=98)


def test_shards_are_copied_out_one_at_a_time() -> None:
    # Staging stores each shard before it takes the next: never a second copy of the data set.
    data = load_dataset(SyntheticSpec(train_size=4096, shape=(16, 16, 2), test_size=1))
    tracemalloc.start()
    try:
        for shard in split_shards(data, 8, seed=0):
            assert shard.x.nbytes == data.x_train.nbytes // 8
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < data.x_train.nbytes / 2  # two shards at most (the one held, the next)


def test_a_shard_crosses_the_store_as_safetensors_x_and_y() -> None:
    shard = list(split_shards(load_dataset(DigitsSpec()), 2, seed=0))[1]

    data = b"".join(shard.encode())
    back = Shard.from_bytes(data, index=1)

    assert np.array_equal(back.x, shard.x)
    assert np.array_equal(back.y, shard.y)
    assert back.count == shard.count
    assert sorted(st_load(data)) == ["x", "y"]  # what the training action documents
    theirs = Shard.from_bytes(st_save({"x": shard.x, "y": shard.y}), index=1)
    assert np.array_equal(theirs.x, shard.x)


def test_what_is_not_a_shard_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="not a shard") as caught:
        Shard.from_bytes(st_save({"x": np.ones(2, np.float32)}), index=0)

    assert caught.value.field == "shard"


def test_more_shards_than_examples_is_refused() -> None:
    data = load_dataset(SyntheticSpec(train_size=3, shape=(4,)))

    with pytest.raises(ValidationError, match="cannot split 3 examples into 4") as caught:
        split_shards(data, 4, seed=0)
    assert caught.value.field == "workers"


def _npz(path: Path, **arrays: np.ndarray) -> NpzSpec:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return NpzSpec(path=str(path))


def test_a_users_npz_loads_with_uint8_scaled_and_a_channel_added(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    spec = _npz(
        tmp_path / "data.npz",
        x_train=rng.integers(0, 256, (20, 6, 6), dtype=np.uint8),
        y_train=rng.integers(0, 3, 20),
        x_test=rng.integers(0, 256, (5, 6, 6), dtype=np.uint8),
        y_test=np.array([0, 1, 2, 2, 1]),
    )

    data = load_dataset(spec)

    assert data.input_shape == (6, 6, 1)
    assert data.classes == 3
    assert data.x_train.max() <= 1.0


def test_boolean_inputs_load_as_zeros_and_ones(tmp_path: Path) -> None:
    # Arrange: binary features saved as NumPy's booleans (refused as not numbers before).
    x = np.array([[True, False, True], [False, False, True], [True, True, False], [False] * 3])
    spec = _npz(
        tmp_path / "bits.npz",
        x_train=x,
        y_train=np.arange(4) % 2,
        x_test=x[:2],
        y_test=np.array([1, 0]),
    )

    # Execute
    data = load_dataset(spec)

    # Assert
    assert data.x_train.dtype == np.float32
    np.testing.assert_array_equal(data.x_train, x.astype(np.float32))
    np.testing.assert_array_equal(data.x_test, x[:2].astype(np.float32))


def test_labels_as_a_column_or_booleans_load_as_class_indices(tmp_path: Path) -> None:
    x = np.zeros((4, 3))
    column = _npz(
        tmp_path / "column.npz",
        x_train=x,
        y_train=np.array([[0], [1], [2], [1]]),
        x_test=x[:2],
        y_test=np.array([[2], [0]]),
    )
    booleans = _npz(
        tmp_path / "bool.npz",
        x_train=x,
        y_train=np.array([True, False, True, True]),
        x_test=x[:2],
        y_test=np.array([False, True]),
    )

    by_column, by_bool = load_dataset(column), load_dataset(booleans)

    assert by_column.y_train.tolist() == [0, 1, 2, 1]
    assert by_column.y_test.tolist() == [2, 0]
    assert by_column.classes == 3
    assert by_bool.y_train.tolist() == [1, 0, 1, 1]
    assert by_bool.y_train.dtype == np.int32
    assert by_bool.classes == 2


@pytest.mark.parametrize(
    ("y_train", "note"),
    [
        ([0, 1, 2, 1], None),
        (
            [1, 2, 2, 1],
            "class 0 has no example in y_train (labels are class indices from 0): a class "
            "without training examples is never predicted",
        ),
        ([0, 4, 9, 4], "7 of 10 classes have no example in y_train (1, 2, 3, …; labels are"),
        # The first few found without a range as long as the classes.
        (
            [0, MAX_LABEL, 0, 1],
            "2,147,483,644 of 2,147,483,647 classes have no example in y_train (2, 3, 4, …;",
        ),
    ],
    ids=["every-class", "counted-from-1", "gaps", "vast"],
)
def test_classes_without_a_training_example_are_noted(
    tmp_path: Path, y_train: list[int], note: str | None
) -> None:
    x = np.zeros((4, 3))
    data = load_dataset(
        _npz(
            tmp_path / "d.npz",
            x_train=x,
            y_train=np.array(y_train),
            x_test=x[:1],
            y_test=np.array([1]),
        )
    )

    found = untrained_classes(data)

    if note is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(note)


@pytest.mark.parametrize(
    ("x_train", "x_test", "note"),
    [
        (np.full((4, 3), 255, np.uint8), np.full((1, 3), 255.0), "x_test's values reach ±255, "),
        (np.full((4, 3), 255, np.uint8), np.full((1, 3), 1.0), None),
        (np.full((4, 3), 255.0), np.full((1, 3), 255, np.uint8), "x_test's values reach ±1, "),
        (np.array([[-2.5, 1.0]] * 4), np.array([[-30.0, 2.0]]), "x_test's values reach ±30, "),
        (np.array([[-2.5, 1.0]] * 4), np.array([[-20.0, 2.0]]), None),  # within ten times
    ],
    ids=["uint8-and-float-pixels", "both-scaled", "float-and-uint8-pixels", "raw-test", "within"],
)
def test_a_test_set_scaled_unlike_the_training_set_is_noted(
    tmp_path: Path, x_train: np.ndarray, x_test: np.ndarray, note: str | None
) -> None:
    # Arrange: the loader scales uint8 inputs only: a set whose parts were saved as two types
    # (or standardised one without the other) trained on one scale and was scored on another.
    spec = _npz(
        tmp_path / "d.npz",
        x_train=x_train,
        y_train=np.arange(4) % 2,
        x_test=x_test,
        y_test=np.array([1]),
    )

    # Execute
    found = unlike_scales(load_dataset(spec))

    # Assert
    if note is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(note)
        assert "scale the test set as the training set" in found


@pytest.mark.parametrize(
    ("x_train", "note"),
    [
        (np.full((4, 3), 100.0), None),  # at the bound
        (np.full((4, 3, 3), 255, np.uint8), None),  # scaled to [0, 1] as it loads
        (np.full((4, 3, 3), 255.0), "x_train's values reach ±255: inputs are taken as given"),
        (np.array([[0.0, -4254.0]] * 4), "x_train's values reach ±4,254: inputs are taken"),
    ],
    ids=["at-the-bound", "uint8-pixels", "float-pixels", "raw-features"],
)
def test_unscaled_inputs_are_noted(tmp_path: Path, x_train: np.ndarray, note: str | None) -> None:
    data = load_dataset(
        _npz(
            tmp_path / "d.npz",
            x_train=x_train,
            y_train=np.arange(4) % 2,
            x_test=x_train[:1],
            y_test=np.array([1]),
        )
    )

    found = data_notes(data)

    if note is None:
        assert found == []
    else:
        assert len(found) == 1
        assert found[0].startswith(note)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x_train": np.zeros((4, 2)), "y_train": np.zeros(4, int)}, "lacks x_test, y_test"),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.zeros(3, int),
                "x_test": np.zeros((2, 2)),
                "y_test": np.zeros(2, int),
            },
            r"y_train must be 4 integer labels, got int64 \[3\]: one per x_train example",
        ),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.array([0.0, 1.0, 1.0, 0.0]),
                "x_test": np.zeros((2, 2)),
                "y_test": np.arange(2),
            },
            r"got float64 \[4\]: class indices saved as floats\? save them as integers, "
            r"y.astype\(np.int64\) \(faasdl trains classifiers",
        ),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.arange(4),
                "x_test": np.zeros((2, 2)),
                "y_test": np.eye(2),
            },
            r"y_test must be 2 integer labels, got float64 \[2, 2\]: one-hot\? save each "
            r"example's class index, y.argmax\(axis=1\)",
        ),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.array(["cat", "dog", "dog", "cat"]),
                "x_test": np.zeros((2, 2)),
                "y_test": np.arange(2),
            },
            r"got <U3 \[4\]: class names\? save their indices, np.unique\(y, return_inverse=True\)",
        ),
        (
            {
                "x_train": np.array([{"a": 1}] * 4, dtype=object),
                "y_train": np.zeros(4, int),
                "x_test": np.zeros((2, 2)),
                "y_test": np.zeros(2, int),
            },
            "would need pickle",
        ),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.zeros(4, int),
                "x_test": np.array([[0.0, 1e300], [0.0, 0.0]]),  # float32's inf
                "y_test": np.zeros(2, int),
            },
            "x_test holds 1 value not finite as float32",
        ),
        (
            {
                "x_train": np.zeros((4, 2), np.complex64),
                "y_train": np.arange(4),
                "x_test": np.zeros((2, 2)),
                "y_test": np.arange(2),
            },
            r"x_train must be real numbers \(or booleans\) with 2 to 4 dimensions, got complex64",
        ),
        (
            {
                "x_train": np.zeros((4, 0)),
                "y_train": np.arange(4),
                "x_test": np.zeros((2, 0)),
                "y_test": np.arange(2),
            },
            r"x_train's examples hold no values \(shape \[4, 0\]\)",
        ),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.arange(4),
                "x_test": np.zeros((0, 2)),
                "y_test": np.zeros(0, int),
            },
            r": x_test is empty \(shape \[0, 2\]\)$",
        ),
        (
            {
                "x_train": np.zeros((4, 8, 8)),  # grey images: 8×8×1 once a channel is added
                "y_train": np.arange(4),
                "x_test": np.zeros((2, 10, 10, 1)),
                "y_test": np.arange(2),
            },
            "x_test's examples are 10×10×1, x_train's 8×8×1",
        ),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.array([0, 1, 2, 2**31], np.uint64),  # int32 would wrap it to < 0
                "x_test": np.zeros((2, 2)),
                "y_test": np.arange(2),
            },
            "y_train: labels must be at most 2,147,483,646 .* found 2,147,483,648",
        ),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.arange(4),
                "x_test": np.zeros((2, 2)),
                "y_test": np.array([0, -1]),  # which array: a user's test labels counted from -1
            },
            r"y_test: labels must be ≥ 0 \(class indices from 0\), found -1",
        ),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.zeros(4, int),
                "x_test": np.zeros((2, 2)),
                "y_test": np.zeros(2, int),
            },
            "every label is 0: a classifier needs at least two classes",
        ),
    ],
    ids=[
        "missing-keys",
        "label-count",
        "float-labels",
        "one-hot-labels",
        "named-labels",
        "needs-pickle",
        "beyond-float32",
        "complex",
        "no-values",
        "no-test-examples",
        "shapes-differ",
        "label-beyond-int32",
        "negative-test-label",
        "one-class",
    ],
)
def test_a_bad_npz_is_refused_naming_the_field(
    tmp_path: Path, arrays: dict[str, np.ndarray], message: str
) -> None:
    spec = _npz(tmp_path / "bad.npz", **arrays)

    with pytest.raises(ValidationError, match=message) as caught:
        load_dataset(spec)
    assert caught.value.field == "dataset.path"


def test_a_corrupt_or_missing_npz_is_refused(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"PK\x03\x04 this is not a zip archive")

    with pytest.raises(ValidationError, match=r"not a valid \.npz") as caught:
        load_dataset(NpzSpec(path=str(corrupt)))
    assert caught.value.field == "dataset.path"
    plain = tmp_path / "plain.npz"
    plain.write_bytes(b"x_train,y_train\n1,2\n")
    with pytest.raises(ValidationError, match=r"not a \.npz archive"):
        load_dataset(NpzSpec(path=str(plain)))
    with pytest.raises(ValidationError, match="no such file"):
        load_dataset(NpzSpec(path=str(tmp_path / "absent.npz")))


def test_a_compressed_npz_too_large_to_hold_is_refused_from_its_headers(tmp_path: Path) -> None:
    # 275 million zeros compress to ~260 KB: decompressed as float32 they would take 1.1 GB.
    images = np.zeros((4200, 256, 256), np.uint8)
    bomb = tmp_path / "bomb.npz"
    labels = np.arange(4200) % 10
    np.savez_compressed(bomb, x_train=images, y_train=labels, x_test=images[:1], y_test=labels[:1])
    del images

    tracemalloc.start()
    try:
        with pytest.raises(ValidationError, match="more than the 268,435,456") as caught:
            load_dataset(NpzSpec(path=str(bomb)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert bomb.stat().st_size < 1 << 20
    assert "x_train and x_test hold 275,316,736 values" in str(caught.value)
    assert peak < 1 << 20  # headers read, no array


def test_an_npz_with_an_encrypted_array_is_refused_naming_it(tmp_path: Path) -> None:
    # zipfile raises RuntimeError for a member saved with a password: an upload of one was a 500.
    spec = _npz(
        tmp_path / "locked.npz",
        x_train=np.zeros((4, 2), np.float32),
        y_train=np.zeros(4, np.int64),
        x_test=np.zeros((2, 2), np.float32),
        y_test=np.zeros(2, np.int64),
    )
    data = bytearray(Path(spec.path).read_bytes())
    for signature, flags in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local, central headers
        at = data.find(signature)
        while at != -1:
            data[at + flags] |= 0x1  # the general purpose flag's bit 0: encrypted
            at = data.find(signature, at + 4)
    Path(spec.path).write_bytes(data)

    with pytest.raises(ValidationError, match="x_train is encrypted") as caught:
        load_dataset(spec)

    assert caught.value.field == "dataset.path"


def test_an_npz_whose_compressed_array_is_damaged_is_refused_naming_it(tmp_path: Path) -> None:
    # A damaged deflate stream raises zlib.error, which no caller expected: a 500.
    spec = NpzSpec(path=str(tmp_path / "damaged.npz"))
    rng = np.random.default_rng(0)
    x, y = rng.random((200, 8)).astype(np.float32), np.zeros(200, np.int64)
    np.savez_compressed(spec.path, x_train=x, y_train=y, x_test=x[:5], y_test=y[:5])
    with zipfile.ZipFile(spec.path) as archive:
        member = archive.getinfo("x_train.npy")
    data = bytearray(Path(spec.path).read_bytes())
    start = member.header_offset + 30 + len(member.filename) + len(member.extra)  # its data
    for at in range(start + 200, start + 250):
        data[at] ^= 0x5A
    Path(spec.path).write_bytes(data)

    with pytest.raises(ValidationError, match=r"is not a valid \.npz: Error -3") as caught:
        load_dataset(spec)

    assert caught.value.field == "dataset.path"


def test_a_damaged_npz_is_loaded_or_refused_naming_it_never_anything_else(tmp_path: Path) -> None:
    # 2,000 files damaged at random (bytes changed, cut short, inserted, deleted), stored and
    # deflated: zlib's error and zipfile's NotImplementedError (a later zip version's) escaped.
    rng = np.random.default_rng(0)
    x, y = rng.random((60, 8)).astype(np.float32), np.arange(60) % 3
    originals = []
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "original.npz", x_train=x, y_train=y, x_test=x[:6], y_test=y[:6])
        originals.append((tmp_path / "original.npz").read_bytes())
    damage = random.Random(0)
    spec = NpzSpec(path=str(tmp_path / "damaged.npz"))
    outcomes: collections.Counter[str] = collections.Counter()

    for _ in range(2_000):
        data = bytearray(damage.choice(originals))
        at = damage.randrange(len(data))
        match damage.randrange(4):
            case 0:
                data[at] = damage.randrange(256)
            case 1:
                del data[max(at, 4) :]
            case 2:
                data[at:at] = damage.randbytes(damage.randint(1, 20))
            case _:
                del data[at : at + damage.randint(1, 40)]
        Path(spec.path).write_bytes(data)
        try:
            load_dataset(spec)
        except ValidationError as exc:
            outcomes[f"refused, {exc.field}"] += 1
        else:
            outcomes["loaded"] += 1  # a byte no reader looks at (a header's date, say)

    assert set(outcomes) <= {"refused, dataset.path", "loaded"}
    assert outcomes["refused, dataset.path"] > 1_500


@pytest.mark.parametrize("shape", [(2, 2, 2, 2), (0, 8), (5000, 1)])
def test_a_synthetic_shape_that_is_not_an_image_is_refused(shape: tuple[int, ...]) -> None:
    with pytest.raises(PydanticValidationError, match="must be 1 to 3 dimensions of 1 to 4096"):
        SyntheticSpec(shape=shape)


def test_a_synthetic_set_larger_than_a_gibibyte_is_refused() -> None:
    with pytest.raises(PydanticValidationError, match="1 GiB"):
        SyntheticSpec(shape=(64, 64, 3), train_size=100_000)


@pytest.mark.parametrize(
    ("fraction", "part"), [(0.9999999999999999, "training"), (1e-9, "test"), (0.00027, "test")]
)
def test_a_digits_test_fraction_that_leaves_a_part_empty_is_refused(
    fraction: float, part: str
) -> None:
    with pytest.raises(PydanticValidationError, match=f"leaves no {part} images"):
        DigitsSpec(test_fraction=fraction)


@pytest.mark.parametrize("fraction", [0.0003, 0.9997])
def test_the_extreme_digits_test_fractions_leave_some_of_both(fraction: float) -> None:
    data = load_dataset(DigitsSpec(test_fraction=fraction))

    assert len(data.y_train) > 0
    assert len(data.y_test) > 0
    assert len(data.y_train) + len(data.y_test) == DIGITS_IMAGES


def test_inputs_that_are_not_finite_are_counted_and_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A NaN in a data set makes every loss NaN: refused as it is read (an upload, a job's spec),
    # counted a few rows at a time.
    monkeypatch.setattr(datasets, "NONFINITE_CHECK_VALUES", 5)  # two rows of two
    x_train = np.zeros((7, 2), dtype=np.float32)
    x_train[[0, 3, 6], [1, 0, 1]] = [np.nan, np.inf, -np.inf]
    spec = _npz(
        tmp_path / "nan.npz",
        x_train=x_train,
        y_train=np.zeros(7, int),
        x_test=np.zeros((2, 2)),
        y_test=np.zeros(2, int),
    )

    with pytest.raises(ValidationError, match="x_train holds 3 values not finite as float32"):
        load_dataset(spec)


def test_a_process_holds_one_data_set_at_a_time(tmp_path: Path) -> None:
    # Arrange: a 16 MiB data set, and what loading it alone holds at its peak.
    path = tmp_path / "set.npz"
    rng = np.random.default_rng(0)
    np.savez(
        path,
        x_train=rng.random((4096, 1024), dtype=np.float32),
        y_train=rng.integers(0, 10, 4096),
        x_test=rng.random((16, 1024), dtype=np.float32),
        y_test=rng.integers(0, 10, 16),
    )
    spec = NpzSpec(path=str(path))
    tracemalloc.start()
    try:
        load_dataset(spec)
        _, alone = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()

        # Execute: four threads load it at the same moment (uploads checked, jobs staged).
        start = threading.Barrier(4)

        def load() -> None:
            start.wait()
            load_dataset(spec)

        threads = [threading.Thread(target=load) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        _, together = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # Assert: they took turns, one data set held at a time (3.4-3.8 times as much without).
    assert alone > 16 * 2**20
    assert together < 1.5 * alone
