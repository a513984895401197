"""The ``Platform`` seam: what faasdl needs from a FaaS platform, and OpenWhisk's records.

Two implementations pass one contract suite (``tests/platform/test_contract.py``):
:class:`~faasdl.platform.local.LocalPlatform`, the embedded platform, and
:class:`~faasdl.platform.openwhisk.OpenWhiskPlatform`, the REST API v1 client.
Records mirror OpenWhisk's JSON (reference/openwhisk.md §1-2) field for field, so a record read
from a real OpenWhisk and one made by the embedded platform are the same type.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from enum import IntEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from faasdl.config import OPENWHISK_NAME
from faasdl.errors import InvalidAction, not_unicode
from faasdl.lifecycle import Resource

#: Who hears, in this thread, that a platform's call failed and is asked again (a line saying
#: so): a job's runner tells its log, where the pause shows only once every try has failed.
_RETRIED: ContextVar[Callable[[str], None] | None] = ContextVar("faasdl_retried", default=None)


@contextlib.contextmanager
def retries_told(listener: Callable[[str], None]) -> Iterator[None]:
    """Within the block, this thread's platform calls tell ``listener`` when one that failed
    is asked again."""
    token = _RETRIED.set(listener)
    try:
        yield
    finally:
        _RETRIED.reset(token)


def tell_retried(line: str) -> None:
    """Tell the listener of :func:`retries_told`, if there is one, that a call is asked again."""
    listener = _RETRIED.get()
    if listener is not None:
        listener(line)


#: How deep arrays and objects may nest in the JSON the platform reads: well inside what Python's
#: recursion can encode again within a response.
MAX_JSON_DEPTH = 200


def parse_json(data: str | bytes | bytearray) -> Any:
    """JSON as OpenWhisk reads it: Python's ``json`` also reads ``NaN`` and ``±Infinity``, which
    JSON has not, OpenWhisk's parser refuses, and no JSON response can carry (the embedded
    server answered 500 for a request or a result that held one). A value nested deeper than
    :data:`MAX_JSON_DEPTH` is refused too: one that Python's recursion could read but not write
    back inside a response reset the connection; and so is text with a lone surrogate (an escape
    such as ``"\\ud800"``), which no response, being UTF-8, can hold either (an action
    created with one in an annotation answered 500, and so did every list of actions after it).
    Raises ``ValueError``."""
    too_deep = f"nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        value = json.loads(data, parse_constant=_not_json)
    except RecursionError:
        raise ValueError(too_deep) from None
    if not _within_depth(value, MAX_JSON_DEPTH):
        raise ValueError(too_deep)
    if isinstance(data, str):
        escaped = _SURROGATE_ESCAPE.search(data) is not None
    else:
        escaped = _SURROGATE_ESCAPE_BYTES.search(data) is not None
    if escaped and (found := not_unicode(value)) is not None:
        place, why = found
        raise ValueError(f"{place or 'the value'}: is not Unicode text ({why})")
    return value


#: The escapes JSON writes a surrogate as (U+D800-U+DFFF): only a text holding one can hold a lone
#: one (UTF-8's bytes cannot encode a surrogate), so that the others are not walked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")


def _within_depth(value: Any, most: int) -> bool:
    """Whether no array or object in ``value`` lies deeper than ``most`` (walked without
    recursion, containers only)."""
    pending = [(value, 1)] if isinstance(value, (dict, list)) else []
    while pending:
        item, depth = pending.pop()
        if depth > most:
            return False
        children = item.values() if isinstance(item, dict) else item
        pending.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return True


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")


#: ``response.status`` for each OpenWhisk status code (``ActivationResponse.messageForCode``).
SUCCESS = "success"
APPLICATION_ERROR = "application error"
DEVELOPER_ERROR = "action developer error"
WHISK_ERROR = "whisk internal error"

#: An action's name, in a package or not (a last character that is a space was taken).
_NAME = re.compile(rf"{OPENWHISK_NAME}(?:/{OPENWHISK_NAME})?")


class StatusCode(IntEnum):
    SUCCESS = 0
    APPLICATION_ERROR = 1
    DEVELOPER_ERROR = 2
    WHISK_ERROR = 3

    @property
    def status(self) -> str:
        return (SUCCESS, APPLICATION_ERROR, DEVELOPER_ERROR, WHISK_ERROR)[self]


class KeyValue(BaseModel):
    key: str
    value: Any = None
    #: An action's init parameter (OpenWhisk's ``"init": true``, written only where true): set in
    #: its container's environment as it starts, never among a run's arguments.
    init: bool | None = None
    #: How a parameter's value is encrypted at rest, where the platform encrypts them (OpenWhisk's
    #: parameter storage: ``"aes128"``): its value is then the ciphertext, not the value set.
    encryption: str | None = None


class ActionLimits(BaseModel):
    """Per-action limits; OpenWhisk's field names and units (MB, ms, MB)."""

    model_config = ConfigDict(extra="ignore")

    memory: int = 256
    timeout: int = 60_000
    logs: int = 10
    concurrency: int = 1


class ActionExec(BaseModel):
    model_config = ConfigDict(extra="ignore")

    kind: str
    code: str | None = None
    image: str | None = None
    main: str | None = None
    binary: bool = False


class Action(BaseModel):
    """An action as OpenWhisk returns it (swagger ``Action``)."""

    model_config = ConfigDict(extra="ignore")

    namespace: str
    name: str
    version: str = "0.0.1"
    publish: bool = False
    exec: ActionExec
    annotations: list[KeyValue] = Field(default_factory=list)
    parameters: list[KeyValue] = Field(default_factory=list)
    limits: ActionLimits = Field(default_factory=ActionLimits)
    updated: int | None = None


class ActionSpec(BaseModel):
    """What to deploy: ``code`` is Python source (``str``) or a zip holding ``__main__.py``; with
    kind ``blackbox``, ``image`` is the container image that runs it (the code is still sent to
    the image's ``/init``, as OpenWhisk's Python images take it)."""

    name: str
    code: str | bytes
    kind: str = "python:3.11"
    image: str | None = None
    main: str = "main"
    memory_mb: int | None = None
    timeout_ms: int | None = None
    logs_mb: int | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    #: Init parameters (OpenWhisk's parameters marked ``init``): kept in the action's record and
    #: set as its containers' environment as they start (``/init``'s ``env``; a value that is no
    #: text as its JSON), never passed to a run. faasdl's actions get the store's settings so
    #: (:func:`faasdl.store.action_environment`).
    environment: dict[str, Any] = Field(default_factory=dict)
    annotations: dict[str, Any] = Field(default_factory=dict)

    def validate_name(self) -> None:
        if not _NAME.fullmatch(self.name) or len(self.name) > 256:
            raise InvalidAction(f"action name '{self.name}' contains illegal characters")


class ActivationResponse(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: str
    success: bool
    result: Any = None
    size: int | None = None


class Activation(BaseModel):
    """An activation record (OpenWhisk ``WhiskActivation.toExtendedJson``)."""

    model_config = ConfigDict(extra="ignore")

    namespace: str
    name: str
    subject: str = ""
    activationId: str
    start: int
    end: int = 0
    duration: int | None = None
    version: str = "0.0.1"
    publish: bool = False
    cause: str | None = None
    annotations: list[KeyValue] = Field(default_factory=list)
    logs: list[str] = Field(default_factory=list)
    response: ActivationResponse

    def annotation(self, key: str, default: Any = None) -> Any:
        for kv in self.annotations:
            if kv.key == key:
                return kv.value
        return default

    @property
    def success(self) -> bool:
        return self.response.success

    @property
    def error(self) -> str | None:
        """``response.result.error`` when the activation failed, else ``None``."""
        result = self.response.result
        if not self.response.success and isinstance(result, dict):
            err = result.get("error")
            return err if isinstance(err, str) else (None if err is None else str(err))
        return None

    @property
    def init_time(self) -> int | None:
        """Milliseconds spent in ``/init``; present only on a cold start."""
        value = self.annotation("initTime")
        return int(value) if value is not None else None

    @property
    def wait_time(self) -> int:
        return int(self.annotation("waitTime", 0))

    @property
    def timed_out(self) -> bool:
        return bool(self.annotation("timeout", False))

    @property
    def memory_mb(self) -> int | None:
        limits = self.annotation("limits")
        return int(limits["memory"]) if isinstance(limits, dict) and "memory" in limits else None


class PlatformLimits(BaseModel):
    """What a platform allows; the estimator and admission plan within these."""

    memory_min_mb: int
    memory_max_mb: int
    memory_std_mb: int
    timeout_min_ms: int
    timeout_max_ms: int
    timeout_std_ms: int
    pool_memory_mb: int | None = Field(
        None, description="Container pool user memory (None when the platform does not say)."
    )
    concurrent_invocations: int | None = None
    invocations_per_minute: int | None = None
    payload_max_bytes: int | None = None
    kinds: list[str] = Field(default_factory=list)
    memory_enforcement: str | None = Field(
        None, description="How memory limits are enforced (embedded platform only)."
    )


def variant_name(base: str, memory_mb: int, timeout_ms: int) -> str:
    """Name of an action variant for a memory/time class: OpenWhisk limits are per action."""
    return f"{base}-m{memory_mb}-t{-(-timeout_ms // 1000)}s"


class Platform(Resource):
    """A FaaS platform with OpenWhisk's semantics.

    Constructors take keyword arguments and do no I/O; :meth:`open` connects or starts,
    :meth:`close` releases everything (for the embedded platform: every container process).
    Both are idempotent, and the class is a context manager.

    Errors are always members of :mod:`faasdl.errors`: a throttle is
    :class:`~faasdl.errors.Throttled` (an implementation that talks to a remote platform retries
    it with jittered backoff first), an unreachable or failing platform is
    :class:`~faasdl.errors.PlatformUnavailable`, a missing action is
    :class:`~faasdl.errors.ActionNotFound`. A failed *activation* is not an exception:
    it is a record whose ``response.success`` is false (classify it with
    :func:`faasdl.platform.classify.classify`).
    """

    name: str
    #: The blackbox image faasdl's own actions run in on this platform; ``None``: its Python
    #: runtime runs them (the embedded platform's has faasdl installed).
    action_image: str | None = None
    #: Whether :meth:`close` kills the activations still running (the embedded platform, which
    #: lives in its user's process): a controller stopping then waits for them a while first.
    kills_on_close: bool = False

    @abstractmethod
    def open(self) -> None:
        """Connect or start. Raises ``PlatformUnavailable`` if the platform cannot be reached."""

    @abstractmethod
    def close(self) -> None:
        """Release every resource. Activations still running are killed (embedded platform)."""

    @abstractmethod
    def limits(self) -> PlatformLimits:
        """The platform's limits (a remote platform's as read when it was opened)."""

    @abstractmethod
    def ping(self) -> None:
        """Ask the platform, once and without retrying, whether it answers now. Raises
        ``PlatformUnavailable`` (``AuthenticationFailed`` where it refuses the key): the
        controller's readiness probe, and how a job paused by an outage learns it is over."""

    @abstractmethod
    def deploy(self, spec: ActionSpec, *, overwrite: bool = True) -> Action:
        """Create or update an action. Limits left out take the platform's standard values.

        Raises ``InvalidAction`` (unknown kind, limits out of range, code too large or empty, bad
        name) and, with ``overwrite=False`` on an existing action, ``ActionExists``. Updating an
        action never changes an activation already running; new activations use the new code.
        """

    @abstractmethod
    def get_action(self, name: str, *, code: bool = False) -> Action:
        """The action, with its code only if ``code`` (``exec.code``: the source, or a zip in
        base64). Raises ``ActionNotFound``."""

    @abstractmethod
    def list_actions(self) -> list[Action]:
        """Every action of the namespace."""

    @abstractmethod
    def delete_action(self, name: str) -> None:
        """Delete an action; its warm containers go too. Raises ``ActionNotFound``."""

    @abstractmethod
    def invoke(self, name: str, params: Mapping[str, Any] | None = None) -> str:
        """Start an activation and return its id at once (non-blocking).

        Raises ``ActionNotFound``, ``PayloadTooLarge``, and ``Throttled`` when a namespace limit is
        hit (after the implementation's own retries, if any). A full container pool is *not* an
        error: the activation waits in the pool's FIFO queue and its ``waitTime`` shows it.
        """

    @abstractmethod
    def get_activation(self, activation_id: str) -> Activation | None:
        """The finished activation's record, or ``None`` while it is not yet recorded.

        OpenWhisk answers 404 both for "still running" and for "never existed"; callers enforce
        their own deadline (see :meth:`wait`).
        """

    def forgot(self, activation_id: str) -> bool:
        """Whether the platform can tell that ``activation_id`` will never be recorded here: it
        is neither running nor recorded (an embedded platform started after the one that ran it,
        with the process of a controller that died). OpenWhisk cannot tell (its 404 is also "not
        yet"), so by default ``False``."""
        return False

    def wait(self, activation_ids: Iterable[str], *, timeout_s: float) -> dict[str, Activation]:
        """Wait until every activation is recorded; return the records by id.

        Raises ``ActivationTimeout`` (with ``pending`` set) when ``timeout_s`` passes first.
        """
        return self._wait(list(activation_ids), timeout_s)

    @abstractmethod
    def _wait(self, activation_ids: list[str], timeout_s: float) -> dict[str, Activation]: ...

    def wait_any(self, activation_ids: list[str], *, timeout_s: float) -> bool:
        """Wait until at least one of the activations is recorded; answer whether one is.

        OpenWhisk offers no notification, so this polls with a growing delay (0.05 s to 1 s); the
        embedded platform overrides it to wake on the record itself.
        """
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while not any(self.get_activation(i) is not None for i in activation_ids):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(delay, remaining))
            delay = min(2 * delay, 1.0)
        return True

    def call(
        self, name: str, params: Mapping[str, Any] | None = None, *, timeout_s: float | None = None
    ) -> Activation:
        """Invoke and wait for the record. ``timeout_s`` defaults to the activation's lost-deadline:
        twice the action's time limit plus a grace period (reference/openwhisk.md §7)."""
        activation_id = self.invoke(name, params)
        if timeout_s is None:
            timeout_s = self.lost_deadline_s(name)
        return self.wait([activation_id], timeout_s=timeout_s)[activation_id]

    def lost_deadline_s(self, name: str) -> float:
        """How long to wait for an activation of ``name`` before calling it lost."""
        return 2 * self.get_action(name).limits.timeout / 1000 + 60.0

    @abstractmethod
    def list_activations(
        self, *, name: str | None = None, since_ms: int | None = None, limit: int = 30
    ) -> list[Activation]:
        """Recorded activations, newest first; ``name`` filters by action, ``since_ms`` by start."""

    @abstractmethod
    def prewarm(self, name: str, count: int = 1, params: Mapping[str, Any] | None = None) -> int:
        """Get ``count`` spare initialized containers of ``name`` ready, so that the next
        activations skip the cold start (Canary's runtime replicas). Returns how many are ready.
        A spare is used up by the activation that takes it: the containers activations leave
        warm are not counted (they are the running work's own, not replicas).

        On the embedded platform these are real idle containers that reserve pool memory. On
        OpenWhisk they are warm-up invocations with ``{"warmup": true}``, which faasdl's actions
        answer at once after importing everything; OpenWhisk keeps the containers warm.
        ``params`` (with ``"warmup": true``) are a warm-up call's parameters, made once a new
        container is initialized: the training action builds and traces the trainer they name.
        """

    @abstractmethod
    def kill(self, activation_id: str) -> None:
        """Kill the container running ``activation_id`` (failure injection).

        The activation then ends as an action developer error ("did not produce a valid response
        and exited unexpectedly"). Raises ``ActivationNotFound`` if it is not running and
        ``Unsupported`` where the platform gives no way to do it.
        """

    def stop(self, activation_id: str) -> None:
        """Stop an activation the caller no longer wants (its job was cancelled or failed): kill
        its container, or, where the platform can, keep one still waiting for a container from
        starting. Raises as :meth:`kill` does."""
        self.kill(activation_id)
