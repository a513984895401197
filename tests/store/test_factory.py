"""Choosing a store by URL, and what a bad URL says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from faasdl.config import StoreSettings
from faasdl.errors import StoreError, StoreFull, StoreUnavailable, ValidationError
from faasdl.store import action_environment, action_store_settings, make_store, shown_url
from faasdl.store.ignite import IgniteStore, refused
from faasdl.store.redis import RedisStore
from faasdl.store.redis_server import free_port
from faasdl.store.sqlite import SqliteStore


def test_urls_pick_the_backend_without_io(tmp_path: Path) -> None:
    settings = StoreSettings()

    sqlite = make_store(settings, f"sqlite:///{tmp_path}/x.db")
    redis = make_store(settings, "redis://127.0.0.1:1/0")
    ignite = make_store(settings, "ignite://10.0.0.1:10800,10.0.0.2?prefix=team-a")

    assert isinstance(sqlite, SqliteStore)
    assert sqlite.path == tmp_path / "x.db"
    assert isinstance(redis, RedisStore)
    assert isinstance(ignite, IgniteStore)
    assert ignite.nodes == [("10.0.0.1", 10800), ("10.0.0.2", 10800)]
    assert ignite.chunk_bytes == 1024 * 1024


def test_an_actions_store_settings_are_the_controllers_read_back_from_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrange: a controller's settings with relative paths and a password in a file of its own.
    for var in [v for v in os.environ if v.startswith("FAASDL_")]:
        monkeypatch.delenv(var)
    (tmp_path / "secret").write_text("from-the-file\n")
    (tmp_path / "ca.pem").write_text("a bundle\n")
    (tmp_path / "action").mkdir()
    monkeypatch.chdir(tmp_path)
    controller = StoreSettings(
        url="rediss://cache:6380/0",
        username="faasdl",
        password_file=Path("secret"),
        spill_bytes=0,
        spill_dir="spill",
        tls_ca_file="ca.pem",
        timeout_s=2.5,
        chunk_bytes=65536,
        ignite_replicated=False,
    )

    # Execute: its environment set in an action's container, in a folder of the action's own.
    environment = action_environment(controller)
    for var, value in environment.items():
        monkeypatch.setenv(var, value)
    monkeypatch.chdir(tmp_path / "action")
    action = action_store_settings()

    # Assert: the same settings, the paths absolute, the password and the CA bundle as read from
    # their files (an action's container has none of the controller's files).
    assert action.password is not None
    assert action.password.get_secret_value() == "from-the-file"
    assert action.model_dump(exclude={"password"}) == controller.model_dump(
        exclude={"password"}
    ) | {
        "spill_dir": str(tmp_path / "spill"),
        "tls_ca_file": None,
        "tls_ca_data": "a bundle\n",
        "password_file": None,
    }
    assert all(isinstance(value, str) for value in environment.values())


@pytest.mark.parametrize(
    ("url", "setting", "password", "url_for_actions"),
    [
        ("redis://:p%40ss%2Fw@cache:6379/0", None, "p@ss/w", "redis://cache:6379/0"),
        ("rediss://app:in-url@cache/1", "set", "in-url", "rediss://app@cache/1"),  # redis-py's
        ("redis://app:@cache/1", "set", "set", "redis://app@cache/1"),  # an empty one: none
        ("redis://cache/1", "set", "set", "redis://cache/1"),
        ("redis://cache/1", None, None, "redis://cache/1"),
    ],
)
def test_a_password_in_the_url_goes_to_the_actions_environment_and_out_of_their_url(
    url: str, setting: str | None, password: str | None, url_for_actions: str
) -> None:
    # Execute
    environment = action_environment(StoreSettings(url=url, password=setting))

    # Assert: the password the controller's Redis client uses (the URL's before the setting's,
    # unquoted), and the URL its actions are called with, which holds none.
    assert environment.get("FAASDL_STORE__PASSWORD") == password
    assert environment["FAASDL_STORE__URL"] == url_for_actions == shown_url(url)


@pytest.mark.parametrize(
    ("url", "text"),
    [
        (
            "mongodb://localhost/x",
            "unknown scheme 'mongodb'; use one of ignite, redis, rediss, sqlite",
        ),
        ("just-a-path.db", "is not a URL"),
        ("sqlite:///", "sqlite URLs need a path"),
        ("sqlite://x.db", "need a path after three slashes: .* not sqlite://x.db"),
        ("redis://127.0.0.1:99999", "Port out of range"),
        ("redis://:pw@[::1", "Invalid IPv6 URL"),
        ("redis://h:0", "port 0 is not a Redis port"),
        ("redis://h:6379/l", "must be a number .* not /l"),  # redis-py had taken database 0
        ("ignite://host:notaport", "'host:notaport' is not host:port"),
        ("ignite://host:99999", "'host:99999' is not host:port"),
    ],
)
def test_bad_urls_are_refused_naming_the_problem(
    url: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # sqlite://x.db had made a store at ./sqlite:/x.db

    with pytest.raises(ValidationError, match=text) as caught:
        make_store(StoreSettings(), url).open()  # the Redis ones raised ValueError here

    assert caught.value.field == "store url"
    assert not any(tmp_path.iterdir())


def test_an_unreachable_ignite_is_one_line_from_the_cli() -> None:
    # pyignite logs a failed handshake with its traceback; with no logging configured, Python
    # printed it above the CLI's one line.
    port = free_port()
    env = {**os.environ, "FAASDL_STORE__URL": f"ignite://127.0.0.1:{port}"}
    code = "from faasdl.cli import app; app(['keys', 'list'])"

    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )

    assert ran.returncode == 2
    assert ran.stderr.strip().splitlines() == [
        f"store: ignite://127.0.0.1:{port}",  # which store the keys command opens
        # pyignite's words for every node's failure, then why the last one's failed.
        f"error: cannot reach Ignite at [('127.0.0.1', {port})]: Can not connect. (the last "
        "handshake: ConnectionRefusedError(111, 'Connection refused'))",
    ]


# An Ignite 2.x node's words for a write it has no room for (IgniteOutOfMemoryException, from
# its page memory; an IOException of a full disk under native persistence), as its thin client
# passes them on. No Ignite runs here to fill (the contract suite runs where one does).
_REGION_FULL = (
    "class org.apache.ignite.internal.mem.IgniteOutOfMemoryException: Out of memory in data "
    "region [name=default, initSize=256.0 MiB, maxSize=256.0 MiB, persistenceEnabled=false] "
    "Try the following:\n  ^-- Increase maximum off-heap memory size "
    "(DataRegionConfiguration.maxSize)\n  ^-- Enable Ignite persistence"
)
_DISK_FULL = "class java.io.IOException: No space left on device"


@pytest.mark.parametrize("message", [_REGION_FULL, _DISK_FULL])
def test_an_ignite_with_no_room_is_store_full_in_one_line(message: str) -> None:
    error = refused([("ignite-0", 10800)], message)

    assert isinstance(error, StoreFull)
    assert not error.retryable
    assert error.status_code == 507
    text = str(error)
    assert text.startswith("the Ignite store at [('ignite-0', 10800)] is full: it refused")
    assert message.splitlines()[0] in text
    assert "^--" not in text  # its hints are for Ignite's operator, its first line names the region
    assert "FAASDL_CONTROLLER__JOB_RETENTION_DAYS" in text


def test_an_operation_ignite_refuses_otherwise_is_a_store_error_not_retried() -> None:
    error = refused([("ignite-0", 10800)], "Failed to update keys: class java.lang.Exception")

    assert type(error) is StoreError
    assert not error.retryable
    assert str(error) == (
        "the Ignite store at [('ignite-0', 10800)] refused an operation: "
        "Failed to update keys: class java.lang.Exception"
    )


def test_an_unreachable_redis_is_store_unavailable() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    store = make_store(StoreSettings(), url)

    with pytest.raises(StoreUnavailable, match=f"cannot reach Redis at {url}"):
        store.open()


def test_an_unwritable_sqlite_path_is_store_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = make_store(StoreSettings(), f"sqlite:///{blocker}/state.db")

    with pytest.raises(StoreUnavailable, match="cannot open the SQLite store"):
        store.open()


def test_redis_password_is_not_in_errors() -> None:
    url = f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"

    with pytest.raises(StoreUnavailable) as caught:
        make_store(StoreSettings(), url).open()

    assert "s3cret-pw" not in str(caught.value)


@pytest.mark.parametrize("module", ["faasdl.experiments.action", "faasdl.canary.writer"])
def test_an_action_and_a_checkpoint_writer_load_only_the_store_they_open(
    module: str, tmp_path: Path
) -> None:
    # Execute: what a container (or its checkpoint writer) imports to open a SQLite store.
    code = (
        f"import sys, {module}\n"
        "from faasdl.config import StoreSettings\n"
        "from faasdl.store import make_store\n"
        f"make_store(StoreSettings(), 'sqlite:///{tmp_path}/s.db').open()\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
        ).stdout.split()
    )

    # Assert: neither the other backends' clients nor the platforms (a third of a second or
    # more of every replica's warm-up, on the cores the functions use).
    assert "faasdl.store.sqlite" in loaded
    assert not loaded & {"redis", "pyignite", "requests", "faasdl.platform", "kubernetes"}


@pytest.mark.parametrize(("synchronous", "level"), [("FULL", 2), ("NORMAL", 1), ("EXTRA", 3)])
def test_sqlite_syncs_commits_as_the_settings_say(
    tmp_path: Path, synchronous: str, level: int
) -> None:
    settings = StoreSettings(sqlite_synchronous=synchronous)

    with make_store(settings, f"sqlite:///{tmp_path}/x.db") as store:
        assert isinstance(store, SqliteStore)
        assert store._execute("PRAGMA synchronous").fetchone()[0] == level
        warning = store.durability_warning()  # what `faasdl serve` logs at its start
    assert (warning is not None) == (synchronous == "NORMAL")
    assert warning is None or "can lose commits it acknowledged" in warning


def test_sqlite_refuses_a_sync_setting_that_could_corrupt_it(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="must be one of EXTRA, FULL, NORMAL") as caught:
        SqliteStore(path=tmp_path / "x.db", synchronous="OFF")  # type: ignore[arg-type]

    assert caught.value.field == "synchronous"
    assert not (tmp_path / "x.db").exists()
