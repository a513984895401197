"""OpenWhisk's own JavaScript client (npm's `openwhisk`, what OpenWhisk's users script it with)
against the embedded platform's REST API: a client faasdl did not write reads its answers as a
real OpenWhisk's. `make test` installs the client with npm where npm is on the PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Served

CLIENT = Path(__file__).parent / "openwhisk-js"
NODE = shutil.which("node")


@pytest.fixture
def said(make_served: Callable[..., Served]) -> dict[str, dict[str, Any]]:
    """What each of the script's calls answered, by step."""
    if NODE is None:
        pytest.skip("no node on the PATH: OpenWhisk's JavaScript client needs Node.js")
    if not (CLIENT / "node_modules" / "openwhisk").is_dir():
        pytest.skip(f"OpenWhisk's JavaScript client is not installed: npm ci --prefix {CLIENT}")
    served = make_served()
    env = {
        **os.environ,
        "OW_APIHOST": served.url,
        "OW_AUTH": served.server_settings.auth.get_secret_value(),
    }
    ran = subprocess.run(
        [NODE, str(CLIENT / "client.js")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    steps = [json.loads(line) for line in ran.stdout.splitlines()]
    return {s["step"]: s for s in steps}


def test_openwhisks_javascript_client_reads_the_embedded_platform_as_openwhisk(
    said: dict[str, dict[str, Any]],
) -> None:
    def ok(step: str) -> Any:
        assert said[step]["ok"], said[step]
        return said[step]["result"]

    def refused(step: str, status: int) -> dict[str, Any]:
        assert not said[step]["ok"], said[step]
        assert said[step]["status"] == status, said[step]
        return said[step]

    created = ok("create")
    assert (created["name"], created["namespace"]) == ("hello", "guest")
    assert created["limits"]["memory"] == 256
    assert created["limits"]["timeout"] == 10_000
    nodejs = refused("create nodejs", 400)["error"]["error"]
    assert nodejs.startswith("The specified runtime 'nodejs:default' is not"), nodejs
    assert "python:3.11" in nodejs
    assert refused("create again", 409)["error"]["error"]
    assert "hello log" in ok("get")["exec"]["code"]
    assert [a["name"] for a in ok("list")] == ["hello"]
    assert ok("invoke result") == {"greeting": "hi js"}
    blocking = ok("invoke blocking")
    assert blocking["response"]["success"] is True
    assert blocking["response"]["result"] == {"greeting": "hi x"}
    started = ok("invoke")["activationId"]
    assert ok("activation")["activationId"] == started
    assert ok("result") == {"status": "success", "success": True, "result": {"greeting": "hi x"}}
    assert any(line.endswith("stdout: hello log") for line in ok("logs")["logs"])
    listed = ok("activations")
    assert {blocking["activationId"], started} <= {a["activationId"] for a in listed}
    assert all(a["name"] == "hello" for a in listed)
    updated = ok("update")
    assert (updated["version"], updated["limits"]["memory"]) == ("0.0.2", 512)
    ok("create fails")
    # An application error: 502, the activation's record in the body (the client's `error`).
    failed = refused("invoke fails", 502)
    assert failed["error"]["response"]["status"] == "application error"
    assert failed["error"]["response"]["result"] == {"error": "bad input"}
    missing = refused("invoke missing", 404)["error"]["error"]
    assert missing == "The requested resource does not exist."
    assert ok("namespaces") == ["guest"]
    assert "triggers are not supported" in refused("triggers", 501)["error"]["error"]
    assert ok("delete")["name"] == "hello"
    refused("get deleted", 404)
