"""Store fixtures: SQLite in a temporary directory, a private real redis-server (AOF, fsync on
every write) started on a free port, and Ignite wherever FAASDL_TEST_IGNITE_URL points."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from faasdl.config import StoreSettings
from faasdl.store import StateStore, make_store
from tests.conftest import eventually

StoreFactory = Callable[..., StateStore]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private redis-server with appendonly + appendfsync always, in its own directory."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (make test installs it with apt-get)")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                assert self.process is not None
                assert self.process.poll() is None, "redis-server died"
                return False

        eventually(up, timeout_s=30, what="redis-server answers PING")
        client.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


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
