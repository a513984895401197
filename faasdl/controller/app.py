"""The controller's FastAPI application: ``faasdl serve``.

Errors are answered by one handler: a faasdl error with its class's HTTP status and
``{"detail": message, "field": the bad input or null}``; a malformed request with FastAPI's 422,
whose ``loc`` names the field.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from faasdl import __version__
from faasdl.config import Settings
from faasdl.controller.jobs import Controller
from faasdl.controller.routes import jobs, ops
from faasdl.errors import FaasdlError, ValidationError
from faasdl.platform import make_platform
from faasdl.store import make_store


def build_controller(settings: Settings) -> Controller:
    """A controller on the platform and store ``settings`` name (constructed, nothing opened)."""
    return Controller(
        settings=settings,
        platform=make_platform(settings),
        store=make_store(settings.store),
        store_url=settings.store.url,
    )


def create_app(controller: Controller, *, owns: bool = True) -> FastAPI:
    """The REST app over ``controller``. With ``owns`` the app opens the platform and the store
    and starts the controller on start-up, and undoes all three on shutdown; otherwise the caller
    does."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if not owns:
            yield
            return
        await asyncio.to_thread(controller.store.open)
        await asyncio.to_thread(controller.platform.open)
        controller.start()
        try:
            yield
        finally:
            await asyncio.to_thread(controller.close)
            await asyncio.to_thread(controller.platform.close)
            await asyncio.to_thread(controller.store.close)

    app = FastAPI(
        title="faasdl controller",
        version=__version__,
        description="Submit deep-learning training jobs to run on a FaaS platform, sized, "
        "sharded, trained in rounds and merged by a tree of aggregation actions.",
        lifespan=lifespan,
    )
    app.state.controller = controller

    @app.exception_handler(FaasdlError)
    async def _faasdl_error(_: Request, exc: FaasdlError) -> JSONResponse:
        field = exc.field if isinstance(exc, ValidationError) else None
        return JSONResponse({"detail": str(exc), "field": field}, status_code=exc.status_code)

    app.include_router(jobs.router)
    app.include_router(ops.router)
    return app
