"""``LocalPlatform``: OpenWhisk's semantics on one machine, the default platform of faasdl.

It plays controller and invoker at once: it validates and stores actions, throttles invocations
per namespace as OpenWhisk does, queues them in the container pool, runs them in container
processes, enforces memory and time limits by killing, and writes activation records with
OpenWhisk's statuses, error texts and annotations.
"""

from __future__ import annotations

import base64
import binascii
import io
import itertools
import json
import os
import sys
import threading
import time
import uuid
import zipfile
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from faasdl.config import LocalPlatformSettings
from faasdl.errors import (
    ActionExists,
    ActionNotFound,
    ActivationNotFound,
    ActivationTimeout,
    InvalidAction,
    PayloadTooLarge,
    PlatformUnavailable,
    Throttled,
)
from faasdl.platform import messages
from faasdl.platform.base import (
    Action,
    ActionExec,
    ActionLimits,
    ActionSpec,
    Activation,
    ActivationResponse,
    KeyValue,
    Platform,
    PlatformLimits,
    StatusCode,
)
from faasdl.platform.local.container import CallResult, Container, KillReason, Reply
from faasdl.platform.local.leftovers import PlatformDir, new_tag, remove_leftovers
from faasdl.platform.local.memory import CGROUP_ROOTS, MemoryGuard, make_guard
from faasdl.platform.local.pool import ContainerPool, PoolClosed, Work
from faasdl.platform.local.sealed import ENCRYPTION, Seal

HOST_KIND = f"python:{sys.version_info.major}.{sys.version_info.minor}"
#: Kinds the embedded platform runs, all with this interpreter. ``python:3`` and
#: ``python:default`` are the aliases OpenWhisk's manifests resolve to their default.
KINDS = (HOST_KIND, "python:3", "python:default")


@dataclass(frozen=True)
class _Deployed:
    action: Action  # with exec.code set (source text, or base64 of the zip)

    @property
    def key(self) -> str:
        return f"{self.action.name}@{self.action.version}"


Callback = Callable[[Activation], None]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _environment_value(value: Any) -> str:
    """An init parameter's value as its container's environment holds it."""
    return value if isinstance(value, str) else json.dumps(value)


def _bump(version: str) -> str:
    major, minor, patch = (int(x) for x in version.split("."))
    return f"{major}.{minor}.{patch + 1}"


class LocalPlatform(Platform):
    """The embedded platform. See :class:`~faasdl.platform.base.Platform` for the contract."""

    name = "local"
    kills_on_close = True

    def __init__(
        self, *, settings: LocalPlatformSettings | None = None, subject: str = "guest"
    ) -> None:
        self.settings = settings or LocalPlatformSettings()
        self.subject = subject
        self._lock = threading.Condition()
        self._actions: dict[str, _Deployed] = {}
        self._records: OrderedDict[str, Activation] = OrderedDict()
        self._pending: dict[str, list[Callback]] = {}
        self._minute: deque[float] = deque()
        self._minute_lock = threading.Lock()
        self._guard: MemoryGuard | None = None
        self._workdirs: PlatformDir | None = None
        self._pool: ContainerPool | None = None
        self._container_ids = itertools.count(1)
        key = self.settings.parameter_storage_key
        self._seal = Seal(base64.b64decode(key.get_secret_value())) if key else None

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            if self._pool is not None:
                return
            s = self.settings
            remove_leftovers(CGROUP_ROOTS)
            tag = new_tag()
            workdirs = PlatformDir(tag)  # before the cgroups named after it
            try:
                self._guard = make_guard(
                    s.memory_enforcement, watchdog_interval_s=s.watchdog_interval_ms / 1000, tag=tag
                )
            except BaseException:
                workdirs.remove()
                raise
            self._workdirs = workdirs
            self._pool = ContainerPool(
                memory_mb=s.pool_memory_mb,
                idle_timeout_s=s.idle_timeout_s,
                new_container=self._new_container,
                max_workers=s.pool_memory_mb // s.memory_min_mb + 8,
            )
            self._pool.start()

    def close(self) -> None:
        with self._lock:
            pool, guard = self._pool, self._guard
            self._pool = None
        if pool is None:
            return
        for work in pool.close():
            self._record_failure(
                work.activation_id,
                StatusCode.WHISK_ERROR,
                "The platform shut down before the activation started.",
            )
        if guard is not None:
            guard.close()
        if self._workdirs is not None:
            self._workdirs.remove()
        remove_leftovers(CGROUP_ROOTS)  # again: a killed platform's containers may run at open

    def _new_container(self, action_key: str, memory_mb: int) -> Container:
        # Called by the pool with its lock held: it must not take this platform's lock.
        assert self._guard is not None
        assert self._workdirs is not None
        return Container(
            container_id=f"c{next(self._container_ids):05d}",
            action_key=action_key,
            memory_mb=memory_mb,
            guard=self._guard,
            workdir_root=self._workdirs.path,
            start_timeout_s=self.settings.container_start_timeout_s,
            nice=self.settings.container_nice,
        )

    def _running_pool(self) -> ContainerPool:
        pool = self._pool
        if pool is None:
            raise PlatformUnavailable("the embedded platform is not open (call open() first)")
        return pool

    def ping(self) -> None:
        self._running_pool()

    # -- limits and actions -------------------------------------------------------------------

    def limits(self) -> PlatformLimits:
        s = self.settings
        return PlatformLimits(
            memory_min_mb=s.memory_min_mb,
            memory_max_mb=s.memory_max_mb,
            memory_std_mb=s.memory_std_mb,
            timeout_min_ms=s.timeout_min_ms,
            timeout_max_ms=s.timeout_max_ms,
            timeout_std_ms=s.timeout_std_ms,
            pool_memory_mb=s.pool_memory_mb,
            concurrent_invocations=s.concurrent_invocations,
            invocations_per_minute=s.invocations_per_minute or None,
            payload_max_bytes=s.payload_max_bytes,
            kinds=list(KINDS),
            memory_enforcement=self._guard.name if self._guard else None,
        )

    def deploy(self, spec: ActionSpec, *, overwrite: bool = True) -> Action:
        spec.validate_name()
        s = self.settings
        if spec.kind == "blackbox":
            if spec.image not in s.images:
                raise InvalidAction(
                    f"image '{spec.image}' is not available: the embedded platform runs no "
                    "container images, only those FAASDL_LOCAL__IMAGES lists (images holding "
                    "faasdl's actions), with its own Python runtime"
                )
        elif spec.kind not in KINDS:
            raise InvalidAction(messages.unsupported_kind(spec.kind, list(KINDS)))
        limits = ActionLimits(
            memory=spec.memory_mb if spec.memory_mb is not None else s.memory_std_mb,
            timeout=spec.timeout_ms if spec.timeout_ms is not None else s.timeout_std_ms,
            logs=spec.logs_mb if spec.logs_mb is not None else min(10, s.log_max_mb),
        )
        self._check_limits(limits)
        code, binary = self._check_code(spec.code)
        annotations = [
            KeyValue(key="exec", value="python"),
            KeyValue(key="provide-api-key", value=False),
        ]
        annotations = [a for a in annotations if a.key not in spec.annotations] + [
            KeyValue(key=k, value=v) for k, v in spec.annotations.items()
        ]
        with self._lock:
            existing = self._actions.get(spec.name)
            if existing is not None and not overwrite:
                raise ActionExists(messages.RESOURCE_EXISTS)
            action = Action(
                namespace=s.namespace,
                name=spec.name,
                version=_bump(existing.action.version) if existing else "0.0.1",
                exec=ActionExec(
                    kind=spec.kind, code=code, image=spec.image, main=spec.main, binary=binary
                ),
                annotations=annotations,
                parameters=[
                    self._stored(k, v, init=None)
                    for k, v in spec.parameters.items()
                    if k not in spec.environment
                ]
                + [self._stored(k, v, init=True) for k, v in spec.environment.items()],
                limits=limits,
                updated=_now_ms(),
            )
            self._actions[spec.name] = _Deployed(action)
        if existing is not None and self._pool is not None:
            self._pool.drop(existing.key)
        return _without_code(action)

    def _stored(self, key: str, value: Any, *, init: bool | None) -> KeyValue:
        """A parameter as the action's record keeps it: sealed where the platform encrypts
        parameters (``parameter_storage_key``), as OpenWhisk's parameter storage does."""
        if self._seal is None:
            return KeyValue(key=key, value=value, init=init)
        if not isinstance(value, str):
            raise InvalidAction(
                f"parameter {key!r} is not a string ({type(value).__name__}): this platform "
                "encrypts parameters (FAASDL_LOCAL__PARAMETER_STORAGE_KEY), strings only"
            )
        return KeyValue(key=key, value=self._seal.seal(value), init=init, encryption=ENCRYPTION)

    def parameter_value(self, parameter: KeyValue) -> Any:
        """A parameter's value as set (opened where the record holds it sealed); ``ValueError``
        for one sealed otherwise than this platform seals them."""
        if parameter.encryption is None:
            return parameter.value
        if self._seal is None or parameter.encryption != ENCRYPTION:
            raise ValueError(
                f"parameter {parameter.key!r} is encrypted ({parameter.encryption}), and this "
                f"platform opens {ENCRYPTION if self._seal else 'none'}"
            )
        return self._seal.open(str(parameter.value))

    def _check_limits(self, limits: ActionLimits) -> None:
        s = self.settings
        if limits.memory > s.memory_max_mb or limits.memory < s.memory_min_mb:
            above = limits.memory > s.memory_max_mb
            bound = s.memory_max_mb if above else s.memory_min_mb
            raise InvalidAction(messages.memory_out_of_range(limits.memory, bound, above=above))
        if limits.timeout > s.timeout_max_ms or limits.timeout < s.timeout_min_ms:
            above = limits.timeout > s.timeout_max_ms
            bound = s.timeout_max_ms if above else s.timeout_min_ms
            raise InvalidAction(messages.timeout_out_of_range(limits.timeout, bound, above=above))
        if limits.logs > s.log_max_mb or limits.logs < 0:
            above = limits.logs > s.log_max_mb
            raise InvalidAction(
                messages.logs_out_of_range(limits.logs, s.log_max_mb if above else 0, above=above)
            )
        if limits.concurrency != 1:
            raise InvalidAction(f"concurrency {limits.concurrency} exceeds allowed threshold of 1")

    def _check_code(self, code: str | bytes) -> tuple[str, bool]:
        """Validate the code; return it as OpenWhisk stores it (text, or base64 of a zip)."""
        size = len(code)
        if size == 0 or (isinstance(code, str) and not code.strip()):
            raise InvalidAction("exec.code is empty: an action needs code")
        if size > self.settings.code_max_bytes:
            raise PayloadTooLarge(
                messages.entity_too_big("Code", size, self.settings.code_max_bytes)
            )
        if isinstance(code, str):
            return code, False
        try:
            with zipfile.ZipFile(io.BytesIO(code)) as archive:
                names = archive.namelist()
        # NotImplementedError: a zip of a later version than zipfile reads (it was a 500).
        except (zipfile.BadZipFile, NotImplementedError) as exc:
            raise InvalidAction(f"exec.code is not a valid zip archive: {exc}") from exc
        if "__main__.py" not in names:
            raise InvalidAction("exec.code: the zip has no __main__.py at its root")
        return base64.b64encode(code).decode("ascii"), True

    def _deployed(self, name: str) -> _Deployed:
        with self._lock:
            deployed = self._actions.get(name)
        if deployed is None:
            raise ActionNotFound(name)
        return deployed

    def get_action(self, name: str, *, code: bool = False) -> Action:
        action = self._deployed(name).action
        return action if code else _without_code(action)

    def list_actions(self) -> list[Action]:
        with self._lock:
            actions = [d.action for d in self._actions.values()]
        return sorted((_without_code(a) for a in actions), key=lambda a: -(a.updated or 0))

    def delete_action(self, name: str) -> None:
        with self._lock:
            deployed = self._actions.pop(name, None)
        if deployed is None:
            raise ActionNotFound(name)
        if self._pool is not None:
            self._pool.drop(deployed.key)

    # -- invocation ------------------------------------------------------------------------

    def invoke(self, name: str, params: Mapping[str, Any] | None = None) -> str:
        return self.invoke_with_callback(name, params)

    def invoke_with_callback(
        self, name: str, params: Mapping[str, Any] | None = None, callback: Callback | None = None
    ) -> str:
        """:meth:`invoke`, calling ``callback(record)`` from an invoker thread once recorded."""
        pool = self._running_pool()
        deployed = self._deployed(name)
        params = dict(params or {})
        size = len(json.dumps(params))
        if size > self.settings.payload_max_bytes:
            raise PayloadTooLarge(
                messages.entity_too_big("Request entity", size, self.settings.payload_max_bytes)
            )
        activation_id = uuid.uuid4().hex
        invoked_ms = _now_ms()
        self._throttle(pool)
        with self._lock:
            self._pending[activation_id] = [callback] if callback else []
        work = Work(
            activation_id=activation_id,
            action_key=deployed.key,
            memory_mb=deployed.action.limits.memory,
            execute=lambda c: self._execute(c, activation_id, deployed, params, invoked_ms),
        )
        try:
            pool.submit(work)
        except PoolClosed as exc:
            with self._lock:
                self._pending.pop(activation_id, None)
            raise PlatformUnavailable("the embedded platform is shutting down") from exc
        return activation_id

    def _throttle(self, pool: ContainerPool) -> None:
        s = self.settings
        in_flight = pool.in_flight()
        if in_flight >= s.concurrent_invocations:
            raise Throttled(messages.too_many_concurrent(in_flight, s.concurrent_invocations))
        if s.invocations_per_minute:
            now = time.monotonic()
            with self._minute_lock:
                while self._minute and self._minute[0] < now - 60:
                    self._minute.popleft()
                if len(self._minute) >= s.invocations_per_minute:
                    raise Throttled(
                        messages.too_many_requests(len(self._minute), s.invocations_per_minute)
                    )
                self._minute.append(now)

    def get_activation(self, activation_id: str) -> Activation | None:
        with self._lock:
            return self._records.get(activation_id)

    def forgot(self, activation_id: str) -> bool:
        """Neither pending nor among the records kept (``max_activation_records``): this
        platform never started it, or its record was dropped for newer ones."""
        with self._lock:
            return activation_id not in self._pending and activation_id not in self._records

    def _wait(self, activation_ids: list[str], timeout_s: float) -> dict[str, Activation]:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                missing = [i for i in activation_ids if i not in self._records]
                if not missing:
                    return {i: self._records[i] for i in activation_ids}
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ActivationTimeout(
                        f"{len(missing)} activation(s) not finished after {timeout_s:g} s",
                        pending=missing,
                    )
                self._lock.wait(remaining)

    def wait_any(self, activation_ids: list[str], *, timeout_s: float) -> bool:
        """Wait until at least one of the activations is recorded; answer whether one is."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not any(i in self._records for i in activation_ids):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    def is_running(self, activation_id: str) -> bool:
        """Whether the activation has a container and is executing (not queued, not finished)."""
        pool = self._pool
        return pool is not None and pool.running_container(activation_id) is not None

    def list_activations(
        self, *, name: str | None = None, since_ms: int | None = None, limit: int = 30
    ) -> list[Activation]:
        out: list[Activation] = []
        with self._lock:
            for record in reversed(self._records.values()):
                if name is not None and record.name != name:
                    continue
                if since_ms is not None and record.start < since_ms:
                    continue
                out.append(record)
                if len(out) >= limit:
                    break
        return out

    def prewarm(self, name: str, count: int = 1, params: Mapping[str, Any] | None = None) -> int:
        pool = self._running_pool()
        deployed = self._deployed(name)
        limits = deployed.action.limits

        def warm(container: Container) -> bool:
            try:
                container.start(lower_by=self.settings.warmup_nice)
            except Exception:
                return False
            try:
                reply = container.call("/init", self._init_message(deployed), limits.timeout / 1000)
                container.initialized = reply.outcome is CallResult.OK and reply.status == 200
                if not container.initialized or params is None:
                    return container.initialized
                # The warm-up call: a run that is no activation (nothing records or bills it).
                message = self._run_message(
                    deployed, dict(params), uuid.uuid4().hex, limits.timeout
                )
                reply = container.call("/run", message, limits.timeout / 1000)
                status, _, _ = self._run_outcome(container, reply, limits.timeout)
                return status is StatusCode.SUCCESS
            finally:
                container.restore_priority()

        try:
            return pool.prewarm(deployed.key, limits.memory, count, warm)
        except PoolClosed as exc:
            raise PlatformUnavailable("the embedded platform is shutting down") from exc

    def kill(self, activation_id: str) -> None:
        container = self._running_pool().running_container(activation_id)
        if container is None:
            raise ActivationNotFound(activation_id)
        container.kill(KillReason.INJECTED)

    def running_since(self, activation_id: str) -> float | None:
        """When a container took ``activation_id`` (unix time); ``None`` while it waits for one,
        and once it has ended."""
        container = self._running_pool().running_container(activation_id)
        return None if container is None else container.taken_at

    def stop(self, activation_id: str) -> None:
        pool = self._running_pool()
        if pool.cancel(activation_id) is None:
            self.kill(activation_id)
            return
        self._record_failure(activation_id, StatusCode.WHISK_ERROR, messages.STOPPED_BEFORE_START)

    def drop_spares(self) -> int:
        """Destroy the idle spare containers (replicas no activation has used), whoever asked
        for them; returns how many. An experiment does so before a run of a strategy that keeps
        no replicas: the replicas another run warmed (and paid for) are not its to use."""
        return self._running_pool().drop_spares()

    def drop_idle_like(self, activation_id: str) -> None:
        """Destroy the idle containers of the action ``activation_id`` is running (failure
        injection: the next attempt then starts cold). Raises ``ActivationNotFound``."""
        pool = self._running_pool()
        container = pool.running_container(activation_id)
        if container is None:
            raise ActivationNotFound(activation_id)
        pool.drop(container.action_key)

    def signal(self, activation_id: str, signum: int) -> None:
        """Send ``signum`` to the process group of the container running ``activation_id``
        (failure injection: SIGSTOP and SIGCONT make a zombie). Raises ``ActivationNotFound``."""
        container = self._running_pool().running_container(activation_id)
        if container is None or container.pid is None:
            raise ActivationNotFound(activation_id)
        try:
            os.killpg(container.pid, signum)
        except ProcessLookupError as exc:
            raise ActivationNotFound(activation_id) from exc

    def pool_stats(self) -> dict[str, int]:
        """Reserved memory, its peak, and containers by state (for tests and benchmarks)."""
        return self._running_pool().stats()

    def container_pids(self) -> list[int]:
        pool = self._pool
        return pool.container_pids() if pool is not None else []

    # -- the invoker ---------------------------------------------------------------------------

    def _run_message(
        self, deployed: _Deployed, params: dict[str, Any], activation_id: str, timeout_ms: int
    ) -> dict[str, Any]:
        action = deployed.action
        return {
            "value": {p.key: self.parameter_value(p) for p in action.parameters if not p.init}
            | params,
            "namespace": action.namespace,
            "action_name": f"/{action.namespace}/{action.name}",
            "action_version": action.version,
            "activation_id": activation_id,
            "transaction_id": uuid.uuid4().hex,
            "deadline": str(int(time.time() * 1000) + timeout_ms),
        }

    def _init_message(self, deployed: _Deployed) -> dict[str, Any]:
        action = deployed.action
        return {
            "value": {
                "name": action.name,
                "main": action.exec.main or "main",
                "code": action.exec.code,
                "binary": action.exec.binary,
                "env": {
                    # Init parameters first: OpenWhisk's own variables are not theirs to set.
                    **{
                        p.key: _environment_value(self.parameter_value(p))
                        for p in action.parameters
                        if p.init
                    },
                    "__OW_NAMESPACE": action.namespace,
                    "__OW_ACTION_NAME": f"/{action.namespace}/{action.name}",
                    "__OW_ACTION_VERSION": action.version,
                },
            }
        }

    def _execute(
        self,
        container: Container,
        activation_id: str,
        deployed: _Deployed,
        params: dict[str, Any],
        invoked_ms: int,
    ) -> bool:
        """Run one activation on ``container``; record it; answer whether to keep the container."""
        action = deployed.action
        timeout_ms = action.limits.timeout
        annotations = _Annotations(action)
        if not container.started:
            try:
                container.start()
            except Exception:
                self._record_failure(
                    activation_id,
                    StatusCode.WHISK_ERROR,
                    messages.RESOURCE_PROVISION_ERROR,
                    annotations=annotations.done(wait_ms=_now_ms() - invoked_ms, timed_out=False),
                    start_ms=invoked_ms,
                )
                return False
        start_ms = _now_ms()
        init_ms: int | None = None
        if not container.initialized:
            reply = container.call("/init", self._init_message(deployed), timeout_ms / 1000)
            init_ms = reply.ended_ms - reply.started_ms
            failure = self._init_failure(container, reply, timeout_ms)
            if failure is not None:
                self._finish(
                    activation_id,
                    container,
                    deployed,
                    start_ms,
                    invoked_ms,
                    init_ms,
                    status=StatusCode.DEVELOPER_ERROR,
                    result={"error": failure},
                    timed_out=reply.outcome is CallResult.TIMED_OUT,
                    expect_sentinel=False,
                )
                return False
            container.initialized = True
        message = self._run_message(deployed, params, activation_id, timeout_ms)
        reply = container.call("/run", message, timeout_ms / 1000)
        status, result, keep = self._run_outcome(container, reply, timeout_ms)
        self._finish(
            activation_id,
            container,
            deployed,
            start_ms,
            invoked_ms,
            init_ms,
            status=status,
            result=result,
            timed_out=reply.outcome is CallResult.TIMED_OUT,
            expect_sentinel=reply.outcome is CallResult.OK,
        )
        return keep

    def _init_failure(self, container: Container, reply: Reply, timeout_ms: int) -> str | None:
        if reply.outcome is CallResult.TIMED_OUT:
            container.kill(KillReason.TIMEOUT)
            return messages.timed_out(timeout_ms, init=True)
        if reply.outcome is CallResult.CONNECTION_LOST:
            return self._lost_message(container, init=True)
        if reply.status == 200:
            return None
        try:
            body = reply.json()
            if isinstance(body, dict) and isinstance(body.get("error"), str):
                return str(body["error"])
        except ValueError:
            pass
        return messages.invalid_init_response(reply.body.decode("utf-8", errors="replace"))

    def _lost_message(self, container: Container, *, init: bool) -> str:
        if container.oom_killed():
            return messages.MEMORY_EXHAUSTED
        return messages.ABNORMAL_INIT if init else messages.ABNORMAL_RUN

    def _run_outcome(
        self, container: Container, reply: Reply, timeout_ms: int
    ) -> tuple[StatusCode, Any, bool]:
        if reply.outcome is CallResult.TIMED_OUT:
            container.kill(KillReason.TIMEOUT)
            return StatusCode.DEVELOPER_ERROR, {"error": messages.timed_out(timeout_ms)}, False
        if reply.outcome is CallResult.CONNECTION_LOST:
            if container.kill_reason is KillReason.SHUTDOWN:
                return (
                    StatusCode.WHISK_ERROR,
                    {"error": "The platform shut down while the action was running."},
                    False,
                )
            return (
                StatusCode.DEVELOPER_ERROR,
                {"error": self._lost_message(container, init=False)},
                False,
            )
        text = reply.body.decode("utf-8", errors="replace")
        try:
            body = reply.json()
        except ValueError:
            return StatusCode.DEVELOPER_ERROR, {"error": messages.invalid_run_response(text)}, False
        if reply.status != 200:
            if isinstance(body, dict) and isinstance(body.get("error"), str):
                return StatusCode.DEVELOPER_ERROR, {"error": body["error"]}, False
            return StatusCode.DEVELOPER_ERROR, {"error": messages.invalid_run_response(text)}, False
        if not isinstance(body, (dict, list)):
            return StatusCode.DEVELOPER_ERROR, {"error": messages.invalid_run_response(text)}, False
        limit = self.settings.payload_max_bytes
        if len(reply.body) > limit:
            error = messages.truncated_response(len(reply.body), limit, text[: limit // 1024])
            return StatusCode.APPLICATION_ERROR, {"error": error}, True
        if isinstance(body, dict) and "error" in body:
            return StatusCode.APPLICATION_ERROR, body, True
        return StatusCode.SUCCESS, body, True

    def _finish(
        self,
        activation_id: str,
        container: Container,
        deployed: _Deployed,
        start_ms: int,
        invoked_ms: int,
        init_ms: int | None,
        *,
        status: StatusCode,
        result: Any,
        timed_out: bool,
        expect_sentinel: bool,
    ) -> None:
        end_ms = _now_ms()
        if status is StatusCode.DEVELOPER_ERROR:
            container.kill(container.kill_reason or KillReason.EVICTED)
            expect_sentinel = False
        logs = container.take_logs(expect_sentinel=expect_sentinel)
        logs = _limit_logs(logs, deployed.action.limits.logs * 1024 * 1024)
        if status is StatusCode.DEVELOPER_ERROR:
            logs.append(f"{_iso(end_ms)} stderr: {messages.LOG_WARNING_DEVELOPER_ERROR}")
        annotations = _Annotations(deployed.action).done(
            wait_ms=start_ms - invoked_ms, timed_out=timed_out, init_ms=init_ms
        )
        record = Activation(
            namespace=deployed.action.namespace,
            name=deployed.action.name,
            subject=self.subject,
            activationId=activation_id,
            start=start_ms,
            end=end_ms,
            duration=end_ms - start_ms,
            version=deployed.action.version,
            annotations=annotations,
            logs=logs,
            response=ActivationResponse(
                status=status.status, success=status is StatusCode.SUCCESS, result=result
            ),
        )
        self._store(record)

    def _record_failure(
        self,
        activation_id: str,
        status: StatusCode,
        error: str,
        *,
        annotations: list[KeyValue] | None = None,
        start_ms: int | None = None,
    ) -> None:
        with self._lock:
            if activation_id not in self._pending:
                return
        now = _now_ms()
        record = Activation(
            namespace=self.settings.namespace,
            name="",
            subject=self.subject,
            activationId=activation_id,
            start=start_ms or now,
            end=now,
            duration=now - (start_ms or now),
            annotations=annotations or [],
            response=ActivationResponse(
                status=status.status, success=False, result={"error": error}
            ),
        )
        self._store(record)

    def _store(self, record: Activation) -> None:
        with self._lock:
            self._records[record.activationId] = record
            while len(self._records) > self.settings.max_activation_records:
                self._records.popitem(last=False)
            callbacks = self._pending.pop(record.activationId, [])
            self._lock.notify_all()
        for callback in callbacks:
            callback(record)


class _Annotations:
    def __init__(self, action: Action) -> None:
        self._action = action

    def done(self, *, wait_ms: int, timed_out: bool, init_ms: int | None = None) -> list[KeyValue]:
        a = self._action
        out = [
            KeyValue(key="path", value=f"{a.namespace}/{a.name}"),
            KeyValue(key="waitTime", value=max(0, wait_ms)),
            KeyValue(key="kind", value=a.exec.kind),
            KeyValue(key="timeout", value=timed_out),
            KeyValue(key="limits", value=a.limits.model_dump()),
        ]
        if init_ms is not None:
            out.append(KeyValue(key="initTime", value=init_ms))
        return out


def _without_code(action: Action) -> Action:
    return action.model_copy(update={"exec": action.exec.model_copy(update={"code": None})})


def _iso(ms: int) -> str:
    seconds, millis = divmod(ms, 1000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{millis:03d}000000Z"


def _limit_logs(lines: list[str], limit_bytes: int) -> list[str]:
    total = 0
    for i, line in enumerate(lines):
        total += len(line.encode("utf-8"))
        if total > limit_bytes:
            return [*lines[:i], messages.truncated_logs(limit_bytes)]
    return lines


def decode_code(code: str) -> str | bytes:
    """OpenWhisk's binary detection (``Exec.isBinaryCode``): a string that is strict base64, with
    no newlines and a length divisible by four, is a zip; anything else is source."""
    trimmed = code.strip()
    if trimmed and len(trimmed) % 4 == 0 and "\n" not in trimmed:
        try:
            return base64.b64decode(trimmed, validate=True)
        except (binascii.Error, ValueError):
            return code
    return code
