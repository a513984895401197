"""The controller's FastAPI application: ``faasdl serve``.

Errors are answered by one handler: a faasdl error with its class's HTTP status and
``{"detail": message, "field": the bad input or null}`` (secrets redacted; ``WWW-Authenticate``
on a 401, ``Retry-After`` on a 429); a malformed request with FastAPI's 422, whose ``loc`` names
the field (a body JSON cannot read too, too deep, not UTF-8 or with a 5,000-digit integer, which
FastAPI answers with a 400 that does not say why); a body over ``FAASDL_API__MAX_BODY_BYTES``
with 413 before it is read.
"""

from __future__ import annotations

import asyncio
import gc
import math
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from faasdl import __version__
from faasdl.config import Settings
from faasdl.controller.auth import RateLimiter, StreamSlots, VouchedKeys
from faasdl.controller.deps import ApiLimits
from faasdl.controller.jobs import Controller
from faasdl.controller.routes import datasets, jobs, ops, ui
from faasdl.errors import (
    FaasdlError,
    LimitExceeded,
    Unauthenticated,
    ValidationError,
    explained,
)
from faasdl.platform import make_platform
from faasdl.redact import Redactor, redact_logs
from faasdl.serving import CloseUnread, HeadAsGet
from faasdl.store import make_store
from faasdl.training.datasets import preload


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else repr(value)


def _json_text(value: str) -> str:
    """``value`` with its lone surrogates (a JSON body's ``"\\ud800"`` reads as one) written as
    their escapes: the response is UTF-8, which has none for them."""
    return value if value.isascii() else value.encode("utf-8", "backslashreplace").decode()


def _unreadable(cause: BaseException | None) -> str | None:
    """Why a JSON body could not be read, where FastAPI answers only "There was an error parsing
    the body" (400; what ``json`` calls a decode error it names itself, a 422)."""
    if isinstance(cause, RecursionError):
        return "nested deeper than the JSON reader goes (about 1,000 levels)"
    if isinstance(cause, UnicodeDecodeError):
        return f"not UTF-8 text: {cause.reason} at byte {cause.start}"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return f"an integer of more than {sys.get_int_max_str_digits():,} digits"
    return None


def _not_json(content_type: str | None) -> str | None:
    """The media type a body was sent as, where FastAPI does not read it as JSON (it reads one
    of no type as JSON, and application/json or application/*+json)."""
    media = (content_type or "").partition(";")[0].strip().lower()
    json_type = media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )
    return None if not media or json_type else media


def _body_model(request: Request) -> type[BaseModel] | None:
    """The model of the body the request's route takes, where it takes one (a job's spec)."""
    params = getattr(getattr(request.scope.get("route"), "dependant", None), "body_params", [])
    model = params[0].field_info.annotation if len(params) == 1 else None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def build_controller(settings: Settings) -> Controller:
    """A controller on the platform and store ``settings`` name (constructed, nothing opened)."""
    return Controller(
        settings=settings,
        platform=make_platform(settings),
        store=make_store(settings.store),
        store_url=settings.store.url,
    )


def steady_heap() -> None:
    """Import now what jobs will import (the data sets' loaders), then move every object alive to
    the collector's permanent generation. Otherwise those objects are new after start-up, and each
    full collection walks them all: a pause of over 100 ms for every request in flight, several
    times a minute under load (measured with ``faasdl bench api``)."""
    preload()
    gc.freeze()


def create_app(controller: Controller, *, owns: bool = True) -> FastAPI:
    """The REST app over ``controller``. With ``owns`` the app opens the platform and the store
    and starts the controller on start-up, and undoes all three on shutdown; otherwise the caller
    does."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = api.worker_threads
        if not owns:
            yield
            return
        await asyncio.to_thread(controller.store.open)
        await asyncio.to_thread(controller.platform.open)
        controller.start()
        await asyncio.to_thread(steady_heap)
        try:
            yield
        finally:
            await asyncio.to_thread(controller.close)
            await asyncio.to_thread(controller.platform.close)
            await asyncio.to_thread(controller.store.close)

    api = controller.settings.api
    redactor = Redactor(controller.settings.secrets())
    redact_logs(redactor)
    app = FastAPI(
        title="faasdl controller",
        version=__version__,
        description="Submit deep-learning training jobs to run on a FaaS platform, sized, "
        "sharded, trained in rounds and merged by a tree of aggregation actions.",
        lifespan=lifespan,
        max_body_size=api.max_body_bytes,
    )
    app.add_middleware(CloseUnread)
    app.add_middleware(HeadAsGet)
    app.state.controller = controller
    app.state.limits = ApiLimits(
        submissions=RateLimiter(per_minute=api.submissions_per_minute),
        estimates=RateLimiter(per_minute=api.estimates_per_minute),
        uploads=RateLimiter(per_minute=api.uploads_per_minute),
        streams=StreamSlots(per_caller=api.max_streams_per_key),
    )
    app.state.vouched = VouchedKeys(grace_s=api.metrics_key_grace_s)

    @app.exception_handler(FaasdlError)
    async def _faasdl_error(_: Request, exc: FaasdlError) -> JSONResponse:
        field = exc.field if isinstance(exc, ValidationError) else None
        headers = {}
        if isinstance(exc, Unauthenticated):
            headers["WWW-Authenticate"] = "Bearer"
        if isinstance(exc, LimitExceeded):
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
        return JSONResponse(
            {"detail": redactor(str(exc)), "field": field},
            status_code=exc.status_code,
            headers=headers,
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler, save that an input echoed back that the response cannot hold
        # (the Infinity or NaN Python's json reads in a body; text with a lone surrogate, which
        # JSON's "\ud800" reads as) is written as its repr or escapes: the response's encoder
        # refused it, and the client got a 500 for its bad input.
        errors = jsonable_encoder(
            exc.errors(), custom_encoder={float: _json_float, str: _json_text}
        )
        model = _body_model(request)
        sent_as = _not_json(request.headers.get("content-type"))
        for error in errors:
            if sent_as and error["loc"] == ["body"] and error["type"] == "model_attributes_type":
                # FastAPI read the body as bytes, not JSON, and said only that it was no object
                # (echoing it whole): `curl -d` sends a form's type.
                error.pop("input", None)
                error["msg"] = (
                    f"sent as {sent_as}, and a body is read as JSON only: send it with "
                    "Content-Type: application/json (curl -d sends a form's type)"
                )
            elif model and error["loc"][0] == "body":  # a field it does not take: the one meant…
                error["msg"] = explained(model, {**error, "loc": error["loc"][1:]})
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        # A body JSON cannot read is a 422 as FastAPI's own decode errors are ("{"), saying why.
        why = _unreadable(exc.__cause__) if exc.status_code == 400 else None
        if why is None:
            return await http_exception_handler(request, exc)
        error = {"type": "json_invalid", "loc": ["body"], "msg": f"JSON decode error: {why}"}
        return JSONResponse({"detail": [{**error, "input": {}, "ctx": {"error": why}}]}, 422)

    app.include_router(jobs.router)
    app.include_router(datasets.router(max_upload_bytes=api.max_upload_bytes))
    app.include_router(ops.router)
    app.include_router(ui.router(auth=api.auth))
    return app
