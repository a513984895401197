"""The ``StateStore`` seam: versioned records with compare-and-set, and chunked checksummed blobs.

Every state change of a unit in the exactly-once protocol (DESIGN.md §3) is one compare-and-set on
one record, so a backend needs only single-key CAS; the shared logic here (validation, JSON,
blobs, spill tier, garbage collection) is the same for all of them. Backends implement the
primitives at the bottom of :class:`StateStore` and pass ``tests/store/test_contract.py``.

Records are JSON values with a version: 1 on create, +1 on every write. Blobs are bytes, written
chunks first under a fresh write id and published by one record write of their manifest, so a
reader sees the previous blob or the whole new one, never a mix; a writer that dies before
publishing leaves only orphan chunks, which :meth:`StateStore.collect_garbage` removes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import os
import time
import uuid
from abc import abstractmethod
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faasdl.errors import (
    BlobCorrupted,
    BlobNotFound,
    StoreFull,
    ValidationError,
    check_unicode,
)
from faasdl.lifecycle import Resource

MANIFEST_PREFIX = "blob/"
#: What a write to a full disk, or past a disk quota, fails with.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
MAX_KEY_LENGTH = 1024
#: Chunks handed to a backend's write at a time: what a blob written from pieces holds in copies
#: at most (the chunks that span two pieces are joined).
CHUNKS_PER_WRITE = 8

#: Bytes, or a view of them (a NumPy array's ``data``).
Buffer = bytes | bytearray | memoryview
#: A blob's bytes as pieces in order (a file's header, then views of its arrays): written without
#: being joined first, which for a model's weights and optimizer state would be a second copy.
Pieces = tuple[Buffer, ...]


@dataclass(frozen=True)
class Streamed:
    """A blob's bytes made as they are written: ``size`` bytes in all, ``pieces`` read once, in
    order, each let go once its bytes are written (a model written from its variables one at a
    time, never held whole beside them)."""

    size: int
    pieces: Iterable[Buffer]


@dataclass(frozen=True)
class Versioned:
    """A record's value and its version."""

    value: Any
    version: int


@dataclass(frozen=True)
class BlobManifest:
    name: str
    write_id: str
    size: int
    sha256: str  # of the chunk digests, in order (of the data itself for a spilled blob)
    chunk_size: int
    chunk_sha256: tuple[str, ...]
    spill_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "write_id": self.write_id,
            "size": self.size,
            "sha256": self.sha256,
            "chunk_size": self.chunk_size,
            "chunk_sha256": list(self.chunk_sha256),
            "spill_path": self.spill_path,
        }

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> BlobManifest:
        return cls(
            name=name,
            write_id=data["write_id"],
            size=int(data["size"]),
            sha256=data["sha256"],
            chunk_size=int(data["chunk_size"]),
            chunk_sha256=tuple(data["chunk_sha256"]),
            spill_path=data.get("spill_path"),
        )


def check_key(key: object, field: str = "key") -> str:
    if not isinstance(key, str):
        raise ValidationError(f"must be a string, not {type(key).__name__}", field=field)
    if not key:
        raise ValidationError("must not be empty", field=field)
    if "\x00" in key:
        raise ValidationError("must not contain NUL characters", field=field)
    if len(key) > MAX_KEY_LENGTH:
        raise ValidationError(f"is longer than {MAX_KEY_LENGTH} characters", field=field)
    check_unicode(key, field)  # every backend keys by its UTF-8
    return key


def encode(key: str, value: Any) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"is not JSON-serialisable ({exc})", field=f"value of {key!r}"
        ) from exc


def decode(data: bytes) -> Any:
    return json.loads(data)


def check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValidationError(
            f"must be a positive integer, not {version!r}", field="expected_version"
        )
    return version


def _write_id() -> str:
    # Starts with the time, so garbage collection can tell an old orphan from a write in flight.
    return f"{time.time_ns():016x}{uuid.uuid4().hex[:12]}"


def _hash_list(digests: Iterable[str]) -> str:
    """The blob's digest: SHA-256 over its chunks' digests (each chunk is hashed only once)."""
    return hashlib.sha256("".join(digests).encode("ascii")).hexdigest()


def _blob_id(name: str) -> str:
    """Chunks are addressed by a digest of the blob's name: short, and safe in any key space."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]


def fsync_dirs(*folders: Path) -> None:
    """Force the entries of ``folders`` to disk: a file or folder made in one survives a machine
    crash only once its folder is synced too."""
    for folder in folders:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_id_age_s(write_id: str) -> float:
    try:
        return time.time() - int(write_id[:16], 16) / 1e9
    except ValueError:
        return float("inf")


class StateStore(Resource):
    """A key-value store with versioned records and blobs.

    Constructors take keyword arguments and do no I/O; :meth:`open` connects (raising
    ``StoreUnavailable`` when the store cannot be reached), :meth:`close` disconnects.

    * A missing key is not an error: :meth:`get` returns ``None``, :meth:`delete` returns
      ``False``. :meth:`get_blob` raises ``BlobNotFound`` because a caller asking for bytes has no
      sensible default.
    * A lost race is not an error either: :meth:`compare_and_set` and :meth:`put_if_absent`
      return ``False``; they never overwrite silently. The fenced protocol above them turns a
      lost race into ``Superseded`` where a writer must stop.
    * Bad input (empty key, NUL in a key, a value that is not JSON, a version that is not a
      positive integer) raises ``ValidationError`` naming it.
    * Losing the connection raises ``StoreUnavailable``; backends retry reads and idempotent
      chunk writes with backoff first, never a CAS (its outcome would be unknown).
    """

    name: str

    def __init__(
        self,
        *,
        chunk_bytes: int = 4 * 1024 * 1024,
        spill_bytes: int | None = 256 * 1024 * 1024,
        spill_dir: str | Path | None = None,
    ) -> None:
        if chunk_bytes < 1024:
            raise ValidationError("must be at least 1024", field="chunk_bytes")
        self.chunk_bytes = chunk_bytes
        self.spill_bytes = spill_bytes
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None

    @abstractmethod
    def open(self) -> None:
        """Connect (and create tables or caches). Idempotent."""

    @abstractmethod
    def close(self) -> None:
        """Disconnect. Idempotent."""

    def durability_warning(self) -> str | None:
        """What an acknowledged write could be lost to, where the backend's settings allow that
        (the exactly-once protocol takes a commit the store acknowledged as kept); ``None`` where
        they do not, or cannot be read."""
        return None

    # -- records ---------------------------------------------------------------------------

    def get(self, key: str) -> Versioned | None:
        """The value and version of ``key``, or ``None`` if it does not exist."""
        found = self.get_raw(key)
        return None if found is None else Versioned(decode(found.value), found.version)

    def get_raw(self, key: str) -> Versioned | None:
        """As :meth:`get`, with the value as stored (JSON bytes, not decoded): for a reader that
        decodes only versions it has not seen."""
        found = self._get(check_key(key))
        return None if found is None else Versioned(found[0], found[1])

    def put(self, key: str, value: Any) -> int:
        """Write ``value`` whatever the current version; return the new version."""
        return self._put(check_key(key), encode(key, value))

    def put_if_absent(self, key: str, value: Any) -> bool:
        """Create ``key`` at version 1; ``False`` if it already exists (exactly one racer wins)."""
        return self._put_if_absent(check_key(key), encode(key, value))

    def compare_and_set(self, key: str, expected_version: int, value: Any) -> bool:
        """Write ``value`` only if ``key`` is at ``expected_version`` (it then becomes
        ``expected_version + 1``); ``False`` when the key moved on or does not exist."""
        return self._compare_and_set(
            check_key(key), check_version(expected_version), encode(key, value)
        )

    def delete(self, key: str, expected_version: int | None = None) -> bool:
        """Delete ``key`` (only at ``expected_version`` if given); ``False`` if nothing was."""
        if expected_version is not None:
            check_version(expected_version)
        return self._delete(check_key(key), expected_version)

    def scan(self, prefix: str, *, from_key: str = "") -> list[tuple[str, Versioned]]:
        """Every record whose key starts with ``prefix``, each exactly once, sorted by key; with
        ``from_key``, only those from that key on (the keys sort as text, by code point)."""
        return [
            (k, Versioned(decode(v.value), v.version))
            for k, v in self.scan_raw(prefix, from_key=from_key)
        ]

    def scan_raw(self, prefix: str, *, from_key: str = "") -> list[tuple[str, Versioned]]:
        """As :meth:`scan`, with the values as stored (JSON bytes, not decoded)."""
        low = max(_checked_prefix(prefix), _checked_prefix(from_key, field="from_key"))
        seen: dict[str, Versioned] = {}
        for key, data, version in self._scan(prefix, low):
            if key.startswith(prefix) and key >= low:
                seen[key] = Versioned(data, version)
        return sorted(seen.items())

    def scan_versions(self, prefix: str) -> list[tuple[str, int]]:
        """As :meth:`scan`, with each record's version and not its value: a reader that keeps
        what it has read by version fetches only the records that changed."""
        seen = {
            key: version
            for key, version in self._scan_versions(_checked_prefix(prefix))
            if key.startswith(prefix)
        }
        return sorted(seen.items())

    # -- blobs -----------------------------------------------------------------------------

    def put_blob(
        self, name: str, data: Buffer | Pieces | Streamed, *, durable: bool = True
    ) -> BlobManifest:
        """Store ``data`` (bytes, :data:`Pieces` to be stored one after another, or
        :class:`Streamed` pieces made as they are written) under ``name``, replacing any previous
        blob atomically.

        Chunks (or the spill file) are written first under a fresh write id, then the manifest is
        published with one record write; the previous blob's chunks are deleted afterwards.
        Pieces are cut into chunks as they are written, :data:`CHUNKS_PER_WRITE` at a time: a
        chunk within one piece is a view of it, one spanning pieces a copy.

        ``durable=False`` lets the store skip forcing the chunks to disk before the manifest is
        published (the SQLite store's fsyncs: most of a large blob's write). A crash of the
        machine (not of a process) can then lose or tear the blob; :meth:`get_blob` finds that
        out by its checksums and raises ``BlobCorrupted``, never returning wrong data. For data
        that can be made again: checkpoints (a lost one costs the work since the one before).
        Redis and Ignite write every blob as their servers are configured to.
        """
        check_key(name, "name")
        if isinstance(data, Streamed):
            views = _exactly((_byte_view(piece) for piece in data.pieces), data.size)
            return self._put_pieces(name, views, data.size, durable=durable)
        pieces = [_byte_view(piece) for piece in (data if isinstance(data, tuple) else (data,))]
        return self._put_pieces(name, pieces, sum(len(p) for p in pieces), durable=durable)

    def copy_blob(self, source: str, name: str, *, durable: bool = True) -> BlobManifest:
        """Store blob ``source``'s bytes under ``name`` as :meth:`put_blob` would, read (each
        chunk checked) and written a chunk at a time: the blob is never held whole. A damaged
        ``source`` raises ``BlobCorrupted`` and leaves ``name`` as it was."""
        check_key(name, "name")
        manifest, pieces = self.read_blob(source)
        views = (memoryview(piece) for piece in pieces)
        return self._put_pieces(name, views, manifest.size, durable=durable)

    def _put_pieces(
        self, name: str, pieces: Iterable[memoryview], size: int, *, durable: bool
    ) -> BlobManifest:
        write_id = _write_id()
        previous = self._manifest(name)
        try:
            if self.spill_bytes is not None and size > self.spill_bytes:
                manifest = self._write_spill(name, write_id, pieces, size, durable=durable)
            else:
                digests = self._write_chunked(name, write_id, pieces, size, durable=durable)
                manifest = BlobManifest(
                    name=name,
                    write_id=write_id,
                    size=size,
                    sha256=_hash_list(digests),
                    chunk_size=self.chunk_bytes,
                    chunk_sha256=digests,
                )
            self._publish_manifest(name, manifest)
        except (StoreFull, ValidationError):
            # What the refused write took is freed now, not after the garbage grace: the store
            # is short of room, or the streamed pieces were not the size declared.
            self._delete_chunks(list(self._chunk_keys(f"{_blob_id(name)}/{write_id}/")))
            if self.spill_dir is not None:
                (self.spill_dir / _blob_id(name) / write_id).unlink(missing_ok=True)
            raise
        if previous is not None:
            self._discard(previous)
        return manifest

    def _write_chunked(
        self, name: str, write_id: str, pieces: Iterable[memoryview], size: int, *, durable: bool
    ) -> tuple[str, ...]:
        """Write ``pieces`` as the chunks of blob ``name``; their checksums in order."""
        chunks = enumerate(_chunks(pieces, self.chunk_bytes))
        digests: list[str] = []
        with contextlib.ExitStack() as stack:
            # Hash while the chunks travel: hashlib and socket writes both release the GIL. On
            # one chunk (a checkpoint) a thread's start and join cost more than that saves.
            hasher = (
                stack.enter_context(ThreadPoolExecutor(max_workers=1))
                if size > self.chunk_bytes
                else None
            )
            while batch := list(itertools.islice(chunks, CHUNKS_PER_WRITE)):
                keyed = [(self._chunk_key(name, write_id, i), chunk) for i, chunk in batch]
                hashing = hasher.submit(_digests, keyed) if hasher else None
                if hashing is None:
                    digests.extend(_digests(keyed))
                self._write_chunks(keyed, durable=durable)
                if hashing is not None:
                    digests.extend(hashing.result())
        return tuple(digests)

    def _publish_manifest(self, name: str, manifest: BlobManifest) -> None:
        self.put(MANIFEST_PREFIX + name, manifest.to_json())

    def get_blob(self, name: str) -> bytearray:
        """The blob's bytes, every chunk checked against its checksum. The chunks are copied into
        the returned buffer as they are read: a large blob is not held twice.

        Raises ``BlobNotFound`` if there is none and ``BlobCorrupted`` if a chunk is missing or
        does not match its checksum: never wrong data.
        """
        manifest, pieces = self.read_blob(name)
        data = bytearray(manifest.size)
        filled = 0
        for piece in pieces:
            data[filled : filled + len(piece)] = piece
            filled += len(piece)
        return data

    def read_blob(
        self, name: str, start: int = 0, end: int | None = None
    ) -> tuple[BlobManifest, Iterator[bytes]]:
        """The blob's manifest, and its bytes a chunk at a time as they are read: for a reader
        that passes them on (the API's model download) rather than holding the blob whole.
        ``start`` and ``end``: the bytes from ``start`` up to ``end`` (the blob's end if
        ``None``) only, a download resumed or a part of one; the chunks outside them are not
        read (a spill file is read whole: its one checksum is over it all).

        The manifest is checked first: ``BlobNotFound`` or ``BlobCorrupted`` before a byte is
        read, ``ValueError`` for a ``start`` and ``end`` outside it. Each piece is checked
        before it is yielded, and the iterator raises ``BlobCorrupted`` at the first that is
        missing or wrong, so that a reader passing them on has sent fewer bytes than it asked
        for, never wrong ones. (A spill file has one checksum over it all: its last piece is
        held back until the whole is checked.) Nothing is read until the iterator is.
        """
        manifest = self._manifest(check_key(name, "name"))
        if manifest is None:
            raise BlobNotFound(f"no blob named {name!r}")
        return manifest, self.blob_part(manifest, start, end)

    def blob_part(
        self, manifest: BlobManifest, start: int = 0, end: int | None = None
    ) -> Iterator[bytes]:
        """The bytes of the blob whose manifest :meth:`read_blob` read, from ``start`` up to
        ``end``, as :meth:`read_blob` gives them (its checks of the manifest and of the part
        raised at once): a reader that chooses the part by the manifest (the API's download of
        a Range) reads the manifest once."""
        name = manifest.name
        end = manifest.size if end is None else end
        if not 0 <= start <= end <= manifest.size:
            raise ValueError(
                f"bytes {start} to {end} are outside blob {name!r}'s {manifest.size} bytes"
            )
        if manifest.spill_path is None:
            if _hash_list(manifest.chunk_sha256) != manifest.sha256:
                raise BlobCorrupted(f"blob {name!r}: its manifest's chunk list is damaged")
            if manifest.size > len(manifest.chunk_sha256) * manifest.chunk_size:
                raise BlobCorrupted(
                    f"blob {name!r}: its manifest's size is more than its chunks hold"
                )
            return self._checked_chunks(manifest, start, end)
        return self._checked_spill(manifest, start, end)

    def _checked_chunks(self, manifest: BlobManifest, start: int, end: int) -> Iterator[bytes]:
        name, size = manifest.name, manifest.size
        # Every chunk but the last holds chunk_size bytes (pieces are cut so as they are
        # written): the first chunk of the part is found without reading those before it.
        first = start // manifest.chunk_size if start else 0
        sent = first * manifest.chunk_size
        last = len(manifest.chunk_sha256) - 1
        for i in range(first, last + 1):
            if sent >= end and end < size:
                return  # the part is sent: what follows it is not read
            piece = self._read_chunk(self._chunk_key(name, manifest.write_id, i))
            if piece is None:
                raise BlobCorrupted(f"blob {name!r}: chunk {i} is missing")
            if hashlib.sha256(piece).hexdigest() != manifest.chunk_sha256[i]:
                raise BlobCorrupted(f"blob {name!r}: chunk {i} does not match its checksum")
            if sent + len(piece) > size:
                raise BlobCorrupted(f"blob {name!r} has more than its {size} bytes")
            if i < last and len(piece) != manifest.chunk_size:
                raise BlobCorrupted(
                    f"blob {name!r}: chunk {i} holds {len(piece)} bytes, not its "
                    f"{manifest.chunk_size}"
                )
            low, high = max(0, start - sent), min(len(piece), end - sent)
            sent += len(piece)
            if high > low:
                yield piece if (low, high) == (0, len(piece)) else piece[low:high]
        if sent != size:
            raise BlobCorrupted(f"blob {name!r} has {sent} bytes, not {size}")

    def _checked_spill(self, manifest: BlobManifest, start: int, end: int) -> Iterator[bytes]:
        name = manifest.name
        digest = hashlib.sha256()
        held: bytes | None = None  # the part's latest piece, sent once the one after it is read
        try:
            with open(manifest.spill_path or "", "rb") as fh:
                if os.fstat(fh.fileno()).st_size != manifest.size:
                    raise BlobCorrupted(
                        f"blob {name!r}: the spill file does not have its {manifest.size} bytes"
                    )
                at = 0
                while piece := fh.read(self.chunk_bytes):
                    digest.update(piece)
                    low, high = max(0, start - at), min(len(piece), end - at)
                    at += len(piece)
                    if high > low:
                        if held is not None:
                            yield held
                        held = piece if (low, high) == (0, len(piece)) else piece[low:high]
        except OSError as exc:
            raise BlobCorrupted(f"blob {name!r}: spill file unreadable ({exc})") from exc
        if digest.hexdigest() != manifest.sha256:
            raise BlobCorrupted(f"blob {name!r}: the spill file does not match its checksum")
        if held is not None:
            yield held

    def blob_manifest(self, name: str) -> BlobManifest | None:
        return self._manifest(check_key(name, "name"))

    def blob_names(self, prefix: str) -> list[str]:
        """The names of the blobs that start with ``prefix``, sorted."""
        return [key[len(MANIFEST_PREFIX) :] for key, _ in self.scan_raw(MANIFEST_PREFIX + prefix)]

    def delete_blob(self, name: str) -> bool:
        """Delete the blob and its chunks; ``False`` if there was none."""
        manifest = self._manifest(check_key(name, "name"))
        if manifest is None:
            return False
        if not self.delete(MANIFEST_PREFIX + name):
            return False
        self._discard(manifest)
        return True

    def collect_garbage(self, *, grace_s: float = 3600.0) -> int:
        """Delete chunks and spill files no manifest points at, once older than ``grace_s``
        (younger ones may belong to a write in flight). Returns how many were deleted."""
        live = {
            _blob_id(key[len(MANIFEST_PREFIX) :]): record.value.get("write_id")
            for key, record in self.scan(MANIFEST_PREFIX)
            if isinstance(record.value, dict)
        }
        orphans = []
        for key in self._chunk_keys(""):
            blob_id, write_id, _ = key.split("/")
            if live.get(blob_id) != write_id and _write_id_age_s(write_id) > grace_s:
                orphans.append(key)
        self._delete_chunks(orphans)
        removed = len(orphans)
        if self.spill_dir is not None and self.spill_dir.is_dir():
            live_ids = set(live.values())
            for path in self.spill_dir.glob("*/*"):
                if path.name not in live_ids and _write_id_age_s(path.name) > grace_s:
                    with contextlib.suppress(OSError):
                        path.unlink()
                        removed += 1
        return removed

    def _manifest(self, name: str) -> BlobManifest | None:
        record = self.get(MANIFEST_PREFIX + name)
        return None if record is None else BlobManifest.from_json(name, record.value)

    def _discard(self, manifest: BlobManifest) -> None:
        if manifest.spill_path is not None:
            with contextlib.suppress(OSError):
                Path(manifest.spill_path).unlink()
        else:
            self._delete_chunks(
                self._chunk_key(manifest.name, manifest.write_id, i)
                for i in range(len(manifest.chunk_sha256))
            )

    @staticmethod
    def _chunk_key(name: str, write_id: str, index: int) -> str:
        return f"{_blob_id(name)}/{write_id}/{index:08d}"

    def _write_spill(
        self, name: str, write_id: str, pieces: Iterable[memoryview], size: int, *, durable: bool
    ) -> BlobManifest:
        if self.spill_dir is None:
            raise ValidationError(
                f"blob of {size} bytes is over the store's {self.spill_bytes}-byte value "
                "limit and no spill directory is configured",
                field="spill_dir",
            )
        folder = self.spill_dir / _blob_id(name)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / write_id
        digest = hashlib.sha256()
        try:
            with open(path, "wb") as fh:
                for piece in pieces:
                    fh.write(piece)
                    digest.update(piece)
                if durable:
                    fh.flush()
                    os.fsync(fh.fileno())
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:  # the file is deleted with the refused write's pieces
                raise disk_full(self.spill_dir) from exc
            raise
        if durable:
            fsync_dirs(folder, self.spill_dir)
        return BlobManifest(
            name=name,
            write_id=write_id,
            size=size,
            sha256=digest.hexdigest(),
            chunk_size=size,
            chunk_sha256=(digest.hexdigest(),),
            spill_path=str(path.resolve()),
        )

    # -- what a backend implements ---------------------------------------------------------

    @abstractmethod
    def _get(self, key: str) -> tuple[bytes, int] | None: ...

    @abstractmethod
    def _put(self, key: str, data: bytes) -> int: ...

    @abstractmethod
    def _put_if_absent(self, key: str, data: bytes) -> bool: ...

    @abstractmethod
    def _compare_and_set(self, key: str, expected_version: int, data: bytes) -> bool:
        """Atomically: if ``key`` is at ``expected_version``, write ``data`` at version + 1."""

    @abstractmethod
    def _delete(self, key: str, expected_version: int | None) -> bool: ...

    @abstractmethod
    def _scan(self, prefix: str, low: str) -> Iterable[tuple[str, bytes, int]]:
        """Records under ``prefix`` from key ``low`` on (``prefix`` itself or a key after it;
        duplicates and extra keys are fine: the caller filters)."""

    def _scan_versions(self, prefix: str) -> Iterable[tuple[str, int]]:
        """As :meth:`_scan`, keys and versions; a backend that can leave the values out does."""
        return ((key, version) for key, _, version in self._scan(prefix, prefix))

    @abstractmethod
    def _write_chunks(
        self, chunks: list[tuple[str, bytes | memoryview]], *, durable: bool = True
    ) -> None:
        """Write every chunk before returning (chunks are immutable once written): durably,
        unless ``durable`` is false and the backend can skip that (see :meth:`put_blob`)."""

    @abstractmethod
    def _read_chunk(self, key: str) -> bytes | None: ...

    @abstractmethod
    def _delete_chunks(self, keys: Iterable[str]) -> None: ...

    @abstractmethod
    def _chunk_keys(self, prefix: str) -> Iterator[str]: ...


def _checked_prefix(prefix: str, *, field: str = "prefix") -> str:
    if not isinstance(prefix, str) or "\x00" in prefix:
        raise ValidationError("must be a string without NUL characters", field=field)
    check_unicode(prefix, field)
    return prefix


def _byte_view(piece: Buffer) -> memoryview:
    """A piece of a blob's data as a flat byte view."""
    try:
        return memoryview(piece).cast("B")
    except TypeError as exc:
        raise ValidationError(
            f"must be bytes or a tuple of buffers, not {type(piece).__name__}", field="data"
        ) from exc


def _exactly(pieces: Iterable[memoryview], size: int) -> Iterator[memoryview]:
    """``pieces``, refused (``ValidationError``) once they come to more or fewer than ``size``
    bytes: before the manifest is published, so that no blob of another size is."""
    total = 0
    for piece in pieces:
        total += len(piece)
        if total > size:
            break
        yield piece
    if total > size:
        raise ValidationError(
            f"the streamed pieces came to more than the {size} bytes declared", field="data"
        )
    if total < size:
        raise ValidationError(
            f"the streamed pieces came to {total} bytes, not the {size} declared", field="data"
        )


def _chunks(pieces: Iterable[memoryview], size: int) -> Iterator[bytes | memoryview]:
    """The bytes of ``pieces`` in order cut into ``size``-byte chunks (the last one shorter):
    views where a chunk lies within one piece, joined copies where it spans several."""
    parts: list[memoryview] = []
    filled = 0
    for piece in pieces:
        start = 0
        while start < len(piece):
            take = min(size - filled, len(piece) - start)
            parts.append(piece[start : start + take])
            filled, start = filled + take, start + take
            if filled == size:
                yield parts[0] if len(parts) == 1 else b"".join(parts)
                parts, filled = [], 0
    if parts:
        yield parts[0] if len(parts) == 1 else b"".join(parts)


def _digests(chunks: list[tuple[str, bytes | memoryview]]) -> list[str]:
    return [hashlib.sha256(chunk).hexdigest() for _, chunk in chunks]


def disk_full(where: Path) -> StoreFull:
    """The error of a store whose disk (the one ``where`` is on) refused a write for want of
    room."""
    return StoreFull(
        f"the store's disk is full: a write to {where} was refused; free room on it (ended "
        "jobs: FAASDL_CONTROLLER__JOB_RETENTION_DAYS) or move the store to a larger one"
    )
