"""The store benchmark on a store the user names: its figures, and nothing of it left there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from faasdl.bench.store import run_store_bench
from faasdl.cli import app
from faasdl.store.sqlite import SqliteStore
from tests.store.conftest import private_redis


def test_the_store_bench_measures_checkpoints_and_leaves_nothing_in_the_store(
    tmp_path: Path,
) -> None:
    store = SqliteStore(path=tmp_path / "state.db")
    store.open()
    store.put("jobs/kept", {"n": 1})  # what the store held before

    result = run_store_bench(
        backend="sqlite",
        url=f"sqlite:///{store.path}",
        sizes_mib=(1,),
        repeats=1,
        cas_ops=10,
        checkpoints=10,
        writers=2,
        contention_s=1.0,
    )

    assert result["blob_write_mb_s"]["1"] > 0
    assert result["cas_ops_per_s"] > 0
    assert result["checkpoint_cpu_ms"] > 0
    assert result["checkpoint_ms"] > 0
    contention = result["contention"]
    assert contention["writers"] == 2
    assert contention["beats"] >= 2  # each beats as it starts, then every 0.5 s
    assert contention["checkpoints_per_s"] > 0
    assert contention["beat_wait_ms_p50"] <= contention["beat_wait_ms_max"]
    assert [key for key, _ in store.scan("")] == ["jobs/kept"]  # no manifest, no counter
    assert list(store.chunk_dir.iterdir()) == []


@pytest.mark.redis
def test_the_store_bench_reaches_and_writes_the_store_as_its_settings_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bench took the store's default settings whatever the environment's: a Redis with a
    # password (or TLS) failed, and another chunk size was not the one measured, while the
    # figures' "environment" named it.
    # Arrange: a Redis with a password; the settings in the environment, as a user gives them.
    server = private_redis(tmp_path / "redis")
    with server:
        server.client().config_set("requirepass", "bench-pw")
        monkeypatch.setenv("FAASDL_STORE__URL", server.url)
        monkeypatch.setenv("FAASDL_STORE__PASSWORD", "bench-pw")
        monkeypatch.setenv("FAASDL_STORE__CHUNK_BYTES", str(1024 * 1024))
        bench = ["bench", "store", "--url", server.url, "--repeats", "1", "--cas-ops", "10"]

        # Execute
        result = CliRunner().invoke(
            app, [*bench, "--checkpoints", "10", "--writers", "1", "--contention-s", "1"]
        )

    # Assert
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.splitlines()[-1])
    assert figures["chunk_bytes"] == 1024 * 1024
    assert figures["raw_write_mb_s"]["1"] > 0  # the plain client logged in too
    assert figures["contention"]["beats"] >= 1
    assert "bench-pw" not in result.output


@pytest.mark.redis
def test_the_store_bench_reaches_its_own_redis_without_the_users_stores_login(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The user's TLS store's CA bundle and password went to the bench's private redis-server
    # too: redis-py's TypeError for a CA bundle on redis://.
    # Arrange
    monkeypatch.setenv("FAASDL_STORE__URL", "rediss://cache.example:6380/0")
    monkeypatch.setenv("FAASDL_STORE__TLS_CA_FILE", __file__)
    monkeypatch.setenv("FAASDL_STORE__PASSWORD", "users-pw")
    bench = ["bench", "store", "--backend", "redis", "--repeats", "1", "--cas-ops", "10"]

    # Execute
    result = CliRunner().invoke(app, [*bench, "--checkpoints", "10", "--writers", "0"])

    # Assert
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.splitlines()[-1])["raw_write_mb_s"]["1"] > 0


@pytest.mark.parametrize(
    ("option", "value"), [("--checkpoints", "5"), ("--writers", "65"), ("--contention-s", "0.5")]
)
def test_the_store_bench_refuses_what_it_cannot_measure_naming_the_option(
    option: str, value: str
) -> None:
    result = CliRunner().invoke(app, ["bench", "store", option, value])

    assert result.exit_code == 2
    assert option in result.output


def test_the_store_bench_takes_its_backend_from_the_url_and_refuses_another(
    tmp_path: Path,
) -> None:
    # A Redis client was given a SQLite URL (a traceback), and a SQLite backend a Redis URL
    # measured Redis against raw files.
    db = f"sqlite:///{tmp_path / 'state.db'}"

    mismatched = CliRunner().invoke(app, ["bench", "store", "--backend", "redis", "--url", db])
    ignite = CliRunner().invoke(app, ["bench", "store", "--url", "ignite://127.0.0.1:10800"])

    assert mismatched.exit_code == 2
    assert "--backend: redis, but --url names a sqlite store" in mismatched.output
    assert ignite.exit_code == 2
    assert "--url: 'ignite://127.0.0.1:10800' is not a sqlite:// or redis:// URL" in ignite.output
    assert list(tmp_path.iterdir()) == []
