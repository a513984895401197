"""A Redis store says what its server's settings (persistence, eviction) would lose of what it
acknowledged."""

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
        {"maxmemory": "1gb", "maxmemory-policy": "volatile-lru"},
        {"maxmemory-policy": "allkeys-lru"},
        {"maxmemory": "0"},
        {"appendfsync": "everysec"},
        {"appendonly": "no", "save": "3600 1"},
        {"appendonly": "no", "save": ""},
        {"maxmemory": "1gb", "maxmemory-policy": "allkeys-lfu"},  # and in memory only
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

    # Assert: nothing to say of the first. An eviction policy that takes keys without an expiry
    # is named; one that takes only keys with one (faasdl sets none), or no maxmemory at all,
    # loses nothing.
    assert said[0] is None
    assert said[1] is None
    assert str(said[2]).startswith(
        f"Redis at {server.url} deletes keys to make room at its maxmemory (maxmemory-policy "
        "allkeys-lru): any of faasdl's records may go"
    )
    assert str(said[2]).endswith(
        "set maxmemory-policy noeviction (a full Redis then refuses writes, and faasdl says so)"
    )
    assert said[3] is None
    # The persistence settings that lose acknowledged writes name what is lost and what to set.
    assert all(
        s is not None and s.endswith("appendonly yes and appendfsync always") for s in said[4:7]
    )
    assert "'everysec' (appendfsync): a crash of its machine can lose commits" in str(said[4])
    assert "snapshots only (appendonly no, save '3600 1')" in str(said[5])
    assert "in memory only (appendonly no, no save points)" in str(said[6])
    # Both at once: both said.
    eviction, persistence = str(said[7]).split("; set maxmemory-policy noeviction")
    assert "(maxmemory-policy allkeys-lfu)" in eviction
    assert "in memory only (appendonly no, no save points)" in persistence


def test_a_server_that_refuses_to_shut_down_is_killed_after_its_grace(tmp_path: Path) -> None:
    # Arrange: a server turning its AOF off and on again, which has it write its first AOF: a
    # SIGTERM meanwhile is refused ("Writing initial AOF, can't exit"), and not tried again.
    server = RedisServer(directory=tmp_path / "redis")
    server.start()
    client = redis.Redis.from_url(server.url)
    client.config_set("appendonly", "no")
    client.config_set("appendonly", "yes")
    client.close()

    # Act
    server.stop(grace_s=2.0)

    # Assert: stopped, one way or the other (before: a TimeoutExpired after 30 s, the server
    # left running).
    assert server.process is not None
    assert server.process.poll() is not None
