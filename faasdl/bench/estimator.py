"""``faasdl bench estimator``: are the memory and time estimates right the first time?

For each configuration of a matrix (models × data sets × batch sizes) it plans the job, deploys the
training action variant with the planned limits on a fresh embedded platform (limits enforced),
and runs one real training activation on one shard:

1. first run: the estimate from the model (no history): does it fail, and how does its memory
   compare with the peak the action measured (overprovision = limit ÷ peak RSS)? Then a later
   round in the same, now warm, container (the first run's output as its global model, under
   the same limits): a later round's activation loads a global model where a first round's draws
   its weights, and a warm container keeps those weights, so it peaks higher;
2. second run of the same matrix: sized from the history the first run left; any out-of-time
   failure, and timeout ÷ measured duration (every attempt starts cold, and the timeout covers
   the cold start since OpenWhisk's limit applies to ``/init`` too), and timeout ÷ what it was
   learned from: the first run's duration with the slowest cold start on record for its own;
3. the naive policy DiSDeL measured against: start at OpenWhisk's defaults (256 MB, 60 s) and add
   256 MB and 240 s after each failure, run for real until an attempt succeeds; the seconds it
   spends on failed attempts, against faasdl's (probes included).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from faasdl.actions import TRAIN, deploy_variant
from faasdl.config import Settings, private_settings
from faasdl.estimator.planner import ActionPlan, EstimateRequest
from faasdl.estimator.sizer import Sizer, facts_of, load_checked
from faasdl.platform.base import Activation, Platform
from faasdl.platform.classify import FailureKind, classify
from faasdl.platform.local import LocalPlatform
from faasdl.store import StateStore, action_environment, make_store
from faasdl.training.datasets import Dataset, DigitsSpec, SyntheticSpec, split_shards

NAIVE_START = (256, 60_000)
NAIVE_STEP = (256, 240_000)
NAIVE_MAX_ATTEMPTS = 12


def _synthetic(side: int, examples: int) -> SyntheticSpec:
    return SyntheticSpec(shape=(side, side, 3), train_size=examples, test_size=64)


#: ≥ 12 configurations: 4 models (2 Keras applications at 32×32 and 64×64), 2 data sets,
#: batch sizes 16 to 256.
FULL: list[EstimateRequest] = [
    EstimateRequest(model="mlp", dataset=DigitsSpec(), batch_size=16),
    EstimateRequest(model="mlp", dataset=DigitsSpec(), batch_size=256),
    EstimateRequest(model="small_cnn", dataset=DigitsSpec(), batch_size=32),
    EstimateRequest(model="small_cnn", dataset=DigitsSpec(), batch_size=128),
    EstimateRequest(model="mlp", dataset=_synthetic(32, 2048), batch_size=64),
    EstimateRequest(model="small_cnn", dataset=_synthetic(32, 2048), batch_size=128),
    EstimateRequest(model="small_cnn", dataset=_synthetic(64, 4096), batch_size=64),
    EstimateRequest(model="mobilenet_v2", dataset=_synthetic(32, 512), batch_size=16),
    EstimateRequest(model="mobilenet_v2", dataset=_synthetic(32, 512), batch_size=64),
    EstimateRequest(model="mobilenet_v2", dataset=_synthetic(64, 512), batch_size=32),
    EstimateRequest(model="resnet50", dataset=_synthetic(32, 256), batch_size=32),
    EstimateRequest(model="vgg16", dataset=_synthetic(32, 512), batch_size=64),
]
#: CI's: two small models, and ResNet50, whose parameters' term (10.5 P, 945 MB) is half of its
#: plan: only a model that large shows a change in the copies an action holds (the coefficient
#: was 9.5 while the peaks came to be 15-17 P, and ResNet50 and VGG16 ran out of memory).
QUICK: list[EstimateRequest] = [FULL[0], FULL[2], FULL[10]]


@dataclass
class Attempt:
    memory_mb: int
    timeout_ms: int
    success: bool
    failure: str | None
    wall_s: float
    duration_ms: int
    peak_mb: float | None
    init_ms: int  # the attempt's container's /init (0: it was warm)

    @property
    def cold(self) -> bool:
        return self.init_ms > 0


@dataclass
class Row:
    request: EstimateRequest
    first: Attempt
    first_plan: ActionPlan
    dataset: Dataset
    later: Attempt | None = None
    second: Attempt | None = None
    #: The slowest cold start on record when the second run was planned (its timeout's).
    slowest_init_ms: int = 0
    naive: list[Attempt] = field(default_factory=list)


class _Runner:
    """Stages one shard per configuration and runs training activations against it."""

    def __init__(
        self, platform: Platform, store: StateStore, store_url: str, environment: dict[str, str]
    ) -> None:
        self.platform = platform
        self.store = store
        self.store_url = store_url
        self.environment = environment  # as the sizer's probe deploys the same action

    def stage(self, index: int, plan: ActionPlan, dataset: Dataset) -> None:
        shard = next(split_shards(dataset, plan.containers, seed=0))
        self.store.put_blob(f"bench/{index}/shard", shard.encode())

    def run(
        self,
        index: int,
        request: EstimateRequest,
        classes: int,
        memory_mb: int,
        timeout_ms: int,
        *,
        later_round: bool = False,
    ) -> list[tuple[Attempt, Activation]]:
        """One attempt in a cold container; with ``later_round``, if it succeeded, a second one
        in the container it left warm, from its output."""
        variant = deploy_variant(
            self.platform,
            TRAIN,
            memory_mb=memory_mb,
            timeout_ms=timeout_ms,
            environment=self.environment,
        )
        params = {
            "store_url": self.store_url,
            "model": request.model,
            "classes": classes,
            "shard": f"bench/{index}/shard",
            "weights_out": f"bench/{index}/weights",
            "batch_size": request.batch_size,
            "epochs": request.epochs,
        }
        runs = [self._call(variant, params, memory_mb, timeout_ms)]
        if later_round and runs[0][0].success:
            later = params | {
                "weights_in": params["weights_out"],
                "weights_out": f"bench/{index}/later",
            }
            runs.append(self._call(variant, later, memory_mb, timeout_ms))
        # Every attempt starts cold, as a round's first actions do: a warm container left by
        # another configuration would make a duration (and timeout ÷ duration) meaningless.
        self.platform.delete_action(variant)
        return runs

    def _call(
        self, variant: str, params: dict[str, Any], memory_mb: int, timeout_ms: int
    ) -> tuple[Attempt, Activation]:
        started = time.perf_counter()
        record = self.platform.call(variant, params)
        wall = time.perf_counter() - started
        failure = classify(record)
        result = record.response.result if isinstance(record.response.result, dict) else {}
        return (
            Attempt(
                memory_mb=memory_mb,
                timeout_ms=timeout_ms,
                success=failure is None,
                failure=f"{failure.kind}: {failure.message}" if failure else None,
                wall_s=wall,
                duration_ms=record.duration or 0,
                peak_mb=result.get("peak_rss_mb"),
                init_ms=record.init_time or 0,
            ),
            record,
        )


def bench_settings(folder: Path) -> Settings:
    """The settings the bench runs with: the environment's (``FAASDL_…``, which its figures'
    ``environment`` names), but for the platform's limits it chooses (room for every model of
    the matrix) and a store of its own in ``folder``. Sections given as objects had replaced
    the environment's whole: its ``FAASDL_LOCAL__…`` and ``FAASDL_ESTIMATOR__…`` went unread
    (:func:`~faasdl.config.private_settings`)."""
    return private_settings(
        local={"memory_max_mb": 4096, "pool_memory_mb": 8192, "timeout_max_ms": 600_000},
        store={"url": f"sqlite:///{folder / 'store.db'}", "spill_dir": str(folder / "spill")},
    )


def run_estimator_bench(*, quick: bool, naive: bool, progress: Console) -> dict[str, Any]:
    matrix = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="faasdl-bench-estimator-") as tmp:
        settings = bench_settings(Path(tmp))
        store_url = settings.store.url
        store = make_store(settings.store)
        with LocalPlatform(settings=settings.local) as platform, store:
            return _bench(matrix, naive, platform, store, store_url, settings, progress)


def _bench(
    matrix: list[EstimateRequest],
    naive: bool,
    platform: Platform,
    store: StateStore,
    store_url: str,
    settings: Settings,
    progress: Console,
) -> dict[str, Any]:
    sizer = Sizer(platform=platform, store=store, settings=settings)
    runner = _Runner(platform, store, store_url, action_environment(settings.store))
    started = time.perf_counter()
    baseline = sizer.baseline().peak_memory_mb
    probe_s = time.perf_counter() - started
    rows: list[Row] = []
    for i, request in enumerate(matrix):
        probe_started = time.perf_counter()
        dataset = load_checked(request)
        plan = sizer.plan(request, facts_of(dataset))
        probe_s += time.perf_counter() - probe_started
        runner.stage(i, plan, dataset)
        runs = runner.run(
            i, request, dataset.classes, plan.memory_mb, plan.timeout_ms, later_round=True
        )
        for _, record in runs:
            sizer.learn(plan, record, classify(record))
        row = Row(request=request, first=runs[0][0], first_plan=plan, dataset=dataset)
        row.later = runs[1][0] if len(runs) > 1 else None
        rows.append(row)
        progress.print(f"first run  {_label(request)}: {_describe(row.first)}", highlight=False)
        if row.later is not None:
            progress.print(f"  round 2  {_label(request)}: {_describe(row.later)}", highlight=False)
    for i, row in enumerate(rows):
        plan = sizer.plan(row.request, facts_of(row.dataset))
        row.slowest_init_ms = max(sizer.baseline().init_ms, default=0)
        classes = row.dataset.classes
        [(attempt, record)] = runner.run(i, row.request, classes, plan.memory_mb, plan.timeout_ms)
        sizer.learn(plan, record, classify(record))
        row.second = attempt
        progress.print(f"second run {_label(row.request)}: {_describe(attempt)}", highlight=False)
    if naive:
        for i, row in enumerate(rows):
            row.naive = _naive(runner, i, row.request, row.dataset.classes, platform)
            progress.print(
                f"naive      {_label(row.request)}: {len(row.naive)} attempts, "
                f"{sum(a.wall_s for a in row.naive):.1f} s",
                highlight=False,
            )
    progress.print(_table(rows), width=140)
    return _summary(rows, baseline, probe_s, naive)


def _naive(
    runner: _Runner, index: int, request: EstimateRequest, classes: int, platform: Platform
) -> list[Attempt]:
    limits = platform.limits()
    memory, timeout = NAIVE_START
    attempts: list[Attempt] = []
    while len(attempts) < NAIVE_MAX_ATTEMPTS:
        [(attempt, _)] = runner.run(index, request, classes, memory, timeout)
        attempts.append(attempt)
        if attempt.success:
            break
        memory = min(limits.memory_max_mb, memory + NAIVE_STEP[0])
        timeout = min(limits.timeout_max_ms, timeout + NAIVE_STEP[1])
    return attempts


def _label(request: EstimateRequest) -> str:
    data = request.dataset
    shape = "x".join(map(str, data.shape)) if isinstance(data, SyntheticSpec) else data.name
    return f"{request.model} {shape} b{request.batch_size}"


def _describe(attempt: Attempt) -> str:
    if not attempt.success:
        return f"FAILED at {attempt.memory_mb} MB / {attempt.timeout_ms} ms: {attempt.failure}"
    return (
        f"{attempt.memory_mb} MB for a {attempt.peak_mb:.0f} MB peak, "
        f"{attempt.duration_ms} ms of {attempt.timeout_ms} ms"
    )


def _ratio(attempt: Attempt) -> float | None:
    return attempt.memory_mb / attempt.peak_mb if attempt.success and attempt.peak_mb else None


def _table(rows: list[Row]) -> Table:
    table = Table(title="faasdl bench estimator")
    for column in (
        "config", "workers", "memory MB", "peak MB", "limit/peak", "round 2 peak",
        "round 2 limit/peak", "2nd memory", "2nd limit/peak", "2nd timeout ms", "2nd duration ms",
        "naive attempts", "naive s",
    ):  # fmt: skip
        table.add_column(column, justify="left" if column == "config" else "right")
    for row in rows:
        second = row.second
        assert second is not None
        ratio, ratio2 = _ratio(row.first), _ratio(second)
        later = _ratio(row.later) if row.later else None
        table.add_row(
            _label(row.request),
            str(row.first_plan.containers),
            str(row.first.memory_mb),
            f"{row.first.peak_mb:.0f}" if row.first.peak_mb else "-",
            f"{ratio:.2f}" if ratio else "FAILED",
            f"{row.later.peak_mb:.0f}" if row.later and row.later.peak_mb else "-",
            f"{later:.2f}" if later else ("FAILED" if row.later else "-"),
            str(second.memory_mb),
            f"{ratio2:.2f}" if ratio2 else "FAILED",
            str(second.timeout_ms),
            str(second.duration_ms),
            str(len(row.naive)) if row.naive else "-",
            f"{sum(a.wall_s for a in row.naive):.0f}" if row.naive else "-",
        )
    return table


def _summary(rows: list[Row], baseline: float, probe_s: float, naive: bool) -> dict[str, Any]:
    ratios = [r for r in (_ratio(row.first) for row in rows) if r is not None]
    later = [row.later for row in rows if row.later is not None]
    later_ratios = [r for r in map(_ratio, later) if r is not None]
    seconds = [row.second for row in rows if row.second is not None]
    faasdl_s = probe_s + sum(row.first.wall_s for row in rows)
    # What a second run's timeout was learned from: the first run's duration, its cold start
    # replaced by the slowest on record (any configuration's: they are one runtime's).
    learned = [
        row.second.timeout_ms
        / max(1, row.slowest_init_ms + row.first.duration_ms - row.first.init_ms)
        for row in rows
        if row.second is not None and row.second.success and row.first.success
    ]
    out: dict[str, Any] = {
        "configs": len(rows),
        "models": len({row.request.model for row in rows}),
        "baseline_mb": round(baseline, 1),
        "first_attempt_failures": sum(not row.first.success for row in rows),
        "overprovision_median": round(statistics.median(ratios), 3) if ratios else None,
        "overprovision_max": round(max(ratios), 3) if ratios else None,
        "overprovision_min": round(min(ratios), 3) if ratios else None,
        # A later round under the first plan's limits, in the container the first run left warm.
        "later_rounds": len(later),
        "later_rounds_warm": sum(not a.cold for a in later),
        "later_round_failures": sum(not a.success for a in later),
        "later_round_overprovision_min": round(min(later_ratios), 3) if later_ratios else None,
        "second_run_failures": sum(not a.success for a in seconds),
        "second_run_out_of_time": sum(
            bool(a.failure and a.failure.startswith(FailureKind.OUT_OF_TIME)) for a in seconds
        ),
        "second_run_overprovision_median": round(
            statistics.median([r for r in map(_ratio, seconds) if r is not None] or [0.0]), 3
        ),
        # Of the runs that finished: a killed run's duration is when it was killed.
        "second_run_timeout_over_duration_max": round(
            max((a.timeout_ms / max(1, a.duration_ms) for a in seconds if a.success), default=0),
            3,
        ),
        # The same timeouts over what they were learned from: the estimator's slack alone
        # (1.3 × a time class: at most 1.73), without the machine's change of speed between a
        # configuration's two runs.
        "second_run_timeout_over_learned_max": round(max(learned), 3) if learned else None,
        "faasdl_seconds": round(faasdl_s, 1),
    }
    if naive:
        naive_s = sum(a.wall_s for row in rows for a in row.naive)
        out |= {
            "naive_retry_attempts": sum(len(row.naive) for row in rows),
            "naive_failed_attempts": sum(not a.success for row in rows for a in row.naive),
            "naive_seconds": round(naive_s, 1),
            "naive_retry_seconds_saved": round(naive_s - faasdl_s, 1),
        }
    return out
