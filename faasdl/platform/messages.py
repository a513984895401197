"""OpenWhisk's own texts, word for word (OW ``http/ErrorResponse.scala`` ``Messages``, the Python
runtime's proxy, akka-http's rejections), so that records made by the embedded platform read like
a real OpenWhisk's and one classifier understands both."""

from __future__ import annotations

ACTIVATION_LOG_SENTINEL = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX"

RESOURCE_DOES_NOT_EXIST = "The requested resource does not exist."
RESOURCE_EXISTS = "resource already exists"
ABNORMAL_INIT = "The action did not initialize and exited unexpectedly."
ABNORMAL_RUN = "The action did not produce a valid response and exited unexpectedly."
MEMORY_EXHAUSTED = "The action exhausted its memory and was aborted."
LOG_WARNING_DEVELOPER_ERROR = (
    "The action did not initialize or run as expected. Log data might be missing."
)
RESOURCE_PROVISION_ERROR = "Failed to provision resources to run the action."
#: faasdl's own: an activation stopped while it waited for a container (``Platform.stop``).
STOPPED_BEFORE_START = "The activation was stopped before it started."
AUTH_REQUIRED = "The resource requires authentication, which was not supplied with the request"
AUTH_INVALID = "The supplied authentication is invalid"
NOT_A_DICT = "The action did not return a dictionary or array."
CANNOT_START = "Cannot start action. Check logs for details."
INIT_TWICE = "Cannot initialize the action more than once."
MISSING_MAIN = "Missing main/no code to execute."
COMMAND_EXITED = "command exited"


#: How OpenWhisk's time-out message ends where the container's initialisation ran out of time.
DURING_INIT = " during initialization."


def timed_out(timeout_ms: int, *, init: bool = False) -> str:
    suffix = DURING_INIT if init else "."
    return f"The action exceeded its time limits of {timeout_ms} milliseconds{suffix}"


def too_many_requests(count: int, allowed: int) -> str:
    return f"Too many requests in the last minute (count: {count}, allowed: {allowed})."


def too_many_concurrent(count: int, allowed: int) -> str:
    return f"Too many concurrent requests in flight (count: {count}, allowed: {allowed})."


def entity_too_big(field: str, size: int, allowed: int) -> str:
    return f"{field} larger than allowed: {size} > {allowed} bytes."


def truncated_response(size: int, allowed: int, trunk: str) -> str:
    return (
        f"The action produced a response that exceeded the allowed length: {size} > {allowed} "
        f"bytes. The truncated response was: {trunk}"
    )


def truncated_logs(limit_bytes: int) -> str:
    return (
        "Logs were truncated because the total bytes size exceeds the limit of "
        f"{limit_bytes} bytes."
    )


def invalid_init_response(body: str) -> str:
    return "The action failed during initialization" + (f": {body}" if body else ".")


def invalid_run_response(body: str) -> str:
    return "The action did not produce a valid JSON or JSON Array response" + (
        f": {body}" if body else "."
    )


def unsupported_kind(kind: str, valid: list[str]) -> str:
    return (
        f"The specified runtime '{kind}' is not supported by this platform. "
        f"Valid values are: {', '.join(valid)}"
    )


def memory_out_of_range(memory_mb: int, bound_mb: int, *, above: bool) -> str:
    word = "exceeds" if above else "below"
    return f"memory size {memory_mb} MB {word} allowed threshold of {bound_mb} MB"


def timeout_out_of_range(timeout_ms: int, bound_ms: int, *, above: bool) -> str:
    word = "exceeds" if above else "below"
    return f"duration {timeout_ms} milliseconds {word} allowed threshold of {bound_ms} milliseconds"


def logs_out_of_range(logs_mb: int, bound_mb: int, *, above: bool) -> str:
    word = "exceeds" if above else "below"
    return f"log size {logs_mb} MB {word} allowed threshold of {bound_mb} MB"


def invalid_wait_timeout(max_ms: int) -> str:
    return f"Timeout must be number of milliseconds up to {max_ms}."
