"""Where a job's ``.npz`` data may come from: a tenant's uploads and the configured roots, nothing
else.

A relative ``dataset.path`` names one of the tenant's uploads (``<upload_dir>/<tenant>/``); an
absolute one must lie, once every symbolic link and ``..`` is resolved, inside a directory of
``FAASDL_API__DATASET_ROOTS`` or the tenant's upload directory. The job then carries the resolved
path, so that what the actions open is what was checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pydantic
from pydantic import BaseModel, Field

from faasdl.config import ApiSettings
from faasdl.controller.validator import JobSpec
from faasdl.errors import AccessError, StoreFull, StoreUnavailable, ValidationError
from faasdl.estimator.sizer import remember_facts
from faasdl.store.base import FULL_ERRNOS
from faasdl.training.datasets import NpzSpec, data_notes, load_dataset

#: An upload's name: a file name of its own, never a path.
DATASET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
SUFFIX = ".npz"
PARTIAL = ".partial"

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
    return (api.upload_dir / tenant).resolve()


def upload_path(api: ApiSettings, tenant: str, name: str) -> Path:
    """Where the tenant's upload ``name`` is kept: the resolved path its jobs keep."""
    return tenant_dir(api, tenant) / f"{name}{SUFFIX}"


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
    # os.path.isfile, not Path.is_file: a name too long for the file system (ENAMETOOLONG) is
    # no file either, where Path.is_file raised it (a 500).
    if not given.is_absolute() and not os.path.isfile(resolved):  # without the server's path
        named = f"{spec.dataset.path}{SUFFIX}"
        hint = f" (did you mean {named!r}?)" if os.path.isfile(own / named) else ""
        raise ValidationError(
            f"no upload of yours is named {spec.dataset.path!r}{hint}: upload one with "
            "faasdl datasets upload FILE, or PUT /v1/datasets/NAME",
            field="dataset.path",
        )
    dataset = spec.dataset.model_copy(update={"path": str(resolved)})
    return spec.model_copy(update={"dataset": dataset})


def shown_path(path: str, api: ApiSettings, tenant: str) -> str:
    """A job's resolved ``dataset.path`` as its tenant sees it: an upload's by its name, as the
    job may give it (the server's directories are its own), any other as it is."""
    resolved = Path(path)
    return resolved.name if resolved.parent == tenant_dir(api, tenant) else path


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
        # The operator's to mend (their log names the folder); the caller is told no path of
        # the server's. It was a 500 with no word of why.
        log.error("uploads cannot be kept in %s: %s", kept.parent, exc)
        if exc.errno in FULL_ERRNOS:
            raise StoreFull(_UPLOADS_FULL) from exc
        raise StoreUnavailable(
            f"the controller cannot keep uploads ({exc.strerror}): ask its operator to make "
            "FAASDL_API__UPLOAD_DIR a folder it can write"
        ) from exc
    size = 0
    try:
        try:
            with os.fdopen(fd, "wb") as out:
                async for chunk in chunks:
                    out.write(chunk)
                    size += len(chunk)
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:
                raise StoreFull(_UPLOADS_FULL) from exc
            raise
        if size == 0:
            raise ValidationError("is empty: send the .npz file as the body", field="body")
        _check_quota(api, tenant, name, size)
        try:
            sha256, contents = await asyncio.to_thread(_check_upload, partial)
        except ValidationError as exc:
            # The temporary name means nothing to the caller.
            message = str(exc).removeprefix("dataset.path: ").replace(partial, "the upload")
            raise ValidationError(message, field="body") from exc
        # Of this file, before it is moved: another upload of the name may replace it at once.
        digest = _Digest.of(Path(partial), sha256, contents)
        os.replace(partial, kept)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    _keep_digest(kept, digest)
    return UploadedDataset(
        name=name, path=f"{name}{SUFFIX}", bytes=size, sha256=sha256, contents=contents
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


def _check_quota(api: ApiSettings, tenant: str, name: str, size: int) -> None:
    """``AccessError`` if the tenant's uploads would hold more than its quota with this one (which
    replaces one of the same name)."""
    quota = api.tenant_max_upload_bytes
    if not quota:
        return
    replaced = f"{name}{SUFFIX}"
    others = [p for p in _upload_files(tenant_dir(api, tenant)) if p.name != replaced]
    held = sum(p.stat().st_size for p in others) + size  # sizes only: no digest is read
    if held > quota:
        raise AccessError(
            f"tenant {tenant!r}'s uploads would hold {held:,} bytes with this one, more than the "
            f"{quota:,} they may: delete one first (DELETE /v1/datasets/NAME)"
        )


def delete_upload(api: ApiSettings, tenant: str, name: str) -> bool:
    """Remove an upload and its digest; whether there was one."""
    path = upload_path(api, tenant, name)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    _digest_path(path).unlink(missing_ok=True)
    return True


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
            with path.open("rb") as fh:
                sha256 = hashlib.file_digest(fh, "sha256").hexdigest()
            digest = _Digest.of(path, sha256)
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
    that nothing has written for ``grace_s``: the quota does not count them. Returns how many."""
    if not api.upload_dir.is_dir():
        return 0
    oldest_kept = time.time() - grace_s
    swept = 0
    for partial in api.upload_dir.glob(f"*/.*{PARTIAL}"):
        with contextlib.suppress(FileNotFoundError):  # an upload that just ended
            if partial.stat().st_mtime < oldest_kept:
                partial.unlink()
                swept += 1
    return swept
