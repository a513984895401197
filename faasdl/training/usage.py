"""What an action really used: peak resident memory per activation (Linux), by phase durations.

A warm container serves many activations, so the process-lifetime ``ru_maxrss`` would carry one
activation's peak into the next. On Linux, writing ``5`` to ``/proc/self/clear_refs`` resets the
high-water mark (``VmHWM``) to the current RSS; where that is refused the lifetime peak is
reported, which can only overstate.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import platform
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import faasdl

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
#: glibc's mallopt parameter for the size from which allocations are mapped on their own.
_M_MMAP_THRESHOLD = -3


def reset_peak_rss() -> bool:
    """Start a new peak at the current RSS; ``False`` where the kernel does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_rss_mb() -> float:
    """Peak resident set size since the last reset (or since the process started), in MiB."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


@functools.cache
def runtime_id() -> str:
    """What this runtime is, as far as its memory goes: Python's, TensorFlow's and NumPy's versions
    and a digest of faasdl's sources (its version alone does not change as its code does).

    The estimator keeps the runtime's baseline and each signature's measured peaks with the id that
    measured them, and learns them again when a run reports another: a runtime that became lighter
    (the training action's import of TensorFlow without scikit-learn: 626 → 570 MB) would
    otherwise keep every plan a memory class larger for good. ~10 ms, once a process."""
    import numpy as np
    import tensorflow as tf  # loaded already by every action that asks

    root = Path(faasdl.__file__).parent
    sources = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        sources.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return (
        f"python {platform.python_version()}, tensorflow {tf.__version__}, numpy "
        f"{np.__version__}, faasdl {faasdl.__version__} ({sources.hexdigest()[:12]})"
    )


def map_large_allocations(threshold_bytes: int = 1 << 20) -> bool:
    """Have the C allocator map every block of ``threshold_bytes`` or more on its own, so that its
    memory goes back to the kernel as it is freed (glibc's ``mallopt(M_MMAP_THRESHOLD)``).

    glibc raises that threshold, up to 32 MiB, each time a mapped block is freed; the blocks below
    it then come from the heap, where freed memory is kept for later and scattered among live
    blocks. An aggregator reading 26 MB models through Redis's client (4 MiB chunks, each copied
    twice as it is parsed) kept more of them each activation, its peak 161 → 187 MB over four
    warm activations. ``False`` where the C library has no such call."""
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, threshold_bytes))
    except (AttributeError, OSError):  # not glibc
        return False


def return_free_memory() -> bool:
    """Give the heap's free pages back to the kernel (glibc's ``malloc_trim``): what an
    activation freed but the allocator kept does not count against the next one's peak. ``False``
    where the C library has no such call or nothing was returned."""
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (AttributeError, OSError):  # not glibc
        return False


class Phases:
    """Wall-clock seconds per named phase of an activation."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
