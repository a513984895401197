"""Admission: which queued jobs may start, so that the platform is never asked for more than it has.

A capacity model of the platform (its container pool's memory and its namespace's concurrency
limit) against what each running job holds: its trainers, each with its memory limit, at once.
A full platform delays a job, it never fails it; a job larger than the whole platform runs alone
(the pool queues its activations). Queued jobs are ordered round robin by tenant, so that one
tenant's burst does not starve another's, and the head of that order is never overtaken, so that
a large job is not starved by small ones either. A tenant at its quota (jobs running, memory
held) waits without holding anyone else up: its queued jobs step out of the order until one of
its running jobs ends. Pure: demands in, decisions out.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import zip_longest


@dataclass(frozen=True)
class Demand:
    """What one job holds while it runs."""

    job_id: str
    tenant: str
    created_ms: int
    memory_mb: int
    actions: int


@dataclass(frozen=True)
class Capacity:
    """What the platform has; ``None`` where it sets no limit."""

    memory_mb: int | None
    actions: int | None


@dataclass(frozen=True)
class TenantQuota:
    """What one tenant's running jobs may hold at once; ``None`` where there is no quota."""

    jobs: int | None = None
    memory_mb: int | None = None


def fair_order(queued: list[Demand]) -> list[Demand]:
    """Tenants take turns, oldest waiting tenant first; each tenant's jobs in submission order."""
    by_tenant: dict[str, list[Demand]] = defaultdict(list)
    for demand in sorted(queued, key=lambda d: (d.created_ms, d.job_id)):
        by_tenant[demand.tenant].append(demand)
    turns = zip_longest(*by_tenant.values())
    return [demand for turn in turns for demand in turn if demand is not None]


def admit(
    queued: list[Demand],
    running: list[Demand],
    capacity: Capacity,
    quota: TenantQuota | None = None,
) -> list[str]:
    """The queued jobs to start now, in the order they were admitted."""
    return admission(queued, running, capacity, quota)[0]


def admission(
    queued: list[Demand],
    running: list[Demand],
    capacity: Capacity,
    quota: TenantQuota | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The queued jobs to start now, in the order they were admitted, and what each of the
    others waits for, in words."""
    quota = quota or TenantQuota()
    memory = sum(_clip(d.memory_mb, capacity.memory_mb) for d in running)
    actions = sum(_clip(d.actions, capacity.actions) for d in running)
    held: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))  # tenant -> (jobs, memory)
    for d in running:
        jobs_, memory_ = held[d.tenant]
        held[d.tenant] = (jobs_ + 1, memory_ + d.memory_mb)
    started: list[str] = []
    waiting: dict[str, str] = {}
    head: Demand | None = None  # the first that did not fit: the rest wait behind it
    for demand in fair_order(queued):
        jobs_, memory_ = held[demand.tenant]
        if not _fits(jobs_ + 1, quota.jobs):  # the tenant at its quota: others go on
            waiting[demand.job_id] = (
                f"its tenant's quota: {jobs_} of {quota.jobs} job(s) running "
                "(FAASDL_API__TENANT_MAX_RUNNING_JOBS)"
            )
            continue
        if not _fits(memory_ + demand.memory_mb, quota.memory_mb):
            waiting[demand.job_id] = (
                f"its tenant's quota: it needs {demand.memory_mb:,} MB, {memory_:,} of "
                f"{quota.memory_mb:,} MB held by its running jobs "
                "(FAASDL_API__TENANT_MAX_MEMORY_MB)"
            )
            continue
        if head is not None:
            waiting[demand.job_id] = f"job {head.job_id}, first in line, to start"
            continue
        need_memory = _clip(demand.memory_mb, capacity.memory_mb)
        need_actions = _clip(demand.actions, capacity.actions)
        idle = not running and not started
        shorts = (
            _short("pool memory", need_memory, memory, capacity.memory_mb, "MB"),
            _short("concurrency limit", need_actions, actions, capacity.actions, "action(s)"),
        )
        short = None if idle else next((s for s in shorts if s), None)
        if short:
            waiting[demand.job_id] = short
            head = demand
            continue
        started.append(demand.job_id)
        held[demand.tenant] = (jobs_ + 1, memory_ + demand.memory_mb)
        memory += need_memory
        actions += need_actions
    return started, waiting


def queue_positions(queued: list[Demand]) -> dict[str, int]:
    """Each queued job's place in line, 1 for the next to start."""
    return {demand.job_id: i for i, demand in enumerate(fair_order(queued), start=1)}


def _short(what: str, need: int, held: int, limit: int | None, unit: str) -> str | None:
    """What a job that needs ``need`` waits for where the running jobs hold ``held`` of
    ``limit``; ``None`` if it fits."""
    if limit is None or held + need <= limit:
        return None
    return (
        f"the platform's {what}: it needs {need:,} {unit}, {max(0, limit - held):,} of "
        f"{limit:,} {unit} free beside the running jobs"
    )


def _clip(value: int, limit: int | None) -> int:
    return value if limit is None else min(value, limit)


def _fits(value: int, limit: int | None) -> bool:
    return limit is None or value <= limit
