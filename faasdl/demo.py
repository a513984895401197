"""``faasdl demo``: a real training job on the embedded platform, with injected failures.

The controller runs in this process behind its REST API on loopback; the job is submitted and
watched through that API as ``faasdl submit --watch`` would, while a thread kills the containers
of some training activations mid-run. The controller classifies each kill as a crash, runs the unit
again, and the job still ends with a trained model.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from faasdl.config import Settings
from faasdl.controller.app import create_app
from faasdl.controller.client import ControllerClient
from faasdl.controller.jobs import Controller, embedded_controller
from faasdl.controller.watch import summary, watch
from faasdl.errors import ActivationNotFound
from faasdl.platform.local import LocalPlatform
from faasdl.serving import AppThread

ROOT = Path(".faasdl/demo")
#: How long a training activation runs before the demo kills it (it is then mid-epoch).
KILL_AFTER_S = 0.3


def run_demo(*, workers: int, epochs: int, kills: int, console: Console) -> bool:
    """Run the demo job; whether it ended done with every injected failure recovered."""
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    settings = Settings(
        local={"pool_memory_mb": 4096, "memory_max_mb": 2048},
        store={"url": f"sqlite:///{(ROOT / 'state.db').resolve()}", "spill_dir": str(ROOT)},
    )
    spec: dict[str, Any] = {
        "model": "small_cnn",
        "dataset": {"name": "digits"},
        "workers": workers,
        "epochs": epochs,
        "batch_size": 32,
    }
    console.print(
        f"[bold]faasdl demo[/]: {spec['model']} on digits, {workers} training actions, "
        f"{epochs} rounds, {kills} container(s) killed mid-run\n"
    )
    with embedded_controller(settings) as (controller, platform):
        server = AppThread(create_app(controller, owns=False), host="127.0.0.1", port=0, name="api")
        client = ControllerClient(url=server.start())
        try:
            job_id = client.submit(spec)["job"]["job_id"]
            killer = _Killer(platform, controller, job_id, kills)
            killer.start()
            view = watch(lambda: client.job(job_id), console)
            killer.stop()
        finally:
            client.close()
            server.stop()
    console.print(summary(view))
    failures = sum(a["outcome"] == "crash" for a in view["job"]["activations"])
    console.print(
        f"injected {len(killer.killed)} failure(s), the controller saw {failures} crash(es) and "
        f"ran those units again; the model is in {ROOT / 'state.db'} "
        f"(job {job_id}, blob {view['job']['model']})"
    )
    done: bool = view["job"]["state"] == "done"
    return done and failures == len(killer.killed) == kills


class _Killer(threading.Thread):
    """Kills the containers of ``kills`` training activations once each has run a while."""

    def __init__(
        self, platform: LocalPlatform, controller: Controller, job_id: str, kills: int
    ) -> None:
        super().__init__(name="faasdl-demo-killer", daemon=True)
        self.platform = platform
        self.controller = controller
        self.job_id = job_id
        self.kills = kills
        self.killed: list[str] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def run(self) -> None:
        seen: dict[str, float] = {}
        while len(self.killed) < self.kills and not self._halt.wait(0.2):
            view = self.controller.view(self.job_id)
            if view.job.finished:
                return
            if view.job.round == 0 and view.job.spec["epochs"] > 1:
                continue  # kill warm containers mid-epoch, not cold ones importing TensorFlow
            for unit in view.units:
                activation = unit.activation_id
                if activation is None or activation in self.killed:
                    continue
                if not self.platform.is_running(activation):
                    continue
                first = seen.setdefault(activation, time.monotonic())
                if time.monotonic() - first >= KILL_AFTER_S and len(self.killed) < self.kills:
                    try:
                        self.platform.kill(activation)
                    except ActivationNotFound:
                        continue  # it finished first
                    self.killed.append(activation)
