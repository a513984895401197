"""``/v1/jobs``: submit, list, inspect, follow, download, finish early, cancel and delete training
jobs.

A caller sees only its tenant's jobs (an administrator sees every tenant's): another tenant's job
is a 404, exactly as one that does not exist, so that ids cannot be probed.
"""

from __future__ import annotations

import itertools
import json
import re
import time
import weakref
from collections.abc import AsyncIterator
from typing import Annotated
from urllib.parse import urlencode

import anyio
from fastapi import APIRouter, Header, Path, Query, Response, status
from fastapi.responses import JSONResponse, StreamingResponse

from faasdl.controller.auth import KEY_RECHECK_S, Principal, caller_id, spec_for, still_valid
from faasdl.controller.deps import (
    ControllerDep,
    CredentialsDep,
    LimitsDep,
    PrincipalDep,
    principal_of,
)
from faasdl.controller.jobs import Controller, JobLine, JobView, job_line
from faasdl.controller.routes import AUTHENTICATED, problems
from faasdl.controller.validator import (
    IDEMPOTENCY_KEY_MAX,
    NAME_MAX,
    TENANT_PATTERN,
    JobSpec,
)
from faasdl.errors import JobNotFound
from faasdl.store.records import JOB_ID_PATTERN, ActivationUse, JobInfo, JobState

router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses={**AUTHENTICATED, **problems(404, 409)}
)

JobId = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="The job's id.")]
#: How often the events stream looks at the job record.
EVENTS_POLL_S = 0.25
#: Jobs in a page of the list, by default and at most.
PAGE = 100
MAX_PAGE = 1000


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
    principal: PrincipalDep,
    limits: LimitsDep,
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
    spec = spec_for(spec, principal)
    limits.submissions.take(caller_id(principal), "job submissions")
    submitted = controller.submit(spec, idempotency=idempotency_key)
    if not submitted.created:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/jobs/{submitted.job.job_id}"
    return controller.view(submitted.job.job_id)


@router.get(
    "",
    summary="List jobs, newest first, a page at a time",
    responses={
        200: {
            "headers": {
                "Link": {
                    "description": 'The next page\'s URL, rel="next", when there are more jobs',
                    "schema": {"type": "string"},
                }
            }
        }
    },
)
def list_jobs(
    controller: ControllerDep,
    principal: PrincipalDep,
    response: Response,
    tenant: Annotated[
        str | None,
        Query(
            pattern=TENANT_PATTERN, description="Only this tenant's (an administrator's filter)."
        ),
    ] = None,
    state: JobState | None = None,
    name: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=NAME_MAX,
            description="Only the jobs whose name holds this (case matters): a sweep's part.",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Jobs in a page.")] = PAGE,
    before: Annotated[
        str | None,
        Query(
            pattern=JOB_ID_PATTERN,
            description="Only the jobs listed after this one: the last job_id of the page before.",
        ),
    ] = None,
) -> list[JobLine]:
    asked = tenant
    if not principal.admin:
        if tenant not in (None, principal.tenant):
            return []
        tenant = principal.tenant
    found = controller.jobs(tenant=tenant, state=state, name=name)
    if before is not None:
        cursor = owned(controller, principal, before)
        found = [j for j in found if (j.created_ms, j.job_id) < (cursor.created_ms, cursor.job_id)]
    if len(found) > limit:
        last = found[limit - 1].job_id
        query = {"tenant": asked, "state": state, "name": name, "limit": limit, "before": last}
        given = urlencode({k: v for k, v in query.items() if v is not None})
        response.headers["Link"] = f'</v1/jobs?{given}>; rel="next"'
    return [job_line(j) for j in found[:limit]]


def owned(controller: Controller, principal: Principal, job_id: str) -> JobInfo:
    """The job, if the caller may see it; ``JobNotFound`` otherwise (no hint that it exists)."""
    job = controller.job(job_id)
    if not principal.owns(job.tenant):
        raise JobNotFound(job_id)
    return job


@router.get("/{job_id}", response_model=JobView, summary="A job's state, rounds and failures")
async def get_job(
    job_id: JobId,
    controller: ControllerDep,
    credentials: CredentialsDep,
    round_from: Annotated[
        int,
        Query(
            ge=0,
            description="Only the rounds from this one on (counted from 0, as each round's "
            "`round`): what a follower that has read the earlier ones asks for (a 10,000-round "
            "job's rounds are 1.4 MB).",
        ),
    ] = 0,
) -> Response:
    def read() -> str:
        principal = principal_of(controller, credentials)
        view = controller.view(job_id, owned(controller, principal, job_id), round_from)
        return view.model_dump_json()

    # The most frequent call goes through the thread pool once for all it does (the key's
    # check, the record, its JSON), and is serialised once, by pydantic-core: FastAPI would
    # validate again the record it has just read (the schema still says JobView).
    return Response(await anyio.to_thread.run_sync(read), media_type="application/json")


@router.get(
    "/{job_id}/events",
    summary="Follow a job (server-sent events)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
def events(
    job_id: JobId,
    controller: ControllerDep,
    principal: PrincipalDep,
    limits: LimitsDep,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            pattern=r"^\d{1,18}$",
            description="Resume after this line of the log (the last `id:` received).",
        ),
    ] = None,
) -> StreamingResponse:
    """One event per line of the job's log (``id:`` the line's number from 0, ``event:`` its kind,
    ``data:`` the line as JSON), then ``event: end`` with the job's final state once it has
    ended. A quiet stream sends a comment every ``FAASDL_API__STREAM_KEEPALIVE_S`` (a client gone
    away is noticed), and ends after ``FAASDL_API__STREAM_MAX_S`` without ``end``: the client
    reconnects with ``Last-Event-ID`` (as a browser's EventSource does) and gets the lines after
    it. Lines the job's record no longer keeps (``events_kept``) are skipped. A stream whose key
    is revoked ends within 2 s, after a comment saying so."""
    owned(controller, principal, job_id)  # a 404 now, not inside the stream
    api = controller.settings.api
    caller = caller_id(principal)
    limits.streams.reserve(caller)

    async def stream() -> AsyncIterator[str]:
        # Async, so that a stream holds no worker thread between looks at the job: a thousand
        # idle followers cost the thread pool nothing.
        sent = 0 if last_event_id is None else int(last_event_id) + 1  # the next line's number
        started = quiet = checked = time.monotonic()
        while time.monotonic() - started < api.stream_max_s:
            if time.monotonic() - checked >= KEY_RECHECK_S:
                # A key revoked while its stream is open: the stream ends, and the client's
                # reconnection gets the 401 every request with it gets.
                if not await anyio.to_thread.run_sync(still_valid, controller.store, principal):
                    yield ": the API key is no longer valid\n\n"
                    return
                checked = time.monotonic()
            try:
                job = await anyio.to_thread.run_sync(controller.job, job_id)
            except JobNotFound:  # deleted as it ended, between two looks
                yield ": the job was deleted\n\n"
                return
            first = max(sent, job.events_dropped)
            for number, event in enumerate(job.events[first - job.events_dropped :], first):
                data = event.model_dump_json()
                yield f"id: {number}\nevent: {event.kind}\ndata: {data}\n\n"
                sent, quiet = number + 1, time.monotonic()
            if job.finished:
                end = {"state": job.state, "error": job.error, "round": job.round}
                yield f"event: end\ndata: {json.dumps(end)}\n\n"
                return
            if time.monotonic() - quiet >= api.stream_keepalive_s:
                yield ": keep-alive\n\n"
                quiet = time.monotonic()
            if controller.runtime.shutdown.is_set():
                return
            await anyio.sleep(EVENTS_POLL_S)

    body = stream()
    # The slot is freed when the stream is dropped, however it ends: even one whose client left
    # before its first line never runs a ``finally``.
    weakref.finalize(body, limits.streams.release, caller)
    return StreamingResponse(body, media_type="text/event-stream")


@router.get("/{job_id}/ledger", summary="What each of a job's activations used and cost")
def ledger(
    job_id: JobId,
    controller: ControllerDep,
    principal: PrincipalDep,
    round_from: Annotated[
        int,
        Query(
            ge=0,
            description="Only the activations of this round and later (rounds count from 0, as "
            "each line's `round`): what a view of a long job's latest rounds reads.",
        ),
    ] = 0,
) -> list[ActivationUse]:
    owned(controller, principal, job_id)
    return controller.ledger(job_id, round_from)


#: One range of bytes (RFC 9110 §14.1.2): FIRST-LAST, FIRST- or -SUFFIX (up to 19 digits: any
#: model's size).
_RANGE = re.compile(r"bytes=(?:(\d{1,19})-(\d{0,19})|-(\d{1,19}))")


class RangeNotSatisfiable(ValueError):
    """A Range that lies past the end of the body (416)."""


def requested_part(
    range_: str | None, if_range: str | None, etag: str, size: int
) -> tuple[int, int] | None:
    """The part ``(start, end)`` of a ``size``-byte body a ``Range`` header asks for; ``None``
    for the whole: no Range, one this server ignores as RFC 9110 lets it (several ranges, or one
    it cannot read), or an ``If-Range`` that is not the body's ETag (the body changed: a resumed
    download starts over). Raises ``RangeNotSatisfiable`` for one past the end."""
    if range_ is None or (if_range is not None and if_range.strip() != etag):
        return None
    found = _RANGE.fullmatch(range_.strip())
    if found is None:
        return None
    first, last, suffix = found.groups()
    if suffix is not None:
        if int(suffix) == 0:
            raise RangeNotSatisfiable("its last 0 bytes")
        return max(0, size - int(suffix)), size
    start = int(first)
    if last and int(last) < start:
        return None  # invalid: ignored
    if start >= size:
        raise RangeNotSatisfiable(f"bytes from {start:,} on")
    return start, size if not last else min(size, int(last) + 1)


@router.get(
    "/{job_id}/model",
    summary="The trained model (safetensors)",
    description="A done job's model, or the model of the last finished round of a job that "
    "failed or was cancelled after one (its record's `model` names it); 409 for a job without "
    "one (not ended, or ended before a round had finished). A `Range` of bytes (one) answers "
    "206 with that part, so that a download cut short is resumed (`curl -C -`), and `If-Range` "
    "with the model's `ETag` makes sure it is the same model.",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}},
        206: {
            "description": "The part of the model a Range asks for",
            "content": {"application/octet-stream": {}},
        },
        **problems(416),
    },
)
def model(
    job_id: JobId,
    controller: ControllerDep,
    principal: PrincipalDep,
    range_: Annotated[
        str | None,
        Header(alias="Range", description="One range of bytes: `bytes=FIRST-`, …"),
    ] = None,
    if_range: Annotated[
        str | None,
        Header(alias="If-Range", description="The model's `ETag`: the Range only if it is."),
    ] = None,
) -> Response:
    owned(controller, principal, job_id)
    manifest, pieces = controller.model(job_id)  # nothing read yet but the manifest
    etag = f'"{manifest.sha256}"'
    headers = {"Accept-Ranges": "bytes", "ETag": etag}
    try:
        part = requested_part(range_, if_range, etag, manifest.size)
    except RangeNotSatisfiable as exc:
        return JSONResponse(
            {"detail": f"Range asks for {exc}: the model has {manifest.size:,} bytes"},
            status_code=status.HTTP_416_RANGE_NOT_SATISFIABLE,
            headers={"Content-Range": f"bytes */{manifest.size}", **headers},
        )
    headers["Content-Disposition"] = f'attachment; filename="{job_id}.safetensors"'
    start, end = part or (0, manifest.size)
    if part is not None:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{manifest.size}"
        pieces = controller.store.blob_part(manifest, start, end)
    # Sent from the store a chunk at a time, each checked before it goes (a model is not held
    # whole: VGG16's with Adam's moments is ~1.6 GB). A chunk found damaged once the answer has
    # begun ends it short of its Content-Length, which a client reads as a failed download; the
    # first is read before answering, so that a damaged one-chunk model is an error answer.
    first = next(pieces, b"")
    return StreamingResponse(
        itertools.chain([first], pieces),
        status_code=status.HTTP_206_PARTIAL_CONTENT if part else status.HTTP_200_OK,
        media_type="application/octet-stream",
        headers={**headers, "Content-Length": str(end - start)},
    )


@router.delete(
    "/{job_id}",
    response_model=JobView,
    summary="Cancel a job (its record stays), or delete an ended one whole (purge)",
    description="Cancel: a queued or running job ends, its activations stopped; its record, "
    "log, ledger and model stay. `purge=true`: an ended job is deleted whole, its record, log, "
    "ledger, model and Idempotency-Key (204); 409 for one that has not ended (cancel it first), "
    "whose activations that could not be stopped are not booked yet, or whose model a job yet "
    "to stage is to train on from (init_model).",
    responses={204: {"description": "purge=true: the job was deleted whole"}},
)
def cancel(
    job_id: JobId,
    controller: ControllerDep,
    principal: PrincipalDep,
    purge: Annotated[
        bool, Query(description="Delete the ended job whole instead of cancelling it.")
    ] = False,
) -> JobView | Response:
    owned(controller, principal, job_id)
    if purge:
        controller.delete(job_id)
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    controller.cancel(job_id)
    return controller.view(job_id)


@router.post(
    "/{job_id}/finish",
    response_model=JobView,
    summary="End a running job now, done, with the model of its last finished round",
    description="An early stop: the round in progress is stopped and dropped; the job's model "
    "is its last finished round's global model. 409 where no round has finished (there is no "
    "model to keep: cancel it) or the job has ended.",
)
def finish(job_id: JobId, controller: ControllerDep, principal: PrincipalDep) -> JobView:
    owned(controller, principal, job_id)
    controller.finish(job_id)
    return controller.view(job_id)
