"""A private ``redis-server`` on a free loopback port, for benchmarks and tests: append-only file
with an fsync before every reply (``appendfsync always``), in a directory of its own; TLS only
(``rediss://``) where it is given a certificate."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from faasdl.errors import StoreUnavailable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class ServerTls:
    """A TLS server's certificate and key, and the CA bundle its clients verify it by (PEM)."""

    cert_file: Path
    key_file: Path
    ca_file: Path


class RedisServer:
    def __init__(
        self, *, directory: Path, port: int | None = None, tls: ServerTls | None = None
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise StoreUnavailable("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.directory = directory
        self.port = port or free_port()
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def client(self, **options: Any) -> redis.Redis:
        """A client of the server (its CA bundle given where it speaks TLS)."""
        if self.tls is not None:
            options["ssl_ca_certs"] = str(self.tls.ca_file)
        return redis.Redis.from_url(self.url, **options)

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Start the server (loading its AOF if there is one) and wait until it answers."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                self.binary,
                *self._listen(),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = self.client(socket_connect_timeout=1)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, redis.BusyLoadingError) as exc:
                    if self.process.poll() is not None:
                        raise StoreUnavailable(
                            f"redis-server exited with {self.process.returncode}"
                        ) from exc
                    if time.monotonic() > deadline:
                        raise StoreUnavailable(
                            f"redis-server did not answer within {timeout_s} s: {exc}"
                        ) from exc
                    time.sleep(0.01)
        except BaseException:
            self.kill()  # one that never answered is not left running
            raise
        finally:
            client.close()

    def _listen(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            str(self.tls.cert_file),
            "--tls-key-file",
            str(self.tls.key_file),
            "--tls-ca-cert-file",
            str(self.tls.ca_file),
            "--tls-auth-clients",
            "no",
        ]

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to flush anything."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, *, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``: a server writing its first AOF (just turned
        on with ``CONFIG SET appendonly yes``) refuses to shut down and does not try again, and
        a stop waited for it in vain."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
