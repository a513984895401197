"""``faasdl bench recovery``: how fast Canary notices a failure and takes over, and what it costs
when nothing fails. Real training jobs (small CNN on digits, 4 units) on the embedded platform:

* ``takeover_ms`` (p50, p99): from a kill to the resumed attempt's first training step, with
  Canary's warm replicas: kills land only while the job has a replica ready (a replica used by
  one takeover is replaced in the background, which on 2 cores busy training takes 10 s and
  more) and at least :data:`KILL_GAP_S` apart; ``takeovers_on_replica`` counts the takeovers
  that found one;
  ``cold_restart_ms_p50``: the same with OpenWhisk-style ``retry`` (no replica, no checkpoint)
  where no warm container is left (each kill also destroys the action's idle containers): a new
  container imports TensorFlow first;
* ``detection_ms_p50``: from the injected failure to the controller's failure report, for a kill
  the platform reports and for a frozen attempt only its heartbeat lease reveals (also in
  heartbeat periods);
* ``checkpoint_stall_ms_p50``: the blocking part of a checkpoint (the snapshot; encoding and
  writing run in the background);
* ``failure_free_overhead``: a longer job (:data:`FAILURE_FREE_JOB`) with ``canary`` (its
  defaults: Young's checkpoint interval, heartbeats, dynamic replicas) against ``none`` (no
  checkpoints, heartbeats or replicas), alternated in one run after two warm-up jobs (each
  variant first, middle and last in turn): mean makespan ratio − 1. Young's interval with no
  failures seen is long, so few checkpoints are taken; ``failure_free_overhead_checkpointing``
  is the same with a checkpoint every :data:`FIXED_INTERVAL_S` (the interval of the kill runs).
"""

from __future__ import annotations

import functools
import statistics
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from faasdl.bench import percentile
from faasdl.canary.inject import Chaos, Injection, Mode
from faasdl.canary.runtime import RuntimeManager
from faasdl.config import private_settings
from faasdl.controller.jobs import Controller, embedded_controller
from faasdl.controller.validator import JobSpec
from faasdl.platform.local import LocalPlatform
from faasdl.store.records import ActivationUse, JobInfo, JobState

HEARTBEAT_S = 1.0
KILL_GAP_S = 4.0
FIXED_INTERVAL_S = 0.25
JOB: dict[str, Any] = {
    "model": "small_cnn",
    "dataset": {"name": "digits"},
    "workers": 4,
    "epochs": 4,
    "sync_every": 2,
    "batch_size": 8,
    "seed": 0,
}
#: Rounds of a few seconds' training: a fixed cost per activation would swamp JOB's 0.6 s ones.
FAILURE_FREE_JOB: dict[str, Any] = {**JOB, "epochs": 24, "sync_every": 8}
#: The failure-free variants: (policy, checkpoint interval; none: Young's).
FAILURE_FREE: dict[str, tuple[str, float | None]] = {
    "none": ("none", None),
    "canary": ("canary", None),
    "canary_checkpointing": ("canary", FIXED_INTERVAL_S),
}


def run_recovery_bench(*, quick: bool, progress: Console) -> dict[str, Any]:
    kills, freezes, pairs = (6, 3, 2) if quick else (30, 12, 9)
    with tempfile.TemporaryDirectory(prefix="faasdl-bench-recovery-") as tmp:
        settings = private_settings(
            local={"pool_memory_mb": 8192, "memory_max_mb": 2048},
            store={"url": f"sqlite:///{Path(tmp) / 'state.db'}", "spill_dir": tmp},
        )
        with embedded_controller(settings) as (controller, platform):
            # The first job sizes from no history, the second from the first's: from then on
            # the action variant (memory and time class) and its warm containers stay the same.
            progress.print("2 warm-up jobs (cold starts, estimator history, a first replica)")
            for _ in range(2):
                _run(controller, _spec("canary", interval_s=None))
                _run(controller, _spec("canary", interval_s=None, job=FAILURE_FREE_JOB))
            progress.print(f"failure-free: {pairs} × ({', '.join(FAILURE_FREE)}) alternated")
            makespans: dict[str, list[float]] = {name: [] for name in FAILURE_FREE}
            for rep in range(pairs):
                # Each variant goes first, middle and last in turn: a drift of the machine
                # during a run biases none of them.
                names = list(FAILURE_FREE)
                for name in names[rep % len(names) :] + names[: rep % len(names)]:
                    policy, interval = FAILURE_FREE[name]
                    job = _run(controller, _spec(policy, interval_s=interval, job=FAILURE_FREE_JOB))
                    makespans[name].append(_makespan_s(job))
            progress.print(f"{kills} kills with canary (warm replicas)")
            warm, warm_kills = _chaos(
                controller, platform, _spec("canary"), "kill", kills, gap_s=KILL_GAP_S, warm=True
            )
            progress.print(f"{max(2, kills // 3)} kills with retry (cold restarts)")
            cold, cold_kills = _chaos(
                controller, platform, _spec("retry"), "kill", max(2, kills // 3), cold=True
            )
            progress.print(f"{freezes} frozen attempts caught by their lease")
            frozen, frozen_at = _chaos(controller, platform, _spec("canary"), "freeze", freezes)
            warm_ledger = [a for job in warm for a in controller.ledger(job.job_id)]
            cold_ledger = [a for job in cold for a in controller.ledger(job.job_id)]
    warm_takeovers = _takeovers(platform, warm_ledger, warm_kills)
    takeover = [ms for ms, _, _ in warm_takeovers]
    cold_takeover = [ms for ms, _, _ in _takeovers(platform, cold_ledger, cold_kills)]
    reported = _detections(warm, warm_kills)
    hung = _detections(frozen, [i for i in frozen_at if i.fenced])
    stalls = [a for a in _results(platform, warm_ledger) if a.get("checkpoint_stall_ms_p50")]
    hung_p50 = percentile(hung, 50)
    result = {
        "jobs": 4 + len(FAILURE_FREE) * pairs + len(warm) + len(cold) + len(frozen),
        "kills": len(warm_kills) + len(cold_kills),
        "freezes": len(frozen_at),
        "takeover_ms_p50": percentile(takeover, 50),
        "takeover_ms_p99": percentile(takeover, 99),
        "takeovers": len(takeover),
        "takeovers_on_replica": sum(warm for _, warm, _ in warm_takeovers),
        "takeovers_on_primed_trainer": sum(primed for _, _, primed in warm_takeovers),
        "cold_restart_ms_p50": percentile(cold_takeover, 50),
        "detection_ms_p50": {"platform_reported": percentile(reported, 50), "lease": hung_p50},
        "detection_heartbeats_p50": {"lease": round(hung_p50 / (1000 * HEARTBEAT_S), 2)},
        "heartbeat_s": HEARTBEAT_S,
        "checkpoint_stall_ms_p50": percentile([s["checkpoint_stall_ms_p50"] for s in stalls], 50),
        "makespan_s": {k: [round(v, 2) for v in vs] for k, vs in makespans.items()},
        "failure_free_overhead": _overhead(makespans, "canary"),
        "failure_free_overhead_checkpointing": _overhead(makespans, "canary_checkpointing"),
    }
    _print(result, progress)
    return result


def _overhead(makespans: dict[str, list[float]], name: str) -> float:
    return round(statistics.mean(makespans[name]) / statistics.mean(makespans["none"]) - 1, 4)


def _spec(
    policy: str, *, interval_s: float | None = FIXED_INTERVAL_S, job: dict[str, Any] = JOB
) -> dict[str, Any]:
    return {
        **job,
        "fault_tolerance": {
            "policy": policy,
            "max_attempts": 20,
            "heartbeat_s": HEARTBEAT_S,
            "checkpoint_interval_s": interval_s,
        },
    }


def _run(controller: Controller, spec: dict[str, Any]) -> JobInfo:
    job_id = controller.submit(JobSpec.model_validate(spec)).job.job_id
    job = controller.wait(job_id, timeout_s=1800)
    if job.state is not JobState.DONE:
        raise RuntimeError(f"bench job {job_id} ended {job.state}: {job.error}")
    return job


def _chaos(
    controller: Controller,
    platform: LocalPlatform,
    spec: dict[str, Any],
    mode: Mode,
    count: int,
    *,
    gap_s: float = 0.0,
    cold: bool = False,
    warm: bool = False,
) -> tuple[list[JobInfo], list[Injection]]:
    """Jobs with ``count`` injected failures in all (as many jobs as it takes)."""
    jobs: list[JobInfo] = []
    done: list[Injection] = []
    replicas = controller.runtime.runtimes
    while len(done) < count and len(jobs) < 4 * count:
        job_id = controller.submit(JobSpec.model_validate(spec)).job.job_id
        with Chaos(
            platform,
            controller.store,
            job_id,
            count - len(done),
            mode=mode,
            seed=len(jobs),
            delay_s=(0.0, 0.5),
            gap_s=gap_s,
            cold=cold,
            when=functools.partial(_has_replica, replicas, job_id) if warm else None,
        ) as chaos:
            job = controller.wait(job_id, timeout_s=1800)
        if job.state is not JobState.DONE:
            raise RuntimeError(f"bench job {job_id} ended {job.state}: {job.error}")
        jobs.append(job)
        done.extend(chaos.done)
    return jobs, done


def _has_replica(replicas: RuntimeManager, job_id: str) -> bool:
    return replicas.ready(job_id) > 0


def _takeovers(
    platform: LocalPlatform, used: list[ActivationUse], kills: list[Injection]
) -> list[tuple[float, bool, bool]]:
    """Kill → the first training step of the unit's next attempt, in ms; whether that attempt
    found a warm container (no cold start), and one with its trainer built (no build).
    ``used``: the ledgers of the jobs killed in."""
    by_id = {a.activation_id: a for a in used}
    out: list[tuple[float, bool, bool]] = []
    for kill in kills:
        killed = by_id.get(kill.activation_id)
        if killed is None:
            continue
        following = [
            a
            for a in used
            if a.kind == "train"
            and (a.job_id, a.round, a.unit) == (killed.job_id, killed.round, killed.unit)
            and a.attempt == killed.attempt + 1
        ]
        for attempt in following:
            record = platform.get_activation(attempt.activation_id)
            result = record.response.result if record else {}
            if result.get("first_step_at"):
                ms = 1000 * (result["first_step_at"] - kill.at)
                out.append((ms, attempt.init_ms == 0, bool(result.get("trainer_reused"))))
    return out


def _detections(jobs: list[JobInfo], injections: list[Injection]) -> list[float]:
    """Injection → the controller's failure report, in ms."""
    at = {i.activation_id: i.at for i in injections}
    return [
        f.t_ms - 1000 * at[f.activation_id]
        for job in jobs
        for f in job.failures
        if f.activation_id in at
    ]


def _results(platform: LocalPlatform, used: list[ActivationUse]) -> list[dict[str, Any]]:
    out = []
    for a in used:
        record = platform.get_activation(a.activation_id) if a.kind == "train" else None
        if record is not None and isinstance(record.response.result, dict):
            out.append(record.response.result)
    return out


def _makespan_s(job: JobInfo) -> float:
    return ((job.finished_ms or 0) - (job.started_ms or 0)) / 1000


def _print(result: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    table = Table(title="recovery (ms unless noted)")
    table.add_column("measure")
    table.add_column("value")
    detection = result["detection_ms_p50"]
    rows = [
        ("takeover p50 / p99 (warm replica)", f"{result['takeover_ms_p50']} / "
         f"{result['takeover_ms_p99']}"),
        ("cold restart p50 (retry)", str(result["cold_restart_ms_p50"])),
        ("detection p50: platform-reported kill", str(detection["platform_reported"])),
        ("detection p50: hung attempt (lease)", f"{detection['lease']} "
         f"({result['detection_heartbeats_p50']['lease']} heartbeats)"),
        ("checkpoint stall p50", str(result["checkpoint_stall_ms_p50"])),
        ("failure-free overhead (canary vs none)", f"{100 * result['failure_free_overhead']:.1f}%"),
        (f"the same, a checkpoint every {FIXED_INTERVAL_S} s",
         f"{100 * result['failure_free_overhead_checkpointing']:.1f}%"),
    ]  # fmt: skip
    for row in rows:
        table.add_row(*row)
    console.print(table, width=120)
