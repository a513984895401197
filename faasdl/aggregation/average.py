"""Weighted averaging of models, one model at a time (memory: one accumulator, not N models).

Every average is weighted by example count, and an aggregate carries the sum of its inputs'
counts, so a tree of averages of averages equals the flat weighted mean of the leaves.

The accumulator is float64, twice a float32 model; beside it an aggregator holds an array of the
input being added (read as the input is, each array added a chunk at a time, never converted
whole: :meth:`WeightedMean.adding`), or at the end one model more, the result being made (each
array made as its sum is dropped). Converting whole arrays, the sums and the result held
together, an aggregator's peak was four to five copies of its model; holding each input whole as
it was added, three.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from faasdl.errors import AggregationError

#: Elements of an input array converted to float64 at a time: an 8 MiB temporary.
CHUNK = 1 << 20


class WeightedMean:
    """Accumulates ``Σ count·w`` in float64 per array; :meth:`result` divides by ``Σ count`` and
    returns each array in the dtype it came in, consuming the sums."""

    def __init__(self) -> None:
        self._sums: list[np.ndarray] = []
        self._dtypes: list[np.dtype[Any]] = []
        self.examples = 0

    def add(self, weights: list[np.ndarray], examples: int) -> None:
        """Add a model's arrays, weighted by ``examples``."""
        add = self.adding([a.shape for a in weights], [a.dtype for a in weights], examples)
        for position, array in enumerate(weights):
            add(position, array)

    def adding(
        self, shapes: list[tuple[int, ...]], dtypes: list[np.dtype[Any]], examples: int
    ) -> Callable[[int, np.ndarray], None]:
        """Begin adding a model of arrays of ``shapes`` and ``dtypes`` weighted by ``examples``,
        its arrays to come one at a time in any order (as a file is read, each let go once
        added): what adds the one at a position. The model counts in the mean from here: each
        of its arrays must be added, once."""
        if examples <= 0:
            raise AggregationError(f"a model trained on {examples} examples cannot be weighed")
        if self._sums and list(shapes) != [s.shape for s in self._sums]:
            raise AggregationError("the models' shapes differ: they are not the same architecture")
        if not self._sums:
            self._sums = [np.zeros(shape, dtype=np.float64) for shape in shapes]
            self._dtypes = list(dtypes)
        self.examples += examples

        def add(position: int, array: np.ndarray) -> None:
            total = self._sums[position]
            if array.shape != total.shape:
                raise AggregationError(
                    f"array {position} is {array.shape}, not the {total.shape} its model said"
                )
            sums, values = total.reshape(-1), array.reshape(-1)  # views: both are C-ordered
            for start in range(0, values.size, CHUNK):
                part = slice(start, start + CHUNK)
                sums[part] += np.multiply(values[part], examples, dtype=np.float64)

        return add

    def result(self) -> list[np.ndarray]:
        """The mean, once: each sum is dropped as its array is made, and the accumulator is empty
        after (another :meth:`result` raises)."""
        if not self.examples:
            raise AggregationError("no models to average")
        sums, examples = self._sums, self.examples
        self._sums, self.examples = [], 0
        arrays = []
        for dtype in self._dtypes:
            total = sums.pop(0)
            total /= examples
            # Each array keeps its dtype; an integer (an optimizer's step counter) is rounded.
            arrays.append(
                (np.rint(total) if np.issubdtype(dtype, np.integer) else total).astype(dtype)
            )
            del total
        return arrays


def weighted_average(models: list[tuple[list[np.ndarray], int]]) -> list[np.ndarray]:
    """The mean of ``(weights, examples)`` pairs, weighted by examples."""
    mean = WeightedMean()
    for weights, examples in models:
        mean.add(weights, examples)
    return mean.result()
