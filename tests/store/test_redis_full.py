"""A Redis store over its ``maxmemory``: a refused write is ``StoreFull``, and leaves nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from faasdl.config import StoreSettings
from faasdl.errors import StoreFull
from faasdl.store import make_store
from faasdl.store.redis_server import RedisServer


def test_a_write_a_full_redis_refuses_is_store_full_and_keeps_nothing(tmp_path: Path) -> None:
    # Arrange: a private server with about 2 MiB of room left, refusing writes beyond it (the
    # chart's noeviction), and a store of 64 KiB chunks.
    server = RedisServer(directory=tmp_path / "redis")
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        with make_store(StoreSettings(chunk_bytes=64 * 1024), server.url) as store:
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory", used + 2 * 2**20)
            client.config_set("maxmemory-policy", "noeviction")
            store.put_blob("fits", os.urandom(2**20))

            # Execute: a blob that cannot fit, then the room made again.
            with pytest.raises(StoreFull) as refused:
                store.put_blob("too-large", os.urandom(4 * 2**20))
            chunks = len(list(client.scan_iter(match="faasdl:c:*", count=1000)))
            store.delete_blob("fits")
            store.put("rec/after", {"written": True})
            after = store.get("rec/after")
    finally:
        server.stop()

    # Assert: the refusal says what to do; the refused write's chunks were deleted at once (the
    # first blob's 16 are all there are), and writes go on once there is room.
    assert f"the Redis store at {server.url} is full" in str(refused.value)
    assert "FAASDL_CONTROLLER__JOB_RETENTION_DAYS" in str(refused.value)
    assert chunks == 16
    assert after is not None
    assert after.value == {"written": True}
