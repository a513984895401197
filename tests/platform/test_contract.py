"""The Platform contract, run against LocalPlatform in process and OpenWhiskPlatform through the
embedded platform's REST server (the ``make_platform`` fixture is parametrized over both)."""

from __future__ import annotations

import base64
import io
import re
import threading
import zipfile

import pytest

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
    APPLICATION_ERROR,
    DEVELOPER_ERROR,
    SUCCESS,
    ActionSpec,
    Activation,
    Platform,
)
from faasdl.platform.classify import FailureKind, classify
from faasdl.platform.openwhisk import OpenWhiskPlatform
from tests.conftest import PARAMETER_STORAGE_KEY, PlatformFactory, kill_when_running
from tests.platform import actions

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z (stdout|stderr): ")


def deploy(platform: Platform, name: str, code: str | bytes, **limits: int) -> None:
    platform.deploy(ActionSpec(name=name, code=code, **limits))


def test_deploy_get_list_update_delete(platform: Platform) -> None:
    # Prepare / Execute
    created = platform.deploy(ActionSpec(name="echo", code=actions.ECHO, memory_mb=128))
    fetched = platform.get_action("echo")
    with_code = platform.get_action("echo", code=True)
    updated = platform.deploy(ActionSpec(name="echo", code=actions.ECHO, timeout_ms=5000))
    names = [a.name for a in platform.list_actions()]
    platform.delete_action("echo")

    # Assert
    assert created.limits.memory == 128
    assert created.exec.kind == fetched.exec.kind
    assert fetched.exec.code is None
    assert with_code.exec.code == actions.ECHO
    assert updated.version != created.version
    assert updated.limits.timeout == 5000
    assert "echo" in names
    with pytest.raises(ActionNotFound):
        platform.get_action("echo")
    with pytest.raises(ActionNotFound):
        platform.delete_action("echo")


def test_init_parameters_are_the_containers_environment_and_no_runs_argument(
    platform: Platform,
) -> None:
    # Prepare: an action with a parameter bound as usual and two init parameters (OpenWhisk's
    # "init": true), one of them no text.
    environment = {"FAASDL_CONTRACT_PASSWORD": "s3cret", "FAASDL_CONTRACT_LIMIT": 3}
    spec = ActionSpec(name="env", code=actions.ENVIRONMENT, parameters={"bound": 1})

    # Execute
    platform.deploy(spec.model_copy(update={"environment": environment}))
    record = platform.call("env", {"given": 2})
    action = platform.get_action("env")

    # Assert: the init parameters are its environment, set as its container started, and not
    # among its arguments; its record keeps them, marked.
    assert record.response.result == {
        "args": {"bound": 1, "given": 2},
        "env": {"FAASDL_CONTRACT_PASSWORD": "s3cret", "FAASDL_CONTRACT_LIMIT": "3"},
    }
    assert sorted((p.key, p.value, p.init) for p in action.parameters) == [
        ("FAASDL_CONTRACT_LIMIT", 3, True),
        ("FAASDL_CONTRACT_PASSWORD", "s3cret", True),
        ("bound", 1, None),
    ]


def test_parameters_encrypted_at_rest_are_sealed_in_the_record_and_given_to_the_action_as_set(
    make_platform: PlatformFactory,
) -> None:
    # Prepare: a platform that encrypts parameters at rest (OpenWhisk's parameter storage); an
    # action with a parameter bound and an init parameter.
    platform = make_platform(parameter_storage_key=PARAMETER_STORAGE_KEY)
    spec = ActionSpec(
        name="env",
        code=actions.ENVIRONMENT,
        parameters={"bound": "one"},
        environment={"FAASDL_CONTRACT_PASSWORD": "s3cret"},
    )

    # Execute: deployed, run, read; then deployed alike again; then one with a number.
    platform.deploy(spec)
    record = platform.call("env", {"given": 2})
    action = platform.get_action("env")
    platform.deploy(spec)
    again = platform.get_action("env")
    with pytest.raises(InvalidAction, match="'bound' is not a string") as refused:
        platform.deploy(spec.model_copy(update={"name": "number", "parameters": {"bound": 1}}))

    # Assert: the action got them as set; its record holds each sealed as OpenWhisk's does
    # (aes128: the IV's length, 12, the IV and the ciphertext with its tag, in base64), anew at
    # each deploy; a value that is no string refused, saying why.
    assert record.response.result == {
        "args": {"bound": "one", "given": 2},
        "env": {"FAASDL_CONTRACT_PASSWORD": "s3cret"},
    }
    sealed = {p.key: p for p in action.parameters}
    assert sorted((p.key, p.init, p.encryption) for p in sealed.values()) == [
        ("FAASDL_CONTRACT_PASSWORD", True, "aes128"),
        ("bound", None, "aes128"),
    ]
    for key, value in [("FAASDL_CONTRACT_PASSWORD", "s3cret"), ("bound", "one")]:
        raw = base64.b64decode(sealed[key].value)
        assert raw[:4] == (12).to_bytes(4, "big")
        assert len(raw) == 4 + 12 + len(value) + 16
        assert value.encode() not in raw
    assert {p.key for p in again.parameters} == sealed.keys()
    assert all(p.value != sealed[p.key].value for p in again.parameters)
    assert "FAASDL_LOCAL__PARAMETER_STORAGE_KEY" in str(refused.value)


def test_a_container_gets_none_of_the_platforms_own_settings(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The embedded platform's containers inherited its whole environment: its OpenWhisk key, the
    # store's password, and a CA bundle's file beside the init parameters' text of it (the
    # actions refused the two: a job on a TLS Redis set up from the environment failed).
    # Arrange: the platform's process with settings of its own, and the action's thread count.
    monkeypatch.setenv("FAASDL_OPENWHISK__AUTH", "user:s3cret")
    monkeypatch.setenv("FAASDL_STORE__PASSWORD", "s3cret")
    monkeypatch.setenv("FAASDL_ACTION_THREADS", "2")
    platform.deploy(
        ActionSpec(
            name="names", code=actions.FAASDL_NAMES, environment={"FAASDL_STORE__USERNAME": "u"}
        )
    )

    # Execute
    record = platform.call("names", {})

    # Assert: its init parameter and the action's own variable, none of the platform's.
    assert record.response.result == {"names": ["FAASDL_ACTION_THREADS", "FAASDL_STORE__USERNAME"]}


def test_a_blackbox_action_runs_in_an_image_the_platform_has_and_no_other(
    make_platform: PlatformFactory,
) -> None:
    # Arrange: a platform that has faasdl's action image (its own runtime stands for it).
    platform = make_platform(images=["faasdl/action:test"])

    # Execute
    created = platform.deploy(
        ActionSpec(name="boxed", code=actions.ECHO, kind="blackbox", image="faasdl/action:test")
    )
    record = platform.call("boxed", {"name": "faasdl"})
    with pytest.raises(InvalidAction, match="image 'other/image:1' is not available"):
        platform.deploy(
            ActionSpec(name="other", code=actions.ECHO, kind="blackbox", image="other/image:1")
        )

    # Assert
    assert (created.exec.kind, created.exec.image) == ("blackbox", "faasdl/action:test")
    assert platform.get_action("boxed").exec.image == "faasdl/action:test"
    assert record.response.success
    assert record.response.result == {"echo": {"name": "faasdl"}}
    with pytest.raises(ActionNotFound):
        platform.get_action("other")


def test_success_record_mirrors_openwhisk(platform: Platform) -> None:
    deploy(platform, "echo", actions.ECHO)

    record = platform.call("echo", {"name": "faasdl"})

    assert record.response.status == SUCCESS
    assert record.response.success is True
    assert record.response.result == {"echo": {"name": "faasdl"}}
    assert len(record.activationId) == 32
    assert record.end >= record.start
    assert record.duration == record.end - record.start
    assert record.annotation("path").endswith("/echo")
    assert record.annotation("kind").startswith("python:")
    assert record.annotation("limits")["memory"] == 256
    assert record.timed_out is False
    assert record.init_time is not None  # the first activation is a cold start
    assert any(line.endswith("stdout: hello faasdl") for line in record.logs)
    assert all(LOG_LINE.match(line) for line in record.logs)
    assert platform.get_activation(record.activationId) == record


def test_memory_limit_kills_within_a_second(platform: Platform) -> None:
    # Prepare: an action that allocates twice its 128 MB limit, 4 MB every 10 ms.
    deploy(platform, "hog", actions.ALLOCATES, memory_mb=128, timeout_ms=30_000)

    # Execute
    record = platform.call("hog", {"mb": 256})

    # Assert: OpenWhisk's Docker wording, and the kill came less than a second after the last
    # moment the action was still under its limit (so within a second of crossing it).
    assert record.response.status == DEVELOPER_ERROR
    assert record.error == messages.MEMORY_EXHAUSTED
    steps = [
        line.split("stdout: step ")[1].split() for line in record.logs if "stdout: step" in line
    ]
    under = [float(t) for t, rss in steps if float(rss) <= 128]
    assert under, record.logs
    assert record.end - under[-1] * 1000 <= 1000
    assert classify(record).kind is FailureKind.OUT_OF_MEMORY  # type: ignore[union-attr]


def test_time_limit_kills_with_openwhisk_text(platform: Platform) -> None:
    deploy(platform, "sleepy", actions.WARMABLE_SLEEP, timeout_ms=1000)

    record = platform.call("sleepy", {"seconds": 30})

    assert record.response.status == DEVELOPER_ERROR
    assert record.error == "The action exceeded its time limits of 1000 milliseconds."
    assert record.timed_out is True
    run_ms = record.duration - (record.init_time or 0)  # type: ignore[operator]
    assert 1000 <= run_ms < 5000
    assert classify(record).kind is FailureKind.OUT_OF_TIME  # type: ignore[union-attr]


def test_crash_is_a_developer_error_and_the_container_is_destroyed(platform: Platform) -> None:
    deploy(platform, "crash", actions.CRASHES)

    first = platform.call("crash")
    second = platform.call("crash")

    assert first.response.status == DEVELOPER_ERROR
    assert first.error == messages.ABNORMAL_RUN
    assert first.logs[-1].endswith(messages.LOG_WARNING_DEVELOPER_ERROR)
    assert second.init_time is not None  # a fresh container: the crashed one is gone
    assert classify(first).kind is FailureKind.CRASH  # type: ignore[union-attr]


def test_exception_is_an_application_error_and_the_container_stays_warm(platform: Platform) -> None:
    deploy(platform, "raises", actions.RAISES)

    first = platform.call("raises", {"n": 1})
    second = platform.call("raises", {"n": 2})

    assert first.response.status == APPLICATION_ERROR
    assert first.response.result == {"error": "bad input: 1"}
    assert any("ValueError: bad input: 1" in line for line in first.logs)
    assert first.init_time is not None
    assert second.init_time is None  # warm reuse
    assert second.response.result == {"error": "bad input: 2"}


def test_full_pool_queues_fifo_and_every_activation_succeeds(
    make_platform: PlatformFactory,
) -> None:
    # Prepare: a 512 MB pool holds two 256 MB containers.
    platform = make_platform(pool_memory_mb=512, memory_max_mb=512)
    deploy(platform, "sleep", actions.WARMABLE_SLEEP, memory_mb=256)

    # Execute
    ids = [platform.invoke("sleep", {"seconds": 1}) for _ in range(4)]
    records = platform.wait(ids, timeout_s=60)

    # Assert: two ran at once; the other two waited for them (> 1 s of sleep) and then reused
    # their warm containers.
    waits = sorted(records[i].wait_time for i in ids)
    assert all(r.success for r in records.values())
    assert waits[2] >= 1000
    assert waits[3] >= 1000
    assert waits[1] < 1000
    queued = [r for r in records.values() if r.wait_time >= 1000]
    assert all(r.init_time is None for r in queued)


def test_prewarmed_action_skips_the_cold_start(platform: Platform) -> None:
    deploy(platform, "warmable", actions.WARMABLE_SLEEP)

    ready = platform.prewarm("warmable", 1)
    record = platform.call("warmable", {"seconds": 0})

    assert ready == 1
    assert record.success
    assert record.init_time is None


def test_killing_an_activations_container_is_a_developer_error(platform: Platform) -> None:
    # Prepare: warm the container so the kill lands while main runs.
    deploy(platform, "sleep", actions.WARMABLE_SLEEP)
    assert platform.call("sleep", {"seconds": 0}).success
    activation_id = platform.invoke("sleep", {"seconds": 30})

    # Execute
    kill_when_running(platform, activation_id)
    record = platform.wait([activation_id], timeout_s=20)[activation_id]

    # Assert
    assert record.response.status == DEVELOPER_ERROR
    assert record.error == messages.ABNORMAL_RUN
    assert record.duration is not None
    assert record.duration < 20_000
    with pytest.raises(ActivationNotFound):
        platform.kill(activation_id)


def test_zip_action_with_selected_main(platform: Platform) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(
            "__main__.py", "from helper import greet\n\ndef entry(args):\n    return greet(args)\n"
        )
        archive.writestr(
            "helper.py", "def greet(args):\n    return {'greeting': 'hi ' + args['who']}\n"
        )
    platform.deploy(ActionSpec(name="zipped", code=buffer.getvalue(), main="entry"))

    record = platform.call("zipped", {"who": "zip"})

    assert record.response.result == {"greeting": "hi zip"}


def test_update_takes_effect_on_the_next_activation(platform: Platform) -> None:
    deploy(platform, "versioned", "def main(a):\n    return {'v': 1}\n")
    first = platform.call("versioned")
    deploy(platform, "versioned", "def main(a):\n    return {'v': 2}\n")

    second = platform.call("versioned")

    assert first.response.result == {"v": 1}
    assert second.response.result == {"v": 2}
    assert second.version != first.version


def test_bad_return_value_and_broken_init_are_developer_errors(platform: Platform) -> None:
    deploy(platform, "number", actions.NOT_A_DICT)
    deploy(platform, "broken", actions.BROKEN)

    number = platform.call("number")
    broken = platform.call("broken")

    assert number.response.status == DEVELOPER_ERROR
    assert number.error == messages.NOT_A_DICT
    assert broken.response.status == DEVELOPER_ERROR
    assert broken.error == messages.CANNOT_START
    assert any("No module named 'no_such_module_anywhere'" in line for line in broken.logs)
    assert classify(broken).kind is FailureKind.APPLICATION_ERROR  # type: ignore[union-attr]


def test_a_result_that_is_not_json_is_a_developer_error(platform: Platform) -> None:
    # Python's json writes NaN; OpenWhisk's parser refuses it, and so does every JSON response
    # (the embedded server answered 500 for it).
    deploy(platform, "nan", "def main(args):\n    return {'loss': float('nan')}\n")

    record = platform.call("nan")

    assert record.response.status == DEVELOPER_ERROR
    assert record.error == messages.invalid_run_response('{"loss": NaN}')


def test_result_over_the_limit_is_truncated(platform: Platform) -> None:
    deploy(platform, "big", actions.BIG_RESULT)

    record = platform.call("big", {"bytes": 2 * 1024 * 1024})

    assert record.response.status == APPLICATION_ERROR
    assert record.error is not None
    assert record.error.startswith(
        "The action produced a response that exceeded the allowed length"
    )


def test_list_activations_newest_first_and_filtered(platform: Platform) -> None:
    deploy(platform, "echo", actions.ECHO)
    deploy(platform, "other", actions.ECHO)
    ids = [platform.call("echo", {"i": i}).activationId for i in range(3)]
    platform.call("other")

    listed = platform.list_activations(name="echo", limit=10)

    assert [r.activationId for r in listed] == ids[::-1]


def test_wait_times_out_with_the_pending_ids(platform: Platform) -> None:
    deploy(platform, "sleep", actions.WARMABLE_SLEEP)
    activation_id = platform.invoke("sleep", {"seconds": 5})

    with pytest.raises(ActivationTimeout) as caught:
        platform.wait([activation_id], timeout_s=0.3)

    assert caught.value.pending == (activation_id,)


def test_only_an_embedded_platform_tells_an_activation_it_never_ran(
    make_platform: PlatformFactory,
) -> None:
    # Arrange: an activation running, one ended, and one of another platform (as a controller
    # restarted with a new embedded platform asks of its predecessor's).
    platform, other = make_platform(), make_platform()
    for p in (platform, other):
        deploy(p, "sleep", actions.WARMABLE_SLEEP)
    running = platform.invoke("sleep", {"seconds": 5})
    ended = platform.call("sleep", {"seconds": 0}).activationId
    elsewhere = other.call("sleep", {"seconds": 0}).activationId

    # Execute
    forgotten = {i: platform.forgot(i) for i in (running, ended, elsewhere)}

    # Assert: OpenWhisk cannot tell a record still to come from one that never will.
    embedded = not isinstance(platform, OpenWhiskPlatform)
    assert forgotten == {running: False, ended: False, elsewhere: embedded}


# -- bad input ----------------------------------------------------------------------------------


def test_unknown_kind_is_refused(platform: Platform) -> None:
    with pytest.raises(InvalidAction, match=r"runtime 'nodejs:20' is not supported"):
        platform.deploy(ActionSpec(name="js", code="function main(){}", kind="nodejs:20"))


@pytest.mark.parametrize(
    ("limits", "text"),
    [
        ({"memory_mb": 4096}, "memory size 4096 MB exceeds allowed threshold of 1024 MB"),
        ({"memory_mb": 64}, "memory size 64 MB below allowed threshold of 128 MB"),
        (
            {"timeout_ms": 600_000},
            "duration 600000 milliseconds exceeds allowed threshold of 300000 milliseconds",
        ),
        (
            {"timeout_ms": 10},
            "duration 10 milliseconds below allowed threshold of 100 milliseconds",
        ),
    ],
)
def test_limits_out_of_range_are_refused(
    platform: Platform, limits: dict[str, int], text: str
) -> None:
    with pytest.raises(InvalidAction, match=re.escape(text)):
        platform.deploy(ActionSpec(name="limited", code=actions.ECHO, **limits))
    with pytest.raises(ActionNotFound):
        platform.get_action("limited")


@pytest.mark.parametrize("name", ["echo ", "-echo", "pkg/", "a/b/c", "\u00e9cho", "x" * 257])
def test_a_name_openwhisk_would_refuse_is_refused(platform: Platform, name: str) -> None:
    # OpenWhisk's entity names: \A([\w]|[\w][\w@ .-]*[\w@.-]+)\z (a space last was taken).
    with pytest.raises(InvalidAction, match="contains illegal characters"):
        platform.deploy(ActionSpec(name=name, code=actions.ECHO))


def test_create_without_overwrite_of_an_existing_action_conflicts(platform: Platform) -> None:
    deploy(platform, "echo", actions.ECHO)

    with pytest.raises(ActionExists):
        platform.deploy(ActionSpec(name="echo", code=actions.ECHO), overwrite=False)


def test_unknown_action_is_not_found(platform: Platform) -> None:
    with pytest.raises(ActionNotFound):
        platform.invoke("nope")
    assert platform.get_activation("0" * 32) is None


def test_oversized_payload_is_refused(platform: Platform) -> None:
    deploy(platform, "echo", actions.ECHO)

    with pytest.raises(PayloadTooLarge, match="larger than allowed"):
        platform.invoke("echo", {"blob": "x" * (2 * 1024 * 1024)})


def test_bad_zip_and_empty_code_are_refused(platform: Platform) -> None:
    with pytest.raises(InvalidAction):
        platform.deploy(ActionSpec(name="bad", code=b"not a zip at all"))
    with pytest.raises(InvalidAction):
        platform.deploy(ActionSpec(name="bad", code="   "))


def test_a_zip_of_a_version_zipfile_cannot_read_is_refused(platform: Platform) -> None:
    # zipfile raises NotImplementedError for it, which answered 500.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("__main__.py", actions.ECHO)
    code = bytearray(buffer.getvalue())
    central = code.find(b"PK\x01\x02")
    code[central + 6] = 99  # the version needed to extract: 9.9, past zipfile's 6.3

    with pytest.raises(InvalidAction, match=r"zip file version 9\.9"):
        platform.deploy(ActionSpec(name="later", code=bytes(code)))


def test_concurrency_limit_throttles_with_openwhisk_text(make_platform: PlatformFactory) -> None:
    platform = make_platform(concurrent_invocations=2)
    deploy(platform, "sleep", actions.WARMABLE_SLEEP)
    ids = [platform.invoke("sleep", {"seconds": 2}) for _ in range(2)]

    with pytest.raises(
        Throttled, match=r"Too many concurrent requests in flight \(count: 2, allowed: 2\)\."
    ):
        platform.invoke("sleep", {"seconds": 0})

    assert all(r.success for r in platform.wait(ids, timeout_s=30).values())


def test_concurrent_callers_each_get_their_own_record(platform: Platform) -> None:
    deploy(platform, "echo", actions.ECHO)
    results: dict[int, Activation] = {}

    def call(i: int) -> None:
        results[i] = platform.call("echo", {"i": i})

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert {i: r.response.result["echo"]["i"] for i, r in results.items()} == {
        i: i for i in range(8)
    }


def test_ping_answers_while_the_platform_is_open_and_not_once_it_is_closed(
    platform: Platform,
) -> None:
    platform.ping()
    platform.close()

    with pytest.raises(PlatformUnavailable, match="not open"):
        platform.ping()
