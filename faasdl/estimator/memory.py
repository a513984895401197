"""Memory of one training action, from the model, the batch, the shard and the runtime.

A training action's peak resident memory is, to a good approximation,

    baseline + k_p·P + k_a·A·b + k_s·S + k_l·L

where the baseline is the runtime with TensorFlow imported and a tiny model trained (measured once
per environment by the action itself and kept in the store), P the parameter bytes, A the
activation bytes one example produces in a forward pass, b the batch size, S the shard's bytes and
L the number of layers. The coefficients count copies: k_p the weights and two Adam moments (3P),
their gradients, the job's initial weights a warm container keeps, a checkpoint's snapshot of
weights and moments held while it is written as training goes on (3P), and what reads and writes
the state (the final state is written a block of a variable at a time, and a global model or a
checkpoint set an array at a time as it is read: a variable's copies, not the state's); k_a the
activations kept for the backward pass and their gradients; k_s the shard
read from the store next to its arrays; k_l each layer's share of the traced graph. They were
fitted to peaks measured on TensorFlow 2.21 (CPU, Linux x86-64) for dense, convolutional and
Keras-application models (``faasdl bench estimator`` re-measures them), and the history of real
runs (:mod:`.history`) replaces the formula once a signature has run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from faasdl.errors import EstimationError
from faasdl.training.models import ModelProfile

MIB = 1024 * 1024
BYTES_PER_VALUE = 4  # float32


@dataclass(frozen=True)
class Coefficients:
    # 9.5 until the output carried the optimizer's moments beside the weights (ResNet50's and
    # VGG16's peaks were then 15-17 P over the other terms), 16 until the state was written and
    # read without copies of its arrays: first rounds 7.5 P (ResNet50) and 9.3 P (VGG16), later
    # rounds in a warm container 9.8 P and 10.2 P. Kept since the final state came to be
    # written a block at a time (a first round's peak without checkpoints ~3 P lower): an attempt
    # that checkpoints holds a snapshot beside training's peak (VGG16's rounds 1959-1966 MB with
    # a checkpoint every 3 s, 1555-1725 without), and the sizing cannot tell which will.
    params: float = 10.5
    activations: float = 1.5
    shard: float = 2.0
    layer_mb: float = 1.0
    margin: float = 1.08


DEFAULT = Coefficients()


@dataclass(frozen=True)
class MemoryEstimate:
    """An estimate in MiB and its parts, so that a plan can show where the memory goes."""

    mb: float
    parts: dict[str, float]


def estimate_memory(
    profile: ModelProfile,
    *,
    batch_size: int,
    shard_bytes: int,
    baseline_mb: float,
    coefficients: Coefficients = DEFAULT,
) -> MemoryEstimate:
    """Peak memory of one training action, margin included, before rounding to a class."""
    k = coefficients
    parts = {
        "runtime": baseline_mb,
        "parameters": k.params * profile.params * BYTES_PER_VALUE / MIB,
        "activations": k.activations
        * profile.activations_per_example
        * batch_size
        * BYTES_PER_VALUE
        / MIB,
        "shard": k.shard * shard_bytes / MIB,
        "graph": k.layer_mb * profile.layers,
    }
    subtotal = sum(parts.values())
    parts["margin"] = subtotal * (k.margin - 1)
    return MemoryEstimate(mb=subtotal + parts["margin"], parts=parts)


def round_to_class(mb: float, *, step_mb: int, min_mb: int, max_mb: int) -> int:
    """The smallest memory class (a multiple of ``step_mb``) holding ``mb``, within the limits."""
    rounded = max(min_mb, math.ceil(mb / step_mb) * step_mb)
    if rounded > max_mb:
        raise EstimationError(
            f"one action needs {mb:.0f} MB but the platform allows at most {max_mb} MB per action"
        )
    return rounded


def plan_containers(
    memory_for: Callable[[int], float], *, limit_mb: int, examples: int, start: int = 2
) -> tuple[int, float]:
    """DiSDeL's container count: start at 2, add ⌈(mₑ − M)/M⌉ while the estimate mₑ exceeds M.

    ``memory_for(c)`` is the estimate of one action when the data is cut into ``c`` shards. Raises
    ``EstimationError`` when no split fits: the model itself is larger than ``limit_mb``.
    """
    containers = min(start, examples)
    while True:
        needed = memory_for(containers)
        if needed <= limit_mb:
            return containers, needed
        grown = containers + math.ceil((needed - limit_mb) / limit_mb)
        grown = min(grown, examples)
        if grown == containers or memory_for(examples) > limit_mb:
            raise EstimationError(
                f"an action needs {memory_for(examples):.0f} MB even with one example per shard, "
                f"over the {limit_mb} MB action limit: raise the limit or pick a smaller model"
            )
        containers = grown
