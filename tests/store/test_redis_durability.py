"""A Redis store says what its server's persistence settings would lose of what it acknowledged."""

from __future__ import annotations

from pathlib import Path

import redis

from faasdl.config import StoreSettings
from faasdl.store import make_store
from faasdl.store.redis_server import RedisServer


def test_a_redis_that_could_lose_acknowledged_writes_is_named_with_the_setting_to_change(
    tmp_path: Path,
) -> None:
    # Arrange: a private server as the chart runs it (AOF written through at every write).
    server = RedisServer(directory=tmp_path / "redis")
    server.start()
    settings: tuple[dict[str, str], ...] = (
        {},  # as started
        {"appendfsync": "everysec"},
        {"appendonly": "no", "save": "3600 1"},
        {"appendonly": "no", "save": ""},
    )
    said = []
    try:
        client = redis.Redis.from_url(server.url)
        with make_store(StoreSettings(), server.url) as store:
            # Execute: each setting in turn, as `faasdl serve` reads them at its start.
            for setting in settings:
                for name, value in setting.items():
                    client.config_set(name, value)
                said.append(store.durability_warning())
    finally:
        server.stop()

    # Assert: nothing to say of the first; the others name what is lost and what to set.
    assert said[0] is None
    assert all(
        s is not None and s.endswith("appendonly yes and appendfsync always") for s in said[1:]
    )
    assert "'everysec' (appendfsync): a crash of its machine can lose commits" in str(said[1])
    assert "snapshots only (appendonly no, save '3600 1')" in str(said[2])
    assert "in memory only (appendonly no, no save points)" in str(said[3])
