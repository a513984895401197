"""Dependencies of the routes, declared once; tests override them like any FastAPI dependency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from faasdl.controller.auth import (
    LOCAL,
    Principal,
    RateLimiter,
    StreamSlots,
    VouchedKeys,
    authenticate,
    authenticate_vouched,
)
from faasdl.controller.jobs import Controller
from faasdl.errors import AccessError

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key made by `faasdl keys create --tenant T`.",
)


@dataclass(frozen=True)
class ApiLimits:
    """The per-key limits of one controller process."""

    submissions: RateLimiter
    estimates: RateLimiter
    uploads: RateLimiter
    streams: StreamSlots


# The app's own objects are looked up on the event loop: a plain ``def`` dependency would cost a
# trip through the thread pool on every request, which is most of a cheap request's time on a
# busy machine (each hop waits for the GIL twice).
async def get_controller(request: Request) -> Controller:
    controller: Controller = request.app.state.controller
    return controller


ControllerDep = Annotated[Controller, Depends(get_controller)]


async def get_limits(request: Request) -> ApiLimits:
    limits: ApiLimits = request.app.state.limits
    return limits


LimitsDep = Annotated[ApiLimits, Depends(get_limits)]


async def get_vouched(request: Request) -> VouchedKeys:
    vouched: VouchedKeys = request.app.state.vouched
    return vouched


VouchedDep = Annotated[VouchedKeys, Depends(get_vouched)]


CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def principal_of(
    controller: Controller, credentials: HTTPAuthorizationCredentials | None
) -> Principal:
    """Who sent the request: the key's tenant and scope (a store read: call it off the loop)."""
    if controller.settings.api.auth == "none":
        return LOCAL
    return authenticate(controller.store, credentials.credentials if credentials else None)


def get_principal(controller: ControllerDep, credentials: CredentialsDep) -> Principal:
    return principal_of(controller, credentials)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def get_scraper(
    controller: ControllerDep, credentials: CredentialsDep, vouched: VouchedDep
) -> Principal:
    """An administrator; while the store is unavailable, one whose key the store accepted lately
    (``FAASDL_API__METRICS_KEY_GRACE_S``): ``/metrics``' caller."""
    if controller.settings.api.auth == "none":
        return LOCAL
    token = credentials.credentials if credentials else None
    principal = authenticate_vouched(controller.store, token, vouched)
    if not principal.admin:
        raise AccessError("this needs an administrator's key (faasdl keys create --admin)")
    return principal


ScraperDep = Annotated[Principal, Depends(get_scraper)]
