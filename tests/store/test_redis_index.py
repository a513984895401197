"""The Redis store's key index: a store written before it existed is indexed when opened."""

from __future__ import annotations

from pathlib import Path

import redis

from faasdl.config import StoreSettings
from faasdl.store import make_store
from faasdl.store.redis import INDEX
from faasdl.store.redis_server import RedisServer


def test_records_written_before_the_index_existed_are_found_by_prefix(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # Arrange: records, then the index dropped, as a store of an earlier version leaves them.
    server = redis.Redis.from_url(redis_server.url)
    server.flushall()
    settings = StoreSettings(spill_dir=str(tmp_path))
    with make_store(settings, redis_server.url) as store:
        for i in range(1200):  # more than one batch of the rebuild
            store.put(f"job/{i:05d}", {"i": i})
        store.put("fn/a", {})
    server.delete(INDEX)

    # Execute
    with make_store(settings, redis_server.url) as store:
        found = store.scan("job/")
        store.put("job/new", {})
        again = store.scan("job/")

    # Assert
    assert [k for k, _ in found] == [f"job/{i:05d}" for i in range(1200)]
    assert len(again) == 1201
    assert server.zcard(INDEX) == 1202
