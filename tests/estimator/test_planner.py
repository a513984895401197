from pathlib import Path
from typing import Any

import pytest

from faasdl.config import Settings
from faasdl.errors import EstimationError, ValidationError
from faasdl.estimator import history
from faasdl.estimator.failures import Limits, correct
from faasdl.estimator.planner import ActionPlan, DataFacts, EstimateRequest, plan_training
from faasdl.estimator.sizer import Sizer, checked_facts
from faasdl.platform.base import Activation, ActivationResponse, KeyValue, PlatformLimits
from faasdl.platform.classify import Failure, FailureKind
from faasdl.platform.local import LocalPlatform
from faasdl.store.records import BaselineRecord, ExecutionHistory
from faasdl.store.sqlite import SqliteStore
from faasdl.training.datasets import DigitsSpec, SyntheticSpec
from faasdl.training.models import ModelProfile

LIMITS = PlatformLimits(
    memory_min_mb=128, memory_max_mb=2048, memory_std_mb=256,
    timeout_min_ms=100, timeout_max_ms=300_000, timeout_std_ms=60_000,
)  # fmt: skip
DATA = DataFacts(
    examples=1000, example_bytes=3 * 32 * 32 * 4 + 4, input_shape=(32, 32, 3), classes=10
)
CORRECT: dict[str, Any] = {"step_mb": 64, "max_memory_mb": 2048, "max_timeout_ms": 300_000}
PROFILE = ModelProfile(
    params=2_000_000, trainable_params=2_000_000, activations_per_example=400_000, layers=150
)


def plan(
    request: EstimateRequest,
    past: dict[str, ExecutionHistory] | None = None,
    *,
    data: DataFacts = DATA,
    limits: PlatformLimits = LIMITS,
) -> ActionPlan:
    return plan_training(
        request, data, profile=PROFILE, baseline_mb=600, init_ms=3000, limits=limits,
        history=lambda sig: (past or {}).get(sig), step_mb=64, price_per_gb_s=0.000017,
    )  # fmt: skip


def request(**fields: object) -> EstimateRequest:
    return EstimateRequest.model_validate(
        {"model": "mobilenet_v2", "dataset": SyntheticSpec(), "batch_size": 32} | fields
    )


def test_a_first_plan_comes_from_the_model_and_uses_the_platform_maximum_time() -> None:
    result = plan(request())

    assert result.containers == 2
    assert result.shard_examples == 500
    assert result.memory_source == "model"
    assert result.memory_mb % 64 == 0
    assert result.memory_mb >= result.memory_estimate_mb
    assert set(result.memory_parts) == {
        "runtime",
        "parameters",
        "activations",
        "shard",
        "graph",
        "margin",
    }
    assert (result.timeout_ms, result.timeout_source) == (300_000, "platform_max")


def test_history_of_the_signature_replaces_the_formula() -> None:
    first = plan(request())
    past = ExecutionHistory(
        signature=first.signature, runs=1, peak_memory_mb=800.0, overhead_ms=[500], epoch_ms=[2000]
    )

    result = plan(request(), {first.signature: past})

    assert (result.memory_source, result.memory_mb) == ("history", 896)  # 800 × 1.1 → 896
    assert (result.timeout_source, result.timeout_ms) == ("history", 8000)  # 5.5 s × 1.3


def test_until_a_run_succeeds_a_plan_starts_where_the_failed_jobs_retry_did() -> None:
    # The formula fell short: the next job's first attempt has the limits the failed job's
    # second attempt had (failures.correct), not one class more, which would fail again.
    first = plan(request(expected_cost=0.01))
    failed = Limits(first.memory_mb, first.timeout_ms)
    past = ExecutionHistory(
        signature=first.signature,
        memory_floor_mb=failed.memory_mb,
        timeout_floor_ms=failed.timeout_ms,
    )
    oom = correct(Failure(FailureKind.OUT_OF_MEMORY, "killed"), failed, **CORRECT)
    oot = correct(Failure(FailureKind.OUT_OF_TIME, "timed out"), failed, **CORRECT)

    second = plan(request(expected_cost=0.01), {first.signature: past})

    assert first.memory_mb < oom.memory_mb == second.memory_mb
    assert first.timeout_ms < oot.timeout_ms == second.timeout_ms
    assert second.memory_source == "model"


def test_once_a_run_succeeded_its_peak_rules_and_a_failed_limit_is_only_exceeded() -> None:
    first = plan(request())
    past = ExecutionHistory(
        signature=first.signature, runs=1, peak_memory_mb=700.0, overhead_ms=[500],
        epoch_ms=[2000], memory_floor_mb=1024,
    )  # fmt: skip

    # 700 × 1.1 = 770 MB is under the failed 1024 MB: one class above it, 1088 MB.
    assert plan(request(), {first.signature: past}).memory_mb == 1088


def test_a_failed_limit_grows_no_further_than_the_platforms_largest() -> None:
    first = plan(request())
    past = ExecutionHistory(signature=first.signature, memory_floor_mb=1600)

    assert plan(request(), {first.signature: past}).memory_mb == LIMITS.memory_max_mb


def test_more_data_than_one_action_holds_is_spread_over_more_actions() -> None:
    big = DataFacts(examples=100_000, example_bytes=12_292, input_shape=(32, 32, 3), classes=10)

    result = plan(request(), data=big)

    assert result.containers > 2
    assert result.memory_mb <= LIMITS.memory_max_mb


def test_a_batch_larger_than_a_shard_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="larger than a shard") as caught:
        plan(request(batch_size=600, workers=2))
    assert caught.value.field == "batch_size"


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"workers": 4}, "workers", "4 workers for 1 training example: a worker needs one at"),
        ({"workers": 1}, "batch_size", r"shard \(1 training example with 1 worker\)$"),
    ],
)
def test_a_set_of_one_example_is_refused_in_the_singular(
    fields: dict[str, int], field: str, message: str
) -> None:
    # Arrange: one training example ("4 workers for 1 examples" was said).
    one = DataFacts(examples=1, example_bytes=28, input_shape=(6,), classes=3)

    # Execute
    with pytest.raises(ValidationError, match=message) as caught:
        plan(request(model="mlp", **fields), data=one)

    # Assert
    assert caught.value.field == field


def test_an_unknown_model_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as caught:
        plan(request(model="gpt"))
    assert caught.value.field == "model"


def test_workers_that_make_an_action_too_large_are_an_estimation_error() -> None:
    small = LIMITS.model_copy(update={"memory_max_mb": 512})

    with pytest.raises(EstimationError, match="leave workers out"):
        plan(request(workers=2), limits=small)


def test_a_run_on_another_runtime_starts_the_peak_and_memory_floor_again(tmp_path: Path) -> None:
    with SqliteStore(path=tmp_path / "s.db") as store:
        # Measured before runtimes reported what they are (runtime_id ""), then on runtime "b".
        history.record_run(store, "sig", peak_memory_mb=700.0, overhead_ms=1, epoch_ms=1)
        history.record_failure(store, "sig", memory_floor_mb=640)
        old = history.read(store, "sig")
        for i, peak in enumerate([560.0, 550.0], start=2):
            history.record_run(
                store, "sig", peak_memory_mb=peak, overhead_ms=i, epoch_ms=i, runtime_id="b"
            )
        found = history.read(store, "sig")

    assert old is not None
    assert (old.peak_memory_mb, old.memory_floor_mb) == (700.0, 640)
    assert found is not None
    assert (found.runtime_id, found.peak_memory_mb, found.memory_floor_mb) == ("b", 560.0, 0)
    assert found.runs == 3
    assert found.epoch_ms == [1, 2, 3]  # durations follow the latest runs whichever runtime's


def test_a_baseline_is_stale_once_a_run_reports_another_runtime(tmp_path: Path) -> None:
    with SqliteStore(path=tmp_path / "s.db") as store:
        history.write_baseline(store, "tf", peak_memory_mb=600.0, init_ms=3000, runtime_id="a")
        history.note_runtime(store, "tf", "a")
        same = history.read_baseline(store, "tf")
        history.note_runtime(store, "tf", "b")
        other = history.read_baseline(store, "tf")
        history.note_runtime(store, "absent", "b")  # no record: nothing to mark
        absent = history.read_baseline(store, "absent")

    assert same is not None
    assert not same.stale
    assert other is not None
    assert other.stale
    assert (other.runtime_id, other.peak_memory_mb, other.init_ms) == ("a", 600.0, [3000])
    assert absent is None


def test_history_updates_by_compare_and_set_lose_nothing(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with SqliteStore(path=tmp_path / "s.db") as store:

        def run(i: int) -> None:
            history.record_run(store, "sig", peak_memory_mb=float(i), overhead_ms=i, epoch_ms=i)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(run, range(40)))
        history.record_failure(store, "sig", memory_floor_mb=512)

        found = history.read(store, "sig")

    assert found is not None
    assert found.runs == 40
    assert found.peak_memory_mb == 39.0
    assert len(found.epoch_ms) == history.KEEP_DURATIONS
    assert found.memory_floor_mb == 512


def test_a_timeout_from_history_covers_the_slowest_cold_start_on_record(tmp_path: Path) -> None:
    # Arrange: the runtime's cold starts: nine alone (3 s) and one of four at once on a node
    # (6.6 s, the four took 6.3-6.7 s each on 2 cores); a signature whose runs took 0.1 s and
    # two epochs of 0.5 s. The platform is never opened: a probe would fail the test.
    settings = Settings()
    runtime = settings.estimator.baseline_runtime
    request = EstimateRequest(model="mlp", dataset=DigitsSpec(), batch_size=16, epochs=2)
    facts = checked_facts(request)
    with SqliteStore(path=tmp_path / "s.db") as store:
        history.write_baseline(store, runtime, peak_memory_mb=570.0, init_ms=6600)
        for _ in range(9):
            history.record_init(store, runtime, 3000, trainers=1)
        name = history.profile_name(request.model, facts.input_shape, facts.classes)
        history.write_profile(store, name, PROFILE)
        sizer = Sizer(platform=LocalPlatform(), store=store, settings=settings)
        first = sizer.plan(request)
        history.record_run(
            store, first.signature, peak_memory_mb=580.0, overhead_ms=100, epoch_ms=500
        )

        # Execute
        learned = sizer.plan(request)

    # Assert: 1.3 × (6.6 + 0.1 + 2 × 0.5) s, rounded up to a time class (the median cold start
    # gave 1.3 × 4.1 s: a 6 s limit that the four at once outlast).
    assert learned.timeout_source == "history"
    assert learned.timeout_ms == 12_000


def test_cold_starts_are_planned_by_those_of_as_many_trainers_at_once() -> None:
    # Arrange: the probe's lone start (6.1 s), three starts of jobs of three trainers at once on a
    # node (7.0-8.2 s) and one of a job of eight; and a record from before starts were kept so.
    record = BaselineRecord(runtime="tf", peak_memory_mb=570.0, measured_ms=0)
    for init_ms, trainers in [(6100, 1), (7000, 3), (8200, 3), (7600, 3), (9900, 8)]:
        record = history.started(record, init_ms, trainers=trainers)
    older = BaselineRecord(runtime="tf", peak_memory_mb=570.0, init_ms=[6100, 7000], measured_ms=0)

    # Execute
    starts = {trainers: record.starts_with(trainers) for trainers in (1, 2, 3, 5, 8, 20)}

    # Assert: a job's own count where it is on record, else the most up to it; every start kept
    # in order; a record from before plans every job by every start.
    assert starts == {
        1: [6100], 2: [6100], 3: [7000, 8200, 7600], 5: [7000, 8200, 7600], 8: [9900], 20: [9900]
    }  # fmt: skip
    assert record.init_ms == [6100, 7000, 8200, 7600, 9900]
    assert older.starts_with(3) == [6100, 7000]


def test_the_starts_kept_are_the_latest_of_the_counts_started_latest() -> None:
    record = BaselineRecord(runtime="tf", peak_memory_mb=570.0, measured_ms=0)
    for trainers in range(1, history.KEEP_DURATIONS + 2):  # one more count than are kept
        record = history.started(record, 1000 + trainers, trainers=trainers)
    for init_ms in range(history.KEEP_DURATIONS + 1):  # one more start of the first kept
        record = history.started(record, init_ms, trainers=2)

    assert list(record.init_ms_by_trainers) == [*range(3, history.KEEP_DURATIONS + 2), 2]
    assert record.init_ms_by_trainers[2] == list(range(1, history.KEEP_DURATIONS + 1))
    assert record.starts_with(1) == record.init_ms  # the lone starts went: every start
    assert len(record.init_ms) == history.KEEP_DURATIONS


def test_a_plan_prices_its_trainers_cold_starts_by_those_of_as_many_at_once(
    tmp_path: Path,
) -> None:
    # Arrange: a runtime whose lone start (the probe's) took 3 s and whose starts of two trainers
    # at once took 5 s. The platform is never opened: a probe would fail the test.
    settings = Settings()
    runtime = settings.estimator.baseline_runtime
    with SqliteStore(path=tmp_path / "s.db") as store:
        history.write_baseline(store, runtime, peak_memory_mb=570.0, init_ms=3000)
        for init_ms in (5000, 5200):
            history.record_init(store, runtime, init_ms, trainers=2)
        facts = checked_facts(EstimateRequest(model="mlp", dataset=DigitsSpec(), batch_size=16))
        name = history.profile_name("mlp", facts.input_shape, facts.classes)
        history.write_profile(store, name, PROFILE)
        sizer = Sizer(platform=LocalPlatform(), store=store, settings=settings)

        # Execute
        planned = {
            workers: sizer.plan(
                EstimateRequest(model="mlp", dataset=DigitsSpec(), batch_size=16, workers=workers)
            )
            for workers in (1, 2, 4)
        }

    # Assert
    assert {w: p.median_cold_start_ms for w, p in planned.items()} == {1: 3000, 2: 5100, 4: 5100}


def activation(*, init_ms: int, timed_out: bool) -> Activation:
    """A failed training activation of a cold start of ``init_ms``."""
    return Activation(
        namespace="guest",
        name="train",
        activationId="a" * 32,
        start=0,
        duration=init_ms + 100,
        annotations=[
            KeyValue(key="initTime", value=init_ms),
            KeyValue(key="timeout", value=timed_out),
        ],
        response=ActivationResponse(status="action developer error", success=False),
    )


def test_a_cold_start_that_ran_out_of_time_is_not_kept_as_one(tmp_path: Path) -> None:
    # Arrange: a start of 3 s on record, and a unit planned with a 10 s limit.
    settings = Settings()
    runtime = settings.estimator.baseline_runtime
    plan = ActionPlan(
        containers=4, shard_examples=450, signature="sig", memory_mb=640, memory_estimate_mb=600,
        memory_parts={}, memory_source="history", timeout_ms=10_000, timeout_source="history",
    )  # fmt: skip
    with SqliteStore(path=tmp_path / "s.db") as store:
        history.write_baseline(store, runtime, peak_memory_mb=570.0, init_ms=3000)
        sizer = Sizer(platform=LocalPlatform(), store=store, settings=settings)

        # Execute: one attempt's start ran out of its 10 s (frozen, say); another's took 6.6 s
        # (four at once) before the attempt was killed.
        sizer.learn(
            plan,
            activation(init_ms=10_020, timed_out=True),
            Failure(FailureKind.OUT_OF_TIME, "exceeded its time limits during initialization."),
        )
        sizer.learn(plan, activation(init_ms=6600, timed_out=False), Failure(FailureKind.CRASH, ""))
        runtime_record = history.read_baseline(store, runtime)
        signature = history.read(store, "sig")

    # Assert: the start that ended at the limit measured the limit: the signature's floor keeps
    # it, the runtime's starts do not (the next limit of every signature would rise past it).
    assert runtime_record is not None
    assert runtime_record.init_ms == [3000, 6600]
    assert signature is not None
    assert signature.timeout_floor_ms == 10_000
