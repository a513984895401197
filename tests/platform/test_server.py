"""The embedded platform's OpenWhisk-compatible REST server: status codes and error bodies for bad
input, and response shapes checked against OpenWhisk's own swagger (apiv1swagger.json)."""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests

from faasdl.actions import PARAMETERS_DIGEST, TRAIN, action_code, deploy_variant
from faasdl.config import OpenWhiskSettings
from faasdl.errors import AuthenticationFailed, PlatformError, PlatformUnavailable, Throttled
from faasdl.platform import messages
from faasdl.platform.base import MAX_JSON_DEPTH, ActionSpec, retries_told
from faasdl.platform.openwhisk import OpenWhiskPlatform
from faasdl.serving import LINGER_BYTES
from tests.conftest import (
    PAGE_BYTES,
    PARAMETER_STORAGE_KEY,
    Endless,
    Served,
    eventually,
    hung_http_server,
    tls_files,
    web_server,
)
from tests.platform import actions

SWAGGER = json.loads((Path(__file__).parent / "data" / "openwhisk-apiv1swagger.json").read_text())


def conforms(instance: Any, definition: str) -> None:
    schema = {"$ref": f"#/definitions/{definition}", "definitions": SWAGGER["definitions"]}
    jsonschema.Draft4Validator(schema).validate(instance)


@pytest.fixture
def served(make_served: Callable[..., Served]) -> Served:
    return make_served()


class Api:
    def __init__(self, served: Served) -> None:
        self.base = f"{served.url}/api/v1/namespaces/_"
        uuid, _, key = served.server_settings.auth.get_secret_value().partition(":")
        self.session = requests.Session()
        self.session.auth = (uuid, key)

    def put_action(self, name: str, body: Any, **params: str) -> requests.Response:
        return self.session.put(f"{self.base}/actions/{name}", json=body, params=params)


@pytest.fixture
def api(served: Served) -> Api:
    return Api(served)


def python_action(code: str = actions.ECHO, **limits: int) -> dict[str, Any]:
    body: dict[str, Any] = {"exec": {"kind": "python:3.11", "code": code}}
    if limits:
        body["limits"] = limits
    return body


def assert_error(response: requests.Response, status: int, text: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    conforms(body, "ErrorMessage")
    assert text in body["error"]
    assert len(body["code"]) == 32


def test_info_needs_no_auth_and_reports_limits(served: Served) -> None:
    info = requests.get(served.url + "/").json()

    assert info["api_paths"] == ["/api/v1"]
    assert info["limits"]["max_action_memory"] == 1024 * 1024 * 1024
    assert info["limits"]["memory_enforcement"] in ("cgroup-v1", "cgroup-v2", "rss-watchdog")
    assert any(r["kind"] == "python:3.11" for r in info["runtimes"]["python"])


def test_responses_conform_to_the_openwhisk_swagger(api: Api) -> None:
    # Prepare / Execute
    put = api.put_action("echo", python_action())
    got = api.session.get(f"{api.base}/actions/echo")
    listed = api.session.get(f"{api.base}/actions")
    invoked = api.session.post(
        f"{api.base}/actions/echo", json={"x": 1}, params={"blocking": "true"}
    )
    record = invoked.json()
    accepted = api.session.post(f"{api.base}/actions/echo", json={})
    activation = api.session.get(f"{api.base}/activations/{record['activationId']}")
    briefs = api.session.get(f"{api.base}/activations", params={"name": "echo"})
    logs = api.session.get(f"{api.base}/activations/{record['activationId']}/logs")
    result = api.session.get(f"{api.base}/activations/{record['activationId']}/result")
    limits = api.session.get(f"{api.base}/limits")

    # Assert
    conforms(put.json(), "Action")
    conforms(got.json(), "Action")
    assert got.json()["exec"]["code"] == actions.ECHO
    for action in listed.json():
        conforms(action, "Action")
    assert invoked.status_code == 200
    assert invoked.headers["x-openwhisk-activation-id"] == record["activationId"]
    conforms(record, "Activation")
    assert accepted.status_code == 202
    conforms(accepted.json(), "ActivationId")
    conforms(activation.json(), "Activation")
    for brief in briefs.json():
        conforms(brief, "ActivationBrief")
        assert brief["statusCode"] == 0
    conforms(logs.json(), "ActivationLogs")
    conforms(result.json(), "ActivationResult")
    assert result.json()["result"] == {"echo": {"x": 1}}
    conforms(limits.json(), "UserLimits")


def test_blocking_invoke_status_codes(api: Api) -> None:
    api.put_action("raises", python_action(actions.RAISES))
    api.put_action("crash", python_action(actions.CRASHES))
    api.put_action("sleep", python_action(actions.WARMABLE_SLEEP))

    app_error = api.session.post(f"{api.base}/actions/raises", json={}, params={"blocking": "true"})
    developer = api.session.post(
        f"{api.base}/actions/crash", json={}, params={"blocking": "true", "result": "true"}
    )
    too_slow = api.session.post(
        f"{api.base}/actions/sleep",
        json={"seconds": 2},
        params={"blocking": "true", "timeout": "100"},
    )

    assert app_error.status_code == 502
    assert app_error.json()["response"]["status"] == "application error"
    assert developer.status_code == 502
    assert developer.json() == {"error": messages.ABNORMAL_RUN}
    assert too_slow.status_code == 202  # the blocking window ran out; the activation goes on
    conforms(too_slow.json(), "ActivationId")


@pytest.mark.parametrize(
    ("auth", "text"),
    [(None, messages.AUTH_REQUIRED), (("nobody", "wrong"), messages.AUTH_INVALID)],
)
def test_every_api_path_needs_valid_auth(
    served: Served, auth: tuple[str, str] | None, text: str
) -> None:
    base = f"{served.url}/api/v1/namespaces/_"
    calls = [
        ("GET", f"{served.url}/api/v1/namespaces"),
        ("GET", f"{base}/actions"),
        ("PUT", f"{base}/actions/x"),
        ("POST", f"{base}/actions/x"),
        ("DELETE", f"{base}/actions/x"),
        ("GET", f"{base}/activations"),
        ("GET", f"{base}/activations/{'0' * 32}"),
        ("POST", f"{served.url}/faasdl/v1/activations/{'0' * 32}/kill"),
    ]
    for method, url in calls:
        assert_error(requests.request(method, url, auth=auth, json={}), 401, text)


def test_other_namespaces_are_forbidden(api: Api) -> None:
    response = api.session.get(api.base.replace("/_", "/someone-else") + "/actions")

    assert_error(response, 403, "not authorized to access 'someone-else'")


def test_malformed_json_is_a_bad_request(api: Api) -> None:
    response = api.session.put(
        f"{api.base}/actions/echo", data=b"{not json", headers={"Content-Type": "application/json"}
    )

    assert_error(response, 400, "The request content was malformed")


def test_a_number_json_has_not_is_a_bad_request(api: Api) -> None:
    # Python's json reads NaN and Infinity; JSON has neither, and the response that echoed one
    # was a 500.
    api.put_action("echo", python_action())

    response = api.session.post(
        f"{api.base}/actions/echo",
        data=b'{"x": NaN, "y": -Infinity}',
        params={"blocking": "true", "result": "true"},
        headers={"Content-Type": "application/json"},
    )

    assert_error(response, 400, "The request content was malformed:\nNaN is not a JSON value")


def test_text_that_is_no_unicode_is_a_bad_request_and_nothing_is_created(api: Api) -> None:
    # JSON's "\ud800" reads as a lone surrogate: an action created with one in an annotation
    # answered 500, and so did every list of actions after it (its record could not be written).
    body = b'{"exec": {"kind": "python:3.11", "code": "def main(a):\\n    return a\\n"},'
    body += b' "annotations": [{"key": "owner", "value": "x\\ud800"}]}'

    created = api.session.put(
        f"{api.base}/actions/half", data=body, headers={"Content-Type": "application/json"}
    )

    message = "The request content was malformed:\nannotations.0.value: is not Unicode text"
    assert_error(created, 400, message)
    assert api.session.get(f"{api.base}/actions/half").status_code == 404
    assert api.session.get(f"{api.base}/actions").status_code == 200


def test_json_nested_too_deeply_is_a_bad_request(api: Api) -> None:
    # Deeper than Python's recursion, it answered 500; within it but too deep to be written
    # back inside a response, it reset the connection.
    api.put_action("echo", python_action())

    for depth in (MAX_JSON_DEPTH + 1, 100_000):
        response = api.session.post(
            f"{api.base}/actions/echo",
            data=b'{"x": ' + b"[" * depth + b"]" * depth + b"}",
            params={"blocking": "true"},
            headers={"Content-Type": "application/json"},
        )

        assert_error(response, 400, f"nested deeper than {MAX_JSON_DEPTH} levels")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"since": "abc"}, "The query parameter 'since' was malformed:\nInput should be a valid"),
        ({"limit": "1.5"}, "The query parameter 'limit' was malformed:\nInput should be a valid"),
        ({"docs": "maybe"}, "The query parameter 'docs' was malformed:\nInput should be a valid"),
    ],
)
def test_a_malformed_query_parameter_is_a_bad_request_in_openwhisks_words(
    api: Api, query: dict[str, str], message: str
) -> None:
    # FastAPI answered 422 with its own body, which no OpenWhisk client reads.
    response = api.session.get(f"{api.base}/activations", params=query)

    assert_error(response, 400, message)


def test_payload_that_is_not_an_object_is_a_bad_request(api: Api) -> None:
    api.put_action("echo", python_action())

    response = api.session.post(f"{api.base}/actions/echo", json=[1, 2, 3])

    assert_error(response, 400, "the payload must be a JSON object")


def _read_response(sock: socket.socket) -> str:
    """One HTTP response: headers, then as many body bytes as they declare (TCP may split it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"\r\n\r\n"
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode()


def _address(served: Served) -> tuple[str, int]:
    host, _, port = served.url.removeprefix("http://").partition(":")
    return host, int(port)


def _head(served: Served, request_line: str, length: int) -> bytes:
    """An authorized JSON request's line and headers, declaring a body of ``length`` bytes."""
    token = base64.b64encode(served.server_settings.auth.get_secret_value().encode()).decode()
    return (
        f"{request_line} HTTP/1.1\r\nHost: {_address(served)[0]}\r\n"
        f"Authorization: Basic {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def test_oversized_body_is_refused_from_its_declared_length(served: Served, api: Api) -> None:
    # Prepare: declare a body far over the limit but send none of it: the server must answer
    # from the header, without waiting to read the body.
    api.put_action("echo", python_action())
    request = _head(served, "POST /api/v1/namespaces/_/actions/echo", 50_000_000)

    # Execute
    with socket.create_connection(_address(served), timeout=10) as sock:
        sock.sendall(request)
        reply = _read_response(sock)

    # Assert
    assert reply.startswith("HTTP/1.1 413")
    assert "larger than allowed: 50000000 > 1048576 bytes." in reply


def test_a_body_refused_before_its_end_is_not_read_on(api: Api) -> None:
    # requests sends a body whole before it reads the answer: kept alive, the connection had
    # the server read the rest of an endless one after its refusal, for ever.
    api.put_action("echo", python_action())
    payload, stranger = Endless(), Endless()
    json_type = {"Content-Type": "application/json"}

    too_big = api.session.post(
        f"{api.base}/actions/echo", data=payload, headers=json_type, timeout=60
    )
    unknown = requests.post(
        f"{api.base}/actions/echo",
        data=stranger,
        headers=json_type,
        auth=("nobody", "nothing"),
        timeout=60,
    )

    assert (too_big.status_code, unknown.status_code) == (413, 401)
    for body in (payload, stranger):
        assert body.sent < LINGER_BYTES + 16 * 2**20, body.sent  # read on after the answer
    assert too_big.headers["connection"] == "close"


def test_a_request_whose_client_goes_away_mid_body_is_one_log_line(
    served: Served,
    api: Api,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # uvicorn logged an ERROR "Exception in ASGI application" with ClientDisconnect's traceback.
    caplog.set_level(logging.INFO, logger="faasdl.platform.local.server")
    request = _head(served, "PUT /api/v1/namespaces/_/actions/cut", 5000)

    with socket.create_connection(_address(served), timeout=10) as sock:
        sock.sendall(request + b'{"exec": {"code": "' + b"x" * 1000)
    eventually(
        lambda: "PUT /api/v1/namespaces/_/actions/cut stopped: its client went away" in caplog.text,
        what="the request's end logged",
    )

    assert "Exception in ASGI application" not in capfd.readouterr().err
    assert api.session.get(f"{api.base}/actions/cut").status_code == 404  # nothing made


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        (
            python_action(memory=4096),
            400,
            "memory size 4096 MB exceeds allowed threshold of 1024 MB",
        ),
        (python_action(timeout=50), 400, "duration 50 milliseconds below allowed threshold"),
        ({"exec": {"kind": "swift:5.7", "code": "x"}}, 400, "runtime 'swift:5.7' is not supported"),
        ({"exec": {"kind": "blackbox", "image": "a/b"}}, 400, "runs no container images"),
        ({"exec": {"kind": "python:3.11"}}, 400, "exec.code must be a string"),
        ({"limits": {"memory": 256}}, 400, "exec undefined"),
        (python_action() | {"limits": {"memory": "lots"}}, 400, "limits.memory must be an integer"),
        (python_action() | {"parameters": {"a": 1}}, 400, "parameters must be a list"),
    ],
)
def test_bad_actions_are_refused_and_nothing_is_created(
    api: Api, body: dict[str, Any], status: int, text: str
) -> None:
    response = api.put_action("bad", body)

    assert_error(response, status, text)
    assert_error(api.session.get(f"{api.base}/actions/bad"), 404, messages.RESOURCE_DOES_NOT_EXIST)


def test_existing_action_without_overwrite_conflicts(api: Api) -> None:
    assert api.put_action("echo", python_action()).status_code == 200

    response = api.put_action("echo", python_action())

    assert_error(response, 409, messages.RESOURCE_EXISTS)
    assert api.put_action("echo", python_action(), overwrite="true").status_code == 200


def test_unknown_action_and_activation_are_not_found(api: Api) -> None:
    for response in (
        api.session.post(f"{api.base}/actions/missing", json={}),
        api.session.get(f"{api.base}/actions/missing"),
        api.session.delete(f"{api.base}/actions/missing"),
        api.session.get(f"{api.base}/activations/{'0' * 32}"),
        api.session.get(f"{api.base}/activations/{'0' * 32}/logs"),
    ):
        assert_error(response, 404, messages.RESOURCE_DOES_NOT_EXIST)


def test_a_path_or_method_no_route_serves_is_answered_in_openwhisks_words(api: Api) -> None:
    api.put_action("echo", python_action())

    assert_error(api.session.get(f"{api.base}/nothing/here"), 404, messages.RESOURCE_DOES_NOT_EXIST)
    patch = api.session.patch(f"{api.base}/actions/echo")
    assert_error(patch, 405, "HTTP method not allowed, supported methods: ")
    assert set(patch.headers["allow"].split(", ")) == {"GET", "PUT", "POST", "DELETE"}


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("packages", "packages"),
        ("packages/utils", "packages"),
        ("triggers/every-minute", "triggers"),
        ("rules", "rules"),
    ],
)
def test_what_openwhisk_serves_and_the_embedded_platform_does_not_is_named(
    api: Api, path: str, what: str
) -> None:
    response = api.session.get(f"{api.base}/{path}")

    assert_error(response, 501, f"serves actions and activations only: {what} are not supported")


def test_web_actions_are_named_as_not_served(served: Served) -> None:
    response = requests.get(f"{served.url}/api/v1/web/guest/default/echo.json")

    assert_error(response, 501, "web actions are not supported")


def test_bad_wait_timeout_and_list_limits_are_refused(api: Api) -> None:
    api.put_action("echo", python_action())

    wait = api.session.post(
        f"{api.base}/actions/echo", json={}, params={"blocking": "true", "timeout": "90000"}
    )
    limit = api.session.get(f"{api.base}/actions", params={"limit": 500})

    assert_error(wait, 400, "Timeout must be number of milliseconds up to 60000.")
    assert_error(limit, 400, "The value '500' is not in the range of 0 to 200 for actions.")


def test_update_without_exec_keeps_the_code_and_changes_limits(api: Api) -> None:
    api.put_action("echo", python_action(memory=256))

    response = api.put_action("echo", {"limits": {"memory": 512}}, overwrite="true")
    invoked = api.session.post(
        f"{api.base}/actions/echo", json={"k": "v"}, params={"blocking": "true"}
    )

    assert response.json()["limits"]["memory"] == 512
    assert invoked.json()["response"]["result"] == {"echo": {"k": "v"}}


def test_an_update_that_names_no_parameters_or_annotations_keeps_the_actions(api: Api) -> None:
    # They were dropped: `wsk action update echo --memory 512` lost its bound and init parameters.
    created = python_action() | {
        "parameters": [
            {"key": "greeting", "value": "hi"},
            {"key": "FAASDL_CONTRACT_SECRET", "value": "s3cret", "init": True},
        ],
        "annotations": [{"key": "team", "value": "ml"}],
    }
    api.put_action("echo", created)

    kept = api.put_action("echo", {"limits": {"memory": 512}}, overwrite="true").json()
    replaced = api.put_action(
        "echo", {"parameters": [], "annotations": []}, overwrite="true"
    ).json()
    twice = {"key": "FAASDL_CONTRACT_SECRET", "init": True}  # the last one is kept, as in a map
    named_twice = api.put_action(
        "echo", {"parameters": [twice | {"value": "a"}, twice | {"value": "b"}]}, overwrite="true"
    )

    assert kept["parameters"] == created["parameters"]
    assert {"key": "team", "value": "ml"} in kept["annotations"]
    assert replaced["parameters"] == []
    assert {"key": "team", "value": "ml"} not in replaced["annotations"]
    assert named_twice.status_code == 200, named_twice.text
    assert named_twice.json()["parameters"] == [twice | {"value": "b"}]


# -- the REST client against the server --------------------------------------------------------


def test_client_retries_429_with_backoff_until_it_gets_through(
    make_served: Callable[..., Served],
) -> None:
    # Prepare: one activation allowed in flight, and it sleeps for a second. Each jittered wait
    # is uniform in [0, 0.3] s, so 60 attempts outlast that second with overwhelming odds
    # (12 did not always: CI once drew eleven waits that summed under a second).
    served = make_served(
        client={"retry_attempts": 60, "retry_max_wait_s": 0.3}, concurrent_invocations=1
    )
    client = served.client
    client.deploy(ActionSpec(name="sleep", code=actions.WARMABLE_SLEEP))
    first = client.invoke("sleep", {"seconds": 1})
    started = time.monotonic()

    # Execute: throttled while the first runs, retried, then accepted.
    second = client.invoke("sleep", {"seconds": 0})

    # Assert
    assert time.monotonic() - started > 0.3
    records = client.wait([first, second], timeout_s=30)
    assert all(r.success for r in records.values())


def test_client_gives_up_on_a_persistent_throttle(make_served: Callable[..., Served]) -> None:
    served = make_served(
        client={"retry_attempts": 2, "retry_max_wait_s": 0.05}, concurrent_invocations=1
    )
    served.client.deploy(ActionSpec(name="sleep", code=actions.WARMABLE_SLEEP))
    served.client.invoke("sleep", {"seconds": 3})
    told: list[str] = []

    with (
        pytest.raises(Throttled, match="Too many concurrent requests in flight"),
        retries_told(told.append),
    ):
        served.client.invoke("sleep", {"seconds": 0})

    # A throttled call was answered: a job's log is not told of its retries (an outage's are).
    assert told == []


def test_client_reports_bad_credentials(served: Served) -> None:
    client = OpenWhiskPlatform(
        settings=OpenWhiskSettings(api_host=served.url, auth="someone:wrong-key")
    )
    client.open()
    try:
        with pytest.raises(AuthenticationFailed, match="supplied authentication is invalid"):
            client.list_actions()
    finally:
        client.close()


def test_client_reports_an_unreachable_platform_after_its_retries_and_stays_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = OpenWhiskSettings(
        api_host=f"http://127.0.0.1:{port}", retry_attempts=2, retry_max_wait_s=0.05
    )
    client = OpenWhiskPlatform(settings=settings)

    with pytest.raises(PlatformUnavailable, match=f"127.0.0.1:{port}") as raised:
        client.open()

    assert str(raised.value).endswith(": [Errno 111] Connection refused")
    # Asked twice, as every call is (it was asked once: an API restarting failed the start).
    assert len([r for r in caplog.records if "Retrying" in r.getMessage()]) == 1
    # Not left half open: opened again, it asks again (it returned, holding no limits).
    with pytest.raises(PlatformUnavailable, match=f"127.0.0.1:{port}"):
        client.open()


def test_a_ping_asks_once_and_names_the_outage_or_the_refused_key(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    served.client.ping()
    wrong = OpenWhiskPlatform(
        settings=OpenWhiskSettings(api_host=served.url, auth="someone:wrong-key")
    )
    wrong.open()
    with pytest.raises(AuthenticationFailed, match="supplied authentication is invalid"):
        wrong.ping()
    wrong.close()

    served.server.stop()

    with pytest.raises(PlatformUnavailable, match=r"Connection refused"):
        served.client.ping()
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]  # asked once


def test_client_names_its_timeout_when_the_platform_does_not_answer() -> None:
    with socket.socket() as silent:  # listens, so a connection is made, and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        settings = OpenWhiskSettings(api_host=url, request_timeout_s=0.2, retry_max_wait_s=0.1)
        client = OpenWhiskPlatform(settings=settings)

        with pytest.raises(PlatformUnavailable) as raised:
            client.open()

    assert str(raised.value) == (
        f"cannot read OpenWhisk's limits from {url}/: "
        "no answer in 0.2 s (FAASDL_OPENWHISK__REQUEST_TIMEOUT_S)"
    )


def test_an_api_host_that_answers_a_web_page_is_told_and_not_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # It was "cannot read OpenWhisk's limits from …: 0" (json's error's reason), asked again
    # for ~90 s as an outage.
    with web_server() as url:
        client = OpenWhiskPlatform(settings=OpenWhiskSettings(api_host=url))
        with caplog.at_level(logging.WARNING), pytest.raises(PlatformError) as raised:
            client.open()

    assert not isinstance(raised.value, PlatformUnavailable)
    assert str(raised.value) == (
        f"{url}/ answered {PAGE_BYTES} bytes of text/html, not OpenWhisk's JSON: is "
        "FAASDL_OPENWHISK__API_HOST OpenWhisk's API?"
    )
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]


def test_a_ping_of_a_platform_that_does_not_answer_ends_within_the_probes_timeout() -> None:
    # Arrange: opened (its limits read) against an API that then hangs; requests' own timeout
    # is 30 s.
    with hung_http_server({"/": {"limits": {}}}) as url:
        client = OpenWhiskPlatform(settings=OpenWhiskSettings(api_host=url, request_timeout_s=30))
        client.open()
        try:
            # Act
            with pytest.raises(PlatformUnavailable) as raised:
                client.ping()
        finally:
            client.close()

    # Assert: it waited 2 s, within the chart's readiness probe's 5 s, and says so.
    assert str(raised.value) == f"cannot reach OpenWhisk at {url}: no answer in 2 s"


def test_a_blocking_invoke_waits_its_window_beyond_the_request_timeout(
    make_served: Callable[..., Served], caplog: pytest.LogCaptureFixture
) -> None:
    # Arrange: requests time out after 0.3 s, and the action answers after 1.5 s, inside the
    # blocking window: the server holds that answer by design, so it is no outage.
    served = make_served(client={"request_timeout_s": 0.3, "blocking_wait_ms": 10_000})
    served.client.deploy(ActionSpec(name="sleep", code=actions.WARMABLE_SLEEP))

    # Act
    with caplog.at_level(logging.WARNING, logger="faasdl.platform.openwhisk"):
        record = served.client.call("sleep", {"seconds": 1.5}, timeout_s=30)

    # Assert: answered by the blocking invoke itself, asked once.
    assert record.success
    assert record.response.result == {"slept": 1.5}
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]
    assert len(served.local.list_activations(name="sleep")) == 1


def test_a_closed_client_says_so_at_once_without_retrying(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    # Arrange: a client opened and closed (a controller that has stopped, whose replicas'
    # warm-up thread calls it once more).
    settings = OpenWhiskSettings(api_host=served.url, auth=served.server_settings.auth)
    client = OpenWhiskPlatform(settings=settings)
    client.open()
    client.close()

    # Act
    with (
        caplog.at_level(logging.WARNING, logger="faasdl.platform.openwhisk"),
        pytest.raises(PlatformUnavailable, match="not open"),
    ):
        client.get_activation("0" * 32)

    # Assert: no retry, which would wait up to FAASDL_OPENWHISK__RETRY_MAX_WAIT_S between eight
    # attempts, each of them logged, for a call that cannot succeed.
    assert caplog.records == []


def test_client_cannot_kill_without_an_admin_endpoint(served: Served) -> None:
    client = OpenWhiskPlatform(
        settings=OpenWhiskSettings(api_host=served.url, auth=served.server_settings.auth)
    )
    client.open()
    try:
        with pytest.raises(Exception, match="cannot kill an activation's container"):
            client.kill("0" * 32)
    finally:
        client.close()


def test_a_variant_is_deployed_again_once_the_stores_settings_for_its_actions_change(
    make_served: Callable[..., Served],
) -> None:
    # Prepare
    served = make_served()
    first_env = {"FAASDL_STORE__PASSWORD": "first", "FAASDL_STORE__SPILL_BYTES": "0"}
    second_env = first_env | {"FAASDL_STORE__PASSWORD": "second"}

    # Execute: deployed, asked again alike, then with another password.
    name = deploy_variant(
        served.client, TRAIN, memory_mb=512, timeout_ms=60_000, environment=first_env
    )
    first = served.local.get_action(name)
    deploy_variant(served.client, TRAIN, memory_mb=512, timeout_ms=60_000, environment=first_env)
    kept = served.local.get_action(name)
    deploy_variant(served.client, TRAIN, memory_mb=512, timeout_ms=60_000, environment=second_env)
    renewed = served.local.get_action(name)

    # Assert: kept while its environment was the same (its warm containers with it), deployed
    # again with the new one, which its record keeps as init parameters.
    assert kept.version == first.version
    assert renewed.version != first.version
    assert {p.key: p.value for p in renewed.parameters if p.init} == second_env
    assert not [p for p in renewed.parameters if not p.init]


def test_a_variant_is_kept_where_the_platform_encrypts_its_parameters_until_they_change(
    make_served: Callable[..., Served],
) -> None:
    # Prepare: a platform that encrypts parameters at rest, as OpenWhisk's parameter storage
    # does: an action's record shows each value sealed, anew at each deploy (so a variant
    # compared by its values was deployed again at each job, its warm containers lost).
    served = make_served(parameter_storage_key=PARAMETER_STORAGE_KEY)
    first_env = {"FAASDL_STORE__PASSWORD": "first", "FAASDL_STORE__SPILL_BYTES": "0"}
    second_env = first_env | {"FAASDL_STORE__PASSWORD": "second"}

    # Execute: deployed, asked again alike, then with another password, then alike again.
    asked = [first_env, first_env, second_env, second_env]
    versions = []
    for environment in asked:
        name = deploy_variant(
            served.client, TRAIN, memory_mb=512, timeout_ms=60_000, environment=environment
        )
        versions.append(served.client.get_action(name).version)
    record = served.client.get_action(name)

    # Assert: kept while its parameters were the same, deployed again with the new ones; the
    # digest that stands for them is salted scrypt's, no password in it.
    assert versions[1] == versions[0]
    assert versions[2] != versions[1]
    assert versions[3] == versions[2]
    assert {p.encryption for p in record.parameters} == {"aes128"}
    [digest] = [a.value for a in record.annotations if a.key == PARAMETERS_DIGEST]
    kind, salt, hashed = digest.split(":")
    assert (kind, len(bytes.fromhex(salt)), len(bytes.fromhex(hashed))) == ("scrypt", 16, 32)
    assert "second" not in digest


def test_an_update_keeps_the_parameters_it_names_none_of_or_sends_back_sealed(
    make_served: Callable[..., Served],
) -> None:
    # Prepare: an action whose parameters the platform encrypts at rest.
    served = make_served(parameter_storage_key=PARAMETER_STORAGE_KEY)
    api = Api(served)
    served.client.deploy(
        ActionSpec(
            name="env",
            code=actions.ENVIRONMENT,
            parameters={"bound": "one"},
            environment={"FAASDL_CONTRACT_PASSWORD": "s3cret"},
        )
    )
    record = api.session.get(f"{api.base}/actions/env").json()

    # Execute: an update that names no parameters (`wsk action update env --memory 256`), one
    # that sends back the record's sealed ones, and one that sends one this key did not seal.
    kept = api.put_action("env", {"limits": {"memory": 256}}, overwrite="true")
    after_kept = served.client.call("env", {})
    sent_back = api.put_action("env", {"parameters": record["parameters"]}, overwrite="true")
    after_sent_back = served.client.call("env", {})
    forged = [{**p, "value": base64.b64encode(b"x" * 40).decode()} for p in record["parameters"]]
    refused = api.put_action("env", {"parameters": forged}, overwrite="true")

    # Assert: the action gets its parameters as set after each (opened, not sealed twice);
    # the forged one refused, the action as it was.
    as_set = {"args": {"bound": "one"}, "env": {"FAASDL_CONTRACT_PASSWORD": "s3cret"}}
    assert (kept.status_code, sent_back.status_code) == (200, 200)
    assert after_kept.response.result == as_set
    assert after_sent_back.response.result == as_set
    assert_error(refused, 400, "not a value this platform's key sealed")
    assert served.client.call("env", {}).response.result == as_set


def test_faasdls_actions_are_deployed_in_the_action_image_once_one_is_set(
    make_served: Callable[..., Served],
) -> None:
    # Arrange: a platform that has the image, a client configured to use it.
    image = "faasdl/action:test"
    served = make_served(client={"action_image": image}, images=[image])
    plain = make_served().client

    # Execute; then the variant's entry point replaced by an older faasdl's, and asked again.
    name = deploy_variant(served.client, TRAIN, memory_mb=512, timeout_ms=60_000, environment={})
    first = served.local.get_action(name)
    again = deploy_variant(served.client, TRAIN, memory_mb=512, timeout_ms=60_000, environment={})
    kept = served.local.get_action(name)
    served.client.deploy(
        ActionSpec(
            name=name,
            code="from faasdl.old_training_action import main\n",
            kind="blackbox",
            image=image,
            memory_mb=512,
            timeout_ms=60_000,
        )
    )
    older = served.local.get_action(name)
    deploy_variant(served.client, TRAIN, memory_mb=512, timeout_ms=60_000, environment={})
    source = deploy_variant(plain, TRAIN, memory_mb=512, timeout_ms=60_000, environment={})

    # Assert: a blackbox action in the image, left alone when asked again, deployed again once
    # its code was not faasdl's; python without an image.
    assert (first.exec.kind, first.exec.image) == ("blackbox", image)
    assert again == name
    assert kept.version == first.version
    renewed = served.local.get_action(name, code=True)
    assert renewed.version not in (first.version, older.version)
    assert renewed.exec.code == action_code(TRAIN)
    assert plain.get_action(source).exec.kind.startswith("python")


@pytest.mark.filterwarnings(
    "ignore:Unverified HTTPS request:urllib3.exceptions.InsecureRequestWarning"
)
def test_an_https_server_is_reached_with_its_ca_bundle_and_refused_without_it(
    make_served: Callable[..., Served], tmp_path: Path
) -> None:
    # Arrange: the server over HTTPS with a certificate of a fresh CA's (its API key went in the
    # clear, and a client could verify a private CA's certificate only by turning checks off;
    # where REQUESTS_CA_BUNDLE is set, as here, verify_tls false was overridden by it).
    tls = tls_files(tmp_path)
    served = make_served(
        client={"ca_file": tls.ca_file},
        server={"tls_cert_file": tls.cert_file, "tls_key_file": tls.key_file},
    )

    def reached(**settings: Any) -> str:
        given = {"api_host": served.url, "auth": served.server_settings.auth, "retry_attempts": 1}
        client = OpenWhiskPlatform(settings=OpenWhiskSettings(**(given | settings)))
        try:
            client.open()
        except PlatformUnavailable as exc:
            return str(exc)
        client.close()
        return "reached"

    # Execute
    with_bundle = reached(ca_file=tls.ca_file)
    systems = reached()
    unverified = reached(verify_tls=False)
    in_the_clear = reached(api_host=served.url.replace("https://", "http://"), verify_tls=False)

    # Assert
    assert served.url.startswith("https://127.0.0.1:")
    assert with_bundle == "reached"
    assert "certificate verify failed" in systems
    assert unverified == "reached"
    assert in_the_clear != "reached"


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"verify_tls": False, "ca_file": __file__}, "ca_file: verify_tls is false"),
        ({"ca_file": "/nonexistent/ca.pem"}, "ca_file: cannot read /nonexistent/ca.pem"),
    ],
)
def test_a_ca_bundle_that_cannot_verify_is_refused_as_it_is_read(
    settings: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValueError, match=said):
        OpenWhiskSettings(**settings)
