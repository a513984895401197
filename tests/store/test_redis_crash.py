"""Durability: kill -9 the Redis server during a stream of acknowledged CAS writes, restart it from
its append-only file, and check that every acknowledged write is there and no unacknowledged one
is half-there."""

from __future__ import annotations

import threading
from pathlib import Path

from faasdl.config import StoreSettings
from faasdl.errors import StoreUnavailable
from faasdl.store import make_store
from faasdl.store.redis_server import RedisServer
from tests.conftest import eventually
from tests.store.conftest import private_redis


def test_acknowledged_cas_writes_survive_kill_9(tmp_path: Path) -> None:
    server = private_redis(tmp_path / "redis")
    server.start()
    try:
        for crash in range(3):
            acknowledged = stream_until_crash(server, crash)
            server.start()  # same directory and port: it replays its AOF

            with make_store(StoreSettings(), server.url) as store:
                record = store.get("fn/counter")
                assert record is not None
                n = record.value["n"]
                # Every acknowledged write is present; the one in flight is whole or absent.
                assert n in (acknowledged, acknowledged + 1), (n, acknowledged)
                assert record.version == n + 1
                assert record.value == {"n": n, "pad": "x" * 1000}
    finally:
        server.stop()


def stream_until_crash(server: RedisServer, crash: int) -> int:
    """CAS-increment a counter until the server is SIGKILLed after 200 more acknowledgements;
    return the last acknowledged value."""
    acknowledged = [-1]
    with make_store(StoreSettings(), server.url) as store:
        store.put_if_absent("fn/counter", {"n": 0, "pad": "x" * 1000})
        start = store.get("fn/counter").value["n"]  # type: ignore[union-attr]
        acknowledged[0] = start

        def writer() -> None:
            while True:
                try:
                    current = store.get("fn/counter")
                    assert current is not None
                    n = current.value["n"] + 1
                    if store.compare_and_set(
                        "fn/counter", current.version, {"n": n, "pad": "x" * 1000}
                    ):
                        acknowledged[0] = n
                except StoreUnavailable:
                    return

        thread = threading.Thread(target=writer)
        thread.start()
        eventually(lambda: acknowledged[0] >= start + 200, timeout_s=60, what=f"crash {crash}")
        server.kill()
        thread.join(timeout=60)
        assert not thread.is_alive()
    return acknowledged[0]
