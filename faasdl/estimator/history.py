"""The execution history in the store: what runs of a model signature really used.

A signature is (model, input shape, classes, batch size, examples per shard): the things that
decide an action's memory and duration. Records live under ``history/`` and are updated by
compare-and-set, so concurrent jobs of one model never lose each other's measurements.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Literal

from faasdl.errors import StoreError
from faasdl.store.base import StateStore
from faasdl.store.records import (
    BaselineRecord,
    ExecutionHistory,
    ProfileRecord,
    baseline_key,
    history_key,
    load,
    profile_key,
    update,
)
from faasdl.training.models import ModelProfile

#: Durations kept per signature: recent enough to follow a changing platform.
KEEP_DURATIONS = 20


def signature(
    model: str, input_shape: tuple[int, ...], classes: int, batch_size: int, shard_examples: int
) -> str:
    shape = "x".join(str(d) for d in input_shape)
    return f"{model}/{shape}/c{classes}/b{batch_size}/n{shard_examples}"


def profile_name(model: str, input_shape: tuple[int, ...], classes: int) -> str:
    return f"{model}/{'x'.join(str(d) for d in input_shape)}/c{classes}"


def read(store: StateStore, sig: str) -> ExecutionHistory | None:
    found = load(store, history_key(sig), ExecutionHistory)
    return found[0] if found else None


def record_run(
    store: StateStore,
    sig: str,
    *,
    peak_memory_mb: float,
    overhead_ms: int,
    epoch_ms: int,
    timeout_ms: int = 0,
    runtime_id: str = "",
    build_ms: int | None = None,
) -> None:
    """Add one successful run (under a time limit of ``timeout_ms``, on runtime ``runtime_id``;
    one that built its trainer took ``build_ms`` to): the peak is the largest seen on that
    runtime, durations the latest few. A run on another runtime than the peak's starts the peak
    and the memory floor again: what an older runtime needed says nothing of this one (a lighter
    one would otherwise be planned as the old for good, the history only raising a peak)."""

    def change(old: ExecutionHistory | None) -> ExecutionHistory:
        old = old or ExecutionHistory(signature=sig, runtime_id=runtime_id)
        if old.runtime_id != runtime_id:
            old = old.model_copy(
                update={"runtime_id": runtime_id, "peak_memory_mb": 0.0, "memory_floor_mb": 0}
            )
        built = [] if build_ms is None else [build_ms]
        return old.model_copy(
            update={
                "runs": old.runs + 1,
                "peak_memory_mb": max(old.peak_memory_mb, peak_memory_mb),
                "overhead_ms": [*old.overhead_ms, overhead_ms][-KEEP_DURATIONS:],
                "epoch_ms": [*old.epoch_ms, epoch_ms][-KEEP_DURATIONS:],
                "build_ms": [*old.build_ms, *built][-KEEP_DURATIONS:],
                "timeout_ms": timeout_ms,
            }
        )

    update(store, history_key(sig), ExecutionHistory, change)


def record_merge_step(
    store: StateStore,
    sig: str,
    kind: Literal["aggregate", "evaluate"],
    duration_ms: int,
    init_ms: int = 0,
) -> None:
    """Add the time of one successful aggregation or evaluation of a job whose trainers run
    ``sig`` (without a cold start) and an aggregation's cold start (``init_ms``, none: 0): the
    latest few, as a training run's."""

    def change(old: ExecutionHistory | None) -> ExecutionHistory:
        old = old or ExecutionHistory(signature=sig)
        field = f"{kind}_ms"
        changed = {field: [*getattr(old, field), duration_ms][-KEEP_DURATIONS:]}
        if kind == "aggregate" and init_ms > 0:
            changed["aggregate_init_ms"] = [*old.aggregate_init_ms, init_ms][-KEEP_DURATIONS:]
        return old.model_copy(update=changed)

    update(store, history_key(sig), ExecutionHistory, change)


def record_failure(
    store: StateStore, sig: str, *, memory_floor_mb: int = 0, timeout_floor_ms: int = 0
) -> None:
    """Remember limits a run of ``sig`` failed under, so that no estimate repeats them."""

    def change(old: ExecutionHistory | None) -> ExecutionHistory:
        old = old or ExecutionHistory(signature=sig)
        return old.model_copy(
            update={
                "memory_floor_mb": max(old.memory_floor_mb, memory_floor_mb),
                "timeout_floor_ms": max(old.timeout_floor_ms, timeout_floor_ms),
            }
        )

    update(store, history_key(sig), ExecutionHistory, change)


def read_profile(store: StateStore, name: str) -> ModelProfile | None:
    found = load(store, profile_key(name), ProfileRecord)
    if found is None:
        return None
    return ModelProfile(**found[0].model_dump(exclude={"name"}))


def write_profile(store: StateStore, name: str, profile: ModelProfile) -> None:
    record = ProfileRecord(name=name, **asdict(profile))
    store.put(record.key(), record.model_dump(mode="json"))


def read_baseline(store: StateStore, runtime: str) -> BaselineRecord | None:
    found = load(store, baseline_key(runtime), BaselineRecord)
    return found[0] if found else None


def write_baseline(
    store: StateStore,
    runtime: str,
    *,
    peak_memory_mb: float,
    init_ms: int | None,
    runtime_id: str = "",
    earlier: BaselineRecord | None = None,
) -> BaselineRecord:
    """Write the runtime's measured record. Its cold starts are those of ``earlier`` (the record
    it replaces: like a signature's durations they follow the latest whichever runtime's, for the
    slowest may be of several at once on a node, which the probe's alone cannot show) then the
    probe's ``init_ms``, a start of one at once."""
    record = BaselineRecord(
        runtime=runtime,
        runtime_id=runtime_id,
        peak_memory_mb=peak_memory_mb,
        init_ms=earlier.init_ms if earlier is not None else [],
        init_ms_by_trainers=earlier.init_ms_by_trainers if earlier is not None else {},
        measured_ms=int(time.time() * 1000),
    )
    if init_ms is not None:
        record = started(record, init_ms, trainers=1)
    store.put(record.key(), record.model_dump(mode="json"))
    return record


def note_runtime(store: StateStore, runtime: str, runtime_id: str) -> None:
    """A run reported ``runtime_id``: where the runtime's record was measured on another, mark it
    stale, so that the next plan measures the runtime again (one read where it is the same)."""
    known = read_baseline(store, runtime)
    if known is None or known.stale or known.runtime_id == runtime_id:
        return

    def change(old: BaselineRecord | None) -> BaselineRecord:
        if old is None:
            raise StoreError(f"no baseline recorded for runtime {runtime!r}")
        return old.model_copy(update={"stale": old.stale or old.runtime_id != runtime_id})

    update(store, baseline_key(runtime), BaselineRecord, change)


def record_init(store: StateStore, runtime: str, init_ms: int, *, trainers: int) -> None:
    """Add a cold start's init time, of a job that ran ``trainers`` at once, to the runtime's
    record (which must exist)."""

    def change(old: BaselineRecord | None) -> BaselineRecord:
        if old is None:
            raise StoreError(f"no baseline recorded for runtime {runtime!r}")
        return started(old, init_ms, trainers=trainers)

    update(store, baseline_key(runtime), BaselineRecord, change)


def started(record: BaselineRecord, init_ms: int, *, trainers: int) -> BaselineRecord:
    """``record`` with a start of ``init_ms`` among ``trainers`` at once added (pure): the
    latest starts of each count, of the counts started latest."""
    by_trainers = dict(record.init_ms_by_trainers)
    alike = by_trainers.pop(trainers, [])
    by_trainers[trainers] = [*alike, init_ms][-KEEP_DURATIONS:]
    return record.model_copy(
        update={
            "init_ms": [*record.init_ms, init_ms][-KEEP_DURATIONS:],
            "init_ms_by_trainers": dict(list(by_trainers.items())[-KEEP_DURATIONS:]),
        }
    )
