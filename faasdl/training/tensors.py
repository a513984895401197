"""Weights and training state as safetensors data: what crosses the store, never pickle.

A large model's arrays are written and read without a second copy. ``safetensors.numpy``'s ``save``
returns one ``bytes`` made from a copy of every array (and its ``load`` copies every array out of
the file): the training action's peak was the end of an attempt, its state's arrays, their copies
and the file all held at once, and in a later round the start, the global model's file and the
arrays copied out of it (VGG16 on 32×32 images, rounds 0-2 in one process: 2674-2734 MB, now
1984-2078; ResNet50 2337-2365, now 1667-1830). The format is an 8-byte little-endian header length,
a JSON header (each tensor's dtype, shape and byte range) padded with spaces to 8 bytes, then the
tensors' bytes; :func:`encode` writes the header and hands the arrays' own buffers over as pieces
(:meth:`~faasdl.store.base.StateStore.put_blob` takes them), and :func:`decode` returns arrays that
are views of the file's bytes. ``safetensors`` reads what they write and they read what it writes
(``tests/training/test_tensors.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from faasdl.errors import ValidationError
from faasdl.store.base import Buffer, Pieces, Streamed

#: The safetensors dtype names of the dtypes faasdl's arrays have.
DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(dtype).newbyteorder("<")
    for name, dtype in {
        "F64": np.float64,
        "F32": np.float32,
        "F16": np.float16,
        "I64": np.int64,
        "I32": np.int32,
        "I16": np.int16,
        "I8": np.int8,
        "U64": np.uint64,
        "U32": np.uint32,
        "U16": np.uint16,
        "U8": np.uint8,
        "BOOL": np.bool_,
    }.items()
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
_T = TypeVar("_T")


def encode(
    groups: dict[str, list[np.ndarray]], *, metadata: dict[str, str] | None = None
) -> Pieces:
    """One safetensors file of named groups of arrays (each ``<group>/0000…``): see
    :func:`encode_tensors`."""
    return encode_tensors(_named(groups), metadata=metadata)


def _named(groups: dict[str, list[_T]]) -> dict[str, _T]:
    """Each group's values named ``<group>/0000…``, in order."""
    return {f"{group}/{i:04d}": v for group, values in groups.items() for i, v in enumerate(values)}


def encode_tensors(
    named: dict[str, np.ndarray], *, metadata: dict[str, str] | None = None
) -> Pieces:
    """One safetensors file of named arrays, as pieces: its header, then views of the arrays
    (copied only where one is not C-ordered little-endian). The arrays must not change until the
    pieces are written. The widest items come first, so that every array starts aligned to its
    item in a file whose start is (what :func:`decode` views)."""
    arrays = {key: _little(key, value) for key, value in named.items()}
    header, order, _ = _layout({key: (a.shape, a.dtype) for key, a in arrays.items()}, metadata)
    return (header, *(_bytes_of(arrays[key]) for key in order))


@dataclass(frozen=True)
class Lazy:
    """An array read only when its bytes are to be written: its shape and dtype, and how to read
    it, whole or as consecutive blocks along its first axis (a model's variable, a few MiB at a
    time)."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    read: Callable[[], Iterable[np.ndarray]]


def encode_streamed(named: dict[str, Lazy], *, metadata: dict[str, str] | None = None) -> Streamed:
    """:func:`encode_tensors` of arrays read a block at a time as the file is written, each block
    let go once its bytes are: what is held beside what they are read from is a block, not the
    arrays. What they are read from must not change until the file is written."""
    specs = {key: (lazy.shape, _little_dtype(key, lazy.dtype)) for key, lazy in named.items()}
    header, order, size = _layout(specs, metadata)

    def pieces() -> Iterator[Buffer]:
        yield header
        for key in order:
            shape, dtype = specs[key]
            left = math.prod(shape) * dtype.itemsize
            for value in named[key].read():
                block = _little(key, value)
                if block.dtype != dtype or block.shape[1:] != shape[1:] or block.nbytes > left:
                    raise ValueError(f"{key} ({shape} {dtype}) read a block of {block.shape}")
                left -= block.nbytes
                yield _bytes_of(block)
                del block  # before the next is read: the writer has let its bytes go
            if left:
                raise ValueError(f"{key} ({shape} {dtype}) read {left} bytes short")

    return Streamed(size=len(header) + size, pieces=pieces())


def _little_dtype(key: str, dtype: np.dtype[Any]) -> np.dtype[Any]:
    little = np.dtype(dtype).newbyteorder("<")
    if little not in _NAMES:
        raise ValidationError(f"arrays of {dtype} cannot be stored", field=key.partition("/")[0])
    return little


def _little(key: str, value: np.ndarray) -> np.ndarray:
    """``value`` as a C-ordered little-endian array of a dtype safetensors has (a copy only where
    it is not one)."""
    array = np.asarray(value)
    # asarray keeps a 0-d array (the step counter) 0-d; ascontiguousarray would not.
    return np.asarray(array, dtype=_little_dtype(key, array.dtype), order="C")


def _bytes_of(array: np.ndarray) -> memoryview:
    return array.reshape(-1).view(np.uint8).data


def _layout(
    specs: dict[str, tuple[tuple[int, ...], np.dtype[Any]]], metadata: dict[str, str] | None
) -> tuple[bytes, list[str], int]:
    """The header of a file of arrays of ``specs``' shapes and little-endian dtypes, its arrays'
    order (the widest items first: stable, groups keep their order) and their bytes in all."""
    order = sorted(specs, key=lambda key: -specs[key][1].itemsize)
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for key in order:
        shape, dtype = specs[key]
        nbytes = math.prod(shape) * dtype.itemsize
        header[key] = {
            "dtype": _NAMES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, order, offset


def pack(
    arrays: list[np.ndarray], *, metadata: dict[str, str] | None = None, **groups: list[np.ndarray]
) -> Pieces:
    """:func:`encode` of ``arrays`` as group ``w`` (the weights) and each named group."""
    return encode({"w": arrays, **groups}, metadata=metadata)


def pack_streamed(
    arrays: list[Lazy], *, metadata: dict[str, str] | None = None, **groups: list[Lazy]
) -> Streamed:
    """:func:`pack` of arrays read one at a time as the file is written: see
    :func:`encode_streamed`."""
    return encode_streamed(_named({"w": arrays, **groups}), metadata=metadata)


def decode(
    data: Buffer, *, what: str = "data"
) -> tuple[dict[str, list[np.ndarray]], dict[str, str]]:
    """The groups of arrays a safetensors file holds (each in its original order; ``w`` holds the
    weights; an array named without a ``/`` is its group's one array) and its metadata. The
    arrays are views of ``data`` (read-only when it is ``bytes``): nothing is copied. Raises
    ``ValidationError`` naming ``what`` when ``data`` is not a safetensors file."""
    view = memoryview(data).cast("B")
    try:
        size = int.from_bytes(view[:8], "little")
        if len(view) < 8 or size > len(view) - 8:
            raise ValueError(f"a header of {size} bytes in {len(view)}")
        metadata, entries = _header(view[8 : 8 + size])
        body = view[8 + size :]
        groups: dict[str, list[np.ndarray]] = {}
        for entry in entries:
            if entry.end > len(body):
                raise ValueError(entry.said)
            array = np.frombuffer(body, entry.dtype, math.prod(entry.shape), entry.begin)
            groups.setdefault(entry.group, []).append(array.reshape(entry.shape))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValidationError(f"not a safetensors file ({exc})", field=what) from exc
    return groups, metadata


@dataclass(frozen=True)
class _Entry:
    """One array a safetensors header names, with its place in its group's order."""

    key: str
    group: str
    position: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    begin: int  # its bytes in the file's body
    end: int

    @property
    def said(self) -> str:
        return _said(self.key, self.begin, self.end, self.shape, self.dtype)


def _said(key: str, begin: int, end: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> str:
    """How an array whose bytes do not fit is named in a refusal."""
    return f"{key}: bytes {begin}-{end} for {shape} {dtype}"


def _header(text: Buffer) -> tuple[dict[str, str], list[_Entry]]:
    """A safetensors header's metadata and arrays, by group (in the order the groups first
    come) and in each group by name; raises ``ValueError``, ``KeyError`` or ``TypeError`` where
    it is not one."""
    header = json.loads(bytes(text))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    metadata: dict[str, str] = header.pop("__metadata__", None) or {}
    named: dict[str, list[tuple[str, str, np.dtype[Any], tuple[int, ...], int, int]]] = {}
    for key, info in header.items():
        dtype = DTYPES[info["dtype"]]
        shape = tuple(int(n) for n in info["shape"])
        begin, end = (int(n) for n in info["data_offsets"])
        if not 0 <= begin <= end or end - begin != math.prod(shape) * dtype.itemsize:
            raise ValueError(_said(key, begin, end, shape, dtype))
        group, _, index = key.partition("/")
        named.setdefault(group, []).append((index, key, dtype, shape, begin, end))
    return metadata, [
        _Entry(key, group, position, dtype, shape, begin, end)
        for group, found in named.items()  # keys are unique: sorted by index, then name
        for position, (_, key, dtype, shape, begin, end) in enumerate(sorted(found))
    ]


class TensorStream:
    """A safetensors file read a piece at a time (the pieces :meth:`StateStore.read_blob
    <faasdl.store.base.StateStore.read_blob>` yields): its header read as it is made, then each
    array handed out once its bytes have come, so that a reader that puts each where it goes
    holds one array and one piece, never the file. ``shapes`` and ``dtypes``: each group's
    arrays', in the order :func:`decode` gives them; ``metadata``: the file's. Raises
    ``ValidationError`` naming ``what`` where the data is not a safetensors file (a short one: as
    it is read)."""

    def __init__(self, pieces: Iterable[Buffer], *, what: str = "data") -> None:
        self.what = what
        self._pieces = iter(pieces)
        self._held = bytearray()  # bytes read and not yet handed out
        try:
            self._fill(8)
            if len(self._held) < 8:
                raise ValueError(f"a file of {len(self._held)} bytes")
            size = int.from_bytes(self._held[:8], "little")
            self._fill(8 + size)
            if len(self._held) < 8 + size:
                raise ValueError(f"a header of {size} bytes in {len(self._held) - 8}")
            self.metadata, entries = _header(self._held[8 : 8 + size])
            del self._held[: 8 + size]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValidationError(f"not a safetensors file ({exc})", field=what) from exc
        self.shapes: dict[str, list[tuple[int, ...]]] = {}
        self.dtypes: dict[str, list[np.dtype[Any]]] = {}
        for entry in entries:
            self.shapes.setdefault(entry.group, []).append(entry.shape)
            self.dtypes.setdefault(entry.group, []).append(entry.dtype)
        # In the file's order, an empty array before the one that starts where it does.
        self._entries = sorted(entries, key=lambda e: (e.begin, e.end))

    def __iter__(self) -> Iterator[tuple[str, int, np.ndarray]]:
        """Each array as ``(group, position, array)``, in the file's order; each a new array,
        its own (the next one reads into another)."""
        at = 0  # the file's body offset of the first byte held
        for entry in self._entries:
            if entry.begin != at:  # as safetensors itself, no holes and no overlaps
                raise ValidationError(
                    f"not a safetensors file (its array {entry.group}/{entry.position} starts "
                    f"at byte {entry.begin}, not {at})",
                    field=self.what,
                )
            out = np.empty(entry.end - entry.begin, np.uint8)
            filled = self._read_into(out)
            if filled < len(out):
                raise ValidationError(
                    f"not a safetensors file (it ends {len(out) - filled} bytes short of its "
                    f"array {entry.group}/{entry.position})",
                    field=self.what,
                )
            at = entry.end
            yield entry.group, entry.position, out.view(entry.dtype).reshape(entry.shape)
            del out  # before the next is made: the reader may have let it go

    def _fill(self, size: int) -> None:
        """Read pieces until ``size`` bytes are held (fewer at the file's end)."""
        while len(self._held) < size:
            piece = next(self._pieces, None)
            if piece is None:
                return
            self._held += memoryview(piece).cast("B")

    def _read_into(self, out: np.ndarray) -> int:
        """Move the next ``len(out)`` bytes into ``out``; the bytes moved (fewer at the end)."""
        filled = 0
        while filled < len(out):
            if not self._held:
                piece = next(self._pieces, None)
                if piece is None:
                    break
                view = memoryview(piece).cast("B")
                taken = min(len(view), len(out) - filled)
                out[filled : filled + taken] = np.frombuffer(view[:taken], np.uint8)
                filled += taken
                self._held += view[taken:]  # the next array's first bytes
                continue
            taken = min(len(self._held), len(out) - filled)
            out[filled : filled + taken] = np.frombuffer(self._held, np.uint8, count=taken)
            del self._held[:taken]
            filled += taken
        return filled


def unpack(data: Buffer, *, what: str = "data") -> dict[str, list[np.ndarray]]:
    """The groups :func:`pack` wrote (views of ``data``: see :func:`decode`)."""
    return decode(data, what=what)[0]


@dataclass
class TrainState:
    """Everything a training attempt needs to resume exactly where another one stopped.

    ``step`` counts the batches of ``epoch`` already applied; the data order of an epoch is a pure
    function of (seed, epoch), so no RNG state is needed beyond those two numbers.
    """

    weights: list[np.ndarray]
    optimizer: list[np.ndarray] = field(default_factory=list)
    epoch: int = 0
    step: int = 0
    loss_sum: float = 0.0
    correct: int = 0
    seen: int = 0
    epochs: list[dict[str, float]] = field(default_factory=list)

    def encode(self) -> Pieces:
        """Arrays as tensors (views: see :func:`encode`); the counters (JSON numbers round-trip
        exactly) as metadata."""
        meta = {k: v for k, v in vars(self).items() if k not in _ARRAYS}
        return pack(self.weights, metadata={"faasdl": json.dumps(meta)}, opt=self.optimizer)

    def to_bytes(self) -> bytes:
        return b"".join(self.encode())  # a copy: for small states

    @classmethod
    def from_bytes(cls, data: Buffer) -> TrainState:
        """The state :meth:`encode` wrote; its arrays are views of ``data``."""
        groups, metadata = decode(data, what="checkpoint")
        counters = cls.counters_of(metadata)
        return replace(counters, weights=groups.get("w", []), optimizer=groups.get("opt", []))

    @classmethod
    def counters_of(cls, metadata: dict[str, str]) -> TrainState:
        """The counters (no arrays) of the state whose file's metadata is ``metadata``."""
        try:
            counters: dict[str, Any] = json.loads(metadata["faasdl"])
            return cls(weights=[], **counters)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValidationError("not a faasdl training state", field="checkpoint") from exc


_ARRAYS = ("weights", "optimizer")
