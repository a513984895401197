"""The experiments' parts: workloads resume to the same result, failure plans are seeded and
validated, and every kind of fault ends with each invocation committed exactly once — read from
the store — on the embedded platform."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from faasdl.actions import deploy_variant
from faasdl.canary.strategies import StrategyName
from faasdl.config import LocalPlatformSettings
from faasdl.errors import ValidationError as FaasdlValidationError
from faasdl.experiments.inject import REACH, FailurePlan, Fault
from faasdl.experiments.lab import Lab, ledger, open_lab
from faasdl.experiments.measure import recovery_s
from faasdl.experiments.runner import WORKLOAD, Hit, InvocationRunner, RunReport, RunSpec
from faasdl.experiments.suite import LIGHT
from faasdl.experiments.workloads import WORKLOADS, State, run_steps, workload
from faasdl.platform import messages
from faasdl.training.models import build_model
from faasdl.training.tensors import TrainState
from tests.conftest import eventually
from tests.store.conftest import private_redis


@pytest.fixture(autouse=True)
def own_temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a workload generates in its temporary directory (a web service's database) goes
    to the test's, not the machine's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


#: Four files of 512 KiB: four steps of ~70 ms, a checkpoint after each.
SMALL = {"files": 4, "file_kb": 512}

#: Eight files of 1 MiB (the workload's default size): ~2 s an invocation here, for blows aimed
#: 0.15 s into one that must find it, and any other it names, still running. With 512 KiB
#: files (~1 s) one of CI's blows came once its invocation had ended: a runner late by most
#: of a second on a busy machine.
LONGER = {"files": 8, "file_kb": 1024}


def expected(n: int, params: dict[str, Any] = SMALL, name: str = "compression") -> dict[int, str]:
    found = workload(name)
    out = {}
    for i in range(n):
        p = found.params.model_validate({**params, "seed": i})
        out[i] = run_steps(found, p, found.context(p)).result()
    return out


#: Smaller runs of the workloads whose default invocation takes seconds here.
SMALLER: dict[str, dict[str, Any]] = {"training": {"epochs": 4, "batch_size": 64}}


@pytest.mark.parametrize(
    "name",
    ["compression", "graph", "webservice", pytest.param("training", marks=pytest.mark.tensorflow)],
)
def test_a_workload_resumed_from_any_checkpoint_ends_with_the_failure_free_result(
    name: str,
) -> None:
    found = WORKLOADS[name]
    params = found.params.model_validate({"seed": 3, **SMALLER.get(name, {})})
    context = found.context(params)
    whole = run_steps(found, params, context)
    state = found.initial(params, context)
    for _ in range(found.steps(params) // 2):
        state = found.step(params, context, state)
    snapshot = found.snapshot(params, context, state)
    # The run goes on from the state it snapshotted (its live part, changed in place) ...
    assert run_steps(found, params, context, state).result() == whole.result()
    # ... and leaves the snapshot as it was (a copy, or a view of what the steps never change),
    # encoded only now as a writer may encode it: an attempt resumed from it ends the same.
    checkpoint = snapshot.encode()
    resumed = run_steps(found, params, context, State.decode(checkpoint))
    assert resumed.result() == whole.result()
    assert whole.result().startswith(f"{found.steps(params)}:")
    # A step applied twice would show: its output is chained into the digest.
    again = found.snapshot(params, context, found.step(params, context, State.decode(checkpoint)))
    twice = State(found.steps(params) // 2, again.digest, again.data, again.blob)
    assert run_steps(found, params, context, twice).result() != whole.result()


@pytest.mark.tensorflow
def test_the_training_workload_learns() -> None:
    """Its loss falls epoch by epoch: the optimizer it starts from has its learning rate (the
    workload once set every optimizer variable to zero, the learning rate too, and learnt
    nothing)."""
    found = WORKLOADS["training"]
    params = found.params.model_validate({"seed": 1, **SMALLER["training"]})
    state = run_steps(found, params, found.context(params))
    epochs = state.live.epochs
    assert len(epochs) == 4
    assert [e["loss"] for e in epochs] == sorted((e["loss"] for e in epochs), reverse=True)
    assert epochs[-1]["loss"] < 0.8 * epochs[0]["loss"]
    assert epochs[-1]["accuracy"] > 0.5


@pytest.mark.tensorflow
@pytest.mark.parametrize("model", ["small_cnn", "mlp"])
def test_the_training_workloads_first_weights_are_drawn_as_keras_draws_them(model: str) -> None:
    """Glorot-uniform kernels within ±√(6 / (fan_in + fan_out)), a convolution's fans counting
    its receptive field, and zero biases: the largest of each kernel as large as the largest
    Keras drew for the container's model (the fans once left the receptive field out, which
    made the 3×3 convolutions' kernels three to four times too large)."""
    found = WORKLOADS["training"]
    params = found.params.model_validate({"seed": 2, "model": model})
    context = found.context(params)
    drawn = TrainState.from_bytes(bytes(found.initial(params, context).blob)).weights
    shape, classes = context.x.shape[1:], context.classes
    keras = [v.numpy() for v in build_model(model, shape, classes, seed=2).weights]

    assert [w.shape for w in drawn] == [w.shape for w in keras]
    for ours, theirs in zip(drawn, keras, strict=True):
        if ours.ndim == 1:
            assert not ours.any()
        else:
            assert np.abs(ours).max() == pytest.approx(np.abs(theirs).max(), rel=0.1)


@pytest.mark.parametrize("name", ["compression", "graph", "webservice"])
def test_a_primed_context_gives_the_results_a_fresh_one_gives(name: str) -> None:
    """A replica runs a step as it warms up (``prime``); what it then runs is unchanged."""
    found = WORKLOADS[name]
    params = found.params.model_validate({"seed": 4})
    fresh = run_steps(found, params, found.context(params)).result()
    context = found.context(params)
    found.prime(found.params.model_validate({}), context)
    assert run_steps(found, params, context).result() == fresh


def test_an_unknown_workload_is_named_with_the_known_ones() -> None:
    with pytest.raises(FaasdlValidationError, match=r"workload: unknown workload 'nope'.*graph"):
        workload("nope")


def test_a_plan_is_drawn_from_its_seed_and_round_trips(tmp_path: Path) -> None:
    plan = FailurePlan.random(seed=7, invocations=100, rate=0.15)
    assert plan == FailurePlan.random(seed=7, invocations=100, rate=0.15)
    assert plan != FailurePlan.random(seed=8, invocations=100, rate=0.15)
    assert len(plan.faults) == 15
    assert len({f.invocation for f in plan.faults}) == 15
    assert all(0 <= f.at <= REACH and f.kind == "kill" for f in plan.faults)
    plan.write(tmp_path / "plan.json")
    assert FailurePlan.read(tmp_path / "plan.json") == plan


def test_a_plan_for_copies_hits_each_copy_independently_and_the_first_as_with_one() -> None:
    one = FailurePlan.random(seed=7, invocations=100, rate=0.15)
    two = FailurePlan.random(seed=7, invocations=100, rate=0.15, copies=2)
    assert [f for f in two.faults if f.copy_index == 0] == one.faults
    second = {f.invocation for f in two.faults if f.copy_index == 1}
    assert len(second) == 15
    assert second != {f.invocation for f in one.faults}  # drawn apart from the first copy's
    assert FailurePlan(faults=[Fault(invocation=1), Fault(invocation=1, copy_index=1)])


def test_a_bad_plan_names_its_field() -> None:
    with pytest.raises(ValidationError, match="point: set exactly when kind is crash_point"):
        Fault(invocation=0, kind="crash_point")
    with pytest.raises(ValidationError, match="point: set exactly when kind is crash_point"):
        Fault(invocation=0, kind="kill", point="committed")
    with pytest.raises(ValidationError, match=r"at most one fault per invocation \(and copy\)"):
        FailurePlan(faults=[Fault(invocation=1), Fault(invocation=1, at=0.2)])
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        Fault(invocation=0, at=1.5)
    with pytest.raises(ValidationError, match="after_checkpoint: a crash point fires where it is"):
        Fault(invocation=0, kind="crash_point", point="committed", after_checkpoint=1)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with open_lab() as opened:
        yield opened


def run(
    lab: Lab,
    run_id: str,
    strategy: StrategyName,
    faults: list[Fault],
    n: int = 3,
    params: dict[str, Any] = SMALL,
    **kw: Any,
) -> RunReport:
    spec = RunSpec(
        run_id=run_id,
        workload="compression",
        params=params,
        invocations=n,
        strategy=strategy,
        plan=FailurePlan(faults=faults),
        expected_s=dict.fromkeys(range(n), 0.3),
        **kw,
    )
    report = lab.run(spec)
    results = expected(n, params)
    found = ledger(lab.store, run_id, results)
    assert found.exactly_once, found
    assert found.units == found.committed == n
    assert [o.result for o in report.outcomes] == [results[i] for i in range(n)]
    return report


def test_a_killed_retry_invocation_starts_over_and_commits_once(lab: Lab) -> None:
    # Eight steps of ~80 ms: the kill, 0.3 s after the attempt's start, comes mid-way.
    eight = {**SMALL, "files": 8}
    report = run(lab, "kill-retry", "retry", [Fault(invocation=1, at=1.0)], params=eight)
    assert [h.invocation for h in report.injected] == [1]
    hit = report.outcomes[1]
    assert hit.attempts == 2
    assert hit.failures == ["crash"]
    assert hit.final["resumed_from"] is None  # retry keeps no checkpoint
    assert hit.final["cpu_s"] > 0
    assert hit.final["writer_cpu_s"] is None  # nor a checkpoint writer
    # The killed attempt's progress marks came back with the hit: it had begun at step 0.
    (killed,) = report.injected
    assert killed.marks[0][0] == 0
    assert_marked_until_the_hit(killed, lab)
    assert recovery_s(killed, hit) is not None


def assert_marked_until_the_hit(killed: Hit, lab: Lab) -> None:
    """The marks of a killed attempt: a step at a time, in time order, from before its kill (a
    step may end as the kill is on its way); their files are gone once the run has ended."""
    steps = [done for done, _ in killed.marks]
    times = [at for _, at in killed.marks]
    assert steps == list(range(steps[0], steps[0] + len(steps)))
    assert times == sorted(times)
    assert times[0] <= killed.at
    assert not list(lab.marks_dir.iterdir())


def test_a_killed_canary_invocation_resumes_from_its_checkpoint_and_commits_once(lab: Lab) -> None:
    # Killed once its second checkpoint is in the store: the next attempt starts there.
    eight = {**SMALL, "files": 8}
    fault = Fault(invocation=1, after_checkpoint=2)
    report = run(lab, "kill-canary", "canary", [fault], params=eight)
    assert [h.invocation for h in report.injected] == [1]
    hit = report.outcomes[1]
    assert hit.attempts == 2
    assert hit.failures == ["crash"]
    assert hit.final["resumed_from"] >= 2
    assert hit.final["steps_run"] == 8 - hit.final["resumed_from"]
    # Its writer persisted its checkpoints beside it: its CPU is the attempt's answer's too.
    assert hit.final["cpu_s"] > 0
    if hit.final["checkpoints"] and Path("/proc/self/schedstat").exists():  # CPU time in ns
        assert hit.final["writer_cpu_s"] > 0
    (killed,) = report.injected
    assert_marked_until_the_hit(killed, lab)
    # Its newest checkpoint was at most as far as the steps it had ended.
    assert hit.final["resumed_from"] <= killed.marks[-1][0]
    # The attempt that took over was invoked after the kill, and ran on a warm replica.
    assert hit.final_invoked_at is not None
    assert hit.final_invoked_at >= killed.at
    assert hit.final_init_ms is None


def test_blows_aimed_into_the_first_millisecond_of_short_invocations_land_in_them(
    lab: Lab,
) -> None:
    """The scale experiment's light workload (a BFS of 8,191 vertices) runs in a few
    milliseconds on a fast machine: a blow due half a millisecond after an attempt's first
    heartbeat must find it still running (with the runner's 10 ms tick alone, 0 of 15 landed in
    a quick scale run there; polled every 10 ms, 4 of these 24). Counted, not each one: on two
    busy cores a wake-up can still come after a 5 ms invocation has ended (one blow of three
    missed in a clean clone's suite run)."""
    name, params = LIGHT
    n = 48
    aimed = list(range(1, n, 2))
    spec = RunSpec(
        run_id="short-blows",
        workload=name,
        params=params,
        invocations=n,
        strategy="retry",
        plan=FailurePlan(faults=[Fault(invocation=i, at=0.1) for i in aimed]),
        expected_s=dict.fromkeys(range(n), 0.005),
    )
    report = lab.run(spec)
    landed = sorted(h.invocation for h in report.injected)
    assert set(landed) <= set(aimed)
    # A blow that lands as the attempt commits counts as its success (one did in cc88).
    crashed = [i for i in landed if report.outcomes[i].failures == ["crash"]]
    assert len(crashed) >= 18, f"{len(crashed)} of {len(aimed)} blows landed in a running attempt"
    for i in landed:
        outcome = report.outcomes[i]
        assert outcome.failures in ([], ["crash"])
        assert outcome.attempts == 1 + len(outcome.failures)
    found = ledger(lab.store, spec.run_id, expected(n, params, name))
    assert found.exactly_once
    assert found.committed == n


def test_a_killed_copy_leaves_the_other_to_commit_and_both_killed_start_again(lab: Lab) -> None:
    # Request replication's copies are killed independently: invocation 1 loses its second copy
    # only (the first goes on and commits), invocation 2 both (a new attempt runs).
    faults = [
        Fault(invocation=1, copy_index=1, at=0.5),
        Fault(invocation=2, at=0.5),
        Fault(invocation=2, copy_index=1, at=0.5),
    ]
    report = run(lab, "kill-copies", "request_replication", faults, params=LONGER)
    # One comparison, so that a failure shows which blows landed and what each invocation saw
    # (attempts, failures: a copy killed as its container started fails otherwise than a crash).
    seen = (
        sorted(h.invocation for h in report.injected),
        [(o.attempts, len(o.failures)) for o in report.outcomes],
    )
    assert seen == ([1, 2, 2], [(1, 0), (1, 1), (2, 2)]), report.outcomes


def test_a_copy_that_waits_for_a_container_is_hit_once_it_runs() -> None:
    # Room for one container: the second copy waits until the first is killed. Its blow, timed
    # from its own start and not from its twin's heartbeat, lands on it then.
    with open_lab(pool_memory_mb=2048) as one:
        faults = [Fault(invocation=0, at=0.5), Fault(invocation=0, copy_index=1, at=0.5)]
        report = run(one, "copy-waits", "request_replication", faults, n=1, memory_mb=2048)
    assert [h.invocation for h in report.injected] == [0, 0]
    assert report.outcomes[0].attempts == 2


def test_a_plan_hitting_a_copy_the_strategy_does_not_run_is_refused(lab: Lab) -> None:
    spec = RunSpec(
        run_id="no-such-copy",
        workload="compression",
        params=SMALL,
        invocations=2,
        strategy="retry",
        plan=FailurePlan(faults=[Fault(invocation=1, copy_index=1)]),
    )
    with pytest.raises(ValueError, match="plan: a fault hits copy 1 of invocation 1, but retry"):
        lab.run(spec)


def test_copies_that_end_together_are_settled_once_and_both_booked(lab: Lab) -> None:
    """Request replication's two copies of an invocation both end before the runner looks: the
    first it settles commits the unit and abandons the other, which the same pass must skip."""
    # Arrange: the runner's steps driven by hand, so that both copies have ended when it looks.
    spec = RunSpec(
        run_id="copies-together",
        workload="compression",
        params={**SMALL, "files": 1},
        invocations=1,
        strategy="request_replication",
    )
    runner = InvocationRunner(
        lab.platform, lab.store, lab.store_url, lab.runtimes, spec, environment=lab.environment
    )
    runner.variant = deploy_variant(
        lab.platform,
        WORKLOAD,
        memory_mb=runner.memory_mb,
        timeout_ms=spec.timeout_s * 1000,
        environment=lab.environment,
    )
    runner._launch()
    copies = list(runner._in_flight)
    assert len(copies) == 2
    eventually(lambda: all(lab.platform.get_activation(c) for c in copies), what="both ended")

    # Execute
    runner._collect()
    runner._drain()

    # Assert: committed once, with the failure-free result, and both copies' time booked.
    found = ledger(lab.store, spec.run_id, expected(1, spec.params))
    assert found.exactly_once
    assert found.committed == 1
    assert runner._activations == 2
    assert not runner._in_flight
    assert not runner._abandoned


def test_the_copies_left_when_another_commits_are_stopped_and_a_waiting_one_never_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Request replication's copies beyond the first wait for the one container the platform
    has room for; once the first commits, the runner stops the others: a copy still waiting
    never runs (a kill refuses an activation that is not running: the third ran after the
    second, to no purpose, and was booked), and stopping one waiting is the platform's
    (``test_local``'s stop of a queued activation)."""
    # Arrange: three copies, each as large as the platform's memory; the runner's stops noted.
    largest = LocalPlatformSettings().memory_max_mb
    spec = RunSpec(
        run_id="queued-copy",
        workload="compression",
        params=SMALL,
        invocations=1,
        strategy="request_replication",
        copies=3,
        memory_mb=largest,
    )
    with open_lab(pool_memory_mb=largest) as small:
        stops: list[str] = []
        stop = small.platform.stop

        def noted(activation_id: str) -> None:
            stops.append(activation_id)
            stop(activation_id)

        monkeypatch.setattr(small.platform, "stop", noted)

        # Execute
        report = small.run(spec)
        records = small.platform.list_activations()
        found = ledger(small.store, spec.run_id, expected(1))

    # Assert: committed once, by one copy; the runner stopped the two others as it saw the
    # commit. The copy that took the freed container is killed, the one still waiting stopped
    # before it started (and never ran); a runner on a busy machine may see the commit only
    # after both have taken the container, found the unit committed and ended, a few ms each.
    assert found.exactly_once
    assert found.committed == 1
    assert report.activations == len(records) == 3
    [committed] = [r for r in records if r.success]
    others = [r.activationId for r in records if r is not committed]
    assert sorted(stops) == sorted(others)
    for record in records:
        if record.error == messages.STOPPED_BEFORE_START:
            assert record.logs == []


def test_a_block_of_a_longer_run_makes_its_own_invocations_with_their_faults(lab: Lab) -> None:
    # Invocations 3 and 4 of a plan over five: their seeds, and the fault of invocation 4 only.
    # LONGER: in a clean clone the blow after the first of four 512 KiB files came once the
    # invocation had ended (the runner late on a busy machine), and none was injected.
    faults = [Fault(invocation=1, after_checkpoint=1), Fault(invocation=4, after_checkpoint=1)]
    spec = RunSpec(
        run_id="block",
        workload="compression",
        params=LONGER,
        invocations=2,
        first=3,
        strategy="canary",
        plan=FailurePlan(faults=faults),
    )
    report = lab.run(spec)
    results = expected(5, LONGER)
    found = ledger(lab.store, "block", {3: results[3], 4: results[4]})
    assert found.exactly_once
    assert found.units == found.committed == 2
    assert [o.index for o in report.outcomes] == [3, 4]
    assert [h.invocation for h in report.injected] == [4]
    assert report.outcome(4).failures == ["crash"]
    assert report.outcome(3).attempts == 1


@pytest.mark.parametrize("point", ["before_checkpoint", "blob_written", "committed"])
def test_a_crash_at_each_point_of_the_protocol_commits_once(lab: Lab, point: str) -> None:
    fault = Fault(invocation=0, kind="crash_point", point=point)
    report = run(lab, f"crash-{point}", "canary", [fault])
    first = report.outcomes[0]
    if point == "committed":
        # Crashed after its commit, before its reply: done, and not run again.
        assert first.attempts == 1
    else:
        assert first.attempts == 2
        assert first.failures == ["crash"]


def test_a_zombie_is_caught_by_its_lease_and_fenced(lab: Lab) -> None:
    zombie = Fault(invocation=0, kind="zombie", at=0.5)
    report = run(lab, "zombie", "canary", [zombie], params=LONGER)
    first = report.outcomes[0]
    assert first.detected_by == ["lease"]
    assert first.attempts == 2
    # The zombie woke after the takeover and was refused at its next write.
    assert report.activations >= 4  # three invocations, the zombie's late record booked too


def test_a_node_loss_kills_every_running_attempt_and_all_recover(lab: Lab) -> None:
    loss = Fault(invocation=1, kind="node_loss", at=0.5)
    report = run(lab, "node", "canary", [loss], n=4, params=LONGER, concurrency=2)
    assert len(report.injected) == 2  # both attempts in flight
    assert sum(o.attempts for o in report.outcomes) == 6


@pytest.mark.redis
def test_a_store_restart_under_running_attempts_loses_nothing(tmp_path: Path) -> None:
    server = private_redis(tmp_path / "redis")
    server.start()

    def restart() -> None:
        server.kill()
        server.start()  # same directory and port: it replays its AOF

    try:
        with open_lab(store_url=server.url) as lab:
            lab.restart_store = restart
            report = run(lab, "restart", "canary", [Fault(invocation=1, kind="store_restart")])
        assert [h.kind for h in report.injected] == ["store_restart"]
    finally:
        server.stop()


@pytest.mark.redis
def test_a_lab_on_a_store_with_a_password_gives_its_actions_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workload action was deployed without the store's settings: its containers opened the
    # store with the environment they inherited, and inherit no FAASDL_ settings now.
    # Arrange: a Redis with a password, the experiment's environment holding it.
    server = private_redis(tmp_path / "redis")
    with server:
        server.client().config_set("requirepass", "lab-pw")
        monkeypatch.setenv("FAASDL_STORE__PASSWORD", "lab-pw")

        # Execute: a run whose invocations checkpoint, one of them killed (LONGER: beside two
        # busy loops of mine the blow after the first of four 512 KiB files came once the
        # invocation had ended, and none was injected).
        with open_lab(store_url=server.url) as lab:
            fault = Fault(invocation=1, after_checkpoint=1)
            report = run(lab, "password", "canary", [fault], params=LONGER)

    # Assert (and run's own: each invocation committed once, with its result): the killed one
    # resumed from its checkpoint in the store.
    assert [h.invocation for h in report.injected] == [1]
    assert report.outcomes[1].final["resumed_from"] >= 1


def test_a_lab_opens_its_own_store_beside_the_users_tls_store_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `faasdl experiment` with the environment of a controller on a TLS Redis ended in a
    # pydantic traceback: the CA bundle's setting was refused beside the lab's SQLite store.
    # Arrange
    monkeypatch.setenv("FAASDL_STORE__URL", "rediss://cache:6380/0")
    monkeypatch.setenv("FAASDL_STORE__TLS_CA_FILE", __file__)

    # Execute
    with open_lab() as lab:
        lab.store.put("lab/a", {"ok": True})
        kept = lab.store.get("lab/a")

    # Assert
    assert kept is not None
    assert lab.store_url.startswith("sqlite:///")


def test_web_service_containers_named_one_database_share_it(tmp_path: Path) -> None:
    # Arrange: the parameters an experiment gives every container of a run, and a database of
    # a container's own
    found = WORKLOADS["webservice"]
    base: dict[str, Any] = {"rows": 500, "requests": 3, "seed": 1}
    named = base | found.shared(found.params.model_validate(base), tmp_path)
    shared = found.params.model_validate(named)
    own = found.params.model_validate(base | {"database": str(tmp_path / "own.db")})
    database = Path(named["database"])

    # Execute: one container generates it, the next finds it
    first = run_steps(found, shared, found.context(shared)).result()
    made = database.stat().st_mtime_ns
    second = run_steps(found, shared, found.context(shared)).result()

    # Assert: one file in the lab's directory, generated once, answering as another one does
    assert database.parent == tmp_path
    assert database.stat().st_mtime_ns == made
    assert first == second == run_steps(found, own, found.context(own)).result()
