"""``faasdl bench api``: does the controller stay responsive to many clients while a job trains?

Deployed as on a cluster, on loopback: the platform in a process of its own (the embedded one
behind its OpenWhisk REST API, ``faasdl platform serve``, standing in for OpenWhisk), the
controller in another (``faasdl serve`` on the OpenWhisk client, a SQLite or Redis store, API
keys). A four-worker job trains, and 50 clients, each with its own key, use the API at once for a
bounded time:

* 40 pollers read the training job's status (``GET /v1/jobs/{id}``), every 0.1–0.5 s, and now
  and then the job list;
* 5 followers hold its event stream open (and reconnect when the controller ends one);
* 5 submitters submit a small job every 1–3 s and cancel it (the training job holds the pool, so
  the small ones wait queued and never start).

Printed: requests, errors (any answer but the expected 2xx, and any failed connection), p50 and
p99 latency of the status reads, per-kind figures, and the controller process's CPU time and peak
memory. Targets: 0 errors, status p99 ≤ 200 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from rich.console import Console

from faasdl.bench import percentile
from faasdl.config import StoreSettings
from faasdl.controller.auth import create_key
from faasdl.errors import FaasdlError
from faasdl.store import make_store
from faasdl.store.redis_server import RedisServer, free_port

CLIENTS = {"poll": 40, "follow": 5, "submit": 5}
TRAINING_JOB: dict[str, Any] = {
    "model": "mlp",
    "dataset": {"name": "digits"},
    "workers": 4,
    "epochs": 2000,
    "sync_every": 4,
    "batch_size": 32,
}
SMALL_JOB: dict[str, Any] = {"model": "mlp", "dataset": {"name": "digits"}, "epochs": 1}
POOL_MB = 4096


@dataclass
class Tally:
    """What the clients saw."""

    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    events: int = 0
    streams: int = 0

    def record(self, kind: str, started: float, response: httpx.Response, *expected: int) -> None:
        self.latencies_ms[kind].append((time.perf_counter() - started) * 1000)
        if response.status_code not in expected:
            self.errors[kind].append(f"HTTP {response.status_code}: {response.text[:200]}")


def run_api_bench(*, quick: bool, store: str, progress: Console) -> dict[str, Any]:
    duration_s = 20.0 if quick else 60.0
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="faasdl-api-bench-")))
        store_url = f"sqlite:///{root / 'state.db'}"
        if store == "redis":
            redis = stack.enter_context(RedisServer(directory=root / "redis"))
            store_url = redis.url
        url, env = _environment(root, store_url)
        keys = _keys(store_url, root, sum(CLIENTS.values()) + 1)
        platform = _start(["platform", "serve"], env, root / "platform.log")
        stack.callback(_stop, platform)
        log = root / "controller.log"
        server = _start(["serve"], env, log)
        try:
            _wait_ready(url, server, log)
            job_id = _start_training(url, keys[-1], progress)
            progress.print(f"{sum(CLIENTS.values())} clients for {duration_s:.0f} s")
            before = _usage(server.pid)
            tally = asyncio.run(_load(url, keys, job_id, duration_s))
            after = _usage(server.pid)
            state = httpx.get(
                f"{url}/v1/jobs/{job_id}", headers=_auth(keys[-1]), timeout=30
            ).json()["job"]
            httpx.delete(f"{url}/v1/jobs/{job_id}", headers=_auth(keys[-1]), timeout=30)
        finally:
            _stop(server)
    return {"store": store, **_figures(tally, duration_s, state, before, after)}


def _environment(root: Path, store_url: str) -> tuple[str, dict[str, str]]:
    port, platform_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAASDL_")} | {
        "FAASDL_STORE__URL": store_url,
        "FAASDL_STORE__SPILL_DIR": str(root / "spill"),
        "FAASDL_CONTROLLER__PORT": str(port),
        "FAASDL_API__MAX_STREAMS_PER_KEY": "2",
        "FAASDL_SERVER__PORT": str(platform_port),
        "FAASDL_LOCAL__POOL_MEMORY_MB": str(POOL_MB),
        "FAASDL_PLATFORM": "openwhisk",
        "FAASDL_OPENWHISK__API_HOST": f"http://127.0.0.1:{platform_port}",
    }
    return f"http://127.0.0.1:{port}", env


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).with_name("faasdl")), *command],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _keys(store_url: str, root: Path, count: int) -> list[str]:
    """One key per client, and the trainer's last; all of tenant ``bench``."""
    with make_store(StoreSettings(url=store_url, spill_dir=str(root / "spill"))) as store:
        return [create_key(store, tenant="bench", name=f"client {i}")[1] for i in range(count)]


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _wait_ready(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise FaasdlError(f"the controller exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise FaasdlError("the controller did not become ready in 120 s")


def _start_training(url: str, key: str, progress: Console) -> str:
    """Submit the training job and wait until it has finished a round (warm containers)."""
    with httpx.Client(base_url=url, headers=_auth(key), timeout=120) as http:
        response = http.post("/v1/jobs", json=TRAINING_JOB)
        if response.status_code != 201:
            raise FaasdlError(f"the training job was refused: {response.text}")
        job_id: str = response.json()["job"]["job_id"]
        progress.print(f"training job {job_id}: waiting for its first round")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            job = http.get(f"/v1/jobs/{job_id}").json()["job"]
            if job["state"] != "running" and job["state"] != "queued":
                raise FaasdlError(f"the training job ended early: {job['state']} {job['error']}")
            if job["round"] >= 1:
                return job_id
            time.sleep(0.5)
    raise FaasdlError("the training job finished no round in 300 s")


async def _load(url: str, keys: list[str], job_id: str, duration_s: float) -> Tally:
    tally = Tally()
    stop = time.monotonic() + duration_s
    async with contextlib.AsyncExitStack() as stack:
        # Each client its own connections, as 50 users would have: one shared pool is a queue
        # of the load generator's own, and its wait was counted as the controller's.
        clients = [
            (await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30)), key)
            for key in keys[: sum(CLIENTS.values())]
        ]
        polling, following, submitting = (
            clients[: CLIENTS["poll"]],
            clients[CLIENTS["poll"] : CLIENTS["poll"] + CLIENTS["follow"]],
            clients[CLIENTS["poll"] + CLIENTS["follow"] :],
        )
        await asyncio.gather(
            *(_poll(http, key, job_id, stop, tally) for http, key in polling),
            *(_follow(http, key, job_id, stop, tally) for http, key in following),
            *(_submit(http, key, stop, tally) for http, key in submitting),
        )
    return tally


async def _call(
    http: httpx.AsyncClient, tally: Tally, kind: str, method: str, path: str, key: str, **kw: Any
) -> httpx.Response | None:
    started = time.perf_counter()
    try:
        response = await http.request(method, path, headers=_auth(key), **kw)
    except httpx.HTTPError as exc:
        tally.errors[kind].append(f"{type(exc).__name__}: {exc}")
        return None
    expected = {"submit": (201,), "cancel": (200,)}.get(kind, (200,))
    tally.record(kind, started, response, *expected)
    return response


async def _poll(http: httpx.AsyncClient, key: str, job_id: str, stop: float, tally: Tally) -> None:
    rng = random.Random(key)
    while time.monotonic() < stop:
        await asyncio.sleep(rng.uniform(0.1, 0.5))
        if rng.random() < 0.1:
            await _call(http, tally, "list", "GET", "/v1/jobs", key)
        else:
            await _call(http, tally, "status", "GET", f"/v1/jobs/{job_id}", key)


async def _follow(
    http: httpx.AsyncClient, key: str, job_id: str, stop: float, tally: Tally
) -> None:
    while (left := stop - time.monotonic()) > 0:
        try:
            async with asyncio.timeout(left):
                async with http.stream(
                    "GET", f"/v1/jobs/{job_id}/events", headers=_auth(key)
                ) as stream:
                    if stream.status_code != 200:
                        tally.errors["follow"].append(f"HTTP {stream.status_code}")
                        await asyncio.sleep(1)
                        continue
                    tally.streams += 1
                    async for line in stream.aiter_lines():
                        tally.events += line.startswith("event: ")
        except TimeoutError:
            return  # the bench's end, not the stream's
        except httpx.HTTPError as exc:
            tally.errors["follow"].append(f"{type(exc).__name__}: {exc}")


async def _submit(http: httpx.AsyncClient, key: str, stop: float, tally: Tally) -> None:
    rng = random.Random(key)
    while time.monotonic() < stop:
        await asyncio.sleep(rng.uniform(1.0, 3.0))
        response = await _call(http, tally, "submit", "POST", "/v1/jobs", key, json=SMALL_JOB)
        if response is not None and response.status_code == 201:
            job_id = response.json()["job"]["job_id"]
            await _call(http, tally, "cancel", "DELETE", f"/v1/jobs/{job_id}", key)


def _usage(pid: int) -> dict[str, float]:
    process = psutil.Process(pid)
    cpu = process.cpu_times()
    return {"cpu_s": cpu.user + cpu.system, "rss_mb": process.memory_info().rss / 2**20}


def _figures(
    tally: Tally,
    duration_s: float,
    job: dict[str, Any],
    before: dict[str, float],
    after: dict[str, float],
) -> dict[str, Any]:
    def quantiles(values: list[float]) -> dict[str, float | int]:
        if not values:
            return {"requests": 0}
        return {
            "requests": len(values),
            "p50_ms": percentile(values, 50),
            "p99_ms": percentile(values, 99),
            "max_ms": round(max(values), 1),
        }

    status = quantiles(tally.latencies_ms["status"])
    every = [ms for values in tally.latencies_ms.values() for ms in values]
    errors = sum(len(e) for e in tally.errors.values())
    return {
        "clients": sum(CLIENTS.values()),
        "duration_s": duration_s,
        "requests": len(every) + tally.streams,
        "errors": errors,
        "p50_ms": status.get("p50_ms"),
        "p99_ms": status.get("p99_ms"),
        "by_kind": {kind: quantiles(values) for kind, values in tally.latencies_ms.items()},
        "streams_opened": tally.streams,
        "stream_events": tally.events,
        "error_samples": {kind: e[:3] for kind, e in tally.errors.items() if e},
        "training_job": {"state": job["state"], "rounds_done": job["round"]},
        "controller_cpu_s": round(after["cpu_s"] - before["cpu_s"], 2),
        "controller_rss_mb": round(after["rss_mb"], 1),
        "targets": {"errors": 0, "p99_ms": 200},
    }
