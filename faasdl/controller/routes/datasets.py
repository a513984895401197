"""``/v1/datasets``: a tenant's uploaded ``.npz`` data sets, which its jobs name by file name."""

from __future__ import annotations

import logging
from typing import Annotated

import anyio
from fastapi import APIRouter, HTTPException, Path, Request, status
from starlette.requests import ClientDisconnect

from faasdl.controller.auth import caller_id
from faasdl.controller.datasets import (
    DATASET_NAME_PATTERN,
    UploadedDataset,
    store_upload,
    uploads,
)
from faasdl.controller.deps import ControllerDep, LimitsDep, PrincipalDep
from faasdl.controller.routes import AUTHENTICATED, problems
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
        controller: ControllerDep,
        principal: PrincipalDep,
        limits: LimitsDep,
    ) -> UploadedDataset:
        """Streamed to disk as it arrives, checked (``x_train``, ``y_train``, ``x_test``,
        ``y_test``, no pickled objects), then kept as ``<name>.npz``: jobs name it as
        ``{"name": "npz", "path": "<name>.npz"}``. A refused upload leaves nothing behind."""
        limits.uploads.take(caller_id(principal), "data set uploads")
        try:
            return await store_upload(
                controller.settings.api, principal.tenant, name, request.stream()
            )
        except ClientDisconnect:  # a user's Ctrl-C: one line, not uvicorn's ASGI traceback
            log.info("upload %r of tenant %s stopped: its client went away", name, principal.tenant)
            raise HTTPException(CLIENT_CLOSED_REQUEST, "the client went away") from None

    @routes.get("", summary="The caller's uploaded data sets")
    async def list_datasets(
        controller: ControllerDep, principal: PrincipalDep
    ) -> list[UploadedDataset]:
        return await anyio.to_thread.run_sync(uploads, controller.settings.api, principal.tenant)

    @routes.delete(
        "/{name}",
        status_code=status.HTTP_204_NO_CONTENT,
        summary="Delete an upload",
        description="409 while a job that trains on it has not staged it yet (queued, or "
        "starting): it would fail as it starts.",
        responses=problems(409),
    )
    def delete(name: DatasetName, controller: ControllerDep, principal: PrincipalDep) -> None:
        controller.delete_dataset(principal.tenant, name)

    return routes
