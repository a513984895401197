"""``IgniteStore``: the reference deployment's store, through the pyignite thin client.

Two caches, created TRANSACTIONAL with FULL_SYNC writes and either REPLICATED or PARTITIONED with
``backups >= 1`` (Ignite's defaults — ATOMIC, backups 0, PRIMARY_SYNC — can lose the latest
write; reference/fault-tolerance.md §4). A record's stored value is ``8-byte version + data``, so
compare-and-set is ``replace_if_equals`` against the exact bytes read: atomic on the server, and
only equal if the version is. Chunks are 1 MiB by default, well under the thin-client message
limit.

No Ignite server runs on the development machines; this backend runs the shared contract suite
wherever ``FAASDL_TEST_IGNITE_URL`` points at an Ignite 2.x node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from pyignite.monitoring import ConnectionEventListener, HandshakeFailedEvent

from faasdl.errors import StoreError, StoreFull, StoreUnavailable, ValidationError
from faasdl.store.base import StateStore

T = TypeVar("T")
_VERSION = struct.Struct(">Q")

#: What an Ignite node's error says when it has no room for a write: a data region out of pages
#: (IgniteOutOfMemoryException, as Ignite 2.x words it) or a full disk under native persistence.
_FULL = ("Out of memory in data region", "No space left on device")

# pyignite logs a failed handshake with its traceback; with no handler configured (the CLI),
# Python's last-resort handler printed it above the one line StoreUnavailable gives. A server's
# configured logging still receives it.
logging.getLogger("pyignite").addHandler(logging.NullHandler())


def parse_nodes(hosts: str) -> list[tuple[str, int]]:
    """``host:port[,host2:port2]`` → ``[(host, port), ...]`` (port 10800 when left out)."""
    nodes = []
    for part in hosts.split(","):
        host, _, port = part.strip().rpartition(":") if ":" in part else (part.strip(), "", "10800")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValidationError(f"'{part}' is not host:port", field="store url")
        nodes.append((host, int(port)))
    return nodes


def refused(nodes: list[tuple[str, int]], message: str) -> StoreError:
    """The error for an operation the Ignite node at ``nodes`` refused, saying ``message``:
    ``StoreFull`` where it had no room (:data:`_FULL`), a ``StoreError`` otherwise; neither is
    retried, as the same write would be refused again."""
    first_line = message.strip().splitlines()[0] if message.strip() else "no reason given"
    if any(phrase in message for phrase in _FULL):
        return StoreFull(
            f"the Ignite store at {nodes} is full: it refused a write ({first_line}); delete what "
            "it holds for nothing (ended jobs: FAASDL_CONTROLLER__JOB_RETENTION_DAYS) or give its "
            "data region or disk more room"
        )
    return StoreError(f"the Ignite store at {nodes} refused an operation: {first_line}")


class _Handshakes(ConnectionEventListener):  # type: ignore[misc]  # pyignite is untyped
    """Why a node's handshake failed, last: pyignite logs it (its traceback, which the
    NullHandler above keeps from the CLI's output) and raises "Can not connect." for them all."""

    def __init__(self) -> None:
        self.failed: str | None = None

    def on_handshake_fail(self, event: HandshakeFailedEvent) -> None:
        self.failed = event.error_msg  # the error's repr: its class, and what it said

    on_authentication_fail = on_handshake_fail


class IgniteStore(StateStore):
    name = "ignite"

    def __init__(
        self,
        *,
        nodes: list[tuple[str, int]],
        cache_prefix: str = "faasdl",
        replicated: bool = True,
        backups: int = 1,
        username: str | None = None,
        password: str | None = None,
        use_ssl: bool = False,
        tls_ca_file: str | None = None,
        tls_ca_data: str | None = None,
        timeout_s: float = 30.0,
        chunk_bytes: int = 1024 * 1024,
        **kw: Any,
    ) -> None:
        super().__init__(chunk_bytes=chunk_bytes, **kw)
        if not replicated and backups < 1:
            raise ValidationError("a PARTITIONED store needs backups >= 1", field="backups")
        self.nodes = nodes
        self._prefix = cache_prefix
        self._replicated = replicated
        self._backups = backups
        self._credentials = (username, password)
        self._use_ssl = use_ssl
        self._tls_ca = (tls_ca_file, tls_ca_data)
        self._ca_copy: str | None = None  # tls_ca_data written for pyignite, which reads a file
        self._timeout_s = timeout_s
        self._client: Any = None
        self._records: Any = None
        self._chunks: Any = None

    def open(self) -> None:
        if self._client is not None:
            return
        from pyignite import Client
        from pyignite.datatypes.cache_config import (
            CacheAtomicityMode,
            CacheMode,
            WriteSynchronizationMode,
        )
        from pyignite.datatypes.prop_codes import (
            PROP_BACKUPS_NUMBER,
            PROP_CACHE_ATOMICITY_MODE,
            PROP_CACHE_MODE,
            PROP_NAME,
            PROP_WRITE_SYNCHRONIZATION_MODE,
        )

        username, password = self._credentials
        options: dict[str, Any] = {"timeout": self._timeout_s}
        if username is not None:
            options.update(username=username, password=password, use_ssl=True)
        elif self._use_ssl:
            options["use_ssl"] = True
        ca_file = self._ca_file()
        if ca_file is not None:  # pyignite verifies no certificate unless told to
            options.update(use_ssl=True, ssl_cert_reqs=ssl.CERT_REQUIRED, ssl_ca_certfile=ca_file)
        handshakes = _Handshakes()
        client = Client(partition_aware=True, event_listeners=[handshakes], **options)

        def config(name: str) -> dict[int, Any]:
            props: dict[int, Any] = {
                PROP_NAME: f"{self._prefix}-{name}",
                PROP_CACHE_ATOMICITY_MODE: CacheAtomicityMode.TRANSACTIONAL,
                PROP_WRITE_SYNCHRONIZATION_MODE: WriteSynchronizationMode.FULL_SYNC,
            }
            if self._replicated:
                props[PROP_CACHE_MODE] = CacheMode.REPLICATED
            else:
                props[PROP_CACHE_MODE] = CacheMode.PARTITIONED
                props[PROP_BACKUPS_NUMBER] = self._backups
            return props

        try:
            client.connect(self.nodes)
            self._records = client.get_or_create_cache(config("records"))
            self._chunks = client.get_or_create_cache(config("chunks"))
        except Exception as exc:  # pyignite raises socket errors and its own, unrelated, types
            client.close()
            self._forget_ca()
            why = f" (the last handshake: {handshakes.failed})" if handshakes.failed else ""
            raise StoreUnavailable(f"cannot reach Ignite at {self.nodes}: {exc}{why}") from exc
        self._client = client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self._forget_ca()

    def _ca_file(self) -> str | None:
        """The CA bundle's file to verify the nodes' certificates with: ``tls_ca_file``, or
        ``tls_ca_data`` written to a file of this store's (an action's container has the text
        only), removed as it closes; ``None`` for neither."""
        ca_file, ca_data = self._tls_ca
        if ca_data is None:
            return ca_file
        descriptor, self._ca_copy = tempfile.mkstemp(prefix="faasdl-ignite-ca-", suffix=".pem")
        with os.fdopen(descriptor, "w", encoding="utf-8") as copy:
            copy.write(ca_data)
        return self._ca_copy

    def _forget_ca(self) -> None:
        if self._ca_copy is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._ca_copy)
            self._ca_copy = None

    def _call(self, op: Callable[[], T]) -> T:
        if self._client is None:
            raise StoreUnavailable("the Ignite store is not open (call open() first)")
        from pyignite.exceptions import CacheError, ReconnectError, SocketError

        try:
            return op()
        except (SocketError, ReconnectError, OSError) as exc:
            raise StoreUnavailable(f"lost the connection to Ignite at {self.nodes}: {exc}") from exc
        except CacheError as exc:
            raise refused(self.nodes, str(exc)) from exc

    @staticmethod
    def _pack(version: int, data: bytes) -> bytes:
        return _VERSION.pack(version) + data

    def _get(self, key: str) -> tuple[bytes, int] | None:
        raw = self._call(lambda: self._records.get(key))
        if raw is None:
            return None
        raw = bytes(raw)
        return raw[_VERSION.size :], _VERSION.unpack_from(raw)[0]

    def _put(self, key: str, data: bytes) -> int:
        while True:
            current = self._call(lambda: self._records.get(key))
            if current is None:
                if self._call(lambda: self._records.put_if_absent(key, self._pack(1, data))):
                    return 1
                continue
            version = int(_VERSION.unpack_from(bytes(current))[0]) + 1
            new = self._pack(version, data)

            def swap(current: Any = current, new: bytes = new) -> bool:
                return bool(self._records.replace_if_equals(key, current, new))

            if self._call(swap):
                return version

    def _put_if_absent(self, key: str, data: bytes) -> bool:
        return bool(self._call(lambda: self._records.put_if_absent(key, self._pack(1, data))))

    def _compare_and_set(self, key: str, expected_version: int, data: bytes) -> bool:
        current = self._call(lambda: self._records.get(key))
        if current is None or _VERSION.unpack_from(bytes(current))[0] != expected_version:
            return False
        new = self._pack(expected_version + 1, data)
        return bool(self._call(lambda: self._records.replace_if_equals(key, current, new)))

    def _delete(self, key: str, expected_version: int | None) -> bool:
        current = self._call(lambda: self._records.get(key))
        if current is None:
            return False
        if (
            expected_version is not None
            and _VERSION.unpack_from(bytes(current))[0] != expected_version
        ):
            return False
        return bool(self._call(lambda: self._records.remove_if_equals(key, current)))

    def _scan(self, prefix: str, low: str) -> Iterable[tuple[str, bytes, int]]:
        def collect() -> list[tuple[str, bytes, int]]:
            out = []
            with self._records.scan(page_size=1000) as cursor:
                for key, raw in cursor:
                    if isinstance(key, str) and key.startswith(prefix) and key >= low:
                        raw = bytes(raw)
                        out.append((key, raw[_VERSION.size :], _VERSION.unpack_from(raw)[0]))
            return out

        return self._call(collect)

    def _write_chunks(
        self, chunks: list[tuple[str, bytes | memoryview]], *, durable: bool = True
    ) -> None:
        # One put_all per few chunks keeps each thin-client message small.
        for start in range(0, len(chunks), 4):
            batch = {key: bytes(data) for key, data in chunks[start : start + 4]}

            def put(batch: dict[str, bytes] = batch) -> None:
                self._chunks.put_all(batch)

            self._call(put)

    def _read_chunk(self, key: str) -> bytes | None:
        raw = self._call(lambda: self._chunks.get(key))
        return None if raw is None else bytes(raw)

    def _delete_chunks(self, keys: Iterable[str]) -> None:
        names = list(keys)
        for start in range(0, len(names), 1000):
            batch = names[start : start + 1000]

            def remove(batch: list[str] = batch) -> None:
                self._chunks.remove_keys(batch)

            self._call(remove)

    def _chunk_keys(self, prefix: str) -> Iterator[str]:
        def collect() -> list[str]:
            with self._chunks.scan(page_size=1000) as cursor:
                return [k for k, _ in cursor if isinstance(k, str) and k.startswith(prefix)]

        yield from self._call(collect)
