"""Timeouts of training and aggregation actions: history first, then the user's cost, then the
platform's maximum (DiSDeL's timeout manager, with history that learns)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

#: Slack over the slowest run on record: room for a busier platform, under 2× after rounding.
HISTORY_SLACK = 1.3
#: Time classes per decade (the 1-2-5 series, refined): a history-based timeout is rounded up to
#: one, so that the drift of a few percent between jobs keeps the same action variant and its
#: warm containers (a new variant starts cold). Neighbours are at most 1.33× apart.
TIME_CLASSES = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)


@dataclass(frozen=True)
class TimeoutEstimate:
    ms: int
    source: Literal["history", "expected_cost", "platform_max"]


def estimate_timeout(
    *,
    overhead_ms: list[int],
    epoch_ms: list[int],
    epochs: int,
    init_ms: int,
    least_ms: int = 0,
    previous_ms: int = 0,
    expected_cost: float | None,
    containers: int,
    memory_mb: int,
    price_per_gb_s: float,
    min_ms: int,
    max_ms: int,
) -> TimeoutEstimate:
    """The action timeout in ms, within ``[min_ms, max_ms]``.

    With history: the slowest recorded cold start (``init_ms``: OpenWhisk's limit covers
    ``/init`` too, and cold starts at once on one node take longer each) plus the slowest
    recorded overhead plus ``epochs`` of the slowest recorded epoch, × 1.3, at least
    ``least_ms`` (the planner's: more than any timeout a run failed under), rounded up to a time
    class (:func:`time_class_ms`); or ``previous_ms``, the limit the latest run had, while it is
    enough and less than twice that (hysteresis: an estimate that wavers around a class boundary
    keeps one variant).
    Without: e_time = (e_cost / c_d) / (μ · mₑ), the time an action may run for its share of the
    user's expected cost at μ per GB·s, at least ``least_ms``, in whole seconds. With neither:
    the platform's maximum.
    """
    if epoch_ms and overhead_ms:
        slowest = init_ms + max(overhead_ms) + epochs * max(epoch_ms)
        wanted = max(math.ceil(slowest * HISTORY_SLACK), least_ms)
        keep = wanted <= previous_ms < 2 * wanted
        ms = previous_ms if keep else time_class_ms(wanted)
        return TimeoutEstimate(_clamp(ms, min_ms, max_ms), "history")
    if expected_cost is not None:
        rate = price_per_gb_s * memory_mb / 1024
        seconds = (expected_cost / containers) / rate if rate > 0 else math.inf
        if not math.isfinite(seconds) or seconds * 1000 >= max_ms:
            return TimeoutEstimate(max_ms, "expected_cost")  # free or lavish: all it may have
        wanted = max(math.ceil(seconds * 1000), least_ms)
        return TimeoutEstimate(_clamp(wanted, min_ms, max_ms), "expected_cost")
    return TimeoutEstimate(max_ms, "platform_max")


def time_class_ms(ms: int) -> int:
    """The smallest time class of at least ``ms`` (1 s, 1.2 s, 1.5 s, 2 s, … 8 s, 10 s, 12 s…)."""
    scale = 1000
    while True:
        for step in TIME_CLASSES:
            if round(step * scale) >= ms:
                return round(step * scale)
        scale *= 10


def _clamp(ms: int, low: int, high: int) -> int:
    # Whole seconds: a variant's name carries its timeout in seconds, so two timeouts in one
    # second would be two limits under one name.
    return max(low, min(high, math.ceil(ms / 1000) * 1000))
