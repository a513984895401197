"""A Redis that stops answering (stopped, or cut off without a reset): a request ends after the
store's timeout, once, where a lost connection is asked again."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest

from faasdl.config import StoreSettings
from faasdl.errors import StoreUnavailable
from faasdl.store import make_store
from tests.store.conftest import private_redis


def test_a_redis_that_stops_answering_is_unavailable_after_one_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Arrange: a real redis-server, stopped (SIGSTOP) once the store has opened it.
    with (
        private_redis(tmp_path / "redis") as server,
        make_store(StoreSettings(timeout_s=0.5), server.url) as store,
    ):
        store.put("job/a", {"n": 1})
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            # Act
            with (
                caplog.at_level(logging.WARNING, logger="faasdl.store.redis"),
                pytest.raises(StoreUnavailable) as raised,
            ):
                store.get("job/a")
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        answered = store.get("job/a")

    # Assert: asked once (five times before, 0.5 s each), saying for how long; and read again
    # once the server answers.
    assert str(raised.value).startswith(
        f"Redis at {server.url} did not answer in 0.5 s (FAASDL_STORE__TIMEOUT_S)"
    )
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]
    assert answered is not None
    assert answered.value == {"n": 1}
