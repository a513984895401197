"""The aggregation tree of a round: which models each aggregation action merges.

DiSDeL's aggregation service starts with one level-1 aggregator for all trainers; when merging them
all needs more memory than one aggregator has, it launches several level-1 aggregators and one more
level above them, and so on until a single root. Pure functions: sizes in, plan out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from faasdl.errors import EstimationError

#: The aggregator's own footprint: Python, NumPy, safetensors and the store client.
AGGREGATOR_BASE_MB = 96.0
#: Copies of a model an aggregator holds at once, measured: the float64 mean (two), and an input's
#: bytes and arrays as it is read or the output's arrays and bytes as it is written. Peaks of
#: 4.7-5.0 copies over the process (26 and 100 MB models in-process; MobileNetV2's 26 MB in a
#: container: 190-194 MB); counted as three, MobileNetV2's aggregators ran at 190-194 MB in
#: 192 MB actions.
RESIDENT_MODELS = 5.0


@dataclass(frozen=True)
class Tree:
    """``levels[k]`` lists the aggregators of level k+1; each is the indices of its inputs in the
    level below (level 0: the trainers). No levels: a single trainer is its own root."""

    leaves: int
    levels: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def aggregators(self) -> int:
        return sum(len(level) for level in self.levels)


def aggregator_memory_mb(model_mb: float) -> float:
    """Memory one streaming aggregator needs, whatever its fan-in (inputs are read one by one).
    ``model_mb`` is what one input holds: the weights and the optimizer's state."""
    return AGGREGATOR_BASE_MB + RESIDENT_MODELS * model_mb


def fan_in(*, model_mb: float, memory_mb: int, max_fan_in: int) -> int:
    """How many models one aggregator of ``memory_mb`` merges.

    The thesis' rule holds its inputs in memory, so the fan-in is what fits beside the accumulator;
    the streaming mean needs less, but the rule still bounds the bytes one aggregator reads, and
    ``max_fan_in`` bounds its time (more, smaller aggregators run in parallel). An aggregator
    sized by :func:`aggregator_memory_mb` has room for three at least. Raises ``EstimationError``
    where ``memory_mb`` is short of the streaming mean's.
    """
    if model_mb <= 0:
        raise EstimationError(f"a model of {model_mb} MB cannot be aggregated")
    needed = aggregator_memory_mb(model_mb)
    if memory_mb < needed:
        raise EstimationError(
            f"merging {model_mb:.1f} MB models (weights and optimizer state) needs aggregators "
            f"of {needed:.0f} MB (the running mean's two copies, an input's or the output's "
            f"three), more than {memory_mb} MB"
        )
    fits = math.floor((memory_mb - AGGREGATOR_BASE_MB) / model_mb + 1e-9) - 2  # beside the mean
    return max(2, min(fits, max_fan_in))


def plan_tree(leaves: int, fan: int) -> Tree:
    """Levels of aggregators over ``leaves`` trainers, each merging at most ``fan`` inputs, sizes
    balanced within a level (7 over fan-in 4 is 4+3, not 4+3 by luck or 6+1)."""
    if leaves < 1:
        raise EstimationError(f"an aggregation tree needs at least one trainer, not {leaves}")
    if fan < 2:
        raise EstimationError(f"a fan-in of {fan} never reaches a root")
    levels: list[tuple[tuple[int, ...], ...]] = []
    width = leaves
    while width > 1:
        groups = math.ceil(width / fan)
        base, extra = divmod(width, groups)
        level: list[tuple[int, ...]] = []
        start = 0
        for g in range(groups):
            size = base + (1 if g < extra else 0)
            level.append(tuple(range(start, start + size)))
            start += size
        levels.append(tuple(level))
        width = groups
    return Tree(leaves=leaves, levels=tuple(levels))
