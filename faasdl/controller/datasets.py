"""Where a job's ``.npz`` data may come from: a tenant's uploads and the configured roots, nothing
else.

A relative ``dataset.path`` names one of the tenant's uploads (``<upload_dir>/<tenant>/``); an
absolute one must lie, once every symbolic link and ``..`` is resolved, inside a directory of
``FAASDL_API__DATASET_ROOTS`` or the tenant's upload directory. The job then carries the resolved
path, so that what the actions open is what was checked.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

import pydantic
from pydantic import BaseModel, Field
from starlette.requests import ClientDisconnect

from faasdl.config import ApiSettings
from faasdl.controller.validator import JobSpec
from faasdl.errors import (
    AccessError,
    StoreFull,
    StoreUnavailable,
    TooLarge,
    UploadConflict,
    ValidationError,
)
from faasdl.estimator.sizer import remember_facts
from faasdl.store.base import FULL_ERRNOS
from faasdl.training.datasets import NpzSpec, data_notes, load_dataset

#: An upload's name: a file name of its own, never a path.
DATASET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
SUFFIX = ".npz"
PARTIAL = ".partial"
#: An upload sent with its SHA-256 is written as it arrives to ``.<name>.npz.sha256-<hex>.partial``
#: (one name per file sent), kept where it is cut short for the upload to go on from there.
RESUMABLE = ".sha256-"
#: How long a part waits for an earlier request of the same upload to let it go (a client that
#: goes on at once after its link was lost may come before the controller has seen it lost).
LOCK_WAIT_S = 10.0
#: How long what is held of an upload may be waited for to settle before it is told.
SETTLE_S = 2.0
#: What link(2) fails with on a file system without hard links: exFAT and FAT (EPERM), an SMB
#: share (EOPNOTSUPP), a FUSE file system that does not make them (ENOSYS).
NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS})

log = logging.getLogger(__name__)


class UploadContents(BaseModel):
    """What an upload holds, as its check found it."""

    examples: int = Field(description="Training examples (x_train's first axis).")
    test_examples: int
    input_shape: tuple[int, ...] = Field(
        description="One example's shape as the model takes it (grey images with a channel)."
    )
    classes: int = Field(description="The highest label + 1: the model's outputs.")
    notes: list[str] = Field(
        default_factory=list,
        description="What the check found worth a look without refusing the file: classes no "
        "training example has (labels counted from 1?), inputs beyond ±100 (unscaled pixels or "
        "features).",
    )


class UploadedDataset(BaseModel):
    """A data set a tenant uploaded; jobs name it as ``{"name": "npz", "path": path}``."""

    name: str
    path: str
    bytes: int
    sha256: str | None = Field(
        None,
        description="The file's SHA-256 (a job's plan keeps it as data_sha256), as it was "
        "uploaded; none in the list where the file was changed since other than by an upload "
        "(until the controller's next housekeeping pass hashes it).",
    )
    contents: UploadContents | None = Field(
        None,
        description="What it holds, as its upload's check found it; none in the list where the "
        "file was changed since other than by an upload, or uploaded before faasdl kept this.",
    )


class UnfinishedUpload(BaseModel):
    """What the controller holds of an upload sent with its SHA-256 and not yet whole: one cut
    short, or sent in parts (``Content-Range``). The next part starts at ``received``."""

    name: str
    sha256: str = Field(description="The whole file's, as its upload's Repr-Digest gave it.")
    received: int = Field(description="Bytes held, from the file's first.")
    updated_ms: int = Field(description="When the last of them came (ms since the epoch).")
    kept_until_ms: int = Field(
        description="When housekeeping may delete them: FAASDL_API__UPLOAD_KEEP_S after the last."
    )


class UploadRange(NamedTuple):
    """A part of an upload, as its ``Content-Range`` gives it: ``bytes FIRST-LAST/TOTAL``."""

    first: int
    last: int
    total: int


_CONTENT_RANGE = re.compile(r"bytes (\d{1,15})-(\d{1,15})/(\d{1,15})")


def upload_range(header: str) -> UploadRange:
    """A ``Content-Range`` header read, or ``ValidationError`` naming it."""
    found = _CONTENT_RANGE.fullmatch(header.strip())
    if found is None:
        raise ValidationError(
            f"{header!r} is not `bytes FIRST-LAST/TOTAL` (the part's first and last bytes, "
            "counted from 0, and the whole file's size)",
            field="Content-Range",
        )
    first, last, total = (int(n) for n in found.groups())
    if not first <= last < total:
        raise ValidationError(
            f"bytes {first}-{last}/{total}: a part's first byte comes before its last, and its "
            "last before the file's size",
            field="Content-Range",
        )
    return UploadRange(first, last, total)


def upload_sha256(header: str) -> str:
    """The SHA-256 of an RFC 9530 ``Repr-Digest`` header (``sha-256=:BASE64:``), in hex; or
    ``ValidationError`` naming the header."""
    for member in header.split(","):
        key, _, value = member.strip().partition("=")
        if key.strip().lower() != "sha-256":
            continue
        value = value.strip()
        try:
            raw = (
                base64.b64decode(value[1:-1], validate=True)
                if value[:1] == value[-1:] == ":"
                else b""
            )
        except binascii.Error:
            raw = b""
        if len(raw) != hashlib.sha256().digest_size:
            raise ValidationError(
                f"sha-256={value}: not the base64 of a SHA-256 between colons (sha-256=:BASE64:)",
                field="Repr-Digest",
            )
        return raw.hex()
    raise ValidationError(
        "has no sha-256: an upload is named by the SHA-256 of the whole file "
        "(sha-256=:BASE64:), the one digest the controller checks",
        field="Repr-Digest",
    )


class _Digest(BaseModel):
    """An upload's SHA-256, kept beside it (``.<name>.npz.sha256``) with what identifies the file
    it was taken of: a file replaced or rewritten since has another inode, size or time."""

    sha256: str
    bytes: int
    mtime_ns: int
    inode: int
    contents: UploadContents | None = None  # housekeeping hashes a file, it does not load it

    @classmethod
    def of(cls, path: Path, sha256: str, contents: UploadContents | None = None) -> _Digest:
        facts = path.stat()
        return cls(
            sha256=sha256,
            bytes=facts.st_size,
            mtime_ns=facts.st_mtime_ns,
            inode=facts.st_ino,
            contents=contents,
        )

    def matches(self, facts: os.stat_result) -> bool:
        return (self.bytes, self.mtime_ns, self.inode) == (
            facts.st_size,
            facts.st_mtime_ns,
            facts.st_ino,
        )


def tenant_dir(api: ApiSettings, tenant: str) -> Path:
    """The tenant's folder of uploads, resolved. ``AccessError`` where it is there as another
    tenant's whose name differs by case alone (:func:`_named_otherwise`): their uploads would be
    one."""
    path = _tenant_path(api, tenant)
    if _named_otherwise(path) is not None:
        raise AccessError(
            "the controller keeps uploads on a file system that does not tell names apart by "
            "case, and another tenant's name is yours in another case: your uploads cannot be "
            "kept apart from theirs there; ask its operator to keep FAASDL_API__UPLOAD_DIR on one "
            "that does"
        )
    return path


def _tenant_path(api: ApiSettings, tenant: str) -> Path:
    return (api.upload_dir / tenant).resolve()


def upload_path(api: ApiSettings, tenant: str, name: str) -> Path:
    """Where the tenant's upload ``name`` is kept: the resolved path its jobs keep.
    ``UploadConflict`` where another upload of theirs is there, named so in another case."""
    path = tenant_dir(api, tenant) / f"{name}{SUFFIX}"
    if (other := _named_otherwise(path)) is not None:
        raise UploadConflict(
            f"your data set {other.removesuffix(SUFFIX)!r} is the same file as {name!r} on the "
            "controller's file system, which does not tell names apart by case: name it so, or "
            "delete that one first"
        )
    return path


def _named_otherwise(path: Path) -> str | None:
    """The name ``path`` is found by where its folder holds it by another that differs by case
    alone (a file system that does not tell names apart by case: exFAT, an SMB share, macOS's
    by default); ``None`` where it is not there (or was deleted as it was looked for), or there
    by its own name. Its folder is listed only where its name in the other case is there too: on
    a file system that tells them apart (the usual one) that is another file, seldom there."""
    if not os.path.lexists(path) or not os.path.lexists(path.with_name(path.name.swapcase())):
        return None
    try:
        names = os.listdir(path.parent)
    except OSError:
        return None
    if path.name in names:
        return None
    return next((n for n in names if n.casefold() == path.name.casefold()), None)


def confine(spec: JobSpec, api: ApiSettings) -> JobSpec:
    """``spec`` with its ``.npz`` path resolved, or ``ValidationError`` on ``dataset.path`` if it
    leads outside what the tenant may read. Built-in data sets pass unchanged."""
    if not isinstance(spec.dataset, NpzSpec):
        return spec
    own = tenant_dir(api, spec.tenant)
    given = Path(spec.dataset.path)
    resolved = (given if given.is_absolute() else own / given).resolve()
    roots = [own, *(root.resolve() for root in api.dataset_roots)]
    if not any(resolved.is_relative_to(root) for root in roots):
        raise ValidationError(
            "is outside the directories data sets may be read from (your uploads, and "
            "FAASDL_API__DATASET_ROOTS)",
            field="dataset.path",
        )
    if not given.is_absolute() and not _own_file(resolved):  # without the server's path
        named = f"{spec.dataset.path}{SUFFIX}"
        # One there in another case, on a file system that does not tell them apart, is not it.
        meant = _named_otherwise(resolved) or _named_otherwise(own / named)
        if meant is None and _own_file(own / named):
            meant = named
        hint = f" (did you mean {meant!r}?)" if meant else ""
        raise ValidationError(
            f"no upload of yours is named {spec.dataset.path!r}{hint}: upload one with "
            "faasdl datasets upload FILE, or PUT /v1/datasets/NAME",
            field="dataset.path",
        )
    dataset = spec.dataset.model_copy(update={"path": str(resolved)})
    return spec.model_copy(update={"dataset": dataset})


def _own_file(path: Path) -> bool:
    """Whether ``path`` is a file there by its own name. ``os.path.isfile``, not
    ``Path.is_file``: a name too long for the file system (ENAMETOOLONG) is no file either, where
    ``Path.is_file`` raised it (a 500)."""
    return os.path.isfile(path) and _named_otherwise(path) is None


def shown_path(path: str, api: ApiSettings, tenant: str) -> str:
    """A job's resolved ``dataset.path`` as its tenant sees it: an upload's by its name, as the
    job may give it (the server's directories are its own), any other as it is."""
    resolved = Path(path)
    return resolved.name if resolved.parent == _tenant_path(api, tenant) else path


def uploads(api: ApiSettings, tenant: str) -> list[UploadedDataset]:
    """The tenant's uploaded data sets, by name, each with its digest where it still matches."""
    return [_listed(path) for path in _upload_files(tenant_dir(api, tenant))]


def _upload_files(directory: Path, pattern: str = f"*{SUFFIX}") -> list[Path]:
    """The uploads' files in ``directory`` (``pattern``: ``*/*.npz`` for every tenant's), by
    name: plain files, no symbolic links."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob(pattern) if p.is_file() and not p.is_symlink())


def _listed(path: Path) -> UploadedDataset:
    facts = path.stat()
    try:
        digest: _Digest | None = _Digest.model_validate_json(_digest_path(path).read_bytes())
    except (OSError, pydantic.ValidationError):  # none kept (an upload's last step cut short)
        digest = None
    kept = digest if digest is not None and digest.matches(facts) else None
    return UploadedDataset(
        name=path.stem,
        path=path.name,
        bytes=facts.st_size,
        sha256=kept.sha256 if kept else None,
        contents=kept.contents if kept else None,
    )


def _digest_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.sha256")


def _keep_digest(path: Path, digest: _Digest) -> None:
    """Write the upload's digest beside it, whole or not at all; a digest that could not be
    written leaves the upload without one (it lists none), not refused."""
    digest_path = _digest_path(path)
    fd, partial = partial_file(digest_path)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(digest.model_dump_json())
        os.replace(partial, digest_path)
    except OSError as exc:
        Path(partial).unlink(missing_ok=True)
        log.warning("the digest of upload %s was not kept: %s", path, exc)


async def store_upload(
    api: ApiSettings, tenant: str, name: str, chunks: AsyncIterator[bytes]
) -> UploadedDataset:
    """Write an upload to a temporary file as it arrives, check that it is a data set faasdl can
    train on, then move it under its name in one step: a failed or refused upload leaves nothing,
    and a job never sees half a file. The size cap is the route's body limit."""
    kept = upload_path(api, tenant, name)
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = partial_file(kept)
    except OSError as exc:
        raise _unkept(kept, exc) from exc
    try:
        with os.fdopen(fd, "wb") as out:
            size = await _write(out, chunks)
        return await _finish(api, tenant, name, Path(partial), size)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


async def store_resumable(
    api: ApiSettings,
    tenant: str,
    name: str,
    chunks: AsyncIterator[bytes],
    *,
    sha256: str,
    part: UploadRange | None,
    length: int | None,
) -> UploadedDataset | UnfinishedUpload:
    """Write an upload of the file whose SHA-256 is ``sha256`` as it arrives, kept where its
    client goes away for it to go on from there: the whole file (``part`` none: what was held of
    it is dropped) or a part that starts at or before what is held (what is held already is
    skipped). Once whole it is checked, its SHA-256 too, and moved under its name as
    :func:`store_upload` moves one; until then, what is held of it. A request refused or failed
    otherwise leaves what was held before it (a checked file found wrong: nothing)."""
    kept = upload_path(api, tenant, name)
    path = _resumable_path(kept, sha256)
    total = part.total if part is not None else length
    if total is not None and total > api.max_upload_bytes:
        raise TooLarge(
            f"the file's {total:,} bytes are over the controller's FAASDL_API__MAX_UPLOAD_BYTES, "
            f"{api.max_upload_bytes:,}"
        )
    if total is not None:  # refused before a byte is taken, then again as it ends
        _check_quota(api, tenant, name, total, own=path)
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unkept(kept, exc) from exc
    with await _locked(kept, path, name) as out:
        held = os.fstat(out.fileno()).st_size
        if part is None:
            out.truncate(0)
            held = 0
        elif part.first > held:
            if held == 0:
                path.unlink()  # made as it was opened
            raise UploadConflict(
                f"the controller holds {held:,} bytes of this file, not {part.first:,}: send it "
                f"from byte {held} (GET /v1/datasets/{name}/upload says so)"
            )
        try:
            came = await _write(out, chunks, skip=held - (part.first if part else 0))
            out.flush()
            if part is not None and came != part.last - part.first + 1:
                raise ValidationError(
                    f"gave {part.last - part.first + 1:,} bytes, and {came:,} came",
                    field="Content-Range",
                )
        except (ClientDisconnect, asyncio.CancelledError):
            out.flush()
            kept_bytes = os.fstat(out.fileno()).st_size
            log.info(
                "upload %r of tenant %s: %s bytes kept to go on from", name, tenant, kept_bytes
            )
            raise
        except BaseException:
            out.truncate(held)
            if held == 0:
                path.unlink(missing_ok=True)
            raise
        size = os.fstat(out.fileno()).st_size  # not tell(): a truncated file's is its old end
        if part is not None and size < part.total:
            return _unfinished(api, path)
        try:
            return await _finish(api, tenant, name, path, size, sha256=sha256)
        except BaseException:
            path.unlink(missing_ok=True)
            raise


async def _locked(kept: Path, path: Path, name: str) -> BinaryIO:
    """The upload's file ``path``, open to append to and locked: a request of the same upload
    that came first may still be writing it (its client, its link lost, has gone on already),
    and is waited for (``LOCK_WAIT_S``); it may have finished the upload (and moved the file)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            out = _created(kept, path)
        except OSError as exc:
            raise _unkept(kept, exc) from exc
        if out is None:
            try:
                out = os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND), "ab")
            except FileNotFoundError:  # there, then moved or deleted as it was opened
                continue
            except OSError as exc:
                raise _unkept(kept, exc) from exc
        try:
            fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out.close()
            if time.monotonic() > deadline:
                raise UploadConflict(
                    f"another request is sending this file as {name!r}: send the rest once it "
                    "has ended"
                ) from None
            await asyncio.sleep(0.05)
            continue
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(out.fileno()).st_ino:
                return out
        out.close()  # moved or deleted as it was waited for: a file of its own


def _created(kept: Path, path: Path) -> BinaryIO | None:
    """``path`` made, empty, open to append to and locked before it is there to be seen (what
    is held of an upload is told once no request holds it: one just made holds nothing yet
    only in its request's eyes); ``None`` where it is there already. On a file system without
    hard links it is made in place, unlocked, and ``None``: the caller opens and locks it as one
    there already (another request of the same upload may lock it first, and be waited for; a
    ``GET`` in between tells it as holding nothing, and its client sends it all)."""
    fd, fresh = partial_file(kept)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        os.link(fresh, path)
    except FileExistsError:
        os.close(fd)
        return None
    except OSError as exc:
        os.close(fd)
        if exc.errno not in NO_HARD_LINKS:
            raise
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return None
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.unlink(fresh)
    return os.fdopen(fd, "ab")


async def _write(out: BinaryIO, chunks: AsyncIterator[bytes], *, skip: int = 0) -> int:
    """Write the body's ``chunks`` to ``out``, but its first ``skip`` bytes, each as it comes
    (what is held of an upload is the file's size); the body's length."""
    length = 0
    try:
        async for chunk in chunks:
            length += len(chunk)
            dropped = min(skip, len(chunk))
            skip -= dropped
            out.write(chunk[dropped:])
            out.flush()
    except OSError as exc:
        if exc.errno in FULL_ERRNOS:
            raise StoreFull(_UPLOADS_FULL) from exc
        raise
    return length


async def _finish(
    api: ApiSettings, tenant: str, name: str, partial: Path, size: int, sha256: str | None = None
) -> UploadedDataset:
    """Check the upload written to ``partial`` (of ``sha256``, where given) and move it under
    its name; the caller deletes ``partial`` where this raises."""
    if size == 0:
        raise ValidationError("is empty: send the .npz file as the body", field="body")
    _check_quota(api, tenant, name, size, own=partial)
    changed = ValidationError(
        f"is not the file its Repr-Digest names (SHA-256 {sha256}): it changed as it was sent, "
        "or the digest is another file's; send it again",
        field="body",
    )
    try:
        found, contents = await asyncio.to_thread(_check_upload, str(partial))
    except ValidationError as exc:
        if sha256 is not None and await asyncio.to_thread(_sha256_of, partial) != sha256:
            raise changed from exc
        # The temporary name means nothing to the caller.
        message = str(exc).removeprefix("dataset.path: ").replace(str(partial), "the upload")
        raise ValidationError(message, field="body") from exc
    if sha256 is not None and found != sha256:
        raise changed
    # Of this file, before it is moved: another upload of the name may replace it at once.
    digest = _Digest.of(partial, found, contents)
    kept = upload_path(api, tenant, name)
    os.replace(partial, kept)
    _keep_digest(kept, digest)
    return UploadedDataset(
        name=name, path=f"{name}{SUFFIX}", bytes=size, sha256=found, contents=contents
    )


def _sha256_of(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _unkept(kept: Path, exc: OSError) -> StoreFull | StoreUnavailable:
    """Why uploads cannot be kept in ``kept``'s folder: the operator's to mend (their log names
    the folder); the caller is told no path of the server's. It was a 500 with no word of why."""
    log.error("uploads cannot be kept in %s: %s", kept.parent, exc)
    if exc.errno in FULL_ERRNOS:
        return StoreFull(_UPLOADS_FULL)
    return StoreUnavailable(
        f"the controller cannot keep uploads ({exc.strerror}): ask its operator to make "
        "FAASDL_API__UPLOAD_DIR a folder it can write"
    )


def _resumable_path(kept: Path, sha256: str) -> Path:
    return kept.with_name(f".{kept.name}{RESUMABLE}{sha256}{PARTIAL}")


def _part_of(path: Path) -> tuple[str, str] | None:
    """The upload's name and SHA-256 a part's file is named after (see ``_resumable_path``);
    ``None`` for an upload's temporary file."""
    named, found, sha256 = path.name[1:].removesuffix(PARTIAL).partition(f"{SUFFIX}{RESUMABLE}")
    return (named, sha256) if found else None


def unfinished(api: ApiSettings, tenant: str, name: str | None = None) -> list[UnfinishedUpload]:
    """What the controller holds of the tenant's unfinished uploads as ``name`` (of every name
    where none), by name and SHA-256; each once the request writing it has ended (``SETTLE_S`` at
    most, for them all): one whose client lost its link may still be writing what came before,
    and its client asks at once."""
    deadline = time.monotonic() + SETTLE_S
    found = []
    for path in _parts(api, tenant, name):
        with contextlib.suppress(FileNotFoundError):  # finished or deleted meanwhile
            _settle(path, deadline)
            found.append(_unfinished(api, path))
    return found


def _settle(path: Path, deadline: float) -> None:
    """Wait until no request writes ``path`` (it holds its lock), until ``deadline`` at most."""
    with path.open("rb") as held:
        while True:
            try:
                fcntl.flock(held.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return  # another upload of it is arriving: what it holds so far
                time.sleep(0.01)


def _parts(api: ApiSettings, tenant: str, name: str | None) -> list[Path]:
    """The files of the tenant's unfinished uploads as ``name`` (of every name where none)."""
    found = tenant_dir(api, tenant).glob(f".{name or '*'}{SUFFIX}{RESUMABLE}*{PARTIAL}")
    return sorted(p for p in found if _part_of(p) is not None)


def _unfinished(api: ApiSettings, path: Path) -> UnfinishedUpload:
    named = _part_of(path)
    assert named is not None  # one of _parts
    facts = path.stat()
    updated_ms = facts.st_mtime_ns // 1_000_000
    return UnfinishedUpload(
        name=named[0],
        sha256=named[1],
        received=facts.st_size,
        updated_ms=updated_ms,
        kept_until_ms=updated_ms + round(api.upload_keep_s * 1000),
    )


_UPLOADS_FULL = (
    "the controller's disk for uploads is full: delete an upload of yours "
    "(DELETE /v1/datasets/NAME), or ask its operator for room"
)


def _check_upload(path: str) -> tuple[str, UploadContents]:
    """An upload checked by loading it (which hashes it), its facts kept for the jobs that will
    name it: its SHA-256 and what it holds."""
    dataset = load_dataset(NpzSpec(path=path))
    facts = remember_facts(dataset)
    assert facts.sha256 is not None  # an .npz's facts always have it
    contents = UploadContents(
        examples=facts.examples,
        test_examples=facts.test_examples,
        input_shape=facts.input_shape,
        classes=facts.classes,
        notes=data_notes(dataset),
    )
    return facts.sha256, contents


def _check_quota(api: ApiSettings, tenant: str, name: str, size: int, *, own: Path) -> None:
    """``AccessError`` if the tenant's uploads would hold more than its quota with this one of
    ``size`` bytes, being written to ``own`` (it replaces one of the same name): the parts held
    of other uploads are counted, unfinished or arriving."""
    quota = api.tenant_max_upload_bytes
    if not quota:
        return
    directory = own.parent  # the tenant's folder, its name checked as ``own`` was made
    replaced = f"{name}{SUFFIX}"
    others = [p for p in _upload_files(directory) if p.name != replaced]
    others += [p for p in _upload_files(directory, f".*{PARTIAL}") if p.name != own.name]
    held = size
    cut_short: dict[str, int] = {}  # the parts kept of unfinished uploads, by name
    for path in others:  # sizes only: no digest is read
        with contextlib.suppress(FileNotFoundError):  # one that ended as they were counted
            found = path.stat().st_size
            held += found
            if (named := _part_of(path)) is not None:
                cut_short[named[0]] = cut_short.get(named[0], 0) + found
    if held > quota:
        parts = ", ".join(f"{n} ({b:,} bytes)" for n, b in sorted(cut_short.items()))
        raise AccessError(
            f"tenant {tenant!r}'s uploads would hold {held:,} bytes with this one, more than the "
            f"{quota:,} they may: delete one first (DELETE /v1/datasets/NAME)"
            + (f"; they count the parts kept of unfinished uploads as {parts}" if parts else "")
        )


def delete_upload(api: ApiSettings, tenant: str, name: str) -> bool:
    """Remove an upload, its digest and what is held of unfinished uploads of its name; whether
    there was any. Raises ``UploadConflict``, removing nothing, while a request writes one."""
    path = upload_path(api, tenant, name)
    found = delete_unfinished(api, tenant, name)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        found = True
    _digest_path(path).unlink(missing_ok=True)
    return found


def delete_unfinished(api: ApiSettings, tenant: str, name: str) -> bool:
    """Remove what is held of the tenant's unfinished uploads as ``name``, all or none; whether
    there was any. Raises ``UploadConflict`` while a request writes one (it holds its lock):
    its file would be gone from under it as it finished."""
    with contextlib.ExitStack() as held:
        found = []
        for path in _parts(api, tenant, name):
            try:
                part = held.enter_context(path.open("rb"))
            except FileNotFoundError:  # finished or deleted meanwhile
                continue
            try:
                fcntl.flock(part.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UploadConflict(
                    f"a request is sending a file as {name!r}: delete it once that request "
                    "has ended"
                ) from None
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(part.fileno()).st_ino:  # not moved meanwhile
                    found.append(path)
        for path in found:
            path.unlink()
    return bool(found)


def fill_digests(api: ApiSettings) -> int:
    """Keep the digest of every upload that has none that matches it (one made before digests
    were kept, or whose digest a crash kept from being written), so that the list shows them all.
    A file changed while it is hashed is left for the next pass. Returns how many were kept."""
    kept = 0
    for path in _upload_files(api.upload_dir, f"*/*{SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):  # an upload deleted meanwhile
            if _listed(path).sha256 is not None:
                continue
            before = path.stat()
            digest = _Digest.of(path, _sha256_of(path))
            if digest.matches(before):
                _keep_digest(path, digest)
                kept += 1
    return kept


def partial_file(path: Path) -> tuple[int, str]:
    """A new temporary file beside ``path`` to write it in, then move it (housekeeping deletes
    one left behind: :func:`sweep_partials`): its descriptor and path."""
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=PARTIAL)


def sweep_partials(api: ApiSettings, grace_s: float) -> int:
    """Delete the temporary files of uploads cut short (a controller killed while one arrived)
    that nothing has written for ``grace_s``, and the parts kept of unfinished uploads nothing
    has written for ``api.upload_keep_s``. Returns how many."""
    if not api.upload_dir.is_dir():
        return 0
    now = time.time()
    swept = 0
    for partial in api.upload_dir.glob(f"*/.*{PARTIAL}"):
        kept_s = api.upload_keep_s if _part_of(partial) is not None else grace_s
        with contextlib.suppress(FileNotFoundError):  # an upload that just ended
            if partial.stat().st_mtime < now - kept_s:
                partial.unlink()
                swept += 1
    return swept
