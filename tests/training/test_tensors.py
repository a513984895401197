"""Safetensors files written and read without copies of their arrays (faasdl.training.tensors)."""

from __future__ import annotations

import tracemalloc
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from faasdl.config import StoreSettings
from faasdl.errors import ValidationError
from faasdl.store import make_store
from faasdl.training.tensors import (
    DTYPES,
    Lazy,
    TensorStream,
    TrainState,
    decode,
    encode,
    pack,
    pack_streamed,
    unpack,
)

MIB = 1024 * 1024


def arrays() -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    return {
        "w": [rng.normal(size=(3, 5)).astype(np.float32), np.zeros((0, 4), np.float32)],
        "opt": [
            np.asarray(7, np.int64),
            rng.normal(size=9).astype(np.float16),
            *(np.arange(4).astype(dtype) for dtype in DTYPES.values()),
        ],
    }


def test_safetensors_reads_what_encode_writes_and_decode_reads_what_it_writes() -> None:
    groups = arrays()

    ours = b"".join(encode(groups, metadata={"note": "kept"}))
    theirs = st_save(
        {f"{g}/{i:04d}": a for g, values in groups.items() for i, a in enumerate(values)},
        metadata={"note": "kept"},
    )

    for data in (ours, theirs):
        read_by_safetensors = st_load(data)
        read_here, metadata = decode(data)
        assert metadata == {"note": "kept"}
        for group, values in groups.items():
            for i, expected in enumerate(values):
                for got in (read_by_safetensors[f"{group}/{i:04d}"], read_here[group][i]):
                    assert got.dtype == expected.dtype
                    assert got.shape == expected.shape
                    assert np.array_equal(got, expected)


def test_pieces_view_the_arrays_and_decoded_arrays_view_the_data() -> None:
    big = np.arange(1000, dtype=np.float32)
    step = np.asarray(3, np.int64)

    pieces = encode({"w": [big], "opt": [step]})
    data = bytearray(b"".join(pieces))
    [back], [back_step] = unpack(data)["w"], unpack(data)["opt"]

    assert any(np.shares_memory(np.asarray(p), big) for p in pieces[1:])
    assert np.shares_memory(back, np.frombuffer(data, np.uint8))
    assert back.flags.aligned  # the widest items first
    assert back_step.flags.aligned
    assert back.flags.writeable  # a bytearray's views are; a bytes object's are read-only
    assert not unpack(bytes(data))["w"][0].flags.writeable


def test_a_training_state_round_trips_with_its_counters() -> None:
    state = TrainState(
        weights=arrays()["w"],
        optimizer=arrays()["opt"],
        epoch=2,
        step=5,
        loss_sum=1.25,
        correct=7,
        seen=9,
        epochs=[{"loss": 0.5, "accuracy": 0.75}],
    )

    back = TrainState.from_bytes(bytearray(state.to_bytes()))

    assert (back.epoch, back.step, back.loss_sum, back.correct, back.seen, back.epochs) == (
        2,
        5,
        1.25,
        7,
        9,
        [{"loss": 0.5, "accuracy": 0.75}],
    )
    assert all(np.array_equal(a, b) for a, b in zip(back.optimizer, state.optimizer, strict=True))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"short", "a header of"),
        ((2**40).to_bytes(8, "little") + b"{}", "a header of"),
        (len(b"[1]").to_bytes(8, "little") + b"[1]", "not a JSON object"),
        (b"".join(pack([np.ones(4, np.float32)]))[:-4], "w/0000: bytes 0-16"),
        (st_save({"w/0000": np.ones(2, np.complex64)}), "C64"),
    ],
)
def test_what_is_not_a_safetensors_file_is_refused_naming_the_field(
    data: bytes, message: str
) -> None:
    with pytest.raises(ValidationError, match=message) as caught:
        decode(data, what="weights_in")

    assert caught.value.field == "weights_in"


def test_a_state_without_its_counters_is_not_a_training_state() -> None:
    with pytest.raises(ValidationError, match="not a faasdl training state") as caught:
        TrainState.from_bytes(b"".join(pack([np.ones(2, np.float32)])))

    assert caught.value.field == "checkpoint"


def test_arrays_of_a_dtype_safetensors_has_no_name_for_are_refused() -> None:
    with pytest.raises(ValidationError, match="arrays of complex64 cannot be stored") as caught:
        encode({"opt": [np.ones(2, np.complex64)]})

    assert caught.value.field == "opt"


def test_a_model_crosses_the_store_without_a_second_copy_of_its_arrays(tmp_path: Path) -> None:
    # Traced allocations (NumPy's arrays, bytes and bytearrays): the old path (safetensors'
    # save, a joined blob, its load) held three copies of the state besides the state itself.
    store = make_store(StoreSettings(), f"sqlite:///{tmp_path / 'state.db'}")
    state = TrainState(weights=[np.ones(4 * MIB, np.float32) for _ in range(8)])  # 128 MiB
    size = sum(a.nbytes for a in state.weights)
    with store:
        tracemalloc.start()
        try:
            store.put_blob("model", state.encode())
            _, written_peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            back = TrainState.from_bytes(store.get_blob("model"))
            _, read_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()

    assert written_peak < 0.25 * size, f"writing held {written_peak / MIB:.0f} MiB"
    assert read_peak < 1.25 * size, f"reading held {read_peak / MIB:.0f} MiB: the file and more"
    assert all(np.array_equal(a, b) for a, b in zip(back.weights, state.weights, strict=True))


@pytest.mark.parametrize("piece", [1, 7, 64, 4096, 1 << 30])
def test_a_stream_of_pieces_hands_out_the_arrays_decode_reads(piece: int) -> None:
    # Pieces of any size: a byte at a time, pieces that end inside the header and inside arrays
    # (every array of `arrays()` is under 64 bytes), and the file whole.
    data = b"".join(encode(arrays(), metadata={"note": "kept"}))
    pieces = (data[i : i + piece] for i in range(0, len(data), piece))

    stream = TensorStream(pieces, what="weights_in")
    read = list(stream)

    groups, _ = decode(data)
    assert stream.shapes == {g: [a.shape for a in values] for g, values in groups.items()}
    assert sorted((g, i) for g, i, _ in read) == sorted(
        (g, i) for g, values in groups.items() for i in range(len(values))
    )
    for group, position, array in read:
        expected = groups[group][position]
        assert (array.dtype, array.shape) == (expected.dtype, expected.shape)
        assert np.array_equal(array, expected)


def holed() -> bytes:
    """A file whose one array starts 8 bytes into the body (safetensors refuses such holes)."""
    header = b'{"w/0000":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}'
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + bytes(24)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01\x00", "a file of 2 bytes"),
        ((100).to_bytes(8, "little") + b"{}", "a header of 100 bytes in 2"),
        (len(b"[1]").to_bytes(8, "little") + b"[1]", "not a JSON object"),
        (b"".join(pack([np.ones(4, np.float32)]))[:-4], "ends 4 bytes short of its array w/0"),
        (holed(), "its array w/0 starts at byte 8, not 0"),
    ],
)
def test_a_stream_that_is_not_a_safetensors_file_is_refused_naming_the_field(
    data: bytes, message: str
) -> None:
    with pytest.raises(ValidationError, match=message) as caught:
        list(TensorStream([data[:5], data[5:]], what="weights_in"))

    assert caught.value.field == "weights_in"


def test_a_streamed_model_is_read_holding_an_array_and_a_chunk_not_the_file(
    tmp_path: Path,
) -> None:
    # Traced allocations: read whole (get_blob, then decode's views), the file is held; read
    # as a stream whose arrays are each let go before the next (as a trainer sets them), one
    # array and a chunk or two.
    store = make_store(StoreSettings(), f"sqlite:///{tmp_path / 'state.db'}")
    state = TrainState(weights=[np.full(4 * MIB, i, np.float32) for i in range(8)])  # 128 MiB
    size, largest = sum(a.nbytes for a in state.weights), state.weights[0].nbytes
    with store:
        store.put_blob("model", state.encode())
        tracemalloc.start()
        try:
            sums = {}
            for _, position, array in TensorStream(store.read_blob("model")[1]):
                sums[position] = float(array[0])
                del array  # as a trainer lets each go once it is set
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        chunk = store.chunk_bytes

    assert sums == {i: float(i) for i in range(8)}
    assert peak < largest + 3 * chunk, f"reading held {peak / MIB:.0f} MiB of {size / MIB:.0f}"


def lazily(array: np.ndarray, rows: int | None, alive: list[weakref.ref[np.ndarray]]) -> Lazy:
    """``array`` read ``rows`` at a time (whole where ``None``), each block a copy of its own
    whose life ``alive`` follows."""

    def read() -> Iterator[np.ndarray]:
        whole = rows is None or array.ndim == 0
        for start in [0] if whole else range(0, len(array), rows or 1):
            block = (array if whole else array[start : start + (rows or 1)]).copy()
            alive.append(weakref.ref(block))
            yield block

    return Lazy(shape=array.shape, dtype=array.dtype, read=read)


@pytest.mark.parametrize("rows", [None, 1, 2])
def test_a_streamed_file_is_encodes_file_its_arrays_read_a_block_at_a_time(
    rows: int | None,
) -> None:
    groups = arrays()
    alive: list[weakref.ref[np.ndarray]] = []
    lazy = {g: [lazily(a, rows, alive) for a in values] for g, values in groups.items()}

    streamed = pack_streamed(lazy["w"], metadata={"note": "kept"}, opt=lazy["opt"])
    pieces = iter(streamed.pieces)
    data = bytearray(next(pieces))
    assert alive == []  # the header is made from shapes and dtypes alone
    for piece in pieces:
        data += piece
        # The piece's block alone: each is let go before the next is read.
        assert sum(block() is not None for block in alive) == 1

    assert bytes(data) == b"".join(pack(groups["w"], metadata={"note": "kept"}, opt=groups["opt"]))
    assert len(data) == streamed.size
    assert len(alive) == sum(
        1 if rows is None or a.ndim == 0 else -(-len(a) // rows)
        for values in groups.values()
        for a in values
    )


@pytest.mark.parametrize(
    ("blocks", "message"),
    [
        ([np.ones((2, 4), np.float32)], r"read 32 bytes short"),
        ([np.ones((4, 4), np.float32), np.ones((1, 4), np.float32)], r"read a block of \(1, 4\)"),
        ([np.ones((4, 2), np.float32)], r"read a block of \(4, 2\)"),
        ([np.ones((4, 4), np.float64)], r"read a block of \(4, 4\)"),
    ],
)
def test_a_lazy_array_that_reads_another_than_it_said_is_refused(
    blocks: list[np.ndarray], message: str
) -> None:
    lazy = Lazy(shape=(4, 4), dtype=np.dtype(np.float32), read=lambda: iter(blocks))

    with pytest.raises(ValueError, match=rf"w/0000 \(\(4, 4\) float32\) {message}"):
        b"".join(pack_streamed([lazy]).pieces)


def test_a_lazy_array_of_a_dtype_safetensors_has_no_name_for_is_refused_before_it_is_read() -> None:
    lazy = Lazy(shape=(2,), dtype=np.dtype(np.complex64), read=lambda: iter([]))

    with pytest.raises(ValidationError, match="arrays of complex64 cannot be stored") as caught:
        pack_streamed([], opt=[lazy])

    assert caught.value.field == "opt"
