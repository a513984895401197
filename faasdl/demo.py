"""``faasdl demo``: a real multi-round job on the embedded platform with injected failures.

Until the TensorFlow training issue lands, the job is federated logistic regression in NumPy:
each round trains one action per shard from the global weights, averages the results weighted by
example count, and carries on. Some activations are killed mid-run (their containers SIGKILLed);
the failure is classified from the activation record and the shard is retried from scratch.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from faasdl.config import LocalPlatformSettings
from faasdl.platform.base import ActionSpec, Activation
from faasdl.platform.classify import classify
from faasdl.platform.local import LocalPlatform

ROUNDS = 3
EXAMPLES_PER_SHARD = 3000
EPOCHS_PER_ROUND = 40


@dataclass
class _Unit:
    shard: int
    activation_id: str = ""
    state: str = "queued"
    attempts: int = 0
    loss: float | None = None
    failures: list[str] = field(default_factory=list)
    result: dict[str, Any] | None = None
    failed_at: float | None = None
    recovery_s: list[float] = field(default_factory=list)


def _table(round_: int, units: list[_Unit], platform: LocalPlatform) -> Table:
    stats = platform.pool_stats()
    table = Table(
        title=f"round {round_ + 1}/{ROUNDS} - pool {stats['reserved_mb']}/{stats['budget_mb']} MB, "
        f"{stats['busy']} busy, {stats['idle']} idle, {stats['queued']} queued"
    )
    for column in ("shard", "state", "attempts", "loss", "failures"):
        table.add_column(column)
    for u in units:
        style = {"done": "green", "killed": "red", "retrying": "yellow"}.get(u.state, "")
        table.add_row(
            str(u.shard),
            f"[{style}]{u.state}[/]" if style else u.state,
            str(u.attempts),
            f"{u.loss:.4f}" if u.loss is not None else "-",
            "; ".join(u.failures) or "-",
        )
    return table


def run_demo(*, shards: int, kills: int, console: Console, seed: int = 7) -> bool:
    """Run the job; answer whether it finished with a model better than chance."""
    code = resources.files("faasdl").joinpath("demo_action.py").read_text()
    settings = LocalPlatformSettings(pool_memory_mb=2048, memory_max_mb=2048)
    rng = random.Random(seed)
    weights: list[float] | None = None
    started = time.monotonic()
    all_units: list[_Unit] = []
    with LocalPlatform(settings=settings) as platform:
        console.print(
            "embedded platform up: memory limits enforced by "
            f"{platform.limits().memory_enforcement}, "
            f"pool {settings.pool_memory_mb} MB"
        )
        platform.deploy(ActionSpec(name="demo-train", code=code, memory_mb=256, timeout_ms=60_000))
        kill_plan = sorted(rng.sample(range(ROUNDS * shards), min(kills, ROUNDS * shards)))
        for round_ in range(ROUNDS):
            units = [_Unit(shard=s) for s in range(shards)]
            all_units += units
            to_kill = {i - round_ * shards for i in kill_plan if i // shards == round_}
            weights = _run_round(platform, round_, units, weights, to_kill, rng, console)
    elapsed = time.monotonic() - started
    accuracy = _accuracy(np.asarray(weights))
    recoveries = [r for u in all_units for r in u.recovery_s]
    console.print(
        f"\n[bold]done[/] in {elapsed:.1f} s: {ROUNDS} rounds x {shards} shards, "
        f"{len(recoveries)} failure(s) injected and recovered by retry "
        f"(mean recovery {np.mean(recoveries) if recoveries else 0:.2f} s); "
        f"test accuracy of the averaged model: [bold]{accuracy:.3f}[/]"
    )
    return accuracy > 0.8 and all(u.state == "done" for u in all_units)


def _run_round(
    platform: LocalPlatform,
    round_: int,
    units: list[_Unit],
    weights: list[float] | None,
    to_kill: set[int],
    rng: random.Random,
    console: Console,
) -> list[float]:
    def params(u: _Unit) -> dict[str, Any]:
        return {
            "shard": u.shard,
            "round": round_,
            "examples": EXAMPLES_PER_SHARD,
            "epochs": EPOCHS_PER_ROUND,
            "weights": weights,
        }

    def launch(u: _Unit) -> None:
        u.activation_id = platform.invoke("demo-train", params(u))
        u.attempts += 1
        u.state = "running" if u.attempts == 1 else "retrying"

    for u in units:
        launch(u)
    # Each planned kill lands a random 0.1-0.5 s after its activation starts running.
    delay = {u.shard: rng.uniform(0.1, 0.5) for u in units if u.shard in to_kill}
    kill_at: dict[int, float] = {}
    with Live(_table(round_, units, platform), console=console, refresh_per_second=8) as live:
        while any(u.state != "done" for u in units):
            for u in units:
                running = platform.is_running(u.activation_id)
                if u.shard in delay and running:
                    kill_at[u.shard] = time.monotonic() + delay.pop(u.shard)
                if u.shard in kill_at and time.monotonic() >= kill_at[u.shard] and running:
                    platform.kill(u.activation_id)
                    del kill_at[u.shard]
                    u.state = "killed"
                record = platform.get_activation(u.activation_id)
                if record is not None and u.state != "done":
                    _settle(platform, u, record, launch)
            live.update(_table(round_, units, platform))
            platform.wait_any([u.activation_id for u in units if u.state != "done"], timeout_s=0.1)
    total = sum(u.result["examples"] for u in units if u.result)
    return list(
        sum(np.asarray(u.result["weights"]) * u.result["examples"] for u in units if u.result)
        / total
    )


def _settle(platform: LocalPlatform, u: _Unit, record: Activation, launch: Any) -> None:
    failure = classify(record)
    if failure is None:
        u.state, u.result = "done", record.response.result
        u.loss = float(record.response.result["loss"])
        if u.failed_at is not None:
            u.recovery_s.append(record.end / 1000 - u.failed_at)
        return
    u.failures.append(failure.kind.value)
    u.failed_at = record.end / 1000
    launch(u)


def _accuracy(weights: np.ndarray) -> float:
    from faasdl.demo_action import make_data

    x, y = make_data(seed=99, n=5000)
    return float(np.mean(((x @ weights) > 0) == y))
