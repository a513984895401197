"""``/v1/jobs``: submit, list, inspect, follow, download and cancel training jobs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Response, status
from fastapi.responses import StreamingResponse

from faasdl.controller.deps import ControllerDep
from faasdl.controller.jobs import IDEMPOTENCY_KEY_MAX, JobLine, JobView, job_line
from faasdl.controller.validator import TENANT_PATTERN, JobSpec
from faasdl.store.records import JobEvent, JobState

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JOB_ID_PATTERN = r"^[0-9a-f]{16}$"
JobId = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="The job's id.")]
#: How often the events stream looks at the job record.
EVENTS_POLL_S = 0.25


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobView,
    summary="Submit a training job",
    responses={200: {"description": "An Idempotency-Key replay: the job the key created"}},
)
def submit(
    spec: JobSpec,
    controller: ControllerDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=IDEMPOTENCY_KEY_MAX,
            description="Replaying a request with the same key returns the same job.",
        ),
    ] = None,
) -> JobView:
    submitted = controller.submit(spec, idempotency=idempotency_key)
    if not submitted.created:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/jobs/{submitted.job.job_id}"
    return controller.view(submitted.job.job_id)


@router.get("", summary="List jobs, newest first")
def list_jobs(
    controller: ControllerDep,
    tenant: Annotated[str | None, Query(pattern=TENANT_PATTERN)] = None,
    state: JobState | None = None,
) -> list[JobLine]:
    return [job_line(j) for j in controller.jobs(tenant=tenant, state=state)]


@router.get("/{job_id}", response_model=JobView, summary="A job's state, rounds and ledger")
def get_job(job_id: JobId, controller: ControllerDep) -> JobView:
    return controller.view(job_id)


@router.get(
    "/{job_id}/events",
    summary="Follow a job (server-sent events)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
def events(job_id: JobId, controller: ControllerDep) -> StreamingResponse:
    """One event per line of the job's log (``event:`` its kind, ``data:`` the line as JSON), then
    ``event: end`` with the job's final state once it has ended."""
    controller.job(job_id)  # a 404 now, not inside the stream

    def stream() -> Iterator[str]:
        last: JobEvent | None = None
        while True:
            job = controller.job(job_id)
            # The log is capped: resume after the last line sent, or from its start if trimmed.
            start = job.events.index(last) + 1 if last in job.events else 0
            for event in job.events[start:]:
                yield f"event: {event.kind}\ndata: {event.model_dump_json()}\n\n"
                last = event
            if job.finished:
                end = {"state": job.state, "error": job.error, "round": job.round}
                yield f"event: end\ndata: {json.dumps(end)}\n\n"
                return
            if controller.runtime.shutdown.wait(EVENTS_POLL_S):
                return

    return StreamingResponse(stream(), media_type="text/event-stream")


@router.get(
    "/{job_id}/model",
    summary="The trained model (safetensors)",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
def model(job_id: JobId, controller: ControllerDep) -> Response:
    return Response(
        controller.model(job_id),
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{job_id}.safetensors"'},
    )


@router.delete("/{job_id}", response_model=JobView, summary="Cancel a job (its record stays)")
def cancel(job_id: JobId, controller: ControllerDep) -> JobView:
    controller.cancel(job_id)
    return controller.view(job_id)
