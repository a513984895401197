"""One router per resource: ``jobs`` (submission, status, events, model, cancel), ``datasets``
(uploads) and ``ops`` (estimate, health, readiness, metrics); and the error answers they share."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Problem(BaseModel):
    """Every error answer: a message, and the input at fault where there is one. FastAPI's own
    schema errors (422) carry a list with one entry per field instead."""

    detail: str | list[dict[str, Any]] = Field(description="What went wrong.")
    field: str | None = Field(None, description="The request field at fault, if any.")


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error statuses an operation can answer with."""
    said = {
        401: "No API key, or one unknown or revoked (WWW-Authenticate: Bearer)",
        403: "The key may not do this (another tenant, an administrator's view)",
        404: "No such resource for this caller",
        409: "Not possible in the resource's state",
        413: "The body is larger than allowed",
        416: "A Range past the end (Content-Range: bytes */SIZE)",
        422: "Invalid input; `field` names it",
        429: "A rate limit or quota; see Retry-After",
        503: "The platform or the store is unavailable; retry later",
        507: "The store (or the disk for uploads) is full: it refused a write",
    }
    return {code: {"model": Problem, "description": said[code]} for code in codes}


#: What any authenticated operation can answer with.
AUTHENTICATED = problems(401, 403, 413, 422, 429, 503, 507)
