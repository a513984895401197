"""Weighted averaging of models, one model at a time (memory: one accumulator, not N models).

Every average is weighted by example count, and an aggregate carries the sum of its inputs'
counts, so a tree of averages of averages equals the flat weighted mean of the leaves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from faasdl.errors import AggregationError


class WeightedMean:
    """Accumulates ``Σ count·w`` in float64 per array; :meth:`result` divides by ``Σ count`` and
    returns each array in the dtype it came in."""

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
            total += examples * array.astype(np.float64)
        self.examples += examples

    def result(self) -> list[np.ndarray]:
        if not self.examples:
            raise AggregationError("no models to average")
        # Each array keeps its dtype; an integer (an optimizer's step counter) is rounded.
        return [
            np.rint(total / self.examples).astype(dtype)
            if np.issubdtype(dtype, np.integer)
            else (total / self.examples).astype(dtype)
            for total, dtype in zip(self._sums, self._dtypes, strict=True)
        ]


def weighted_average(models: list[tuple[list[np.ndarray], int]]) -> list[np.ndarray]:
    """The mean of ``(weights, examples)`` pairs, weighted by examples."""
    mean = WeightedMean()
    for weights, examples in models:
        mean.add(weights, examples)
    return mean.result()
