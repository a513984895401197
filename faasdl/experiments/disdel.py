"""``faasdl experiment disdel``: DiSDeL's evaluation (thesis Figs 4.3–4.7) on faasdl's controller.

* the three execution environments: bare-metal TensorFlow, default serverless (one action sized
  for the whole job) and faasdl (parallel actions merged by aggregation): makespan and peak memory
  per action (``faasdl bench training``'s measurements);
* the pool limit: the same 4-worker job under growing container-pool memory (what an OpenWhisk
  invoker's ``userMemory`` allows): activations wait in the queue when the pool is full;
* a batch of 8 jobs submitted at once: each job's makespan and the batch's.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from faasdl.bench.training import run_training_bench
from faasdl.config import Settings, private_settings
from faasdl.controller.jobs import Controller, embedded_controller
from faasdl.controller.validator import JobSpec
from faasdl.errors import ValidationError
from faasdl.experiments.report import Plot, Result, Size
from faasdl.store.records import JobInfo, JobState

BATCH = 8


def _job(size: Size, seed: int = 0) -> dict[str, Any]:
    return {
        "model": "mlp",
        "dataset": {"name": "digits"},
        "workers": 4,
        "epochs": 1 if size == "quick" else 6,
        "sync_every": 1,
        "batch_size": 32,
        "seed": seed,
    }


def _settings(tmp: str, pool_mb: int) -> Settings:
    return private_settings(
        local={"pool_memory_mb": pool_mb, "memory_max_mb": min(2048, pool_mb)},
        store={"url": f"sqlite:///{Path(tmp) / 'state.db'}", "spill_dir": tmp},
        controller={"scheduler_tick_s": 0.1, "tenant_max_running_jobs": BATCH},
    )


def _wait(controller: Controller, job_id: str) -> JobInfo:
    job = controller.wait(job_id, timeout_s=1800)
    if job.state is not JobState.DONE:
        raise RuntimeError(f"experiment job {job_id} ended {job.state}: {job.error}")
    return job


def _makespan_s(job: JobInfo) -> float:
    return round(((job.finished_ms or 0) - job.created_ms) / 1000, 2)


def disdel(size: Size, progress: Console, params: Sequence[str] = ()) -> Result:
    """DiSDeL's evaluation (thesis Figs 4.3-4.7): the execution environments, the container
    pool's limit and a batch of jobs. It runs training jobs, no workload: ``params`` (``--param``
    options of the other experiments) must be empty."""
    if params:
        message = "the disdel experiment runs training jobs, not workloads: it takes none"
        raise ValidationError(message, field="--param")
    rows: list[dict[str, Any]] = []
    bench = run_training_bench(quick=size == "quick", seeds=1, progress=progress)
    for w in bench["workloads"]:
        for env, e in w["environments"].items():
            rows.append(
                {
                    "section": "environments",
                    "series": w["workload"],
                    "environment": env,
                    "makespan_s": e["makespan_s"],
                    "peak_mb_per_action": e["peak_mb_per_action"],
                    "actions": e["actions"],
                }
            )
    pools = [1024, 4096] if size == "quick" else [1024, 2048, 4096, 8192]
    for pool in pools:
        progress.print(f"disdel: a 4-worker job with {pool} MB of container pool")
        with (
            tempfile.TemporaryDirectory(prefix="faasdl-disdel-") as tmp,
            embedded_controller(_settings(tmp, pool)) as (controller, _),
        ):
            job = _wait(
                controller, controller.submit(JobSpec.model_validate(_job(size))).job.job_id
            )
            used = controller.ledger(job.job_id)
            rows.append(
                {
                    "section": "pool_limit",
                    "series": "4-worker job",
                    "pool_memory_mb": pool,
                    "makespan_s": _makespan_s(job),
                    "queue_wait_s": round(sum(a.wait_ms for a in used) / 1000, 2),
                    "memory_limit_mb": max(a.memory_mb for a in used if a.kind == "train"),
                }
            )
    progress.print(f"disdel: a batch of {BATCH} jobs submitted at once")
    with (
        tempfile.TemporaryDirectory(prefix="faasdl-disdel-") as tmp,
        embedded_controller(_settings(tmp, 8192)) as (controller, _),
    ):
        ids = [
            controller.submit(JobSpec.model_validate(_job(size, seed))).job.job_id
            for seed in range(BATCH)
        ]
        jobs = [_wait(controller, i) for i in ids]
    start = min(j.created_ms for j in jobs)
    batch_s = round((max(j.finished_ms or 0 for j in jobs) - start) / 1000, 2)
    for n, job in enumerate(jobs):
        rows.append(
            {
                "section": "batch",
                "series": f"batch of {BATCH}",
                "job": n,
                "makespan_s": _makespan_s(job),
                "accuracy": round(job.rounds[-1].accuracy, 4),
            }
        )
    envs = {r["environment"]: r for r in rows if r["section"] == "environments"}
    pool_rows = [r for r in rows if r["section"] == "pool_limit"]
    summary: dict[str, Any] = {
        "experiment": "disdel",
        "size": size,
        "environments": {
            k: {"makespan_s": v["makespan_s"], "peak_mb_per_action": v["peak_mb_per_action"]}
            for k, v in envs.items()
        },
        "pool_limit_makespan_s": {r["pool_memory_mb"]: r["makespan_s"] for r in pool_rows},
        "batch": {
            "jobs": BATCH,
            "batch_makespan_s": batch_s,
            "job_makespan_s_mean": round(statistics.mean(_makespan_s(j) for j in jobs), 2),
        },
    }
    serverless, faasdl = envs["default_serverless"], envs["faasdl"]
    findings = [
        f"faasdl's actions peak at {faasdl['peak_mb_per_action']} MB each against "
        f"{serverless['peak_mb_per_action']} MB for the one default-serverless action; makespan "
        f"{faasdl['makespan_s']} s against {serverless['makespan_s']} s and bare-metal's "
        f"{envs['bare_metal']['makespan_s']} s (bare-metal has no cold start, no store and "
        "every core).",
        "Pool limit: makespan "
        + ", ".join(f"{r['makespan_s']} s at {r['pool_memory_mb']} MB" for r in pool_rows)
        + " (activations queue while the pool is full).",
        f"{BATCH} jobs at once finish in {batch_s} s, "
        f"{summary['batch']['job_makespan_s_mean']} s per job on average.",
    ]
    return Result(
        name="disdel",
        size=size,
        rows=rows,
        summary=summary,
        findings=findings,
        setup=[
            "Digits with the MLP; faasdl jobs with 4 workers, a round per epoch; the embedded "
            "platform and a SQLite store; every environment from a cold start.",
        ],
        plots=[
            Plot(
                "environments.png",
                "Makespan",
                "environment",
                "makespan_s",
                "series",
                None,
                "",
                "seconds",
                bars=True,
            ),
            Plot(
                "environments-memory.png",
                "Peak memory per action",
                "environment",
                "peak_mb_per_action",
                "series",
                None,
                "",
                "MB",
                bars=True,
            ),
            Plot(
                "pool-limit.png",
                "Pool limit",
                "pool_memory_mb",
                "makespan_s",
                "series",
                None,
                "container pool (MB)",
                "seconds",
            ),
            Plot(
                "batch.png",
                f"A batch of {BATCH} jobs",
                "job",
                "makespan_s",
                "series",
                None,
                "job",
                "makespan (s)",
                bars=True,
            ),
        ],
    )
