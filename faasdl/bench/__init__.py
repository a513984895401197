"""Benchmarks behind ``faasdl bench …``: each returns a dict the CLI prints as JSON."""

from __future__ import annotations


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile of ``values`` (nearest rank), to 0.1; NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 1)
