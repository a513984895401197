"""Store fixtures: SQLite in a temporary directory, a private real redis-server (AOF, fsync on
every write) started on a free port, and Ignite wherever FAASDL_TEST_IGNITE_URL points."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from faasdl.config import StoreSettings
from faasdl.store import StateStore, make_store
from faasdl.store.redis_server import RedisServer

StoreFactory = Callable[..., StateStore]


def private_redis(directory: Path) -> RedisServer:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it with apt-get)")
    return RedisServer(directory=directory)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with private_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(params=["sqlite", "redis", "ignite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"  # an absolute path: sqlite:////tmp/...
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        redis.Redis.from_url(server.url).flushall()
        return server.url
    url = os.environ.get("FAASDL_TEST_IGNITE_URL")
    if not url:
        pytest.skip("no Ignite node: set FAASDL_TEST_IGNITE_URL=ignite://host:10800 to run")
    return f"{url}?prefix=faasdl-test-{uuid.uuid4().hex[:8]}"  # fresh caches per test


@pytest.fixture
def make_store_for(store_url: str, tmp_path: Path) -> Iterator[StoreFactory]:
    opened: list[StateStore] = []

    def make(**settings: Any) -> StateStore:
        config = StoreSettings(**({"spill_dir": str(tmp_path / "spill")} | settings))
        store = make_store(config, store_url)
        store.open()
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store_for: StoreFactory) -> StateStore:
    return make_store_for()
