"""The one exception tree of faasdl.

Every error faasdl raises is a :class:`FaasdlError`; errors of the libraries it talks through
(requests, redis, pyignite, kubernetes) are translated at the boundary with ``raise … from exc``.
Each class carries the HTTP status the controller's single exception handler answers with.

::

    FaasdlError (500)
    ├── ConfigError (500)                  settings that cannot work
    ├── ValidationError (422)              a request or spec that cannot run; names the field
    │   └── DatasetNotFound (404)          an uploaded data set (or upload of one) not there
    ├── PlatformError (502)                anything the FaaS platform refused or failed at
    │   ├── AuthenticationFailed (401)
    │   ├── ActionNotFound (404)
    │   ├── ActivationNotFound (404)
    │   ├── ActionExists (409)             create without overwrite of an existing action
    │   ├── InvalidAction (400)            unknown kind, limits out of range, bad code
    │   ├── PayloadTooLarge (413)
    │   ├── Throttled (429)                namespace rate or concurrency limit
    │   ├── Unsupported (501)              an operation this platform cannot do
    │   ├── PlatformUnavailable (503)      unreachable, 5xx, or shut down
    │   └── ActivationTimeout (504)        activations not finished by a deadline (or lost)
    ├── StoreError (500)
    │   ├── StoreUnavailable (503)         unreachable, or the connection was lost
    │   ├── StoreFull (507)                the store refused a write for want of room
    │   ├── BlobNotFound (404)
    │   ├── BlobCorrupted (500)            a chunk missing or failing its checksum: never wrong data
    │   └── Superseded (409)               a fenced write from an attempt that lost ownership
    ├── EstimationError (422)
    ├── AggregationError (500)
    ├── TrainingDiverged (422)             a loss or weight no longer finite; a retry would too
    ├── AccessError (403)                  the controller's API refused the caller
    │   ├── Unauthenticated (401)          no API key, or one unknown or revoked
    │   └── LimitExceeded (429)            a rate limit or a tenant's quota; retry after a while
    ├── UploadConflict (409)               an upload's part past what is held, or sent twice at once
    ├── TooLarge (413)                     content over a limit of the controller's
    └── JobError (409)                     a job that cannot do what was asked in its state
        ├── JobNotFound (404)
        └── JobFailed (500)                a job stopped by a failure it could not recover from
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import requests
    from pydantic import BaseModel
    from pydantic import ValidationError as PydanticValidationError

#: Key of an action's error result that says a later attempt may succeed (faasdl's convention;
#: actions set it from :attr:`FaasdlError.retryable`, the platform's classifier reads it).
RETRYABLE = "retryable"


def reason(exc: BaseException) -> str:
    """What went wrong beneath a library's wrappers: the message of the innermost exception in
    ``exc``'s chain. (requests' ``ConnectionError`` says "HTTPConnectionPool(host=…, port=…): Max
    retries exceeded with url: … (Caused by NewConnectionError(…))" around the socket's
    "[Errno 111] Connection refused", which is what a user needs.)"""
    inner, seen = exc, {id(exc)}
    while (below := _below(inner)) is not None and id(below) not in seen:
        inner = below
        seen.add(id(inner))
    said = str(inner) or type(inner).__name__
    if getattr(inner, "reason", None) == "WRONG_VERSION_NUMBER":  # ssl's, for an https:// URL
        said += " (the server answered without TLS: is its URL http://?)"
    return said


def body_said(response: requests.Response) -> str:
    """A body that is not the JSON its client expected (a web server's or a proxy's page), by
    its size and type, not printed whole."""
    kind = response.headers.get("content-type", "no content type").partition(";")[0]
    return f"{len(response.content):,} bytes of {kind}"


def _below(exc: BaseException) -> BaseException | None:
    """The exception ``exc`` was raised from, or while handling, unless it was raised ``from
    None``: json's "Expecting value" is, over the ``StopIteration(0)`` its scanner caught, and
    its reason read "0"."""
    if exc.__cause__ is not None:
        return exc.__cause__
    return None if exc.__suppress_context__ else exc.__context__


def lone_surrogate(text: str) -> str | None:
    """Why ``text`` is no Unicode text, or ``None`` if it is: its first lone surrogate (JSON's
    ``"\\ud800"`` reads as one, an undecodable byte of a file name or an argument as another),
    which UTF-8 has no bytes for, so that no record, key or response could hold the text."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a lone surrogate, {text[exc.start]!r} at {exc.start}"
    return None


def not_unicode(value: object) -> tuple[str, str] | None:
    """The first text in ``value`` (a JSON value as Python reads it: its mappings' keys too)
    that is no Unicode text: its place (dotted, "" for ``value`` itself) and why. Walked without
    recursion (a body nested as deep as Python's parser goes is read whole), each list and
    mapping once (a Python caller's may hold itself)."""
    pending: list[tuple[object, tuple[str | int, ...]]] = [(value, ())]
    seen: set[int] = set()
    while pending:
        item, at = pending.pop()
        if isinstance(item, str):
            why = lone_surrogate(item)
            if why is not None:
                return ".".join(map(str, at)), why
            continue
        if not isinstance(item, dict | list) or id(item) in seen:
            continue
        seen.add(id(item))
        children: list[tuple[str | int, object]] = list(
            item.items() if isinstance(item, dict) else enumerate(item)
        )
        for key, _ in children:
            if isinstance(key, str) and (why := lone_surrogate(key)) is not None:
                return ".".join(map(str, at)), f"a field's name holds {why}"
        pending.extend((child, (*at, key)) for key, child in reversed(children))
    return None


class FaasdlError(Exception):
    """Root of every faasdl error."""

    status_code = 500
    #: Whether the same call may succeed later unchanged (a service that was briefly down).
    retryable = False


class ConfigError(FaasdlError):
    """Settings that cannot work together (raised at start-up, never mid-job)."""


class ValidationError(FaasdlError):
    """A request, spec or argument that cannot run. ``field`` names the offending input."""

    status_code = 422

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

    @classmethod
    def from_pydantic(
        cls, exc: PydanticValidationError, *, model: type[BaseModel] | None = None
    ) -> ValidationError:
        """One error for all of pydantic's, named by the first field: ``a.b: msg; c: msg``. With
        the ``model`` validated, each says what would mend it (:func:`explained`) and names its
        field as the user wrote it (no union's tag in it)."""
        problems = []
        for e in exc.errors():
            message = e["msg"] if model is None else explained(model, e)
            loc = e["loc"] if model is None else _without_tags(model, e["loc"])
            problems.append((".".join(str(p) for p in loc), message))
        rest = "".join(f"; {field}: {msg}" for field, msg in problems[1:])
        return cls(problems[0][1] + rest, field=problems[0][0] or None)


def check_unicode(value: object, field: str | None = None) -> None:
    """``ValidationError`` where ``value`` (text, or a JSON value as Python reads it) holds text
    that is no Unicode (:func:`not_unicode`), naming ``field`` and the place within it."""
    found = not_unicode(value)
    if found is not None:
        place, why = found
        named = ".".join(part for part in (field, place) if part) or None
        raise ValidationError(f"is not Unicode text ({why})", field=named)


def explained(model: type[BaseModel], error: Mapping[str, Any]) -> str:
    """pydantic's message for ``error`` (one of ``exc.errors()`` validating ``model``), with
    what a user needs to mend the input: for a field it does not take, the field it may have
    meant (:func:`unknown_field_hint`); for a discriminated union's value without its tag, or not
    a mapping at all, the tag and its values (pydantic says "Unable to extract tag using
    discriminator 'name'" and "Input should be a valid dictionary or object to extract fields
    from")."""
    loc, message = error["loc"], str(error["msg"])
    if error["type"] == "extra_forbidden":
        return message + unknown_field_hint(model, loc)
    tagged = _union_tags(model, loc) if loc else None
    if tagged is None or error["type"] not in ("union_tag_not_found", "model_attributes_type"):
        return message
    tag, values = tagged
    wanted = f"{tag!r} (one of {', '.join(map(repr, values))})"
    if error["type"] == "union_tag_not_found":
        return f"needs {wanted}"
    given = error.get("input")
    if isinstance(given, str) and given in values:
        return f"should be a mapping, {{{tag}: {given}}}, not {given!r}"
    return f"should be a mapping with {wanted}, not {given!r}"


#: Fields listed in a hint at most (a job spec's top level has more: no list, only a match).
HINT_FIELDS = 12


def unknown_field_hint(model: type[BaseModel], loc: Sequence[str | int]) -> str:
    """For an input ``model`` does not take at ``loc`` (pydantic's ``extra_forbidden``): the field
    there it is closest to, else the fields there if they are few; "" where there is neither.
    A discriminated union's tag in ``loc`` (``dataset.npz.pathh``) leads to its member."""
    names = sorted({name for m in _models_at(model, loc[:-1]) for name in m.model_fields})
    # Matched whatever their case: "EPOCHS" was close to no field.
    lowered = {name.lower(): name for name in names}
    if close := difflib.get_close_matches(str(loc[-1]).lower(), list(lowered), n=1, cutoff=0.6):
        return f" (did you mean {lowered[close[0]]!r}?)"
    if names and len(names) <= HINT_FIELDS:
        return f" (expected one of: {', '.join(names)})"
    return ""


def _union_tags(model: type[BaseModel], loc: Sequence[str | int]) -> tuple[str, list[str]] | None:
    """The tag of the discriminated union the field at ``loc`` holds, and its values."""
    here = _models_at(model, loc[:-1])
    fields = [m.model_fields[loc[-1]] for m in here if loc[-1] in m.model_fields]
    tag = fields[0].discriminator if fields else None
    if not isinstance(tag, str):
        return None
    members = _models_in(fields[0].annotation)
    return tag, [v for m in members for v in typing.get_args(m.model_fields[tag].annotation)]


def _without_tags(model: type[BaseModel], loc: Sequence[str | int]) -> list[str | int]:
    """``loc`` without the tags of discriminated unions pydantic puts in it: a user's
    ``dataset.path``, which pydantic locates at ``dataset.npz.path``."""
    here, kept = [model], list[str | int]()
    for part in loc:
        if isinstance(part, int):
            kept.append(part)
            continue
        tag = bool(here) and all(part not in m.model_fields for m in here)
        here = [found for m in here for found in _step(m, part)]
        if not (tag and here):
            kept.append(part)
    return kept


def _models_at(model: type[BaseModel], path: Sequence[str | int]) -> list[type[BaseModel]]:
    """The models the location ``path`` leads to from ``model`` (an int: an item of a list, of
    the same model)."""
    here = [model]
    for part in path:
        if not isinstance(part, int):
            here = [found for m in here for found in _step(m, part)]
    return here


def _step(model: type[BaseModel], part: str) -> list[type[BaseModel]]:
    """The models ``part`` of a location leads to from ``model``: its field's (a union's
    members), or ``model`` itself where ``part`` is its tag in a discriminated union."""
    field = model.model_fields.get(part)
    if field is not None:
        return _models_in(field.annotation)
    fields = model.model_fields.values()
    return [model] if any(part in typing.get_args(f.annotation) for f in fields) else []


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


class DatasetNotFound(ValidationError):
    status_code = 404

    def __init__(self, name: str, *, unfinished: bool = False) -> None:
        what = "unfinished upload as" if unfinished else "uploaded data set"
        super().__init__(f"no {what} {name!r}", field="name")


class PlatformError(FaasdlError):
    """The FaaS platform refused a request or failed to carry it out."""

    status_code = 502


class AuthenticationFailed(PlatformError):
    status_code = 401


class ActionNotFound(PlatformError):
    status_code = 404

    def __init__(self, name: str) -> None:
        super().__init__(f"action '{name}' does not exist")
        self.name = name


class ActivationNotFound(PlatformError):
    status_code = 404

    def __init__(self, activation_id: str) -> None:
        super().__init__(f"activation '{activation_id}' does not exist")
        self.activation_id = activation_id


class ActionExists(PlatformError):
    status_code = 409


class InvalidAction(PlatformError):
    status_code = 400


class PayloadTooLarge(PlatformError):
    status_code = 413


class Throttled(PlatformError):
    """A namespace limit was hit; safe to retry after a backoff."""

    status_code = 429


class Unsupported(PlatformError):
    status_code = 501


class PlatformUnavailable(PlatformError):
    """The platform could not be reached or answered with a server error; retryable."""

    status_code = 503


class ActivationTimeout(PlatformError):
    """Activations did not finish before a deadline; ``pending`` lists their ids."""

    status_code = 504

    def __init__(self, message: str, *, pending: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.pending = tuple(pending)


class StoreError(FaasdlError):
    """The state store refused or failed an operation."""


class StoreUnavailable(StoreError):
    status_code = 503
    retryable = True


class StoreFull(StoreError):
    """The store refused a write for want of room (Redis over its ``maxmemory``, a full disk):
    not retried, since waiting frees nothing; what the refused write had stored is deleted at
    once."""

    status_code = 507


class BlobNotFound(StoreError):
    status_code = 404


class BlobCorrupted(StoreError):
    """A blob's chunk is missing or does not match its checksum."""


class Superseded(StoreError):
    """A write fenced by an owner epoch that is no longer current: the writer is a zombie."""

    status_code = 409


class EstimationError(FaasdlError):
    status_code = 422


class AggregationError(FaasdlError):
    """Models that cannot be merged (shapes differ, no examples, missing results)."""


#: How a :class:`TrainingDiverged` message starts, in an action's error as the controller reads it.
DIVERGED = "training diverged: "


class TrainingDiverged(FaasdlError):
    """A loss or a weight that is no longer finite (NaN or infinite). Training is deterministic,
    so every attempt would end the same: the job's learning rate (or its data) must change.
    ``where`` says what was found, ``trained_with`` the optimizer and rate it trained at."""

    status_code = 422

    def __init__(self, where: str, *, trained_with: str | None = None) -> None:
        how = f" ({trained_with})" if trained_with else ""
        super().__init__(f"{DIVERGED}{where}{how}: a lower learning_rate may train")


class AccessError(FaasdlError):
    """The caller is known but may not do this (another tenant's name, an administrator's view)."""

    status_code = 403


class Unauthenticated(AccessError):
    """No API key, or one the controller does not know or has revoked."""

    status_code = 401


class LimitExceeded(AccessError):
    """A rate limit or a tenant's quota; ``retry_after_s`` says when to try again."""

    status_code = 429

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UploadConflict(FaasdlError):
    """An upload that cannot go on as sent: another of the same file is arriving, or a part
    starts past what the controller holds of it."""

    status_code = 409


class TooLarge(FaasdlError):
    """A request's content over a limit of the controller's (413)."""

    status_code = 413


class JobError(FaasdlError):
    """A job that cannot do what was asked in its state (e.g. the model of an unfinished job, or
    an ``Idempotency-Key`` reused for a different request)."""

    status_code = 409


class JobNotFound(JobError):
    status_code = 404

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job_id: no job {job_id!r}")
        self.job_id = job_id


class JobFailed(JobError):
    """A unit failed more often than its policy allows, or in a way no retry can mend."""

    status_code = 500
