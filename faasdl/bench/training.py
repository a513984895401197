"""``faasdl bench training``: is faasdl's model as good as single-worker training, and how long
does it take in the thesis' three execution environments?

Per data set (digits with the MLP; synthetic 32×32×3 images with the small CNN), at equal epochs:

* accuracy over seeds of single-worker training (bare-metal TensorFlow, one process), faasdl with
  periodic rounds (one epoch per round, N workers), and faasdl one-shot (DiSDeL's mode: one round
  of all epochs, averaged once at the end); ``accuracy_gap_periodic`` is single − periodic in
  points of accuracy;
* makespan and peak memory per action of bare-metal TensorFlow (one process with every core),
  default serverless (one action sized to fit the whole job) and faasdl (N actions), all three
  with the first seed and from a cold start; for serverless and faasdl the makespan runs from
  submission to the job's end, cold starts, staging and per-round evaluation included;
* ``controller_overhead_ratio`` of the faasdl jobs: the share of a job's makespan (from admission)
  during which none of its activations was running or queued on the platform — the controller's
  own time between them, the critical path of the activations being the rest.
"""

from __future__ import annotations

import multiprocessing
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from faasdl.actions import PREFIX
from faasdl.config import private_settings
from faasdl.controller.jobs import Controller, embedded_controller
from faasdl.controller.validator import JobSpec
from faasdl.store.records import ActivationUse, JobInfo, JobState
from faasdl.training.datasets import DatasetSpec, DigitsSpec, SyntheticSpec

WORKERS = 4


@dataclass(frozen=True)
class Workload:
    label: str
    model: str
    dataset: DatasetSpec
    epochs: int
    batch_size: int = 32


FULL = [
    Workload("digits", "mlp", DigitsSpec(), epochs=20),
    Workload(
        "synthetic-32x32x3",
        "small_cnn",
        SyntheticSpec(shape=(32, 32, 3), noise=2.0, train_size=2048, test_size=512),
        epochs=20,
    ),
]
QUICK = [Workload("digits", "mlp", DigitsSpec(), epochs=2)]


def bare_metal(
    model: str, dataset: dict[str, Any], epochs: int, batch: int, seed: int, tmp: str
) -> dict[str, float]:
    """Single-worker training in this process (run it in a fresh one): accuracy, seconds from the
    call (TensorFlow's import included) and the process's peak memory. Its temporary files go
    to ``tmp``: a pool's worker ends without its exit hooks, and AutoGraph's three generated
    modules were left in /tmp by every run."""
    started = time.perf_counter()
    tempfile.tempdir = tmp
    from pydantic import TypeAdapter

    from faasdl.training.datasets import load_dataset
    from faasdl.training.loop import TrainConfig, Trainer, configure_runtime
    from faasdl.training.models import build_model
    from faasdl.training.usage import peak_rss_mb

    # Bare metal: TensorFlow loaded whole, as a plain script loads it.
    configure_runtime(intra_op_threads=multiprocessing.cpu_count(), without=())
    data = load_dataset(TypeAdapter(DatasetSpec).validate_python(dataset))
    trainer = Trainer(
        build_model(model, data.input_shape, data.classes, seed=seed),
        TrainConfig(batch_size=batch, epochs=epochs, seed=seed),
    )
    report = trainer.train(data.x_train, data.y_train, trainer.initial_state())
    trainer.load(report.state)
    score = trainer.evaluate(data.x_test, data.y_test)
    return {
        "accuracy": score["accuracy"],
        "seconds": time.perf_counter() - started,
        "peak_mb": peak_rss_mb(),
    }


def run_training_bench(*, quick: bool, seeds: int, progress: Console) -> dict[str, Any]:
    workloads = QUICK if quick else FULL
    seeds = 1 if quick else seeds
    with tempfile.TemporaryDirectory(prefix="faasdl-bench-training-") as tmp:
        settings = private_settings(
            local={"pool_memory_mb": 8192, "memory_max_mb": 2048},
            store={"url": f"sqlite:///{Path(tmp) / 'state.db'}", "spill_dir": tmp},
            controller={"scheduler_tick_s": 0.1},
        )
        with embedded_controller(settings) as (controller, _):
            rows = [_workload(w, seeds, controller, progress, tmp) for w in workloads]
    _print(rows, progress)
    return {
        "workers": WORKERS,
        "seeds": seeds,
        "workloads": rows,
        "accuracy_gap_periodic": max(r["accuracy_gap_periodic"] for r in rows),
        "accuracy_gap_one_shot": max(r["accuracy_gap_one_shot"] for r in rows),
        "controller_overhead_ratio": max(r["controller_overhead_ratio"] for r in rows),
    }


def _workload(
    w: Workload, seeds: int, controller: Controller, progress: Console, tmp: str
) -> dict[str, Any]:
    single: list[dict[str, float]] = []
    periodic: list[JobInfo] = []
    one_shot: list[JobInfo] = []
    spec = {
        "model": w.model,
        "dataset": w.dataset.model_dump(),
        "epochs": w.epochs,
        "batch_size": w.batch_size,
    }
    ctx = multiprocessing.get_context("spawn")
    for seed in range(seeds):
        progress.print(f"{w.label}: seed {seed}: bare metal, faasdl periodic, faasdl one-shot")
        with ctx.Pool(1) as pool:
            single.append(
                pool.apply(
                    bare_metal, (w.model, spec["dataset"], w.epochs, w.batch_size, seed, tmp)
                )
            )
        job = {**spec, "seed": seed, "workers": WORKERS}
        if seed == 0:
            _cold(controller)  # the environments compare from a cold start
        periodic.append(_run(controller, {**job, "sync_every": 1}))
        one_shot.append(_run(controller, {**job, "sync_every": 0}))
    progress.print(f"{w.label}: default serverless (one action)")
    _cold(controller)
    serverless = _run(controller, {**spec, "workers": 1, "sync_every": 0})

    def accuracy(jobs: list[JobInfo]) -> list[float]:
        return [round(j.rounds[-1].accuracy, 4) for j in jobs]

    single_acc = [round(s["accuracy"], 4) for s in single]
    return {
        "workload": w.label,
        "model": w.model,
        "epochs": w.epochs,
        "accuracy_single": single_acc,
        "accuracy_periodic": accuracy(periodic),
        "accuracy_one_shot": accuracy(one_shot),
        "accuracy_gap_periodic": _gap(single_acc, accuracy(periodic)),
        "accuracy_gap_one_shot": _gap(single_acc, accuracy(one_shot)),
        "environments": {
            "bare_metal": {
                "makespan_s": round(single[0]["seconds"], 2),
                "peak_mb_per_action": round(single[0]["peak_mb"], 1),
                "actions": 1,
            },
            "default_serverless": _environment(serverless, controller.ledger(serverless.job_id)),
            "faasdl": _environment(periodic[0], controller.ledger(periodic[0].job_id)),
        },
        "controller_overhead_ratio": round(
            max(_overhead(j, controller.ledger(j.job_id)) for j in periodic), 4
        ),
    }


def _run(controller: Controller, spec: dict[str, Any]) -> JobInfo:
    job_id = controller.submit(JobSpec.model_validate(spec)).job.job_id
    job = controller.wait(job_id, timeout_s=3600)
    if job.state is not JobState.DONE:
        raise RuntimeError(f"bench job {job_id} ended {job.state}: {job.error}")
    return job


def _cold(controller: Controller) -> None:
    """Delete faasdl's action variants, and with them their warm containers."""
    for action in controller.platform.list_actions():
        if action.name.startswith(PREFIX):
            controller.platform.delete_action(action.name)


def _gap(single: list[float], other: list[float]) -> float:
    return round(100 * (statistics.mean(single) - statistics.mean(other)), 2)


def _environment(job: JobInfo, used: list[ActivationUse]) -> dict[str, Any]:
    train = [a for a in used if a.kind == "train"]
    return {
        "makespan_s": round(((job.finished_ms or 0) - job.created_ms) / 1000, 2),
        "peak_mb_per_action": max(a.peak_memory_mb or 0.0 for a in train),
        "memory_limit_mb": max(a.memory_mb for a in train),
        "actions": len({a.unit for a in train}),
        "activations": len(used),
        "gb_s": round(sum(a.gb_s for a in used), 2),
        "cost_usd": round(job.cost_usd, 6),
    }


def _overhead(job: JobInfo, used: list[ActivationUse]) -> float:
    """Share of the job's makespan (from admission) with none of its activations on the platform."""
    start, end = job.started_ms or 0, job.finished_ms or 0
    intervals = sorted((a.start_ms - a.wait_ms, a.start_ms + a.duration_ms) for a in used)
    covered, reach = 0, start
    for lo, hi in intervals:
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return 1 - covered / (end - start)


def _print(rows: list[dict[str, Any]], console: Console) -> None:
    accuracy = Table(title="test accuracy at equal epochs (mean over seeds)")
    for column in (
        "workload",
        "epochs",
        "single worker",
        "faasdl periodic",
        "faasdl one-shot",
        "gap (points)",
    ):
        accuracy.add_column(column)
    for r in rows:
        accuracy.add_row(
            r["workload"],
            str(r["epochs"]),
            f"{statistics.mean(r['accuracy_single']):.4f}",
            f"{statistics.mean(r['accuracy_periodic']):.4f}",
            f"{statistics.mean(r['accuracy_one_shot']):.4f}",
            f"{r['accuracy_gap_periodic']:+.2f} / {r['accuracy_gap_one_shot']:+.2f}",
        )
    console.print(accuracy, width=140)
    envs = Table(title="execution environments")
    for column in ("workload", "environment", "actions", "makespan (s)", "peak MB per action"):
        envs.add_column(column)
    for r in rows:
        for name, e in r["environments"].items():
            envs.add_row(
                r["workload"],
                name,
                str(e["actions"]),
                f"{e['makespan_s']:.1f}",
                f"{e['peak_mb_per_action']:.0f}",
            )
    console.print(envs, width=140)
