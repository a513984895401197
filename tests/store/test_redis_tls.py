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


def test_a_tls_redis_whose_certificate_names_another_host_is_refused(tmp_path: Path) -> None:
    # Arrange: a server whose certificate names 127.0.0.1 alone, reached as localhost. redis-py
    # before 6.0 checked no host name: any certificate of the CA's (with the system's bundle, a
    # public CA's) was taken.
    private_redis(tmp_path)  # skips where redis-server is not installed
    files = tls_files(tmp_path, "127.0.0.1")
    with RedisServer(directory=tmp_path, tls=files) as server:
        by_name = StoreSettings(
            url=server.url.replace("127.0.0.1", "localhost"), tls_ca_file=str(files.ca_file)
        )
        by_address = StoreSettings(url=server.url, tls_ca_file=str(files.ca_file))

        # Execute
        with pytest.raises(StoreUnavailable) as refused:
            make_store(by_name).open()
        with make_store(by_address) as store:
            answered = store.get("missing")

    # Assert
    assert "certificate verify failed: Hostname mismatch" in str(refused.value)
    assert answered is None


def test_a_redis_server_that_never_answers_is_not_left_running(tmp_path: Path) -> None:
    # Arrange: a TLS server whose certificate names another host: its own client is refused.
    private_redis(tmp_path)  # skips where redis-server is not installed
    server = RedisServer(directory=tmp_path, tls=tls_files(tmp_path, "redis.example"))

    # Execute
    with pytest.raises(StoreUnavailable, match=r"did not answer within 1 s: .*mismatch"):
        server.start(timeout_s=1)

    # Assert: it was running, and is not now (it was left, and the test run warned of it).
    assert server.process is not None
    assert server.process.poll() is not None
