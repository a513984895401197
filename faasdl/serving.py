"""Serving an ASGI app with uvicorn on a background thread (tests, benchmarks, the demo)."""

from __future__ import annotations

import threading
import time

import uvicorn
from starlette.types import ASGIApp


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
