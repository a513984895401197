"""Weighted averaging of models, one model at a time (memory: one accumulator, not N models).

Every average is weighted by example count, and an aggregate carries the sum of its inputs'
counts, so a tree of averages of averages equals the flat weighted mean of the leaves.

The accumulator is float64, twice a float32 model; beside it an aggregator holds one model more
at most: the input being added (each array added a chunk at a time, never converted whole) or the
result being made (each array made as its sum is dropped). Converting whole arrays, the sums and
the result held together, an aggregator's peak was four to five copies of its model.
"""

from __future__ import annotations

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
        if examples <= 0:
            raise AggregationError(f"a model trained on {examples} examples cannot be weighed")
        if self._sums and [a.shape for a in weights] != [s.shape for s in self._sums]:
            raise AggregationError("the models' shapes differ: they are not the same architecture")
        if not self._sums:
            self._sums = [np.zeros(a.shape, dtype=np.float64) for a in weights]
            self._dtypes = [a.dtype for a in weights]
        for total, array in zip(self._sums, weights, strict=True):
            sums, values = total.reshape(-1), array.reshape(-1)  # views: both are C-ordered
            for start in range(0, values.size, CHUNK):
                part = slice(start, start + CHUNK)
                sums[part] += np.multiply(values[part], examples, dtype=np.float64)
        self.examples += examples

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
