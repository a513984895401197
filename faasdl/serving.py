"""Serving an ASGI app with uvicorn: on a background thread (tests, benchmarks, the demo), and
in the foreground with a second Ctrl-C heard (``faasdl serve``)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

import uvicorn
from starlette.types import ASGIApp
from uvicorn.logging import DefaultFormatter

#: The status an access log shows for a request whose client went away before its body had
#: arrived (nginx's "client closed request": no client reads it).
CLIENT_CLOSED_REQUEST = 499


def log_to_stderr(level: str) -> None:
    """faasdl's log lines of ``level`` and above on stderr, as uvicorn writes its own (with no
    handler they went to Python's last resort: warnings only, without a level or a source)."""
    handler = logging.StreamHandler()
    handler.setFormatter(DefaultFormatter("%(levelprefix)s %(name)s: %(message)s"))
    logger = logging.getLogger("faasdl")
    logger.addHandler(handler)
    logger.setLevel(level.upper())


class AppThread:
    """Runs ``app`` on ``host:port`` (0: a free port) in a thread; :meth:`start` waits until it
    listens and returns its base URL."""

    def __init__(self, app: ASGIApp, *, host: str, port: int, name: str) -> None:
        self.host = host
        self.port = port
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", access_log=False, lifespan="on"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=name, daemon=True)

    @property
    def url(self) -> str:
        servers = self._server.servers
        port = servers[0].sockets[0].getsockname()[1] if servers else self.port
        return f"http://{self.host}:{port}"

    def start(self, timeout_s: float = 30.0) -> str:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self._thread.name} did not start")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


class HurriedServer(uvicorn.Server):
    """uvicorn's server, whose second Ctrl-C (uvicorn's "stop now": it skips what is left of a
    graceful stop) also sets ``hurry``, so that what the app waits for as it stops (the
    controller's drain) stops waiting."""

    def __init__(self, config: uvicorn.Config, *, hurry: threading.Event) -> None:
        super().__init__(config)
        self.hurry = hurry

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.hurry.set()
        super().handle_exit(sig, frame)
