"""Weights and training state as safetensors bytes: what crosses the store, never pickle."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from faasdl.errors import ValidationError


def pack(
    arrays: list[np.ndarray], *, metadata: dict[str, str] | None = None, **groups: list[np.ndarray]
) -> bytes:
    """One safetensors file: ``arrays`` as ``w/0000…`` and each named group as ``<name>/0000…``."""
    return pack_groups({"w": arrays, **groups}, metadata=metadata)


def pack_groups(
    groups: dict[str, list[np.ndarray]], *, metadata: dict[str, str] | None = None
) -> bytes:
    """One safetensors file of named groups of arrays (what :func:`unpack` returns)."""
    # np.ascontiguousarray would turn 0-d arrays (the step counter) into 1-d; asarray does not.
    tensors = {
        f"{group}/{i:04d}": np.asarray(a, order="C")
        for group, values in groups.items()
        for i, a in enumerate(values)
    }
    return st_save(tensors, metadata=metadata)


def unpack(data: bytes) -> dict[str, list[np.ndarray]]:
    """The groups ``pack`` wrote, each in its original order (``w`` holds the weights)."""
    groups: dict[str, list[tuple[str, np.ndarray]]] = {}
    for key, array in st_load(data).items():
        group, _, index = key.partition("/")
        groups.setdefault(group, []).append((index, array))
    return {group: [a for _, a in sorted(items)] for group, items in groups.items()}


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

    def to_bytes(self) -> bytes:
        """Arrays as tensors; the counters (JSON numbers round-trip exactly) as metadata."""
        meta = {k: v for k, v in vars(self).items() if k not in _ARRAYS}
        return pack(self.weights, metadata={"faasdl": json.dumps(meta)}, opt=self.optimizer)

    @classmethod
    def from_bytes(cls, data: bytes) -> TrainState:
        groups = unpack(data)
        return cls(weights=groups.get("w", []), optimizer=groups.get("opt", []), **_metadata(data))


_ARRAYS = ("weights", "optimizer")


def _metadata(data: bytes) -> dict[str, Any]:
    # safetensors reads metadata from files only; its header is 8 bytes of length then JSON.
    size = int.from_bytes(data[:8], "little")
    try:
        header = json.loads(data[8 : 8 + size])
        meta: dict[str, Any] = json.loads(header["__metadata__"]["faasdl"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValidationError("not a faasdl training state", field="checkpoint") from exc
    return meta
