"""``SqliteStore``: the embedded default. Records in one SQLite database in WAL mode, safe for many
processes on one machine; blob chunks as files beside it, fsynced before their manifest is
published (unless the blob is written ``durable=False``: see :meth:`StateStore.put_blob`).

One process writes at a time. A statement that finds the database locked is tried again every
0.5-2 ms (:func:`busy_pauses`), not by SQLite's own busy handler, whose pauses grow to 100 ms: a
writer that has waited a while then looks only ten times a second, and beside busy writers (eight
processes checkpointing every 20 ms: ``faasdl bench store``) a heartbeat found the lock taken at
each look for up to 1.5 s, a lease's length (0.2 s at most with the short pauses)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, get_args

from faasdl.config import SqliteSynchronous
from faasdl.errors import StoreUnavailable, ValidationError
from faasdl.store.base import FULL_ERRNOS, StateStore, disk_full, fsync_dirs

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    version INTEGER NOT NULL
) WITHOUT ROWID
"""

SYNCHRONOUS: tuple[str, ...] = get_args(SqliteSynchronous)

#: The first and the longest pause between tries of a statement that found the database locked.
BUSY_FIRST_PAUSE_S = 0.0005
BUSY_LAST_PAUSE_S = 0.002


def busy_pauses(timeout_s: float) -> Iterator[float]:
    """The pauses before each next try of a statement the database was locked for (each half as
    long again as the one before, up to :data:`BUSY_LAST_PAUSE_S`), until ``timeout_s`` has gone
    by in them: short enough that a waiting writer takes the lock in one of the gaps between other
    writers' commits."""
    pause, waited = BUSY_FIRST_PAUSE_S, 0.0
    while waited < timeout_s:
        yield pause
        waited += pause
        pause = min(pause * 1.5, BUSY_LAST_PAUSE_S)


class SqliteStore(StateStore):
    """A store in ``path`` (its chunks under ``<path>.chunks/``)."""

    name = "sqlite"

    def __init__(
        self,
        *,
        path: str | Path,
        synchronous: SqliteSynchronous = "FULL",
        busy_timeout_s: float = 60.0,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        if synchronous not in SYNCHRONOUS:
            raise ValidationError(f"must be one of {', '.join(SYNCHRONOUS)}", field="synchronous")
        self.path = Path(path)
        self.chunk_dir = Path(f"{self.path}.chunks")
        self._synchronous = synchronous
        self._busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._opened = False

    def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.chunk_dir.mkdir(parents=True, exist_ok=True)
            self._patiently(lambda: self._conn().execute(_SCHEMA))
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(f"cannot open the SQLite store at {self.path}: {exc}") from exc
        self._opened = True

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        self._opened = False

    def durability_warning(self) -> str | None:
        if self._synchronous != "NORMAL":
            return None
        return (
            f"the SQLite store at {self.path} syncs only the write-ahead log's checkpoints "
            "(synchronous NORMAL: FAASDL_STORE__SQLITE_SYNCHRONOUS): a crash of its machine can "
            "lose commits it acknowledged, and their units run again; FULL forces each to disk"
        )

    def _conn(self) -> sqlite3.Connection:
        # One connection per thread: sqlite3 connections must not be shared across threads.
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.execute("PRAGMA busy_timeout=0")  # locked: tried again by _patiently
            self._local.conn = conn
        return conn

    def _patiently(self, statement: Callable[[], sqlite3.Cursor]) -> sqlite3.Cursor:
        """Run ``statement``, again after each of :func:`busy_pauses` while the database is
        locked (each try is a statement of its own: nothing of a refused one was written). Not
        tenacity's ``Retrying``: it adds ~23 µs to every statement, locked or not, and its import
        to every action's start."""
        for pause in busy_pauses(self._busy_timeout_s):
            try:
                return statement()
            except sqlite3.OperationalError as exc:
                code = getattr(exc, "sqlite_errorcode", None)
                if code is None or code & 0xFF != sqlite3.SQLITE_BUSY:  # BUSY, and its kinds
                    raise
            time.sleep(pause)
        return statement()  # the last try: its error, if locked still, is the caller's

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        if not self._opened:
            raise StoreUnavailable("the SQLite store is not open (call open() first)")
        try:
            return self._patiently(lambda: self._conn().execute(sql, params))
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode == sqlite3.SQLITE_FULL:
                raise disk_full(self.path) from exc
            raise StoreUnavailable(f"SQLite store {self.path}: {exc}") from exc

    def _get(self, key: str) -> tuple[bytes, int] | None:
        row = self._execute("SELECT value, version FROM records WHERE key = ?", (key,)).fetchone()
        return None if row is None else (bytes(row[0]), int(row[1]))

    def _put(self, key: str, data: bytes) -> int:
        row = self._execute(
            "INSERT INTO records (key, value, version) VALUES (?, ?, 1) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = version + 1 "
            "RETURNING version",
            (key, data),
        ).fetchone()
        return int(row[0])

    def _put_if_absent(self, key: str, data: bytes) -> bool:
        cursor = self._execute(
            "INSERT OR IGNORE INTO records (key, value, version) VALUES (?, ?, 1)", (key, data)
        )
        return cursor.rowcount == 1

    def _compare_and_set(self, key: str, expected_version: int, data: bytes) -> bool:
        cursor = self._execute(
            "UPDATE records SET value = ?, version = version + 1 WHERE key = ? AND version = ?",
            (data, key, expected_version),
        )
        return cursor.rowcount == 1

    def _delete(self, key: str, expected_version: int | None) -> bool:
        if expected_version is None:
            cursor = self._execute("DELETE FROM records WHERE key = ?", (key,))
        else:
            cursor = self._execute(
                "DELETE FROM records WHERE key = ? AND version = ?", (key, expected_version)
            )
        return cursor.rowcount == 1

    def _scan(self, prefix: str, low: str) -> Iterable[tuple[str, bytes, int]]:
        rows = self._range("key, value, version", prefix, low)
        return [(str(k), bytes(v), int(n)) for k, v, n in rows]

    def _scan_versions(self, prefix: str) -> Iterable[tuple[str, int]]:
        return [(str(k), int(n)) for k, n in self._range("key, version", prefix, prefix)]

    def _range(self, columns: str, prefix: str, low: str) -> list[Any]:
        """``columns`` of the records under ``prefix`` from key ``low`` on: a range scan on the
        primary key, up to the first text after all that start with the prefix."""
        end = _prefix_end(prefix)
        if end is None:
            return self._execute(
                f"SELECT {columns} FROM records WHERE key >= ? ORDER BY key", (low,)
            ).fetchall()
        return self._execute(
            f"SELECT {columns} FROM records WHERE key >= ? AND key < ? ORDER BY key",
            (low, end),
        ).fetchall()

    def _chunk_path(self, key: str) -> Path:
        # One flat folder: <blob id>-<write id>-<index>. A folder per blob and per write cost each
        # checkpoint (a blob of its own name) two mkdirs and two rmdirs, more than its file did.
        return self.chunk_dir / key.replace("/", "-")

    def _write_chunks(
        self, chunks: list[tuple[str, bytes | memoryview]], *, durable: bool = True
    ) -> None:
        for key, data in chunks:
            path = self._chunk_path(key)
            tmp = path.with_name(f"{path.name}.tmp")
            try:
                with open(tmp, "wb") as fh:
                    fh.write(data)
                    if durable:
                        fh.flush()
                        os.fsync(fh.fileno())
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                if exc.errno in FULL_ERRNOS:
                    raise disk_full(self.chunk_dir) from exc
                raise
            tmp.replace(path)
        if durable and chunks:
            fsync_dirs(self.chunk_dir)  # the chunks' entries

    def _read_chunk(self, key: str) -> bytes | None:
        try:
            return self._chunk_path(key).read_bytes()
        except FileNotFoundError:
            return None

    def _delete_chunks(self, keys: Iterable[str]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                self._chunk_path(key).unlink()

    def _chunk_keys(self, prefix: str) -> Iterator[str]:
        for path in self.chunk_dir.iterdir():
            key = path.name.replace("-", "/")
            if path.suffix != ".tmp" and key.count("/") == 2 and key.startswith(prefix):
                yield key


def _prefix_end(prefix: str) -> str | None:
    """The least text greater than every text that starts with ``prefix`` (its last character
    that can be raised, raised; code point order is UTF-8's byte order), or ``None`` when there is
    none (an empty prefix, or only U+10FFFF)."""
    chars = prefix.rstrip("\U0010ffff")
    if not chars:
        return None
    nxt = ord(chars[-1]) + 1
    if 0xD800 <= nxt <= 0xDFFF:  # surrogates are no text: UTF-8 has no bytes for them
        nxt = 0xE000
    return chars[:-1] + chr(nxt)
