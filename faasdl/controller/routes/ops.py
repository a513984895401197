"""Estimation without running, and the service's health, readiness and metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from faasdl.controller.auth import caller_id, spec_for
from faasdl.controller.deps import ControllerDep, LimitsDep, PrincipalDep, ScraperDep
from faasdl.controller.plan import JobPlan
from faasdl.controller.routes import AUTHENTICATED
from faasdl.controller.validator import JobSpec
from faasdl.errors import FaasdlError

log = logging.getLogger(__name__)
router = APIRouter()


@router.post(
    "/v1/estimate",
    response_model=JobPlan,
    tags=["jobs"],
    summary="Plan, run nothing",
    responses=AUTHENTICATED,
)
def estimate(
    spec: JobSpec, controller: ControllerDep, principal: PrincipalDep, limits: LimitsDep
) -> JobPlan:
    spec = spec_for(spec, principal)
    limits.estimates.take(caller_id(principal), "estimates")
    return controller.estimate(spec)


@router.get("/healthz", tags=["ops"], summary="The process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    tags=["ops"],
    summary="The store answers and this controller holds the store's lease; the platform's "
    "answer is reported beside",
    responses={
        503: {
            "description": "Not ready: the store is unavailable, or another controller took the "
            "store's lease"
        }
    },
)
def readyz(controller: ControllerDep) -> JSONResponse:
    """Unauthenticated (a probe), so it says only ``ok`` or ``unavailable``; why is logged.

    A platform that does not answer is reported, and leaves the controller ready: it still
    serves its jobs, which wait for the platform and say so (taken out of a Service's endpoints,
    it would leave their users nothing to ask)."""
    checks: dict[str, str] = {}
    probes: dict[str, Callable[[], object]] = {
        "store": lambda: controller.store.get("job/"),
        "platform": controller.platform.ping,
    }
    for name, probe in probes.items():
        try:
            probe()
            checks[name] = "ok"
        except FaasdlError as exc:
            log.warning("readiness: the %s is unavailable: %s", name, exc)
            checks[name] = "unavailable"
    # Lost, it was logged as it was: another controller runs this store's jobs.
    checks["lease"] = "unavailable" if controller.lease.lost.is_set() else "ok"
    ready = checks["store"] == checks["lease"] == "ok"
    return JSONResponse({"ready": ready, **checks}, status_code=200 if ready else 503)


@router.get(
    "/metrics",
    tags=["ops"],
    summary="Prometheus metrics (an administrator's key; while the store is unavailable, one it "
    "accepted within FAASDL_API__METRICS_KEY_GRACE_S)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, **AUTHENTICATED},
)
def metrics(controller: ControllerDep, _: ScraperDep) -> Response:
    return Response(controller.metrics.render(), media_type=CONTENT_TYPE_LATEST)
