"""``faasdl bench platform``: start latency (cold, warm, prewarmed; a no-op and a TensorFlow
action), round-trip latency in process and over the REST server, and no-op throughput.

Start latency is measured from ``invoke`` to the moment the action's ``main`` begins (the action
reports its own entry time; client and container share the machine's clock), so it is exactly
what a cold start costs a caller. Round trips are ``invoke`` to record, warm.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rich.console import Console

from faasdl.config import OpenWhiskSettings, ServerSettings, private_settings
from faasdl.errors import PlatformError
from faasdl.platform.base import ActionSpec, Platform
from faasdl.platform.local import LocalPlatform
from faasdl.platform.local.server import serve_in_thread
from faasdl.platform.openwhisk import OpenWhiskPlatform

NOOP = """\
import time

def main(args):
    return {"entered": time.time()}
"""

TF_ACTION = """\
import time
import tensorflow as tf

def main(args):
    entered = time.time()
    if args.get("warmup"):
        return {"warm": True}
    return {"entered": entered, "tf": tf.__version__}
"""


def _p50(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def _start_latency(platform: Platform, name: str, params: dict[str, Any] | None = None) -> float:
    invoked = time.time()
    record = platform.call(name, params or {})
    if not record.success:
        raise PlatformError(f"benchmark action {name} failed: {record.error}")
    return (float(record.response.result["entered"]) - invoked) * 1000


def _round_trip(platform: Platform, name: str) -> float:
    started = time.perf_counter()
    record = platform.call(name, {})
    if not record.success:
        raise PlatformError(f"benchmark action {name} failed: {record.error}")
    return (time.perf_counter() - started) * 1000


def _cold_starts(platform: LocalPlatform, spec: ActionSpec, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        platform.deploy(spec)  # a new version: its warm containers are dropped
        out.append(_start_latency(platform, spec.name))
    return out


def _prewarmed_starts(platform: LocalPlatform, spec: ActionSpec, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        platform.deploy(spec)
        if platform.prewarm(spec.name, 1) != 1:
            raise PlatformError(f"could not prewarm {spec.name}")
        out.append(_start_latency(platform, spec.name))
    return out


def _throughput(platform: LocalPlatform, name: str, activations: int, clients: int) -> float:
    def submit(count: int) -> list[str]:
        return [platform.invoke(name) for _ in range(count)]

    share = [
        activations // clients + (1 if i < activations % clients else 0) for i in range(clients)
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        ids = [i for batch in pool.map(submit, share) for i in batch]
    records = platform.wait(ids, timeout_s=300)
    elapsed = time.perf_counter() - started
    failed = [r for r in records.values() if not r.success]
    if failed:
        raise PlatformError(f"{len(failed)} throughput activations failed: {failed[0].error}")
    return activations / elapsed


def run_platform_bench(
    *,
    samples: int = 30,
    tf_samples: int = 3,
    throughput_activations: int = 500,
    progress: Console | None = None,
) -> dict[str, Any]:
    say: Callable[[str], None] = progress.print if progress else (lambda _: None)
    settings = private_settings(
        local={
            "pool_memory_mb": 4096,
            "memory_max_mb": 2048,
            "concurrent_invocations": max(100, throughput_activations + 10),
        }
    ).local
    result: dict[str, Any] = {}  # the machine and Python: under the command's "environment"
    noop = ActionSpec(name="bench-noop", code=NOOP, memory_mb=128, timeout_ms=10_000)
    with LocalPlatform(settings=settings) as local:
        result["memory_enforcement"] = local.limits().memory_enforcement
        say(f"cold starts of a no-op action ({samples})")
        result["cold_start_ms_p50"] = _p50(_cold_starts(local, noop, samples))
        say("warm starts")
        local.deploy(noop)
        _start_latency(local, noop.name)
        result["warm_start_ms_p50"] = _p50(
            [_start_latency(local, noop.name) for _ in range(samples)]
        )
        say("prewarmed starts")
        result["prewarmed_start_ms_p50"] = _p50(_prewarmed_starts(local, noop, samples))
        say("warm round trips in process")
        _round_trip(local, noop.name)
        result["noop_invoke_ms_p50"] = _p50([_round_trip(local, noop.name) for _ in range(samples)])

        if importlib.util.find_spec("tensorflow") is not None:
            tf = ActionSpec(name="bench-tf", code=TF_ACTION, memory_mb=1024, timeout_ms=120_000)
            say(f"cold starts of a TensorFlow action ({tf_samples})")
            cold = _p50(_cold_starts(local, tf, tf_samples))
            say("prewarmed starts of a TensorFlow action")
            warm = _p50(_prewarmed_starts(local, tf, tf_samples))
            result.update(
                tf_cold_start_ms_p50=cold,
                tf_prewarmed_start_ms_p50=warm,
                tf_prewarmed_over_cold=round(warm / cold, 4),
            )
            local.delete_action(tf.name)
        else:
            say("TensorFlow is not installed: skipping the TensorFlow figures")
            result.update(tf_cold_start_ms_p50=None, tf_prewarmed_start_ms_p50=None)

        containers = 8
        say(f"throughput: {throughput_activations} no-op activations on {containers} containers")
        pool_spec = noop.model_copy(
            update={"name": "bench-noop-pool", "memory_mb": settings.pool_memory_mb // containers}
        )
        local.deploy(pool_spec)
        local.prewarm(pool_spec.name, containers)
        _throughput(local, pool_spec.name, containers * 4, clients=4)
        result["noop_activations_per_s"] = round(
            _throughput(local, pool_spec.name, throughput_activations, clients=4), 1
        )

        say("warm round trips over the REST server")
        server_settings = ServerSettings(port=0)
        with (
            serve_in_thread(local, server_settings) as url,
            OpenWhiskPlatform(
                settings=OpenWhiskSettings(api_host=url, auth=server_settings.auth)
            ) as rest,
        ):
            rest.deploy(noop.model_copy(update={"name": "bench-rest-noop"}))
            _round_trip(rest, "bench-rest-noop")
            result["rest_noop_invoke_ms_p50"] = _p50(
                [_round_trip(rest, "bench-rest-noop") for _ in range(samples)]
            )
    return result
