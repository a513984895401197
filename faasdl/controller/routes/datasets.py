"""``/v1/datasets``: a tenant's uploaded ``.npz`` data sets, which its jobs name by file name."""

from __future__ import annotations

import logging
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, HTTPException, Path, Request, Response, status
from starlette.requests import ClientDisconnect

from faasdl.controller.auth import caller_id
from faasdl.controller.datasets import (
    DATASET_NAME_PATTERN,
    UnfinishedUpload,
    UploadedDataset,
    delete_unfinished,
    store_resumable,
    store_upload,
    unfinished,
    upload_range,
    upload_sha256,
    uploads,
)
from faasdl.controller.deps import ControllerDep, LimitsDep, PrincipalDep
from faasdl.controller.routes import AUTHENTICATED, problems
from faasdl.errors import DatasetNotFound, ValidationError
from faasdl.serving import CLIENT_CLOSED_REQUEST

log = logging.getLogger(__name__)

DatasetName = Annotated[
    str, Path(pattern=DATASET_NAME_PATTERN, description="The data set's name (no extension).")
]


def router(*, max_upload_bytes: int) -> APIRouter:
    """The routes, with the upload's own body limit (larger than the API's)."""
    routes = APIRouter(
        prefix="/v1/datasets", tags=["datasets"], responses={**AUTHENTICATED, **problems(404)}
    )

    @routes.put(
        "/{name}",
        status_code=status.HTTP_201_CREATED,
        summary="Upload a data set (the .npz file as the body; replaces one of the same name)",
        max_body_size=max_upload_bytes,
        responses={
            202: {
                "model": UnfinishedUpload,
                "description": "A part taken (Content-Range), the file not whole yet",
            },
            **problems(409, 413),
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string"}}},
            }
        },
    )
    async def upload(
        name: DatasetName,
        request: Request,
        response: Response,
        controller: ControllerDep,
        principal: PrincipalDep,
        limits: LimitsDep,
        repr_digest: Annotated[
            str | None,
            Header(
                alias="Repr-Digest",
                description="The whole file's SHA-256 (RFC 9530: `sha-256=:BASE64:`): what "
                "arrives is kept where the upload is cut short, for it to go on from there "
                "(Content-Range), and the file is checked against it.",
            ),
        ] = None,
        content_range: Annotated[
            str | None,
            Header(
                alias="Content-Range",
                description="`bytes FIRST-LAST/TOTAL`: the body is that part of the file named "
                "by Repr-Digest, going on from what the controller holds of it (GET "
                "/v1/datasets/NAME/upload); 202 until the file is whole.",
            ),
        ] = None,
    ) -> UploadedDataset | UnfinishedUpload:
        """Streamed to disk as it arrives, checked (``x_train``, ``y_train``, ``x_test``,
        ``y_test``, no pickled objects), then kept as ``<name>.npz``: jobs name it as
        ``{"name": "npz", "path": "<name>.npz"}``. A refused upload leaves nothing behind; one
        sent with its Repr-Digest and cut short leaves what came, for its rest to follow."""
        sha256 = upload_sha256(repr_digest) if repr_digest is not None else None
        part = upload_range(content_range) if content_range is not None else None
        if part is not None and sha256 is None:
            raise ValidationError(
                "needs Repr-Digest: the whole file's SHA-256 names the upload a part goes on",
                field="Content-Range",
            )
        if part is None or part.first == 0:  # an upload's start, not the rest of one
            limits.uploads.take(caller_id(principal), "data set uploads")
        api = controller.settings.api
        try:
            if sha256 is None:
                return await store_upload(api, principal.tenant, name, request.stream())
            length = request.headers.get("content-length", "")
            stored = await store_resumable(
                api,
                principal.tenant,
                name,
                request.stream(),
                sha256=sha256,
                part=part,
                length=int(length) if length.isdigit() else None,
            )
        except ClientDisconnect:  # a user's Ctrl-C: one line, not uvicorn's ASGI traceback
            log.info("upload %r of tenant %s stopped: its client went away", name, principal.tenant)
            raise HTTPException(CLIENT_CLOSED_REQUEST, "the client went away") from None
        if isinstance(stored, UnfinishedUpload):
            response.status_code = status.HTTP_202_ACCEPTED
        return stored

    @routes.get(
        "/{name}/upload",
        summary="What the controller holds of unfinished uploads as NAME (sent with Repr-Digest)",
    )
    async def unfinished_uploads(
        name: DatasetName, controller: ControllerDep, principal: PrincipalDep
    ) -> list[UnfinishedUpload]:
        """One per file (by its SHA-256) whose upload was cut short or is arriving: the next part
        starts at its ``received``; housekeeping deletes it after ``kept_until_ms``."""
        api = controller.settings.api
        return await anyio.to_thread.run_sync(unfinished, api, principal.tenant, name)

    @routes.delete(
        "/{name}/upload",
        status_code=status.HTTP_204_NO_CONTENT,
        summary="Delete what is held of unfinished uploads as NAME (its data set stays)",
        description="409 while a request is sending one of them.",
        responses=problems(409),
    )
    def delete_unfinished_uploads(
        name: DatasetName, controller: ControllerDep, principal: PrincipalDep
    ) -> None:
        if not delete_unfinished(controller.settings.api, principal.tenant, name):
            raise DatasetNotFound(name, unfinished=True)

    @routes.get("", summary="The caller's uploaded data sets")
    async def list_datasets(
        controller: ControllerDep, principal: PrincipalDep
    ) -> list[UploadedDataset]:
        return await anyio.to_thread.run_sync(uploads, controller.settings.api, principal.tenant)

    @routes.delete(
        "/{name}",
        status_code=status.HTTP_204_NO_CONTENT,
        summary="Delete an upload (and what is held of unfinished uploads of its name)",
        description="409 while a job that trains on it has not staged it yet (queued, or "
        "starting): it would fail as it starts; or while a request is sending a file as NAME.",
        responses=problems(409),
    )
    def delete(name: DatasetName, controller: ControllerDep, principal: PrincipalDep) -> None:
        controller.delete_dataset(principal.tenant, name)

    # Every name's, beside the data sets rather than under them: no data set's name can be
    # taken from their path.
    every = APIRouter(tags=["datasets"], responses=AUTHENTICATED)

    @every.get(
        "/v1/uploads", summary="What the controller holds of the caller's unfinished uploads"
    )
    async def every_unfinished_upload(
        controller: ControllerDep, principal: PrincipalDep
    ) -> list[UnfinishedUpload]:
        """Those of every name (``GET /v1/datasets/NAME/upload``'s, by name): what counts toward
        the tenant's quota besides its data sets until each is finished, deleted (``DELETE
        /v1/datasets/NAME/upload``) or deleted by housekeeping after ``kept_until_ms``."""
        api = controller.settings.api
        return await anyio.to_thread.run_sync(unfinished, api, principal.tenant)

    every.include_router(routes)
    return every
