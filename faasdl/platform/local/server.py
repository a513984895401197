"""``faasdl platform serve``: the embedded platform behind OpenWhisk's REST API v1.

The subset that ``wsk`` and the official clients use for actions and activations, with basic auth
by ``uuid:key``, OpenWhisk's status codes and ``{"error", "code"}`` bodies, and responses shaped as
reference/openwhisk-apiv1swagger.json says. One extension lives outside ``/api/v1``:
``POST /faasdl/v1/activations/{id}/kill`` kills an activation's container (failure injection).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import re
import secrets
import uuid
from collections.abc import Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from faasdl import __version__
from faasdl.config import ServerSettings
from faasdl.errors import (
    ActionNotFound,
    ActivationNotFound,
    FaasdlError,
    InvalidAction,
)
from faasdl.platform import messages
from faasdl.platform.base import (
    Action,
    ActionSpec,
    Activation,
    KeyValue,
    StatusCode,
    parse_json,
)
from faasdl.platform.local.embedded import LocalPlatform, decode_code
from faasdl.serving import CLIENT_CLOSED_REQUEST, AppThread, CloseUnread

API = "/api/v1"
LIST_MAX = 200
#: What OpenWhisk's API has that this server does not serve: packages (an action's name may
#: still name one: ``utils/echo``), triggers, rules and web actions.
UNSERVED = re.compile(
    rf"^{API}/(?:namespaces/[^/]+/(?P<collection>packages|triggers|rules)|web)(?:/|$)"
)


log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered with OpenWhisk's body: ``{"error": message, "code": transaction id}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": message, "code": uuid.uuid4().hex}, status_code=status, headers=headers
    )


def _action_json(action: Action) -> dict[str, Any]:
    data = action.model_dump(exclude_none=True)
    data["exec"].setdefault("binary", action.exec.binary)
    return data


def _record_json(record: Activation) -> dict[str, Any]:
    return record.model_dump(exclude_none=True)


def _brief_json(record: Activation) -> dict[str, Any]:
    data = record.model_dump(
        include={
            "namespace",
            "name",
            "version",
            "publish",
            "activationId",
            "start",
            "end",
            "duration",
            "annotations",
            "cause",
        },
        exclude_none=True,
    )
    data["statusCode"] = _status_code(record)
    return data


def _status_code(record: Activation) -> int:
    for code in StatusCode:
        if code.status == record.response.status:
            return int(code)
    return int(StatusCode.WHISK_ERROR)


def _invoke_status(record: Activation) -> int:
    code = _status_code(record)
    if code == StatusCode.SUCCESS:
        return 200
    return 500 if code == StatusCode.WHISK_ERROR else 502


def create_app(
    platform: LocalPlatform, settings: ServerSettings | None = None, *, owns_platform: bool = True
) -> FastAPI:
    """The REST app. With ``owns_platform`` it opens ``platform`` on start-up and closes it on
    shutdown; otherwise the caller does both."""
    settings = settings or ServerSettings()
    uuid_part, _, key_part = settings.auth.get_secret_value().partition(":")
    local = platform.settings
    # A zip of code_max bytes grows by a third in base64, plus the JSON around it.
    put_limit = local.code_max_bytes * 4 // 3 + 64 * 1024

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        if not owns_platform:
            yield
            return
        await asyncio.to_thread(platform.open)
        try:
            yield
        finally:
            await asyncio.to_thread(platform.close)

    app = FastAPI(
        title="faasdl embedded OpenWhisk",
        version=__version__,
        description="OpenWhisk REST API v1 (actions and activations) over the embedded platform.",
        lifespan=lifespan,
    )
    app.add_middleware(CloseUnread)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message)

    @app.exception_handler(FaasdlError)
    async def _faasdl_error(_: Request, exc: FaasdlError) -> JSONResponse:
        if isinstance(exc, (ActionNotFound, ActivationNotFound)):
            return _error(404, messages.RESOURCE_DOES_NOT_EXIST)
        return _error(exc.status_code, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _malformed(_: Request, exc: RequestValidationError) -> JSONResponse:
        # akka-http's rejection as OpenWhisk answers it, not FastAPI's 422 and its own body.
        first = exc.errors()[0]
        where, name = first["loc"][0], first["loc"][-1]
        if where == "query":
            return _error(400, f"The query parameter '{name}' was malformed:\n{first['msg']}")
        return _error(400, f"The request content was malformed:\n{name}: {first['msg']}")

    @app.exception_handler(HTTPException)
    async def _no_route(request: Request, exc: HTTPException) -> JSONResponse:
        # A path or method no route serves, answered in OpenWhisk's body (not FastAPI's).
        if exc.status_code == 405:
            # The methods a route serves at the path (Starlette's header names the first
            # route's only).
            allowed = [
                method
                for method in ("GET", "PUT", "POST", "DELETE")
                if any(
                    route.matches({**request.scope, "method": method})[0] == Match.FULL
                    for route in app.router.routes
                )
            ]
            message = f"HTTP method not allowed, supported methods: {', '.join(allowed)}"
            return _error(405, message, headers={"Allow": ", ".join(allowed)})
        unserved = UNSERVED.match(request.url.path) if exc.status_code == 404 else None
        if unserved is not None:
            what = unserved["collection"] or "web actions"
            return _error(
                501,
                f"The embedded platform serves actions and activations only: {what} are not "
                "supported here (OpenWhisk serves them).",
            )
        if exc.status_code == 404:
            return _error(404, messages.RESOURCE_DOES_NOT_EXIST)
        return _error(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return _error(500, "The server encountered an internal error.")

    def authenticate(request: Request) -> str:
        header = request.headers.get("authorization")
        if not header:
            raise ApiError(401, messages.AUTH_REQUIRED)
        scheme, _, encoded = header.partition(" ")
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise ApiError(401, messages.AUTH_INVALID) from None
        ok_user = secrets.compare_digest(user.encode(), uuid_part.encode())
        ok_key = secrets.compare_digest(password.encode(), key_part.encode())
        if scheme.lower() != "basic" or not (ok_user and ok_key):
            raise ApiError(401, messages.AUTH_INVALID)
        return user

    api = APIRouter(prefix=API, dependencies=[Depends(authenticate)])
    admin = APIRouter(prefix="/faasdl/v1", dependencies=[Depends(authenticate)])

    def check_namespace(namespace: str) -> None:
        if namespace not in ("_", local.namespace):
            raise ApiError(
                403, f"The supplied authentication is not authorized to access '{namespace}'."
            )

    async def read_json(request: Request, limit: int) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, messages.entity_too_big("Request entity", int(declared), limit))
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise ApiError(413, messages.entity_too_big("Request entity", len(body), limit))
        except ClientDisconnect:  # one line, not uvicorn's ASGI traceback
            log.info("%s %s stopped: its client went away", request.method, request.url.path)
            raise ApiError(CLIENT_CLOSED_REQUEST, "the client went away") from None
        if not body.strip():
            return None
        try:
            return parse_json(body)
        except ValueError as exc:
            raise ApiError(400, f"The request content was malformed:\n{exc}") from None

    def list_window(limit: int, skip: int, collection: str) -> tuple[int, int]:
        if limit < 0 or limit > LIST_MAX:
            raise ApiError(
                400, f"The value '{limit}' is not in the range of 0 to {LIST_MAX} for {collection}."
            )
        if skip < 0:
            raise ApiError(
                400, f"The value '{skip}' is not greater than or equal to 0 for {collection}."
            )
        return (limit or LIST_MAX), skip

    @app.get("/", summary="Platform information and limits (no authentication)")
    def info() -> dict[str, Any]:
        limits = platform.limits()
        return {
            "description": "faasdl embedded OpenWhisk-compatible platform",
            "support": {"github": "faasdl"},
            "api_paths": [API],
            "build": __version__,
            "limits": {
                "actions_per_minute": local.invocations_per_minute or None,
                "concurrent_actions": local.concurrent_invocations,
                "min_action_memory": local.memory_min_mb * 1024 * 1024,
                "max_action_memory": local.memory_max_mb * 1024 * 1024,
                "std_action_memory": local.memory_std_mb * 1024 * 1024,
                "min_action_duration": local.timeout_min_ms,
                "max_action_duration": local.timeout_max_ms,
                "std_action_duration": local.timeout_std_ms,
                "max_action_logs": local.log_max_mb * 1024 * 1024,
                "container_pool_user_memory": local.pool_memory_mb * 1024 * 1024,
                "payload_max": local.payload_max_bytes,
                "memory_enforcement": limits.memory_enforcement,
            },
            "runtimes": {
                "python": [
                    {"kind": kind, "default": kind == limits.kinds[0], "deprecated": False}
                    for kind in limits.kinds
                ]
            },
        }

    @api.get("/namespaces", summary="Namespaces of the key")
    def namespaces() -> list[str]:
        return [local.namespace]

    @api.get("/namespaces/{namespace}/limits", summary="Limits of a namespace")
    def namespace_limits(namespace: str) -> dict[str, Any]:
        check_namespace(namespace)
        return {
            "invocationsPerMinute": local.invocations_per_minute,
            "concurrentInvocations": local.concurrent_invocations,
            "minActionMemory": local.memory_min_mb,
            "maxActionMemory": local.memory_max_mb,
            "minActionTimeout": local.timeout_min_ms,
            "maxActionTimeout": local.timeout_max_ms,
            "minActionLogs": 0,
            "maxActionLogs": local.log_max_mb,
            "minActionConcurrency": 1,
            "maxActionConcurrency": 1,
            "maxParameterSize": f"{local.payload_max_bytes} B",
        }

    @api.get("/namespaces/{namespace}/actions", summary="List actions")
    def list_actions(
        namespace: str,
        limit: Annotated[int, Query()] = 30,
        skip: Annotated[int, Query()] = 0,
    ) -> list[dict[str, Any]]:
        check_namespace(namespace)
        count, skip = list_window(limit, skip, "actions")
        return [_action_json(a) for a in platform.list_actions()[skip : skip + count]]

    @api.get("/namespaces/{namespace}/actions/{name:path}", summary="Get an action")
    def get_action(
        namespace: str, name: str, code: Annotated[bool, Query()] = True
    ) -> dict[str, Any]:
        check_namespace(namespace)
        return _action_json(platform.get_action(name, code=code))

    @api.delete("/namespaces/{namespace}/actions/{name:path}", summary="Delete an action")
    def delete_action(namespace: str, name: str) -> dict[str, Any]:
        check_namespace(namespace)
        action = platform.get_action(name)
        platform.delete_action(name)
        return _action_json(action)

    @api.put("/namespaces/{namespace}/actions/{name:path}", summary="Create or update an action")
    async def put_action(
        namespace: str,
        name: str,
        request: Request,
        overwrite: Annotated[bool, Query()] = False,
    ) -> JSONResponse:
        check_namespace(namespace)
        body = await read_json(request, put_limit)
        spec = _spec_from_put(platform, name, body)
        action = await asyncio.to_thread(platform.deploy, spec, overwrite=overwrite)
        return JSONResponse(_action_json(action))

    @api.post("/namespaces/{namespace}/actions/{name:path}", summary="Invoke an action")
    async def invoke(
        namespace: str,
        name: str,
        request: Request,
        blocking: Annotated[str, Query()] = "false",
        result: Annotated[str, Query()] = "false",
        timeout: Annotated[str | None, Query()] = None,
    ) -> Response:
        check_namespace(namespace)
        params = await read_json(request, local.payload_max_bytes)
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ApiError(
                400, "The request content was malformed:\nthe payload must be a JSON object"
            )
        wait_ms = settings.blocking_wait_max_ms
        if timeout is not None:
            if not timeout.isdigit() or not 0 < int(timeout) <= settings.blocking_wait_max_ms:
                raise ApiError(400, messages.invalid_wait_timeout(settings.blocking_wait_max_ms))
            wait_ms = int(timeout)
        if blocking != "true":
            activation_id = platform.invoke(name, params)
            return _accepted(activation_id)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Activation] = loop.create_future()

        def finished(record: Activation) -> None:
            def settle() -> None:
                if not done.done():
                    done.set_result(record)

            loop.call_soon_threadsafe(settle)

        activation_id = platform.invoke_with_callback(name, params, finished)
        try:
            record = await asyncio.wait_for(asyncio.shield(done), wait_ms / 1000)
        except TimeoutError:
            return _accepted(activation_id)
        body = record.response.result if result == "true" else _record_json(record)
        return JSONResponse(
            body,
            status_code=_invoke_status(record),
            headers={"x-openwhisk-activation-id": activation_id},
        )

    @api.get("/namespaces/{namespace}/activations", summary="List activations")
    def list_activations(
        namespace: str,
        name: str | None = None,
        limit: Annotated[int, Query()] = 30,
        skip: Annotated[int, Query()] = 0,
        since: Annotated[int | None, Query()] = None,
        upto: Annotated[int | None, Query()] = None,
        docs: Annotated[bool, Query()] = False,
    ) -> list[dict[str, Any]]:
        check_namespace(namespace)
        count, skip = list_window(limit, skip, "activations")
        records = platform.list_activations(
            name=name, since_ms=since, limit=local.max_activation_records
        )
        if upto is not None:
            records = [r for r in records if r.start <= upto]
        page = records[skip : skip + count]
        return [_record_json(r) if docs else _brief_json(r) for r in page]

    def activation(namespace: str, activation_id: str) -> Activation:
        check_namespace(namespace)
        record = platform.get_activation(activation_id)
        if record is None:
            raise ActivationNotFound(activation_id)
        return record

    @api.get("/namespaces/{namespace}/activations/{activation_id}", summary="Get an activation")
    def get_activation(namespace: str, activation_id: str) -> dict[str, Any]:
        return _record_json(activation(namespace, activation_id))

    @api.get(
        "/namespaces/{namespace}/activations/{activation_id}/result", summary="Activation result"
    )
    def get_result(namespace: str, activation_id: str) -> dict[str, Any]:
        record = activation(namespace, activation_id)
        return record.response.model_dump(exclude_none=True)

    @api.get("/namespaces/{namespace}/activations/{activation_id}/logs", summary="Activation logs")
    def get_logs(namespace: str, activation_id: str) -> dict[str, Any]:
        return {"logs": activation(namespace, activation_id).logs}

    @admin.post(
        "/activations/{activation_id}/kill",
        status_code=204,
        summary="Kill the container running an activation (failure injection)",
    )
    def kill(activation_id: str) -> Response:
        platform.kill(activation_id)
        return Response(status_code=204)

    app.include_router(api)
    app.include_router(admin)
    return app


def _accepted(activation_id: str) -> JSONResponse:
    return JSONResponse(
        {"activationId": activation_id},
        status_code=202,
        headers={"x-openwhisk-activation-id": activation_id},
    )


def _spec_from_put(platform: LocalPlatform, name: str, body: Any) -> ActionSpec:
    """Turn an ``ActionPut`` body into a spec; an update may leave out exec and limits."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request content was malformed:\nthe action must be a JSON object")
    try:
        existing: Action | None = platform.get_action(name, code=True)
    except ActionNotFound:
        existing = None
    exec_ = body.get("exec")
    if exec_ is None:
        if existing is None:
            raise ApiError(400, "The request content was malformed:\nexec undefined")
        exec_ = existing.exec.model_dump()
    if not isinstance(exec_, dict) or not isinstance(exec_.get("kind"), str):
        raise ApiError(400, "The request content was malformed:\nexec.kind must be a string")
    image = exec_.get("image")
    if image is not None and not isinstance(image, str):
        raise ApiError(400, "The request content was malformed:\nexec.image must be a string")
    code = exec_.get("code")
    if code is None and exec_["kind"] == "blackbox":
        code = ""  # an image with its own code: the platform says whether it can run it
    if not isinstance(code, str):
        raise ApiError(400, "The request content was malformed:\nexec.code must be a string")
    limits = body.get("limits") or {}
    if not isinstance(limits, dict):
        raise ApiError(400, "The request content was malformed:\nlimits must be an object")
    old = existing.limits if existing else None
    try:
        memory = _int_or(limits, "memory", old.memory if old else None)
        timeout = _int_or(limits, "timeout", old.timeout if old else None)
        logs = _int_or(limits, "logs", old.logs if old else None)
        # An update that names no parameters or annotations keeps the action's, as OpenWhisk's
        # does (`wsk action update NAME --memory 256` keeps its bound parameters).
        items, noted = body.get("parameters"), body.get("annotations")
        if existing is not None:
            if items is None:
                items = [p.model_dump(exclude_none=True) for p in existing.parameters]
            if noted is None:
                noted = [a.model_dump(exclude_none=True) for a in existing.annotations]
        _key_values(items, "parameters")  # its form checked before sealed values are opened
        items = _opened(platform, items or [])
        parameters = _key_values(items, "parameters")
        environment = {i["key"]: i.get("value") for i in items if i.get("init") is True}
        parameters = {k: v for k, v in parameters.items() if k not in environment}
        annotations = _key_values(noted, "annotations")
    except ValueError as exc:
        raise ApiError(400, f"The request content was malformed:\n{exc}") from None
    if "concurrency" in limits and limits["concurrency"] != 1:
        raise InvalidAction(f"concurrency {limits['concurrency']} exceeds allowed threshold of 1")
    return ActionSpec(
        name=name,
        code=decode_code(code) if existing is None or body.get("exec") else _stored_code(existing),
        kind=exec_["kind"],
        image=image,
        main=exec_.get("main") or "main",
        memory_mb=memory,
        timeout_ms=timeout,
        logs_mb=logs,
        parameters=parameters,
        environment=environment,
        annotations=annotations,
    )


def _stored_code(action: Action) -> str | bytes:
    code = action.exec.code or ""
    return base64.b64decode(code) if action.exec.binary else code


def _int_or(limits: dict[str, Any], key: str, default: int | None) -> int | None:
    if key not in limits:
        return default
    value = limits[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"limits.{key} must be an integer")
    return value


def _opened(platform: LocalPlatform, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The parameters as set: one the record holds sealed (an update that keeps the action's,
    or a client that sends back what it read, which OpenWhisk keeps as it is) opened, so that it
    is not sealed twice; ``ValueError`` for one this platform did not seal."""
    opened = []
    for item in items:
        if item.get("encryption") is not None:
            value = platform.parameter_value(KeyValue.model_validate(item))
            item = {k: v for k, v in item.items() if k != "encryption"} | {"value": value}
        opened.append(item)
    return opened


def _key_values(items: Any, field: str) -> dict[str, Any]:
    if items is None:
        return {}
    if not isinstance(items, list) or not all(
        isinstance(i, dict) and isinstance(i.get("key"), str) for i in items
    ):
        raise ValueError(f"{field} must be a list of {{key, value}} objects")
    return {i["key"]: i.get("value") for i in items}


class ServerThread(AppThread):
    """Runs the REST server on a background thread (tests, benchmarks). The caller opens and
    closes the platform."""

    def __init__(self, platform: LocalPlatform, settings: ServerSettings | None = None) -> None:
        self.settings = settings or ServerSettings(port=0)
        cert, key = self.settings.tls_cert_file, self.settings.tls_key_file
        super().__init__(
            create_app(platform, self.settings, owns_platform=False),
            host=self.settings.host,
            port=self.settings.port,
            name="faasdl-ow-server",
            tls=(cert, key) if cert is not None and key is not None else None,
        )


@contextlib.contextmanager
def serve_in_thread(
    platform: LocalPlatform, settings: ServerSettings | None = None
) -> Iterator[str]:
    """Serve ``platform`` on loopback for the duration of the block; yields the base URL."""
    server = ServerThread(platform, settings)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
