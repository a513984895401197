"""``faasdl bench store``: blob write/read throughput and CAS rate of a backend, against the raw
client writing the same bytes in the same run (redis-py pipelined SETs of the same chunks; plain
file writes with fsync), so the overhead of chunking, checksums and manifests is visible; and what
a checkpoint's blob costs (a 512 KiB blob not forced to disk, the one before it deleted: the
store's part of every Canary checkpoint), in time and in the writing process's CPU; and how long a
heartbeat's write waits beside ``--writers`` processes checkpointing every 20 ms (on SQLite one
process writes at a time: a beat held back past its lease has a live attempt recovered)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import multiprocessing
import os
import queue
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import redis
from rich.console import Console

from faasdl.config import StoreSettings, private_settings
from faasdl.errors import StoreError, ValidationError
from faasdl.store import make_store
from faasdl.store.base import StateStore
from faasdl.store.redis import RedisStore
from faasdl.store.redis_server import RedisServer

MiB = 1024 * 1024
#: The checkpoint-sized blob: a BFS frontier or a small model's weights.
CHECKPOINT_BYTES = 512 * 1024


def _median_rate(size: int, runs: list[float]) -> float:
    return round(size / MiB / statistics.median(runs), 1)


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


Raw = tuple[Callable[[str, bytes], None], Callable[[str], None]]


def _raw_redis(client: redis.Redis, chunk: int) -> Raw:
    def write(name: str, data: bytes) -> None:
        pipe = client.pipeline(transaction=False)
        for i in range(0, len(data), chunk):
            pipe.set(f"raw:{name}:{i}", data[i : i + chunk])
        pipe.execute()

    def delete(name: str) -> None:
        keys = list(client.scan_iter(match=f"raw:{name}:*"))
        if keys:
            client.delete(*keys)

    return write, delete


def _raw_files(folder: Path, chunk: int) -> Raw:
    def write(name: str, data: bytes) -> None:
        target = folder / name
        target.mkdir(parents=True, exist_ok=True)
        for i in range(0, len(data), chunk):
            with open(target / str(i), "wb") as fh:
                fh.write(data[i : i + chunk])
                fh.flush()
                os.fsync(fh.fileno())

    def delete(name: str) -> None:
        shutil.rmtree(folder / name, ignore_errors=True)

    return write, delete


def _one_run(
    store: StateStore, raw: Raw, name: str, data: bytes, *, raw_first: bool
) -> tuple[float, float, float]:
    """Seconds for the raw write, the blob write and the blob read of ``data``. Which writer goes
    first alternates, and both clean up, so that neither meets a fuller server (or an
    append-only-file rewrite) more often than the other."""
    raw_write, raw_delete = raw
    if raw_first:
        raw_s = _timed(lambda: raw_write(name, data))
        blob_s = _timed(lambda: store.put_blob(f"bench/{name}", data))
    else:
        blob_s = _timed(lambda: store.put_blob(f"bench/{name}", data))
        raw_s = _timed(lambda: raw_write(name, data))
    read_s = _timed(lambda: store.get_blob(f"bench/{name}"))
    store.delete_blob(f"bench/{name}")
    raw_delete(name)
    return raw_s, blob_s, read_s


def _measure(
    store: StateStore,
    raw: Raw,
    *,
    sizes_mib: list[int],
    repeats: int,
    cas_ops: int,
    checkpoints: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "blob_write_mb_s": {},
        "blob_read_mb_s": {},
        "raw_write_mb_s": {},
        "overhead_ratio": {},
    }
    for mib in sizes_mib:
        size = mib * MiB
        data = os.urandom(size)
        say(f"{mib} MiB blobs x {repeats}")
        runs = [
            _one_run(store, raw, f"{mib}-{r}", data, raw_first=r % 2 == 0) for r in range(repeats)
        ]
        raws, writes, reads = (list(column) for column in zip(*runs, strict=True))
        key = str(mib)
        out["blob_write_mb_s"][key] = _median_rate(size, writes)
        out["blob_read_mb_s"][key] = _median_rate(size, reads)
        out["raw_write_mb_s"][key] = _median_rate(size, raws)
        out["overhead_ratio"][key] = round(
            out["blob_write_mb_s"][key] / out["raw_write_mb_s"][key], 3
        )
    say(f"{cas_ops} CAS increments")
    store.put("bench/counter", {"n": 0})
    started = time.perf_counter()
    for _ in range(cas_ops):
        current = store.get("bench/counter")
        assert current is not None
        store.compare_and_set("bench/counter", current.version, {"n": current.value["n"] + 1})
    out["cas_ops_per_s"] = round(cas_ops / (time.perf_counter() - started), 1)
    store.delete("bench/counter")  # nothing of the run is left in a store given by --url
    say(f"{checkpoints} checkpoint-sized blobs")
    out["checkpoint_ms"], out["checkpoint_cpu_ms"] = _checkpoints(store, checkpoints)
    return out


def _checkpoints(store: StateStore, count: int) -> tuple[float, float]:
    """Median wall and mean CPU milliseconds (of this process) of a checkpoint's blob: a new blob
    of :data:`CHECKPOINT_BYTES` not forced to disk, the one before it deleted (as a checkpoint's
    head moves on)."""
    data = os.urandom(CHECKPOINT_BYTES)
    store.put_blob("bench/ckpt/0", data, durable=False)
    walls = []
    cpu_started = time.process_time()
    for i in range(1, count + 1):
        started = time.perf_counter()
        store.put_blob(f"bench/ckpt/{i}", data, durable=False)
        store.delete_blob(f"bench/ckpt/{i - 1}")
        walls.append(time.perf_counter() - started)
    cpu_s = time.process_time() - cpu_started
    store.delete_blob(f"bench/ckpt/{count}")
    return round(1000 * statistics.median(walls), 3), round(1000 * cpu_s / count, 3)


#: A contending writer's checkpoint and heartbeat periods (s): a small model's checkpoint after
#: each short epoch, and a beat twice a 1 s heartbeat period.
CONTEND_CHECKPOINT_S = 0.02
CONTEND_BEAT_S = 0.5


def _contender(
    settings: StoreSettings,
    url: str,
    index: int,
    seconds: float,
    start: Barrier,
    results: multiprocessing.Queue[tuple[list[float], list[float]]],
) -> None:
    """One of ``--writers`` processes, for ``seconds``: a thread writes a checkpoint-sized blob
    every :data:`CONTEND_CHECKPOINT_S` (its head moved, the blob before deleted), another beats (a
    record written) every :data:`CONTEND_BEAT_S`, while the main thread computes as a trainer's
    does (hashing, which like TensorFlow's kernels lets the GIL go); puts each thread's waits."""
    beats: list[float] = []
    checkpoints: list[float] = []
    with make_store(settings, url) as store:
        start.wait(timeout=120)  # the others' starts; one that failed breaks it
        ends = time.monotonic() + seconds

        def beat() -> None:
            while time.monotonic() < ends:
                beats.append(_timed(lambda: store.put(f"bench/contend/{index}/unit", {"at": 0})))
                time.sleep(CONTEND_BEAT_S)

        beating = threading.Thread(target=beat, name="beat")
        beating.start()
        data = os.urandom(CHECKPOINT_BYTES)
        head = f"bench/contend/{index}/head"
        written = 0

        def persist() -> None:
            nonlocal written
            while time.monotonic() < ends:
                started = time.perf_counter()
                store.put_blob(f"bench/contend/{index}/{written}", data, durable=False)
                store.put(head, {"n": written})
                if written:
                    store.delete_blob(f"bench/contend/{index}/{written - 1}")
                checkpoints.append(time.perf_counter() - started)
                written += 1
                time.sleep(CONTEND_CHECKPOINT_S)

        persisting = threading.Thread(target=persist, name="persist")
        persisting.start()
        while time.monotonic() < ends:  # the trainer
            hashlib.sha256(data).digest()
        beating.join()
        persisting.join()
        if written:
            store.delete_blob(f"bench/contend/{index}/{written - 1}")
        store.delete(head)
        store.delete(f"bench/contend/{index}/unit")
    results.put((beats, checkpoints))


def _contention(settings: StoreSettings, url: str, writers: int, seconds: float) -> dict[str, Any]:
    """What ``writers`` processes of :func:`_contender` waited, at once, on the store at ``url``."""
    context = multiprocessing.get_context("spawn")  # no copy of this process's threads or store
    start = context.Barrier(writers)
    results: multiprocessing.Queue[tuple[list[float], list[float]]] = context.Queue()
    processes = [
        context.Process(
            target=_contender, args=(settings, url, i, seconds, start, results), daemon=True
        )
        for i in range(writers)
    ]
    for process in processes:
        process.start()
    found: list[tuple[list[float], list[float]]] = []
    while len(found) < writers:
        try:
            found.append(results.get(timeout=1.0))
        except queue.Empty:
            failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            if failed:
                for process in processes:
                    process.kill()
                raise StoreError(
                    f"a contending writer failed (exit code {failed[0]}): see its error above"
                ) from None
    for process in processes:
        process.join()
    beats = sorted(b for waits, _ in found for b in waits)
    checkpoints = sorted(c for _, waits in found for c in waits)

    def ms(waits: list[float], q: float) -> float:
        return round(1000 * waits[min(len(waits) - 1, int(q * len(waits)))], 1)

    return {
        "writers": writers,
        "seconds": seconds,
        "beats": len(beats),
        "beat_wait_ms_p50": ms(beats, 0.5),
        "beat_wait_ms_p99": ms(beats, 0.99),
        "beat_wait_ms_max": ms(beats, 1.0),
        "checkpoints_per_s": round(len(checkpoints) / seconds, 1),
        "checkpoint_wait_ms_p50": ms(checkpoints, 0.5),
        "checkpoint_wait_ms_max": ms(checkpoints, 1.0),
    }


#: The backend each store scheme the bench measures is (its raw client is that backend's).
BACKENDS = {"sqlite": "sqlite", "redis": "redis", "rediss": "redis"}


def bench_backend(backend: str | None, url: str | None) -> str:
    """The backend to measure: ``url``'s where one is given (another is refused), else
    ``backend``, else sqlite."""
    if backend not in (None, *BACKENDS.values()):
        raise ValidationError(
            f"unknown backend '{backend}'; use sqlite or redis", field="--backend"
        )
    if url is None:
        return backend or "sqlite"
    of_url = BACKENDS.get(url.partition("://")[0])
    if of_url is None:
        raise ValidationError(
            f"'{url}' is not a sqlite:// or redis:// URL (the two this bench measures)",
            field="--url",
        )
    if backend not in (None, of_url):
        raise ValidationError(f"{backend}, but --url names a {of_url} store", field="--backend")
    return of_url


def run_store_bench(
    *,
    backend: str | None = None,
    url: str | None = None,
    sizes_mib: tuple[int, ...] = (1, 16, 100),
    repeats: int = 5,
    cas_ops: int = 2000,
    checkpoints: int = 200,
    writers: int = 0,
    contention_s: float = 20.0,
    progress: Console | None = None,
) -> dict[str, Any]:
    """The bench's figures (see the module); ``writers`` processes contend for
    ``contention_s`` seconds (none: not measured). The store is written as the environment's
    settings say (its chunks, spill threshold); a store ``url`` names is reached as they say
    too (its user, password and CA bundle), the bench's own store without them."""
    backend = bench_backend(backend, url)  # the raw client compared with is the store's kind
    say: Callable[[str], None] = progress.print if progress else (lambda _: None)
    measure = functools.partial(
        _measure,
        sizes_mib=list(sizes_mib),
        repeats=repeats,
        cas_ops=cas_ops,
        checkpoints=checkpoints,
        say=say,
    )
    settings = private_settings(users_store=url is not None).store
    with (
        tempfile.TemporaryDirectory(prefix="faasdl-bench-store-") as tmp,
        contextlib.ExitStack() as stack,  # a private redis-server, stopped before tmp goes
    ):
        folder = Path(tmp)
        settings = settings.model_copy(update={"spill_dir": str(folder / "spill")})
        if backend == "sqlite":
            url = url or f"sqlite:///{folder / 'bench.db'}"
        elif url is None:
            server = stack.enter_context(RedisServer(directory=folder / "redis"))
            say(f"private redis-server on port {server.port} (appendfsync always)")
            url = server.url
        with make_store(settings, url) as store:
            # The plain client reaches the server as the store does (a password, a CA bundle).
            raw = (
                _raw_redis(store.new_client(), settings.chunk_bytes)
                if isinstance(store, RedisStore)
                else _raw_files(folder / "raw", settings.chunk_bytes)
            )
            result = {"backend": backend, "chunk_bytes": settings.chunk_bytes}
            result.update(measure(store, raw))
        if writers:
            say(
                f"{writers} processes checkpointing every {1000 * CONTEND_CHECKPOINT_S:g} ms "
                f"and beating every {CONTEND_BEAT_S:g} s, for {contention_s:g} s"
            )
            result["contention"] = _contention(settings, url, writers, contention_s)
        return result
