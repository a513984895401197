"""Shared fixtures. Platforms are real: the embedded platform in process, and the REST client
talking to the embedded platform's OpenWhisk-compatible server on loopback."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from rich.console import Console

from faasdl.config import LocalPlatformSettings, OpenWhiskSettings, ServerSettings, StoreSettings
from faasdl.errors import ActivationNotFound
from faasdl.platform.base import Platform
from faasdl.platform.local import LocalPlatform
from faasdl.platform.local.server import ServerThread
from faasdl.platform.openwhisk import OpenWhiskPlatform
from faasdl.serving import LINGER_BYTES
from faasdl.store import StateStore, make_store
from faasdl.store.redis_server import ServerTls

PlatformFactory = Callable[..., Platform]

# The tests read faasdl's messages as a log file gets them (faasdl.cli.LOG_WIDTH wide, not
# wrapped): a COLUMNS of the shell's, or pytest-xdist's workers' (80), would wrap them.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A test server's request handler that logs nothing (the base writes each request to
    stderr)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass


def eventually(condition: Callable[[], bool], *, timeout_s: float = 10.0, what: str = "") -> None:
    """Poll ``condition`` until it holds; fail the test if it does not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s: {what or condition}")
        time.sleep(0.01)


def tls_files(directory: Path, *hosts: str) -> ServerTls:
    """A fresh CA, and a certificate it signed for ``hosts`` (default: 127.0.0.1 and
    localhost), as PEM files in ``directory``."""
    ca = trustme.CA()
    issued = ca.issue_cert(*(hosts or ("127.0.0.1", "localhost")))
    directory.mkdir(parents=True, exist_ok=True)
    files = ServerTls(directory / "cert.pem", directory / "key.pem", directory / "ca.pem")
    issued.cert_chain_pems[0].write_to_path(str(files.cert_file))
    issued.private_key_pem.write_to_path(str(files.key_file))
    ca.cert_pem.write_to_path(str(files.ca_file))
    return files


def write_and_die(store_url: str, name: str, data: bytes, *, chunk_bytes: int) -> None:
    """Write blob ``name`` from another process that is killed (SIGKILL) after its chunks are
    durable and before it publishes the manifest: what a writer killed mid-write leaves."""
    writer = """
        import os, signal, sys
        from faasdl.config import StoreSettings
        from faasdl.store import make_store
        store = make_store(StoreSettings(chunk_bytes=int(sys.argv[3])), sys.argv[1])
        store.open()
        store._publish_manifest = lambda name, manifest: os.kill(os.getpid(), signal.SIGKILL)
        store.put_blob(sys.argv[2], sys.stdin.buffer.read())
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(writer), store_url, name, str(chunk_bytes)],
        input=data,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr.decode(errors="replace")


def kill_when_running(platform: Platform, activation_id: str) -> None:
    """Kill ``activation_id`` as soon as it has a container (it is refused while queued)."""

    def killed() -> bool:
        try:
            platform.kill(activation_id)
        except ActivationNotFound:
            return False
        return True

    eventually(killed, what=f"kill {activation_id}")


@contextlib.contextmanager
def hung_http_server(
    answers: dict[str, Any] | None = None, *, held: list[str] | None = None
) -> Iterator[str]:
    """An HTTP server on loopback (its URL) that answers a GET of each path in ``answers`` with
    its JSON, and holds every other request unanswered until it closes (each such path appended
    to ``held``): an API cut off without a reset, or whose backend hangs."""
    released = threading.Event()
    known = answers or {}

    class Hung(QuietHandler):
        def do_GET(self) -> None:
            if self.path not in known:
                if held is not None:
                    held.append(self.path)
                released.wait()
                return
            body = json.dumps(known[self.path]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serving_http(Hung) as url:
        try:
            yield url
        finally:
            released.set()  # before the server's shutdown, which waits for held requests


class Endless:
    """A request body with no length (sent chunked) and no end, as ``requests`` sends an
    iterable: whole before it reads the answer. ``sent`` counts the bytes taken from it; it ends
    at ``limit``, so that a server that reads on ends the test instead of hanging it."""

    def __init__(self, limit: int = 4 * LINGER_BYTES) -> None:
        self.limit = limit
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        chunk = bytes(65536)
        while self.sent < self.limit:
            self.sent += len(chunk)
            yield chunk


@contextlib.contextmanager
def reading_pipe(path: Path) -> Iterator[tuple[Path, list[bytes]]]:
    """A named pipe at ``path`` and what a thread reads from it, once the block has ended (its
    write end opened and closed, so that the reader ends whatever was written)."""
    os.mkfifo(path)
    received: list[bytes] = []

    def read() -> None:
        with path.open("rb") as pipe:
            received.append(pipe.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    yield path, received
    with contextlib.suppress(OSError):  # ENXIO: the reader has gone (it opened and read)
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    reader.join(timeout=30)


#: The size of :func:`web_server`'s pages.
PAGE_BYTES = 557


def keras_layer(kind: str, **config: Any) -> dict[str, Any]:
    """A Keras layer's config as ``model.to_json()`` writes it (what it leaves out takes Keras's
    defaults)."""
    return {"module": "keras.layers", "class_name": kind, "config": config, "registered_name": None}


def keras_architecture(
    *, shape: tuple[int, ...] = (8, 8, 1), classes: int = 10, hidden: int = 16
) -> dict[str, Any]:
    """A job's own architecture, written by hand as ``model.to_json()`` writes a Sequential
    model's: examples of ``shape`` flattened, a ``hidden`` layer and ``classes`` logits."""
    layers = [
        keras_layer("InputLayer", batch_shape=[None, *shape], name="pixels"),
        keras_layer("Flatten", name="flat"),
        keras_layer("Dense", units=hidden, activation="relu", name="hidden"),
        keras_layer("Dense", units=classes, name="logits"),
    ]
    return {
        "module": "keras",
        "class_name": "Sequential",
        "config": {"name": "tiny", "layers": layers},
        "registered_name": None,
    }


#: An embedded platform's parameter storage key (the base64 of 16 bytes), as OpenWhisk's
#: ``whisk.parameter-storage.key``.
PARAMETER_STORAGE_KEY = base64.b64encode(bytes(range(16))).decode()


@contextlib.contextmanager
def web_server() -> Iterator[str]:
    """A web server that is neither the controller nor OpenWhisk (its URL): a GET of / or
    /v1/jobs answers an HTML page, every other GET a 404 page, every POST a proxy's 502 page."""
    page = b"<!DOCTYPE html><html><body><h1>Welcome</h1>" + b"<p>...</p>" * 50 + b"</body></html>"
    assert len(page) == PAGE_BYTES

    class Web(QuietHandler):
        def answer(self, status: int) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def do_GET(self) -> None:
            self.answer(200 if self.path.partition("?")[0] in ("/", "/v1/jobs") else 404)

        def do_POST(self) -> None:
            self.answer(502)

    with serving_http(Web) as url:
        yield url


@contextlib.contextmanager
def serving_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler``'s HTTP server on loopback, in a thread: its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def relay(
    handler: http.server.BaseHTTPRequestHandler, answer: httpx.Response, cut: int | None = None
) -> None:
    """Send a proxy's upstream's ``answer`` as ``handler``'s, its body cut after ``cut`` bytes
    where given (a link lost), its hop-by-hop headers not passed on."""
    handler.send_response(answer.status_code)
    for name, value in answer.headers.items():
        if name.lower() not in ("connection", "date", "server", "transfer-encoding"):
            handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(answer.content[:cut])


DEFAULTS: dict[str, Any] = {"pool_memory_mb": 2048, "memory_max_mb": 1024}


class Served:
    """An embedded platform, its REST server, and a REST client of it."""

    def __init__(
        self,
        settings: LocalPlatformSettings,
        server: dict[str, Any] | None = None,
        **client: Any,
    ) -> None:
        self.local = LocalPlatform(settings=settings)
        self.local.open()
        self.server_settings = ServerSettings(**{"port": 0, **(server or {})})
        self.server = ServerThread(self.local, self.server_settings)
        self.url = self.server.start()
        self.client = OpenWhiskPlatform(
            settings=OpenWhiskSettings(
                **{
                    "api_host": self.url,
                    "auth": self.server_settings.auth,
                    "admin_url": f"{self.url}/faasdl/v1",
                    "retry_attempts": 3,
                    "retry_max_wait_s": 0.2,
                }
                | client
            )
        )
        self.client.open()

    def restart_server(self) -> None:
        """Serve the platform again on the same port, after ``server.stop()`` (an OpenWhisk API
        that went down while its invokers ran on)."""
        port = int(self.url.rsplit(":", 1)[1])
        settings = self.server_settings.model_copy(update={"port": port})
        self.server = ServerThread(self.local, settings)
        self.server.start()

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.local.close()


@pytest.fixture
def make_local() -> Iterator[Callable[..., LocalPlatform]]:
    created: list[LocalPlatform] = []

    def make(**overrides: Any) -> LocalPlatform:
        platform = LocalPlatform(settings=LocalPlatformSettings(**(DEFAULTS | overrides)))
        platform.open()
        created.append(platform)
        return platform

    yield make
    for platform in reversed(created):
        platform.close()


@pytest.fixture
def make_served() -> Iterator[Callable[..., Served]]:
    created: list[Served] = []

    def make(
        client: dict[str, Any] | None = None,
        server: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> Served:
        """``client``: the REST client's settings; ``server``: its server's."""
        served = Served(LocalPlatformSettings(**(DEFAULTS | overrides)), server, **(client or {}))
        created.append(served)
        return served

    yield make
    for served in reversed(created):
        served.close()


@pytest.fixture(params=["local", "openwhisk"])
def make_platform(
    request: pytest.FixtureRequest,
    make_local: Callable[..., LocalPlatform],
    make_served: Callable[..., Served],
) -> PlatformFactory:
    """Builds the platform under test: the embedded one, or the REST client over its server."""
    if request.param == "local":
        return make_local
    return lambda **overrides: make_served(**overrides).client


@pytest.fixture
def platform(make_platform: PlatformFactory) -> Platform:
    return make_platform()


@pytest.fixture(scope="module")
def tf_platform() -> Iterator[LocalPlatform]:
    """An embedded platform for TensorFlow actions, shared by a module so that containers stay
    warm between its tests (each cold start imports TensorFlow)."""
    settings = LocalPlatformSettings(pool_memory_mb=4096, memory_max_mb=2048)
    with LocalPlatform(settings=settings) as platform:
        yield platform


@pytest.fixture(scope="session")
def quick_training_bench() -> dict[str, Any]:
    """``faasdl bench training --quick``'s result, measured once a session: its own test reads
    it, and the disdel experiment's test (whose first section is this benchmark) is handed it
    rather than train the same minute again."""
    pytest.importorskip("tensorflow", reason="needs TensorFlow (the 'train' extra)")
    from faasdl.bench.training import run_training_bench

    return run_training_bench(quick=True, seeds=3, progress=Console(quiet=True))


@pytest.fixture(scope="module")
def tf_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StateStore, str]]:
    """A SQLite store and its absolute URL, which actions (other processes) open too."""
    root: Path = tmp_path_factory.mktemp("store")
    url = f"sqlite:///{root / 'state.db'}"
    with make_store(StoreSettings(spill_dir=str(root / "spill")), url) as store:
        yield store, url
