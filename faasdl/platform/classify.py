"""Why did an activation fail? One classifier for records from the embedded platform, a Docker
invoker and a Kubernetes invoker (reference/openwhisk.md §2, §5 and pitfalls 1-2)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from faasdl.errors import RETRYABLE
from faasdl.platform import messages
from faasdl.platform.base import APPLICATION_ERROR, WHISK_ERROR, Activation


class FailureKind(StrEnum):
    OUT_OF_MEMORY = "out_of_memory"
    OUT_OF_TIME = "out_of_time"
    CRASH = "crash"
    APPLICATION_ERROR = "application_error"
    PLATFORM_ERROR = "platform_error"
    HUNG = "hung"  # no record, but its heartbeat lease lapsed (Canary's core, not the platform)
    UNAVAILABLE = "unavailable"  # the action said a service it needs was down (its store)


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    message: str

    @property
    def starting(self) -> bool:
        """Out of time while its container started (initialised the action), as OpenWhisk's
        message says: the attempt never ran its work."""
        return self.kind is FailureKind.OUT_OF_TIME and self.message.endswith(messages.DURING_INIT)


_CRASH_TEXTS = (messages.ABNORMAL_RUN, messages.ABNORMAL_INIT, messages.COMMAND_EXITED)
_PLATFORM_PREFIXES = (
    messages.RESOURCE_PROVISION_ERROR,
    "Failed to run container with image",
    "Failed to pull container image",
)


def classify(activation: Activation, *, oom_killed: bool = False) -> Failure | None:
    """Classify a finished activation; ``None`` when it succeeded.

    ``oom_killed`` is outside evidence that the container was OOM-killed (a Kubernetes pod watch
    that saw ``OOMKilled``): the Kubernetes invoker never reports memory exhaustion itself and a
    cgroup-v1 kill of only the Python child reads ``command exited``.
    """
    if activation.response.success:
        return None
    message = activation.error or activation.response.status
    status = activation.response.status
    if status == APPLICATION_ERROR:
        result = activation.response.result
        if isinstance(result, dict) and result.get(RETRYABLE) is True:
            return Failure(FailureKind.UNAVAILABLE, message)
        return Failure(FailureKind.APPLICATION_ERROR, message)
    if status == WHISK_ERROR or message.startswith(_PLATFORM_PREFIXES):
        return Failure(FailureKind.PLATFORM_ERROR, message)
    if activation.timed_out or message.startswith("The action exceeded its time limits"):
        return Failure(FailureKind.OUT_OF_TIME, message)
    if message == messages.MEMORY_EXHAUSTED:
        return Failure(FailureKind.OUT_OF_MEMORY, message)
    if any(text in message for text in _CRASH_TEXTS):
        kind = FailureKind.OUT_OF_MEMORY if oom_killed else FailureKind.CRASH
        return Failure(kind, message)
    # The remaining developer errors are the action's own fault: a bad return value, an import
    # error at init, a missing main. Retrying the same code cannot help.
    return Failure(FailureKind.APPLICATION_ERROR, message)
