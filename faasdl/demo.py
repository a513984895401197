"""``faasdl demo``: a real training job on the embedded platform, with injected failures.

The controller runs in this process behind its REST API on loopback; the job is submitted and
watched through that API as ``faasdl submit --watch`` would, while a thread kills the containers
of some training activations mid-run (:class:`faasdl.canary.inject.Chaos`). Canary classifies
each kill as a crash, resumes the unit from its latest checkpoint on a warm replica, and the job
still ends with a trained model. A kill that lands after its attempt committed (short attempts
on a fast machine commit within the kill's delay) is no failure: exactly-once keeps the commit,
and the demo says so.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rich.console import Console

from faasdl.canary.inject import Chaos, Injection
from faasdl.config import private_settings
from faasdl.controller.app import create_app
from faasdl.controller.client import ControllerClient
from faasdl.controller.jobs import embedded_controller
from faasdl.controller.validator import FaultTolerance
from faasdl.controller.watch import summary, watch
from faasdl.serving import AppThread
from faasdl.store import StateStore
from faasdl.store.records import FunctionInfo, UnitState, load

ROOT = Path(".faasdl/demo")
MODEL = ROOT / "model.safetensors"
#: How long after its start a training attempt may be killed (it is then mid-epoch).
KILL_DELAY_S = (0.05, 0.3)


def run_demo(*, workers: int, epochs: int, kills: int, console: Console) -> bool:
    """Run the demo job; whether it ended done with every injected failure recovered. A job that
    ends before all ``kills`` have landed still passes; the demo says how many did."""
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    settings = private_settings(
        local={"pool_memory_mb": 4096, "memory_max_mb": 2048},
        store={"url": f"sqlite:///{(ROOT / 'state.db').resolve()}", "spill_dir": str(ROOT)},
        api={"auth": "none"},  # on loopback, for this process only
    )
    spec = demo_spec(workers=workers, epochs=epochs, kills=kills)
    console.print(
        f"[bold]faasdl demo[/]: {spec['model']} on digits, {workers} training actions, "
        f"{epochs} rounds, {kills} container(s) killed mid-run\n"
    )
    with embedded_controller(settings) as (controller, platform):
        server = AppThread(create_app(controller, owns=False), host="127.0.0.1", port=0, name="api")
        url = server.start()
        client = ControllerClient(url=url)
        try:
            job_id = client.submit(spec)["job"]["job_id"]
            console.print(f"dashboard: {url}/ui#job={job_id}\n")
            with Chaos(platform, controller.store, job_id, kills, delay_s=KILL_DELAY_S) as chaos:
                view = watch(lambda r: client.job(job_id, round_from=r), console)
            kept = sum(_after_its_commit(controller.store, i) for i in chaos.done)
            done: bool = view["job"]["state"] == "done"
            if done:
                client.save_model(job_id, MODEL)
        finally:
            client.close()
            server.stop()
    console.print(summary(view))  # its job's record keeps the ledger's totals
    failures = view["job"]["failures"]
    reported = len(failures) + view["job"]["failures_dropped"]
    resumed = sum(f["recovery"] == "resume" for f in failures)
    landed = (
        f"; {kept} landed after its attempt had committed, which exactly-once keeps (no failure)"
        if kept
        else ""
    )
    short = (
        f" ({kills} asked: the job ended before the rest could land)"
        if len(chaos.done) < kills
        else ""
    )
    console.print(
        f"injected {len(chaos.done)} failure(s){short}; the controller reported {reported} and "
        f"resumed the unit from its checkpoints after {resumed} of them{landed}"
    )
    if done:
        console.print(
            f"the trained model: {MODEL} (in Python: "
            f"faasdl.training.models.load_model({str(MODEL)!r}))"
        )
    return done and resumed == reported == len(chaos.done) - kept


def demo_spec(*, workers: int, epochs: int, kills: int) -> dict[str, Any]:
    """The demo's job. Its attempts allow every kill to land on one unit before it has made
    progress (kills are chosen at random, and may): more kills than the default allowance
    failed the job rather than showing its recovery."""
    return {
        "model": "small_cnn",
        "dataset": {"name": "digits"},
        "workers": workers,
        "epochs": epochs,
        "batch_size": 8,
        "fault_tolerance": {
            "checkpoint_interval_s": 0.1,
            "max_attempts": max(FaultTolerance().max_attempts, kills + 1),
        },
    }


def _after_its_commit(store: StateStore, injection: Injection) -> bool:
    """Whether the kill came once its attempt had committed the unit."""
    found = load(store, injection.unit, FunctionInfo)
    return (
        found is not None
        and found[0].owner_epoch == injection.token
        and found[0].state is UnitState.COMMITTED
    )
