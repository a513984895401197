from faasdl.controller.admission import Capacity, Demand, admit, fair_order, queue_positions

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
