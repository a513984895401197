from faasdl.controller.admission import (
    Capacity,
    Demand,
    TenantQuota,
    admission,
    admit,
    fair_order,
    queue_positions,
)

POOL = Capacity(memory_mb=4096, actions=8)


def job(job_id: str, tenant: str = "a", t: int = 0, memory: int = 2048, actions: int = 2) -> Demand:
    return Demand(job_id=job_id, tenant=tenant, created_ms=t, memory_mb=memory, actions=actions)


def test_jobs_start_while_they_fit_and_the_rest_wait() -> None:
    queued = [job("j1", t=1), job("j2", t=2), job("j3", t=3)]

    assert admit(queued, [], POOL) == ["j1", "j2"]
    assert admit([job("j3", t=3)], [job("j1"), job("j2")], POOL) == []
    assert admit([job("j3", t=3)], [job("j2")], POOL) == ["j3"]


def test_the_concurrency_limit_counts_like_memory() -> None:
    small = Capacity(memory_mb=None, actions=3)

    assert admit([job("j1", t=1), job("j2", t=2)], [], small) == ["j1"]


def test_a_job_larger_than_the_platform_runs_alone_and_is_not_starved() -> None:
    huge = job("huge", t=1, memory=10_000, actions=20)
    later = job("small", t=2, memory=256, actions=1)

    assert admit([huge, later], [job("other", memory=256, actions=1)], POOL) == []
    assert admit([huge, later], [], POOL) == ["huge"]


def test_tenants_take_turns() -> None:
    burst = [job(f"a{i}", tenant="a", t=i) for i in range(3)]
    other = [job("b0", tenant="b", t=10), job("b1", tenant="b", t=11)]

    order = [d.job_id for d in fair_order(burst + other)]

    assert order == ["a0", "b0", "a1", "b1", "a2"]
    assert queue_positions(burst + other) == {"a0": 1, "b0": 2, "a1": 3, "b1": 4, "a2": 5}


def test_a_tenant_at_its_job_quota_waits_and_does_not_hold_up_the_others() -> None:
    big = Capacity(memory_mb=None, actions=None)
    running = [job("a0", tenant="a")]
    queued = [job("a1", tenant="a", t=1), job("a2", tenant="a", t=2), job("b0", tenant="b", t=3)]

    assert admit(queued, running, big, TenantQuota(jobs=2)) == ["a1", "b0"]
    assert admit(queued, running, big, TenantQuota(jobs=1)) == ["b0"]
    assert admit(queued, running, big) == ["a1", "b0", "a2"]


def test_a_tenants_memory_quota_counts_what_its_running_jobs_hold() -> None:
    big = Capacity(memory_mb=None, actions=None)
    quota = TenantQuota(memory_mb=3000)
    queued = [job("a1", tenant="a", t=1, memory=1000), job("b0", tenant="b", t=2, memory=2500)]

    assert admit(queued, [job("a0", tenant="a", memory=2048)], big, quota) == ["b0"]
    assert admit(queued, [job("a0", tenant="a", memory=1024)], big, quota) == ["a1", "b0"]


def test_what_each_queued_job_waits_for_is_said() -> None:
    quota = TenantQuota(jobs=1, memory_mb=5000)
    running = [job("a0", tenant="a")]
    queued = [
        job("a1", tenant="a", t=1),
        job("b0", tenant="b", t=2, memory=6000),
        job("c0", tenant="c", t=3, memory=4096),
        job("d0", tenant="d", t=4, memory=256, actions=1),
    ]
    tenants = {
        "a1": "its tenant's quota: 1 of 1 job(s) running (FAASDL_API__TENANT_MAX_RUNNING_JOBS)",
        "b0": "its tenant's quota: it needs 6,000 MB, 0 of 5,000 MB held by its running jobs "
        "(FAASDL_API__TENANT_MAX_MEMORY_MB)",
        "d0": "job c0, first in line, to start",
    }

    by_memory = admission(queued, running, POOL, quota)
    by_actions = admission(queued, running, Capacity(memory_mb=None, actions=3), quota)

    assert by_memory == (
        [],
        {
            **tenants,
            "c0": "the platform's pool memory: it needs 4,096 MB, 2,048 of 4,096 MB free beside "
            "the running jobs",
        },
    )
    assert by_actions == (
        [],
        {
            **tenants,
            "c0": "the platform's concurrency limit: it needs 2 action(s), 1 of 3 action(s) free "
            "beside the running jobs",
        },
    )
