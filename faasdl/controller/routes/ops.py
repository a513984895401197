"""Estimation without running, and the service's health, readiness and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from faasdl.controller.deps import ControllerDep
from faasdl.controller.plan import JobPlan
from faasdl.controller.validator import JobSpec
from faasdl.errors import FaasdlError

router = APIRouter()


@router.post("/v1/estimate", response_model=JobPlan, tags=["jobs"], summary="Plan, run nothing")
def estimate(spec: JobSpec, controller: ControllerDep) -> JobPlan:
    return controller.estimate(spec)


@router.get("/healthz", tags=["ops"], summary="The process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", tags=["ops"], summary="The platform and the store answer")
def readyz(controller: ControllerDep) -> JSONResponse:
    checks: dict[str, str] = {}
    for name, probe in (
        ("store", lambda: controller.store.get("job/")),
        ("platform", controller.platform.limits),
    ):
        try:
            probe()
            checks[name] = "ok"
        except FaasdlError as exc:
            checks[name] = str(exc)
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"ready": ready, **checks}, status_code=200 if ready else 503)


@router.get("/metrics", tags=["ops"], summary="Prometheus metrics", response_class=Response)
def metrics(controller: ControllerDep) -> Response:
    return Response(controller.metrics.render(), media_type=CONTENT_TYPE_LATEST)
