"""The failure classifier on records as a Docker invoker, a Kubernetes invoker and the embedded
platform write them (reference/openwhisk.md §2 and §5)."""

from __future__ import annotations

from typing import Any

import pytest

from faasdl.actionkit import serve
from faasdl.errors import StoreUnavailable, ValidationError
from faasdl.platform.base import Activation
from faasdl.platform.classify import FailureKind, classify


def record(
    status: str, error: str | None = None, *, retryable: bool | None = None, **annotations: Any
) -> Activation:
    result: dict[str, Any] = {"error": error} if error is not None else {"ok": True}
    if retryable is not None:
        result["retryable"] = retryable
    return Activation.model_validate(
        {
            "namespace": "guest",
            "name": "train",
            "activationId": "a" * 32,
            "start": 1,
            "end": 2,
            "response": {"status": status, "success": status == "success", "result": result},
            "annotations": [{"key": k, "value": v} for k, v in annotations.items()],
        }
    )


DEV = "action developer error"


def test_success_is_no_failure() -> None:
    assert classify(record("success")) is None


@pytest.mark.parametrize(
    ("activation", "kind"),
    [
        # Docker invoker: OOMKilled is reported in words.
        (
            record(DEV, "The action exhausted its memory and was aborted."),
            FailureKind.OUT_OF_MEMORY,
        ),
        (
            record(DEV, "The action exceeded its time limits of 60000 milliseconds.", timeout=True),
            FailureKind.OUT_OF_TIME,
        ),
        (
            record(
                DEV,
                "The action exceeded its time limits of 300000 milliseconds during initialization.",
            ),
            FailureKind.OUT_OF_TIME,
        ),
        (
            record(DEV, "The action did not produce a valid response and exited unexpectedly."),
            FailureKind.CRASH,
        ),
        (record(DEV, "The action did not initialize and exited unexpectedly."), FailureKind.CRASH),
        # The Go proxy of the Python images when only the child process died.
        (record(DEV, "command exited"), FailureKind.CRASH),
        (record("application error", "division by zero"), FailureKind.APPLICATION_ERROR),
        # faasdl's actions: a store that was down is worth another attempt; only true says so.
        (
            record("application error", "lost the connection to Redis", retryable=True),
            FailureKind.UNAVAILABLE,
        ),
        (
            record("application error", "no such shard", retryable=False),
            FailureKind.APPLICATION_ERROR,
        ),
        (
            record(DEV, "The action did not return a dictionary or array."),
            FailureKind.APPLICATION_ERROR,
        ),
        (
            record(DEV, "Cannot start action. Check logs for details."),
            FailureKind.APPLICATION_ERROR,
        ),
        (
            record("whisk internal error", "Failed to provision resources to run the action."),
            FailureKind.PLATFORM_ERROR,
        ),
        (
            record(DEV, "Failed to pull container image 'faasdl/runtime:1'."),
            FailureKind.PLATFORM_ERROR,
        ),
    ],
)
def test_classification(activation: Activation, kind: FailureKind) -> None:
    failure = classify(activation)

    assert failure is not None
    assert failure.kind is kind
    assert failure.message == activation.error


def test_a_time_out_as_the_container_started_is_told_from_one_as_the_action_ran() -> None:
    # Arrange: OpenWhisk's words for each (an invoker's, and the embedded platform's)
    said = {
        "init": "The action exceeded its time limits of 12000 milliseconds during initialization.",
        "run": "The action exceeded its time limits of 12000 milliseconds.",
        "init crash": "The action did not initialize and exited unexpectedly.",
    }

    # Execute
    failures = {case: classify(record(DEV, error)) for case, error in said.items()}

    # Assert
    starting = {case: f is not None and f.starting for case, f in failures.items()}
    assert starting == {"init": True, "run": False, "init crash": False}


@pytest.mark.parametrize(
    "error",
    ["The action did not produce a valid response and exited unexpectedly.", "command exited"],
)
def test_kubernetes_oom_needs_pod_evidence(error: str) -> None:
    # The Kubernetes invoker never says "exhausted its memory": a pod watch that saw OOMKilled
    # turns the crash into what it was.
    activation = record(DEV, error)

    assert classify(activation).kind is FailureKind.CRASH  # type: ignore[union-attr]
    assert classify(activation, oom_killed=True).kind is FailureKind.OUT_OF_MEMORY  # type: ignore[union-attr]


def test_a_store_outage_in_an_action_comes_back_retryable_and_a_bad_argument_does_not() -> None:
    def down(args: dict[str, Any]) -> dict[str, Any]:
        raise StoreUnavailable("lost the connection to Redis at redis://127.0.0.1:1/0")

    def bad(args: dict[str, Any]) -> dict[str, Any]:
        raise ValidationError("must be positive", field="epochs")

    assert serve({}, down) == {
        "error": "lost the connection to Redis at redis://127.0.0.1:1/0",
        "retryable": True,
    }
    assert serve({}, bad) == {"error": "epochs: must be positive"}
