"""The store's controller lease: one controller at a time runs a store's jobs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from faasdl import __version__
from faasdl.config import Settings
from faasdl.controller.app import create_app
from faasdl.controller.jobs import Controller
from faasdl.controller.lease import LEASE_KEY, AnotherController, ControllerLease
from faasdl.platform.local import LocalPlatform
from faasdl.serving import AppThread
from faasdl.store import StateStore, shown_url
from tests.conftest import eventually

#: Short, so that waiting one out is quick; long enough that a renewal (a third of it) is never
#: late on a loaded machine.
LEASE_S = 1.5


@pytest.fixture
def controller_on(
    own_store: tuple[StateStore, str], make_local: Callable[..., LocalPlatform]
) -> Callable[[], Controller]:
    """Controllers (not started) on the one store, each with its own embedded platform."""

    def make() -> Controller:
        settings = Settings(controller={"lease_s": LEASE_S})
        platform = make_local()
        return Controller(
            settings=settings, platform=platform, store=own_store[0], store_url=own_store[1]
        )

    return make


def test_a_second_controller_refuses_to_start_naming_the_one_that_runs(
    controller_on: Callable[[], Controller],
) -> None:
    with controller_on() as running:
        second = controller_on()
        started = time.monotonic()

        with pytest.raises(AnotherController) as caught:
            second.start()

        waited = time.monotonic() - started
        assert not running.runtime.shutdown.is_set()
    assert str(caught.value) == (
        f"another controller runs on this store: {socket.gethostname()} (pid {os.getpid()}) "
        f"renewed its lease within {LEASE_S:g} s; stop it first (two controllers would run the "
        "same jobs twice)"
    )
    assert waited < LEASE_S  # it is refused as the lease is renewed, not once it would lapse
    assert not second.lease.held


def test_a_controller_that_died_holding_the_lease_is_followed_after_the_lease(
    controller_on: Callable[[], Controller], own_store: tuple[StateStore, str]
) -> None:
    # Arrange: a lease taken and never renewed nor released, as a controller killed leaves it.
    ControllerLease(own_store[0], lease_s=LEASE_S).acquire()
    follower = controller_on()

    # Execute
    started = time.monotonic()
    with follower:
        waited = time.monotonic() - started
        holder = own_store[0].get(LEASE_KEY)

    # Assert: it waited the lease out, held it while it ran, and released it as it closed.
    assert waited >= LEASE_S
    assert holder is not None
    assert holder.value["holder"] == follower.lease.holder
    assert own_store[0].get(LEASE_KEY) is None


def test_a_controller_closed_lets_the_next_start_at_once(
    controller_on: Callable[[], Controller],
) -> None:
    with controller_on():
        pass
    started = time.monotonic()

    with controller_on() as second:
        waited = time.monotonic() - started

    assert waited < LEASE_S
    assert not second.lease.held  # released as it closed


def take_lease(store: StateStore) -> None:
    """Take the lease over, as a controller does that started while its holder was stopped
    (SIGSTOP) or cut off from the store for longer than the lease."""
    current = store.get(LEASE_KEY)
    assert current is not None
    taken = {**current.value, "holder": "another", "host": "elsewhere", "pid": 1}
    assert store.compare_and_set(LEASE_KEY, current.version, taken)


def test_a_controller_whose_lease_was_taken_stops_running_jobs_and_is_not_ready(
    controller_on: Callable[[], Controller], own_store: tuple[StateStore, str]
) -> None:
    with controller_on() as cut_off:
        server = AppThread(create_app(cut_off, owns=False), host="127.0.0.1", port=0, name="api")
        url = server.start()
        try:
            before = httpx.get(f"{url}/readyz", timeout=10)

            # Execute: at its next renewal it stops its scheduler and runners.
            take_lease(own_store[0])
            eventually(cut_off.runtime.shutdown.is_set, timeout_s=10, what="the controller stops")
            after = httpx.get(f"{url}/readyz", timeout=10)
        finally:
            server.stop()
        assert not cut_off.lease.held
    assert before.json() == {"ready": True, "store": "ok", "platform": "ok", "lease": "ok"}
    assert after.status_code == 503
    assert after.json() == {"ready": False, "store": "ok", "platform": "ok", "lease": "unavailable"}
    holder = own_store[0].get(LEASE_KEY)
    assert holder is not None
    assert holder.value["holder"] == "another"  # not released by the controller that lost it


def test_faasdl_serve_whose_lease_was_taken_exits_naming_the_taker(
    own_store: tuple[StateStore, str],
) -> None:
    serving = subprocess.Popen(
        [str(Path(sys.executable).with_name("faasdl")), "serve"],
        env=serve_env(own_store[1]),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        eventually(
            lambda: (
                (lease := own_store[0].get(LEASE_KEY)) is not None
                and lease.value["pid"] == serving.pid
            ),
            timeout_s=120,
            what="faasdl serve holds the lease",
        )

        take_lease(own_store[0])
        _, stderr = serving.communicate(timeout=60)
    finally:
        serving.kill()

    assert serving.returncode == 1, stderr
    # Its own log lines, from INFO (FAASDL_CONTROLLER__LOG_LEVEL's default), name what it runs on.
    assert (
        f"INFO:     faasdl.serve: faasdl {__version__}: store {shown_url(own_store[1])}, "
        "actions on the embedded platform, API auth keys"
    ) in stderr
    assert stderr.strip().splitlines()[-1] == (
        "error: this controller lost the store's lease (the controller on elsewhere (pid 1) "
        "took it) and stopped: another controller runs the store's jobs"
    )
    assert "Traceback" not in stderr


def test_a_second_faasdl_serve_on_a_store_is_refused_in_one_line(
    controller_on: Callable[[], Controller], own_store: tuple[StateStore, str]
) -> None:
    with controller_on():
        ran = subprocess.run(
            [str(Path(sys.executable).with_name("faasdl")), "serve"],
            env=serve_env(own_store[1]),
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert ran.returncode == 2, ran.stderr
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("error: another controller runs on this store: ")
    assert "Traceback" not in ran.stderr


def test_faasdl_serve_without_its_platform_is_refused_in_one_line_and_frees_the_lease(
    own_store: tuple[StateStore, str],
) -> None:
    # OpenWhisk not answering as the controller starts (a cluster coming up): the app's start
    # failed with urllib3's traceback, and the lease taken was left for the next to wait out.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = serve_env(own_store[1]) | {
        "FAASDL_PLATFORM": "openwhisk",
        "FAASDL_OPENWHISK__API_HOST": f"http://127.0.0.1:{port}",
        "FAASDL_OPENWHISK__RETRY_ATTEMPTS": "2",
        "FAASDL_OPENWHISK__RETRY_MAX_WAIT_S": "0.05",
    }

    ran = subprocess.run(
        [str(Path(sys.executable).with_name("faasdl")), "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.strip().splitlines()[-1] == (
        f"error: cannot read OpenWhisk's limits from http://127.0.0.1:{port}/: "
        "[Errno 111] Connection refused"
    )
    assert "Traceback" not in ran.stderr
    assert own_store[0].get(LEASE_KEY) is None


def serve_env(store_url: str) -> dict[str, str]:
    """``faasdl serve``'s environment: the test's store, any free port, the test's lease."""
    return os.environ | {
        "FAASDL_STORE__URL": store_url,
        "FAASDL_CONTROLLER__PORT": "0",
        "FAASDL_CONTROLLER__LEASE_S": str(LEASE_S),
    }
