"""Failure injection on the embedded platform with real TensorFlow actions: kills at random
points, zombies, and attempts that run out of time; every job must end bit-identical to the
same job without failures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faasdl.canary.inject import Chaos, Injection, Mode
from faasdl.config import LocalPlatformSettings, Settings, StoreSettings
from faasdl.controller.jobs import Controller
from faasdl.controller.validator import JobSpec
from faasdl.platform.local import LocalPlatform
from faasdl.store import StateStore, make_store
from faasdl.store.records import FunctionInfo, JobInfo, JobState, load

pytestmark = pytest.mark.tensorflow

JOB: dict[str, Any] = {
    "model": "small_cnn",
    "dataset": {"name": "digits"},
    "workers": 4,
    "epochs": 6,
    "sync_every": 2,
    "batch_size": 8,
    "seed": 5,
    "fault_tolerance": {"checkpoint_interval_s": 0.25, "max_attempts": 20, "heartbeat_s": 1.0},
}


@pytest.fixture(scope="module")
def controller(
    tf_platform: LocalPlatform, tf_store: tuple[StateStore, str]
) -> Iterator[Controller]:
    store, url = tf_store
    settings = Settings(controller={"scheduler_tick_s": 0.1})
    with Controller(settings=settings, platform=tf_platform, store=store, store_url=url) as c:
        yield c


def run(controller: Controller, spec: dict[str, Any]) -> JobInfo:
    job_id = controller.submit(JobSpec.model_validate(spec)).job.job_id
    return controller.wait(job_id, timeout_s=900)


def model_bytes(controller: Controller, job: JobInfo) -> bytes:
    assert job.state is JobState.DONE, job.error
    assert job.model is not None
    return controller.store.get_blob(job.model)


@pytest.fixture(scope="module")
def reference(controller: Controller) -> bytes:
    """The failure-free run's final model (weights and optimizer state)."""
    job = run(controller, JOB)
    assert job.failures == []
    return model_bytes(controller, job)


def run_with_chaos(
    controller: Controller, mode: Mode, count: int, seed: int, delay_s: tuple[float, float]
) -> tuple[JobInfo, list[Injection]]:
    job_id = controller.submit(JobSpec.model_validate(JOB)).job.job_id
    platform = controller.platform
    assert isinstance(platform, LocalPlatform)
    chaos = Chaos(platform, controller.store, job_id, count, mode=mode, seed=seed, delay_s=delay_s)
    with chaos:
        job = controller.wait(job_id, timeout_s=900)
    return job, chaos.done


def test_fifty_kills_at_random_points_across_jobs_end_bit_identical(
    controller: Controller, reference: bytes
) -> None:
    kills: list[Injection] = []
    for seed in range(8):
        if len(kills) >= 50:
            break
        job, done = run_with_chaos(controller, "kill", 50 - len(kills), seed, (0.0, 0.6))

        assert model_bytes(controller, job) == reference
        killed = {i.activation_id for i in done}
        reported = {f.activation_id for f in job.failures}
        assert reported <= killed  # no failure but the injected ones
        assert len(killed - reported) <= 1  # a kill racing the commit may count as a success
        assert all(f.classification == "crash" and f.recovery == "resume" for f in job.failures)
        kills.extend(done)
    assert len(kills) >= 50
    resumed = [i for i in kills if i.token > 1]
    assert resumed, "some kills hit attempts that were themselves recoveries"


def test_a_frozen_attempt_is_fenced_and_never_gets_a_write_accepted_when_it_wakes(
    controller: Controller, reference: bytes
) -> None:
    zombies: list[Injection] = []
    for seed in range(8):
        if len(zombies) >= 20:
            break
        job, done = run_with_chaos(controller, "freeze", 20 - len(zombies), seed, (0.0, 0.4))

        assert model_bytes(controller, job) == reference
        fenced = [i for i in done if i.fenced]
        lease = {f.activation_id for f in job.failures if f.classification == "hung"}
        for zombie in fenced:
            record = controller.platform.wait([zombie.activation_id], timeout_s=120)
            outcome = record[zombie.activation_id]
            # Woken, it was refused at its first write; or it stayed frozen past its time limit
            # and the platform ended it before it tried one.
            assert not outcome.success
            assert "superseded" in (outcome.error or "") or outcome.timed_out, outcome.error
            assert zombie.activation_id in lease
            found = load(controller.store, zombie.unit, FunctionInfo)
            assert found is not None
            assert found[0].owner_epoch > zombie.token
            assert not (found[0].committed_result or "").endswith(f"-a{zombie.token:04d}")
        zombies.extend(fenced)
    assert len(zombies) >= 20


def test_a_unit_longer_than_any_time_limit_finishes_through_resumed_activations(
    tmp_path: Path, controller: Controller, reference: bytes
) -> None:
    # Arrange: a platform whose longest time limit is shorter than one unit's training.
    local = LocalPlatformSettings(
        pool_memory_mb=4096, memory_max_mb=2048, timeout_std_ms=8000, timeout_max_ms=8000
    )
    url = f"sqlite:///{tmp_path / 'state.db'}"
    spec = {**JOB, "workers": 1, "epochs": 100, "sync_every": 100}
    with (
        LocalPlatform(settings=local) as platform,
        make_store(StoreSettings(spill_dir=str(tmp_path)), url) as store,
        Controller(settings=Settings(), platform=platform, store=store, store_url=url) as short,
    ):
        # Execute
        job = run(short, spec)

        # Assert: every attempt but the last ran out of time, each resumed further on, and the
        # model is the one an unlimited run trains.
        timeouts = [f for f in job.failures if f.classification == "out_of_time"]
        assert job.state is JobState.DONE, job.error
        assert len(timeouts) >= 2
        assert all(f.recovery == "resume" for f in timeouts)
        positions = [f.resume_from or 0 for f in timeouts]
        assert positions == sorted(positions)
        assert positions[-1] > 0
        unlimited = run(controller, spec)
        assert store.get_blob(job.model or "") == model_bytes(controller, unlimited)
