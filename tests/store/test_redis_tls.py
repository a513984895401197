"""A Redis that speaks TLS only (rediss://): reached with its CA bundle, a file or its text, and
refused, saying why, without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from faasdl.config import StoreSettings
from faasdl.errors import StoreUnavailable
from faasdl.store import make_store
from faasdl.store.redis_server import RedisServer
from tests.conftest import tls_files
from tests.store.conftest import private_redis


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> RedisServer:
    directory = tmp_path_factory.mktemp("redis-tls")
    private_redis(directory)  # skips where redis-server is not installed
    return RedisServer(directory=directory, tls=tls_files(directory / "tls"))


def test_a_tls_redis_is_reached_with_its_ca_bundle_as_a_file_or_as_its_text(
    tls_redis: RedisServer,
) -> None:
    # Arrange
    assert tls_redis.tls is not None
    ca = tls_redis.tls.ca_file
    with tls_redis:
        # Execute: a blob written through a store given the bundle's file, read through one
        # given its text.
        with make_store(StoreSettings(url=tls_redis.url, tls_ca_file=str(ca))) as by_file:
            by_file.put_blob("blob/a", b"x" * 100_000)
        settings = StoreSettings(url=tls_redis.url, tls_ca_data=ca.read_text())
        with make_store(settings) as by_text:
            read = by_text.get_blob("blob/a")

    # Assert: over TLS (the server has no plain port: --port 0)
    assert read == b"x" * 100_000


@pytest.mark.parametrize("bundle", ["none", "another CA's"])
def test_a_tls_redis_not_verified_by_the_bundle_is_refused_saying_why(
    tls_redis: RedisServer, tmp_path: Path, bundle: str
) -> None:
    # Arrange: no bundle (the system's, which lacks the test's CA), or another CA's.
    other = tls_files(tmp_path / "other").ca_file.read_text() if bundle != "none" else None
    # Execute
    with tls_redis, pytest.raises(StoreUnavailable) as refused:
        make_store(StoreSettings(url=tls_redis.url, tls_ca_data=other)).open()

    # Assert
    assert str(refused.value).startswith(f"cannot reach Redis at {tls_redis.url}: ")
    assert "certificate verify failed" in str(refused.value)
