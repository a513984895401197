"""``faasdl bench steadiness``: how steady this machine's CPU speed is, and so how finely a timing
comparison made on it can tell two runs apart.

A fixed piece of CPU work (a SHA-256 over a few thousand integers, a few milliseconds) runs back
to back in one process for ``duration_s``. On a machine of its own each run takes about as long as
the others; on a virtual machine whose host shares its cores each run takes one of two times or
so, the vCPU running at full speed or at part of it, and the share of slow runs drifts over
seconds (this development machine's: ~1.9 ms or ~3.7 ms, the slow share 40-70%). The figures:

* the run's time by quantile, and the share of runs over 1.5 times the fastest tenth's (slow);
* for windows of 0.25-2 s of consecutive runs: how far apart two adjacent windows' times are
  (the standard deviation of their relative difference): the noise between two invocations of
  that length run one after the other, as the recovery experiment's pairs are;
* what that noise leaves of an overhead measured from ``pairs`` such pairs of 1 s invocations:
  the half-width of its 95% interval (1.96 × the 1 s spread ÷ √pairs), before any noise of the
  invocations' own (failures hit at random points): the finest a quick run can resolve here.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

import numpy as np
from rich.console import Console

#: Window lengths (seconds) whose adjacent spread is reported.
WINDOWS_S = (0.25, 0.5, 1.0, 2.0)
#: A run slower than this many times the fastest tenth's median counts as slow.
SLOW_FACTOR = 1.5
#: Pairs of invocations in a quick recovery run (two passes of 20): the resolution's default.
QUICK_PAIRS = 40
#: Integers hashed by one run of the probe (a few milliseconds).
PROBE_INTEGERS = 20_000


def probe() -> None:
    """The fixed piece of CPU work timed again and again."""
    digest = hashlib.sha256()
    for i in range(PROBE_INTEGERS):
        digest.update(i.to_bytes(8, "big"))


def sample(duration_s: float) -> np.ndarray:
    """Run :func:`probe` back to back for ``duration_s``; each run's seconds."""
    times: list[float] = []
    end = time.perf_counter() + duration_s
    while (started := time.perf_counter()) < end:
        probe()
        times.append(time.perf_counter() - started)
    return np.array(times)


def adjacent_spread(times: np.ndarray, window_s: float) -> tuple[float | None, int]:
    """The standard deviation of (b - a) / a over pairs of adjacent windows (a, b) of about
    ``window_s`` seconds of consecutive runs each, and how many pairs there were (``None``
    under three pairs)."""
    per_window = max(1, round(window_s / float(np.mean(times))))
    windows = len(times) // per_window
    sums = times[: windows * per_window].reshape(windows, per_window).sum(axis=1)
    pairs = windows // 2
    if pairs < 3:
        return None, pairs
    first, second = sums[0 : 2 * pairs : 2], sums[1 : 2 * pairs : 2]
    return float(np.std((second - first) / first, ddof=1)), pairs


def summarize(times: np.ndarray, *, pairs: int = QUICK_PAIRS) -> dict[str, Any]:
    """The figures of one sample (see the module's doc)."""
    if len(times) < 20:
        raise ValueError(f"a sample of {len(times)} runs is too short to summarize (20 at least)")
    fastest = float(np.median(np.sort(times)[: max(1, len(times) // 10)]))
    spreads: dict[str, float | None] = {}
    windows: dict[str, int] = {}
    for window in WINDOWS_S:
        spread, count = adjacent_spread(times, window)
        spreads[f"{window:g}"] = round(spread, 4) if spread is not None else None
        windows[f"{window:g}"] = count
    one_second = spreads["1"]
    quantiles = {
        f"p{q}": round(float(np.quantile(times, q / 100)) * 1000, 3) for q in (5, 25, 50, 75, 95)
    }
    return {
        "runs": len(times),
        "run_ms": quantiles,
        "slow_share": round(float(np.mean(times > SLOW_FACTOR * fastest)), 4),
        "adjacent_spread": spreads,
        "adjacent_pairs": windows,
        "pairs": pairs,
        "overhead_resolution_95": (
            round(1.96 * one_second / math.sqrt(pairs), 4) if one_second is not None else None
        ),
    }


def run_steadiness_bench(
    duration_s: float = 120.0, *, pairs: int = QUICK_PAIRS, progress: Console | None = None
) -> dict[str, Any]:
    progress = progress or Console(stderr=True)
    progress.print(f"steadiness: timing a {PROBE_INTEGERS:,}-integer SHA-256 for {duration_s:g} s")
    result = {"duration_s": duration_s} | summarize(sample(duration_s), pairs=pairs)
    spreads = ", ".join(
        f"{w} s ±{s:.1%}" for w, s in result["adjacent_spread"].items() if s is not None
    )
    progress.print(
        f"steadiness: runs of {result['run_ms']['p5']}-{result['run_ms']['p95']} ms "
        f"(median {result['run_ms']['p50']}), {result['slow_share']:.0%} slow; two adjacent "
        f"windows differ by {spreads} (one standard deviation)"
    )
    if result["overhead_resolution_95"] is not None:
        progress.print(
            f"steadiness: an overhead measured from {pairs} pairs of 1 s invocations is known "
            f"to ±{result['overhead_resolution_95']:.1%} (95%) at best on this machine"
        )
    return result
