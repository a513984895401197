"""``OpenWhiskPlatform``: the Platform seam over OpenWhisk's REST API v1 (``requests``).

Follows reference/openwhisk.md §7: invoke non-blocking (or blocking without ``result`` for a single
call), treat 404 on an activation as "pending", poll with growing delays, and enforce a deadline of
its own because a lost activation is never recorded. 429 and unavailability are retried with
jittered exponential backoff (tenacity), every HTTP or network error becomes a faasdl error.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import requests
from tenacity import (
    RetryCallState,
    before_sleep_log,
    retry,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from faasdl.config import OpenWhiskSettings
from faasdl.errors import (
    ActionExists,
    ActionNotFound,
    ActivationNotFound,
    ActivationTimeout,
    AuthenticationFailed,
    InvalidAction,
    PayloadTooLarge,
    PlatformError,
    PlatformUnavailable,
    Throttled,
    Unsupported,
    body_said,
    reason,
)
from faasdl.platform.base import (
    Action,
    ActionSpec,
    Activation,
    Platform,
    PlatformLimits,
    tell_retried,
)

log = logging.getLogger(__name__)
_log_retry = before_sleep_log(log, logging.WARNING)

_MB = 1024 * 1024
#: The longest a ping waits for an answer (``request_timeout_s`` where that is shorter): the
#: controller's readiness probe asks it, and a probe must answer within its own timeout, a
#: platform that hangs or not (Kubernetes' default: 1 s; the chart gives it 5).
PING_TIMEOUT_S = 2.0


class _Missing(PlatformError):
    """404 from OpenWhisk; each caller knows what was missing and raises the precise error."""

    status_code = 404


class _NotOpen(PlatformUnavailable):
    """A call on a client not opened, or closed: no retry makes it answer."""

    def __init__(self) -> None:
        super().__init__("the OpenWhisk client is not open (call open() first)")


def _error_text(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return response.text.strip() or response.reason


class OpenWhiskPlatform(Platform):
    """A real OpenWhisk (or ``faasdl platform serve``). See the seam for the contract."""

    name = "openwhisk"

    def __init__(self, *, settings: OpenWhiskSettings | None = None) -> None:
        self.settings = settings or OpenWhiskSettings()
        self.action_image = self.settings.action_image
        self._session: requests.Session | None = None
        # Given with each request: a session's own is overridden by REQUESTS_CA_BUNDLE where
        # that is set (requests' merge of the environment), verify_tls false and ca_file too.
        ca_file = self.settings.ca_file
        self._verify: bool | str = str(ca_file) if ca_file is not None else self.settings.verify_tls
        self._limits: PlatformLimits | None = None
        self._timeouts: dict[str, int] = {}
        retrying = retry(
            retry=retry_if_exception_type((Throttled, PlatformUnavailable))
            & retry_if_not_exception_type(_NotOpen),
            wait=wait_random_exponential(multiplier=0.1, max=self.settings.retry_max_wait_s),
            stop=stop_after_attempt(self.settings.retry_attempts),
            before_sleep=self._retrying,
            reraise=True,
        )
        self._request_retrying = retrying(self._request)
        self._read_limits_retrying = retrying(self._read_limits)

    def _retrying(self, state: RetryCallState) -> None:
        """Before a failed call is asked again: logged, and at a call's first unanswered try
        told to whoever listens in this thread (a job's log; a throttled call is answered)."""
        _log_retry(state)
        error = state.outcome.exception() if state.outcome is not None else None
        if state.attempt_number == 1 and isinstance(error, PlatformUnavailable):
            tell_retried(
                f"{error}; asking again ({self.settings.retry_attempts} tries in all, "
                "FAASDL_OPENWHISK__RETRY_ATTEMPTS)"
            )

    # -- HTTP ------------------------------------------------------------------------------

    def open(self) -> None:
        if self._session is not None:
            return
        session = requests.Session()
        uuid, _, key = self.settings.auth.get_secret_value().partition(":")
        session.auth = (uuid, key)
        session.headers["Content-Type"] = "application/json"
        self._session = session
        try:
            # Retried as every call is: an API restarting as the controller starts is waited out.
            self._limits = self._read_limits_retrying()
        except BaseException:
            self._session = None  # not half open: a later open() reads the limits again
            session.close()
            raise

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def _url(self, path: str) -> str:
        ns = quote(self.settings.namespace, safe="")
        return f"{self.settings.api_host.rstrip('/')}/api/v1/namespaces/{ns}/{path}"

    def _request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        ok: tuple[int, ...] = (200,),
        waits_s: float = 0.0,
        timeout_s: float | None = None,
    ) -> requests.Response:
        """One HTTP call; a status outside ``ok`` is translated into the faasdl tree. ``waits_s``:
        how long the server may hold its answer by design (a blocking invoke's window), allowed
        beyond the request timeout (or ``timeout_s``, where given)."""
        if self._session is None:
            raise _NotOpen
        setting = timeout_s is None  # a timeout of the setting's names it
        timeout_s = waits_s + (self.settings.request_timeout_s if timeout_s is None else timeout_s)
        try:
            response = self._session.request(
                method, url, json=json_body, params=params, timeout=timeout_s, verify=self._verify
            )
        except requests.RequestException as exc:
            raise PlatformUnavailable(
                f"cannot reach OpenWhisk at {self.settings.api_host}: "
                f"{self._failure(exc, timeout_s, setting=setting)}"
            ) from exc
        if response.status_code in ok:
            return response
        text = _error_text(response)
        status = response.status_code
        error: PlatformError
        if status == 401 or status == 403:
            error = AuthenticationFailed(f"OpenWhisk refused the credentials ({status}): {text}")
        elif status == 404:
            error = _Missing(text)
        elif status == 409:
            error = ActionExists(text)
        elif status == 413:
            error = PayloadTooLarge(text)
        elif status == 429:
            error = Throttled(text)
        elif status == 400:
            error = InvalidAction(text)
        elif status >= 500:
            error = PlatformUnavailable(f"OpenWhisk answered {status}: {text}")
        else:
            error = PlatformError(f"OpenWhisk answered {status}: {text}")
        raise error

    def _failure(self, exc: Exception, timeout_s: float, *, setting: bool = True) -> str:
        """What failed, in a line: requests' own messages wrap it in the connection pool's. A
        timeout names ``request_timeout_s`` where that ``setting`` set it."""
        if isinstance(exc, requests.Timeout):
            named = " (FAASDL_OPENWHISK__REQUEST_TIMEOUT_S)" if setting else ""
            return f"no answer in {timeout_s:g} s{named}"
        return reason(exc)

    def _call(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        return self._request_retrying(method, url, **kwargs)

    # -- limits ----------------------------------------------------------------------------

    def _read_limits(self) -> PlatformLimits:
        try:
            response = self._session.get(  # type: ignore[union-attr]
                self.settings.api_host.rstrip("/") + "/",
                timeout=self.settings.request_timeout_s,
                verify=self._verify,
            )
            response.raise_for_status()
        except requests.RequestException as exc:
            raise PlatformUnavailable(
                f"cannot read OpenWhisk's limits from {self.settings.api_host}/: "
                f"{self._failure(exc, self.settings.request_timeout_s)}"
            ) from exc
        try:
            info = response.json()
        except ValueError:
            info = None
        if not isinstance(info, dict):  # a web server's page: not asked again (it was, ~90 s)
            raise PlatformError(
                f"{self.settings.api_host}/ answered {body_said(response)}, not OpenWhisk's "
                "JSON: is FAASDL_OPENWHISK__API_HOST OpenWhisk's API?"
            )
        limits = info.get("limits") or {}
        runtimes = info.get("runtimes") or {}
        kinds = [r["kind"] for family in runtimes.values() for r in family if "kind" in r]

        def mb(key: str, default: int) -> int:
            value = limits.get(key)
            return int(value) // _MB if isinstance(value, int) else default

        def num(key: str, default: int | None) -> int | None:
            value = limits.get(key)
            return int(value) if isinstance(value, int) else default

        pool = num("container_pool_user_memory", None)
        # OpenWhisk's defaults (reference/openwhisk.md §3) where /info does not say.
        return PlatformLimits(
            memory_min_mb=mb("min_action_memory", 128),
            memory_max_mb=mb("max_action_memory", 512),
            memory_std_mb=mb("std_action_memory", 256),
            timeout_min_ms=num("min_action_duration", 100) or 100,
            timeout_max_ms=num("max_action_duration", 300_000) or 300_000,
            timeout_std_ms=num("std_action_duration", 60_000) or 60_000,
            pool_memory_mb=pool // _MB if pool else None,
            concurrent_invocations=num("concurrent_actions", None),
            invocations_per_minute=num("actions_per_minute", None),
            payload_max_bytes=num("payload_max", 1_048_576),
            kinds=kinds,
            memory_enforcement=limits.get("memory_enforcement"),
        )

    def limits(self) -> PlatformLimits:
        if self._limits is None:
            raise _NotOpen
        return self._limits

    def ping(self) -> None:
        shorter = self.settings.request_timeout_s > PING_TIMEOUT_S  # than the setting's
        self._request(
            "GET",
            self.settings.api_host.rstrip("/") + "/api/v1/namespaces",
            timeout_s=PING_TIMEOUT_S if shorter else None,
        )

    # -- actions ---------------------------------------------------------------------------

    def deploy(self, spec: ActionSpec, *, overwrite: bool = True) -> Action:
        spec.validate_name()
        code = spec.code
        exec_: dict[str, Any] = {
            "kind": spec.kind,
            "code": base64.b64encode(code).decode("ascii") if isinstance(code, bytes) else code,
            "main": spec.main,
        }
        if spec.image is not None:
            exec_["image"] = spec.image
        limits = {
            k: v
            for k, v in (
                ("memory", spec.memory_mb),
                ("timeout", spec.timeout_ms),
                ("logs", spec.logs_mb),
            )
            if v is not None
        }
        body: dict[str, Any] = {
            "exec": exec_,
            "parameters": [{"key": k, "value": v} for k, v in spec.parameters.items()]
            + [{"key": k, "value": v, "init": True} for k, v in spec.environment.items()],
            "annotations": [{"key": k, "value": v} for k, v in spec.annotations.items()],
        }
        if limits:
            body["limits"] = limits
        response = self._call(
            "PUT",
            self._url(f"actions/{quote(spec.name)}"),
            json_body=body,
            params={"overwrite": str(overwrite).lower()},
        )
        action = Action.model_validate(response.json())
        self._timeouts[spec.name] = action.limits.timeout
        return action.model_copy(update={"exec": action.exec.model_copy(update={"code": None})})

    def get_action(self, name: str, *, code: bool = False) -> Action:
        try:
            response = self._call(
                "GET", self._url(f"actions/{quote(name)}"), params={"code": str(code).lower()}
            )
        except _Missing as exc:
            raise ActionNotFound(name) from exc
        action = Action.model_validate(response.json())
        self._timeouts[name] = action.limits.timeout
        return action

    def list_actions(self) -> list[Action]:
        out: list[Action] = []
        skip = 0
        while True:
            page = self._call(
                "GET", self._url("actions"), params={"limit": 200, "skip": skip}
            ).json()
            out.extend(Action.model_validate(a) for a in page)
            if len(page) < 200:
                return out
            skip += len(page)

    def delete_action(self, name: str) -> None:
        try:
            self._call("DELETE", self._url(f"actions/{quote(name)}"))
        except _Missing as exc:
            raise ActionNotFound(name) from exc
        self._timeouts.pop(name, None)

    # -- activations -----------------------------------------------------------------------

    def invoke(self, name: str, params: Mapping[str, Any] | None = None) -> str:
        try:
            response = self._call(
                "POST",
                self._url(f"actions/{quote(name)}"),
                json_body=dict(params or {}),
                params={"blocking": "false"},
                ok=(202,),
            )
        except _Missing as exc:
            raise ActionNotFound(name) from exc
        return str(response.json()["activationId"])

    def call(
        self, name: str, params: Mapping[str, Any] | None = None, *, timeout_s: float | None = None
    ) -> Activation:
        """Blocking invoke without ``result`` (the full record comes back on 200/502/500); on 202
        the activation outlived the blocking window and is polled for."""
        started = time.monotonic()
        if timeout_s is None:
            timeout_s = self.lost_deadline_s(name)
        wait_ms = max(1, min(self.settings.blocking_wait_ms, int(timeout_s * 1000)))
        try:
            response = self._call(
                "POST",
                self._url(f"actions/{quote(name)}"),
                json_body=dict(params or {}),
                params={"blocking": "true", "timeout": wait_ms},
                ok=(200, 202, 500, 502),
                waits_s=wait_ms / 1000,
            )
        except _Missing as exc:
            raise ActionNotFound(name) from exc
        body = response.json()
        if response.status_code != 202 and isinstance(body, dict) and "response" in body:
            return Activation.model_validate(body)
        activation_id = response.headers.get("x-openwhisk-activation-id") or body["activationId"]
        remaining = timeout_s - (time.monotonic() - started)
        return self.wait([activation_id], timeout_s=max(0.0, remaining))[activation_id]

    def lost_deadline_s(self, name: str) -> float:
        timeout_ms = self._timeouts.get(name)
        if timeout_ms is None:
            timeout_ms = self.get_action(name).limits.timeout
        return 2 * timeout_ms / 1000 + self.settings.lost_grace_s

    def get_activation(self, activation_id: str) -> Activation | None:
        try:
            response = self._call("GET", self._url(f"activations/{quote(activation_id)}"))
        except _Missing:
            return None
        return Activation.model_validate(response.json())

    def _wait(self, activation_ids: list[str], timeout_s: float) -> dict[str, Activation]:
        deadline = time.monotonic() + timeout_s
        delay = self.settings.poll_initial_s
        done: dict[str, Activation] = {}
        while True:
            for activation_id in activation_ids:
                if activation_id not in done:
                    record = self.get_activation(activation_id)
                    if record is not None:
                        done[activation_id] = record
            missing = [i for i in activation_ids if i not in done]
            if not missing:
                return {i: done[i] for i in activation_ids}
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ActivationTimeout(
                    f"{len(missing)} activation(s) not recorded after {timeout_s:g} s "
                    "(still running, or lost)",
                    pending=missing,
                )
            time.sleep(min(delay, remaining))
            delay = min(delay * 1.5, self.settings.poll_max_s)

    def list_activations(
        self, *, name: str | None = None, since_ms: int | None = None, limit: int = 30
    ) -> list[Activation]:
        params: dict[str, Any] = {"docs": "true", "limit": min(max(limit, 1), 200)}
        if name is not None:
            params["name"] = name
        if since_ms is not None:
            params["since"] = since_ms
        page = self._call("GET", self._url("activations"), params=params).json()
        return [Activation.model_validate(r) for r in page]

    def prewarm(self, name: str, count: int = 1, params: Mapping[str, Any] | None = None) -> int:
        ids = [self.invoke(name, params or {"warmup": True}) for _ in range(count)]
        records = self.wait(ids, timeout_s=self.lost_deadline_s(name))
        return sum(1 for r in records.values() if r.success)

    def kill(self, activation_id: str) -> None:
        if not self.settings.admin_url:
            raise Unsupported(
                "OpenWhisk's API cannot kill an activation's container; use the Kubernetes pod "
                "injector, or set openwhisk.admin_url for faasdl's embedded server"
            )
        url = f"{self.settings.admin_url.rstrip('/')}/activations/{quote(activation_id)}/kill"
        try:
            self._call("POST", url, ok=(204,))
        except _Missing as exc:
            raise ActivationNotFound(activation_id) from exc
