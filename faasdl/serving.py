"""Serving an ASGI app with uvicorn: on a background thread (tests, benchmarks, the demo), and
in the foreground with a second Ctrl-C heard (``faasdl serve``)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType

import anyio
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
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


#: How long, and for how many bytes, a server reads on of a body it has answered before its end,
#: before it closes the connection: closed with data unread, a connection is reset, and an answer
#: not yet read by the client can go with it (a lingering close, as Apache and nginx make).
LINGER_S = 2.0
LINGER_BYTES = 64 * 2**20


class CloseUnread:
    """ASGI middleware: an answer to a request whose body has not been read to its end (refused
    over a limit, or before it was read: a bad key, a rate limit) says ``Connection: close``,
    then the server reads on and drops what more comes, up to :data:`LINGER_S` and
    :data:`LINGER_BYTES`, before it ends the answer and uvicorn closes the connection. Kept alive,
    the connection had the server read the rest of the body to find the next request: a client
    that sends all of its body before it reads an answer (requests does) sent the whole of a file
    over the limit after a 413 at its first MiB, and one whose body has no end (``faasdl datasets
    upload /dev/zero``, chunked) never stopped. Closed, the client's next send fails, and it reads
    the answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        unread = b"transfer-encoding" in headers or headers.get(b"content-length", b"0") != b"0"
        closing = False

        async def receiving() -> Message:
            nonlocal unread
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                unread = False
            return message

        async def sending(message: Message) -> None:
            nonlocal closing
            if message["type"] == "http.response.start" and unread:
                closing = True
                closed = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": closed}
            elif (
                closing and message["type"] == "http.response.body" and not message.get("more_body")
            ):
                await send({**message, "more_body": True})
                await _linger(receive)
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        await self.app(scope, receiving, sending)


class HeadAsGet:
    """ASGI middleware: a HEAD request is answered as its GET would be, with that answer's status
    and headers (its Content-Length too) and no body (RFC 9110 §9.3.2: a server that answers
    GET answers HEAD). FastAPI routes a method only where a route names it, so ``curl -I`` of a
    job's model was a 405, and of ``/v1/jobs`` one saying ``allow: POST``. The body the GET's
    route begins is dropped: once the answer has ended, the server tells the route its client
    has gone (a stream of events or a model's chunks stops there)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        ended = False

        async def headers_only(message: Message) -> None:
            nonlocal ended
            if message["type"] == "http.response.start":
                await send(message)
            elif message["type"] == "http.response.body" and not ended:
                ended = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.app({**scope, "method": "GET"}, receive, headers_only)


async def _linger(receive: Receive) -> None:
    """Read and drop the rest of a request's body, until it ends or the client goes away, for
    :data:`LINGER_S` and :data:`LINGER_BYTES` at most."""
    taken = 0
    with anyio.move_on_after(LINGER_S):
        while taken < LINGER_BYTES:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            taken += len(message.get("body", b""))


class AppThread:
    """Runs ``app`` on ``host:port`` (0: a free port) in a thread; :meth:`start` waits until it
    listens and returns its base URL."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        host: str,
        port: int,
        name: str,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """``tls``: HTTPS, with this certificate file and key file (PEM)."""
        self.host = host
        self.port = port
        self.scheme = "https" if tls else "http"
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            ssl_certfile=tls[0] if tls else None,
            ssl_keyfile=tls[1] if tls else None,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=name, daemon=True)

    @property
    def url(self) -> str:
        servers = self._server.servers
        port = servers[0].sockets[0].getsockname()[1] if servers else self.port
        return f"{self.scheme}://{self.host}:{port}"

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
