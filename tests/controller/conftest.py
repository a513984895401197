from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from faasdl.config import Settings, StoreSettings
from faasdl.controller.app import create_app
from faasdl.controller.auth import create_key
from faasdl.controller.jobs import Controller
from faasdl.platform.local import LocalPlatform
from faasdl.serving import AppThread
from faasdl.store import StateStore, make_store
from faasdl.store.records import RoundResult


@pytest.fixture(scope="module")
def controller(
    tf_platform: LocalPlatform, tf_store: tuple[StateStore, str]
) -> Iterator[Controller]:
    """A running controller on the module's embedded platform (4096 MB pool) and SQLite store;
    a fan-in of 3 gives four trainers a two-level aggregation tree, whose trainers' outputs an
    ended job keeps (``keep_job_data``) for the tests to read."""
    store, url = tf_store
    settings = Settings(
        controller={"scheduler_tick_s": 0.2, "max_fan_in": 3, "keep_job_data": True}
    )
    with Controller(settings=settings, platform=tf_platform, store=store, store_url=url) as c:
        yield c


@pytest.fixture(scope="module")
def api_url(controller: Controller) -> Iterator[str]:
    """The controller's REST API, served by uvicorn on loopback."""
    server = AppThread(create_app(controller, owns=False), host="127.0.0.1", port=0, name="api")
    yield server.start()
    server.stop()


@pytest.fixture(scope="module")
def admin_key(controller: Controller) -> str:
    """An administrator's API key of tenant ``default``."""
    return create_key(controller.store, tenant="default", admin=True, name="tests")[1]


@pytest.fixture(scope="module")
def client(api_url: str, admin_key: str) -> Iterator[httpx.Client]:
    """A client of the API with an administrator's key."""
    auth = {"Authorization": f"Bearer {admin_key}"}
    with httpx.Client(base_url=api_url, timeout=300, headers=auth) as http:
        yield http


@pytest.fixture
def own_store(tmp_path: Path) -> Iterator[tuple[StateStore, str]]:
    """A SQLite store of the test's own, and its URL: one no module's controller reads."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    with make_store(StoreSettings(spill_dir=str(tmp_path / "spill")), url) as store:
        yield store, url


def round_result(round_: int) -> RoundResult:
    """A round's result as a job's record holds it (its loss 1 / (round + 1))."""
    return RoundResult(
        round=round_,
        epochs=1,
        examples=1_000,
        loss=1 / (round_ + 1),
        test_loss=1 / (round_ + 1),
        accuracy=0.9,
        started_ms=0,
        finished_ms=1,
    )
