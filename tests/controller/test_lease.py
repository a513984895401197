"""The store's controller lease: one controller at a time runs a store's jobs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from faasdl.config import Settings, StoreSettings
from faasdl.controller.jobs import Controller
from faasdl.controller.lease import LEASE_KEY, AnotherController, ControllerLease
from faasdl.platform.local import LocalPlatform
from faasdl.store import StateStore, make_store
from tests.conftest import eventually

#: Short, so that waiting one out is quick; long enough that a renewal (a third of it) is never
#: late on a loaded machine.
LEASE_S = 1.5


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[StateStore, str]]:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    with make_store(StoreSettings(spill_dir=str(tmp_path / "spill")), url) as opened:
        yield opened, url


@pytest.fixture
def controller_on(
    store: tuple[StateStore, str], make_local: Callable[..., LocalPlatform]
) -> Callable[[], Controller]:
    """Controllers (not started) on the one store, each with its own embedded platform."""

    def make() -> Controller:
        settings = Settings(controller={"lease_s": LEASE_S})
        platform = make_local()
        return Controller(settings=settings, platform=platform, store=store[0], store_url=store[1])

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
    controller_on: Callable[[], Controller], store: tuple[StateStore, str]
) -> None:
    # Arrange: a lease taken and never renewed nor released, as a controller killed leaves it.
    ControllerLease(store[0], lease_s=LEASE_S).acquire()
    follower = controller_on()

    # Execute
    started = time.monotonic()
    with follower:
        waited = time.monotonic() - started
        holder = store[0].get(LEASE_KEY)

    # Assert: it waited the lease out, held it while it ran, and released it as it closed.
    assert waited >= LEASE_S
    assert holder is not None
    assert holder.value["holder"] == follower.lease.holder
    assert store[0].get(LEASE_KEY) is None


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


def test_a_controller_whose_lease_was_taken_stops_running_jobs(
    controller_on: Callable[[], Controller], store: tuple[StateStore, str]
) -> None:
    # Arrange: a running controller; its lease then taken over, as one that started while this
    # one was stopped (SIGSTOP) or cut off from the store for longer than the lease does.
    with controller_on() as cut_off:
        current = store[0].get(LEASE_KEY)
        assert current is not None
        taken = {**current.value, "holder": "another", "pid": 1}
        assert store[0].compare_and_set(LEASE_KEY, current.version, taken)

        # Execute / Assert: at its next renewal it stops its scheduler and runners.
        eventually(cut_off.runtime.shutdown.is_set, timeout_s=10, what="the controller stops")
        assert not cut_off.lease.held
    holder = store[0].get(LEASE_KEY)
    assert holder is not None
    assert holder.value["holder"] == "another"


def test_a_second_faasdl_serve_on_a_store_is_refused_in_one_line(
    controller_on: Callable[[], Controller], store: tuple[StateStore, str]
) -> None:
    env = os.environ | {
        "FAASDL_STORE__URL": store[1],
        "FAASDL_CONTROLLER__PORT": "0",
        "FAASDL_CONTROLLER__LEASE_S": str(LEASE_S),
    }
    with controller_on():
        ran = subprocess.run(
            [str(Path(sys.executable).with_name("faasdl")), "serve"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert ran.returncode == 2, ran.stderr
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("error: another controller runs on this store: ")
    assert "Traceback" not in ran.stderr
