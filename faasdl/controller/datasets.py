"""Where a job's ``.npz`` data may come from: a tenant's uploads and the configured roots, nothing
else.

A relative ``dataset.path`` names one of the tenant's uploads (``<upload_dir>/<tenant>/``); an
absolute one must lie, once every symbolic link and ``..`` is resolved, inside a directory of
``FAASDL_API__DATASET_ROOTS`` or the tenant's upload directory. The job then carries the resolved
path, so that what the actions open is what was checked.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from pydantic import BaseModel, Field

from faasdl.config import ApiSettings
from faasdl.controller.validator import JobSpec
from faasdl.errors import AccessError, ValidationError
from faasdl.estimator.sizer import remember_facts
from faasdl.training.datasets import NpzSpec, load_dataset

#: An upload's name: a file name of its own, never a path.
DATASET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
SUFFIX = ".npz"


class UploadedDataset(BaseModel):
    """A data set a tenant uploaded; jobs name it as ``{"name": "npz", "path": path}``."""

    name: str
    path: str
    bytes: int
    sha256: str | None = Field(
        None,
        description="The file's SHA-256, in the upload's answer (a job's plan keeps it as "
        "data_sha256); the list leaves it out, which would read every file.",
    )


def tenant_dir(api: ApiSettings, tenant: str) -> Path:
    return (api.upload_dir / tenant).resolve()


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
    if not given.is_absolute() and not resolved.is_file():  # said without the server's path
        named = f"{spec.dataset.path}{SUFFIX}"
        hint = f" (did you mean {named!r}?)" if (own / named).is_file() else ""
        raise ValidationError(
            f"no upload of yours is named {spec.dataset.path!r}{hint}: upload one with "
            "faasdl datasets upload FILE, or PUT /v1/datasets/NAME",
            field="dataset.path",
        )
    dataset = spec.dataset.model_copy(update={"path": str(resolved)})
    return spec.model_copy(update={"dataset": dataset})


def uploads(api: ApiSettings, tenant: str) -> list[UploadedDataset]:
    """The tenant's uploaded data sets, by name."""
    directory = tenant_dir(api, tenant)
    if not directory.is_dir():
        return []
    return [
        UploadedDataset(name=path.stem, path=path.name, bytes=path.stat().st_size)
        for path in sorted(directory.glob(f"*{SUFFIX}"))
        if path.is_file() and not path.is_symlink()
    ]


async def store_upload(
    api: ApiSettings, tenant: str, name: str, chunks: AsyncIterator[bytes]
) -> UploadedDataset:
    """Write an upload to a temporary file as it arrives, check that it is a data set faasdl can
    train on, then move it under its name in one step: a failed or refused upload leaves nothing,
    and a job never sees half a file. The size cap is the route's body limit."""
    directory = tenant_dir(api, tenant)
    directory.mkdir(parents=True, exist_ok=True)
    size = 0
    fd, partial = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in chunks:
                out.write(chunk)
                size += len(chunk)
        if size == 0:
            raise ValidationError("is empty: send the .npz file as the body", field="body")
        _check_quota(api, tenant, name, size)
        try:
            # Checked by loading it (which hashes it), and its facts kept for the jobs that will
            # name it.
            facts = await asyncio.to_thread(
                lambda: remember_facts(load_dataset(NpzSpec(path=partial)))
            )
        except ValidationError as exc:
            # The temporary name means nothing to the caller.
            message = str(exc).removeprefix("dataset.path: ").replace(partial, "the upload")
            raise ValidationError(message, field="body") from exc
        os.replace(partial, directory / f"{name}{SUFFIX}")
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return UploadedDataset(name=name, path=f"{name}{SUFFIX}", bytes=size, sha256=facts.sha256)


def _check_quota(api: ApiSettings, tenant: str, name: str, size: int) -> None:
    """``AccessError`` if the tenant's uploads would hold more than its quota with this one (which
    replaces one of the same name)."""
    quota = api.tenant_max_upload_bytes
    if not quota:
        return
    held = sum(d.bytes for d in uploads(api, tenant) if d.name != name) + size
    if held > quota:
        raise AccessError(
            f"tenant {tenant!r}'s uploads would hold {held:,} bytes with this one, more than the "
            f"{quota:,} they may: delete one first (DELETE /v1/datasets/NAME)"
        )


def delete_upload(api: ApiSettings, tenant: str, name: str) -> bool:
    """Remove an upload; whether there was one."""
    path = tenant_dir(api, tenant) / f"{name}{SUFFIX}"
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
