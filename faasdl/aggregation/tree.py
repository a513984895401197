"""The aggregation tree of a round: which models each aggregation action merges.

DiSDeL's aggregation service starts with one level-1 aggregator for all trainers; when merging them
all needs more memory than one aggregator has, it launches several level-1 aggregators and one more
level above them, and so on until a single root. faasdl's aggregators read their inputs one at a
time, so their memory does not grow with how many they merge: the fan-in that widens the tree is
a bound on an aggregator's time. Pure functions: sizes in, plan out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from faasdl.errors import EstimationError

#: The aggregator's own footprint: Python, NumPy, safetensors and the store client.
AGGREGATOR_BASE_MB = 96.0
#: Copies of a model an aggregator holds at once: the float64 mean (two), beside it an array of the
#: input being read, or at the end the output being made (see :mod:`faasdl.aggregation.average`).
#: Measured in one process over three inputs of 26, 130 and 270 MB (in 300 arrays, SQLite): 2.83,
#: 2.13 and 2.10 copies over a 50 MB start, peaks of 124, 328 and 618 MB where this sizes 153, 382
#: and 690; in a warm container through Redis, the 26 MB one's 135-140 MB. (Holding each input
#: whole as it was added: 3.0-3.4 copies, 139, 451 and 876 MB; holding it until the next was read
#: and the whole result beside the mean: 4.7-5.0.)
RESIDENT_MODELS = 2.2


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
    """How many models one aggregator of ``memory_mb`` merges: ``max_fan_in``, which bounds its
    time (more, smaller aggregators run in parallel).

    The thesis' aggregator holds its inputs, so it merges what fits in its memory and more of them
    need more aggregators. faasdl's reads them one at a time: its memory is the same whatever it
    merges, and the tree is as wide as the time bound makes it. Raises ``EstimationError`` where
    ``memory_mb`` is short of the streaming mean's.
    """
    if model_mb <= 0:
        raise EstimationError(f"a model of {model_mb} MB cannot be aggregated")
    needed = aggregator_memory_mb(model_mb)
    if memory_mb < needed:
        raise EstimationError(
            f"merging {model_mb:.1f} MB models (weights and optimizer state) needs aggregators "
            f"of {needed:.0f} MB (the running mean's two copies and an input's arrays), more than "
            f"{memory_mb} MB"
        )
    return max_fan_in


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
