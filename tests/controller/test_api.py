"""The REST API refuses bad input with a 4xx that names the problem, and stores nothing for it;
a schemathesis run over the OpenAPI schema finds no 500.

The controller here is not started: jobs that pass validation stay queued, so that generated
requests do not all train. Validation still sizes them for real on the embedded platform (the
model's profile and the runtime's baseline are measured by the training action once).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    ignored_auth,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from typer.testing import CliRunner

from faasdl.aggregation.tree import aggregator_memory_mb
from faasdl.cli import app
from faasdl.config import LocalPlatformSettings, Settings
from faasdl.controller.events import delete_job
from faasdl.controller.jobs import Controller
from faasdl.controller.metrics import Metrics
from faasdl.controller.routes.jobs import RangeNotSatisfiable, requested_part
from faasdl.platform.local import LocalPlatform
from faasdl.store import StateStore

pytestmark = pytest.mark.tensorflow

#: Generated requests per operation.
EXAMPLES = 40
#: No 5xx, every answer as the schema documents it (status, content type, headers, body), and
#: no operation that declares authentication answering without it.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    ignored_auth,
]

MLP: dict[str, Any] = {"model": "mlp", "dataset": {"name": "digits"}, "epochs": 1}


@pytest.fixture(scope="module")
def controller(
    tf_platform: LocalPlatform,
    tf_store: tuple[StateStore, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Controller:
    store, url = tf_store
    # Uploads (the fuzzer's) in a folder of the module's, not the checkout's .faasdl/datasets.
    settings = Settings(api={"upload_dir": str(tmp_path_factory.mktemp("uploads"))})
    return Controller(settings=settings, platform=tf_platform, store=store, store_url=url)


def stored(controller: Controller) -> list[str]:
    return [key for key, _ in controller.store.scan("job/")] + [
        key for key, _ in controller.store.scan("idem/")
    ]


@pytest.mark.parametrize(
    ("body", "field", "text"),
    [
        ({**MLP, "model": "alexnet"}, "model", "unknown model"),
        ({**MLP, "model": "resnet50"}, "dataset", "at least 32×32"),
        ({**MLP, "workers": 5000}, "workers", ""),
        ({**MLP, "epochs": 2, "sync_every": 3}, "sync_every", "more epochs"),
        ({**MLP, "batch_size": 0}, "batch_size", ""),
        ({**MLP, "tenant": "a b"}, "tenant", ""),
        ({**MLP, "fault_tolerance": {"policy": "pray"}}, "policy", ""),
        ({**MLP, "dataset": {"name": "npz", "path": "/nonexistent.npz"}}, "dataset.path", ""),
        ({**MLP, "dataset": {"name": "npz", "path": "a\x00b.npz"}}, "path", "NUL character"),
        # A terminal showing the job would act on an escape sequence (a file may be so named).
        (
            {**MLP, "dataset": {"name": "npz", "path": "a\x1b[2Jb.npz"}},
            "path",
            "at 1: a data set's path holds no control characters",
        ),
        ({**MLP, "dataset": {"name": "npz", "path": ""}}, "path", "is empty"),
        ({**MLP, "dataset": {"name": "synthetic", "train_size": 10**6}}, "dataset", "1 GiB"),
        (
            {**MLP, "dataset": {"name": "digits", "test_fraction": 0.9999999999999999}},
            "test_fraction",
            "no training images",
        ),
        # JSON has no infinity (Python's json reads one): a stored job read it back as null.
        ({**MLP, "expected_cost": math.inf}, "expected_cost", "finite number"),
        ({**MLP, "target_loss": math.nan}, "target_loss", "finite number"),  # was a 500
        ({**MLP, "max_cost_usd": 0}, "max_cost_usd", "greater than 0"),
        ({**MLP, "max_cost_usd": math.inf}, "max_cost_usd", "finite number"),
        ({**MLP, "patience": 0}, "patience", "greater than or equal to 1"),
        ({**MLP, "keep_model": "first"}, "keep_model", "'last' or 'best'"),
        ({**MLP, "validation_fraction": 0.6}, "validation_fraction", "less than or equal to 0.5"),
        ({**MLP, "validation_fraction": 1e-4}, "validation_fraction", "holds none out"),
        (  # a shard each for the examples the validation set leaves: 900 of 1,000
            {
                **MLP,
                "dataset": {"name": "synthetic", "shape": [8, 8, 1], "train_size": 1000},
                "workers": 1000,
                "validation_fraction": 0.1,
            },
            "workers",
            "1000 workers for 900 training examples: a worker needs one at least",
        ),
        ({**MLP, "dataset": {"name": "synthetic", "noise": math.nan}}, "noise", "finite number"),
        ({**MLP, "colour": "blue"}, "colour", ""),
        ({**MLP, "name": "sweep\nlr=3e-4"}, "name", "at 5: a name is one line of text"),
        ({**MLP, "name": "x" * 101}, "name", "at most 100 characters"),
        ({**MLP, "name": " sweep"}, "name", "begins or ends with white space"),
        ({**MLP, "worker": 2}, "worker", "not permitted (did you mean 'workers'?)"),
        (
            {**MLP, "dataset": {"name": "digits", "size": 2}},
            "size",
            "not permitted (expected one of: name, test_fraction)",
        ),
        ({"dataset": {"name": "digits"}}, "model", ""),
        ({**MLP, "dataset": {"kind": "digits"}}, "dataset", "needs 'name' (one of 'digits',"),
        ({**MLP, "dataset": "digits"}, "dataset", "should be a mapping, {name: digits}"),
        # A name too long for the file system (ENAMETOOLONG) was a 500.
        ({**MLP, "dataset": {"name": "npz", "path": "x" * 300}}, "dataset.path", "no upload"),
    ],
)
def test_a_bad_job_is_refused_naming_the_field_and_nothing_is_stored(
    client: httpx.Client, controller: Controller, body: dict[str, Any], field: str, text: str
) -> None:
    before = stored(controller)

    # Python's json writes (and reads) Infinity and NaN, which httpx's json= refuses to send.
    response = client.post(
        "/v1/jobs",
        content=json.dumps(body),
        headers={"Idempotency-Key": "k1", "content-type": "application/json"},
    )

    assert response.status_code == 422, response.text
    assert field in response.text
    assert text.lower() in response.text.lower()
    assert stored(controller) == before


@pytest.mark.parametrize(
    ("body", "place"),
    [
        ({**MLP, "model": "mlp\ud800"}, "model"),  # a text field pydantic does not measure
        ({**MLP, "name": "sweep \udcff"}, "name"),
        ({**MLP, "dataset": {"name": "npz", "path": "x\udc80.npz"}}, "dataset.path"),
        ({**MLP, "nam\ud800": "sweep"}, "the request"),
    ],
)
def test_text_that_is_no_unicode_is_refused_naming_its_field_not_answered_500(
    client: httpx.Client, controller: Controller, body: dict[str, Any], place: str
) -> None:
    # JSON's "\ud800" reads as a lone surrogate, which UTF-8 (a record's, a response's) cannot
    # hold: a job's model named with one was answered 500, and so was any such input pydantic
    # refused, its echo in the 422 unwritable.
    before = stored(controller)

    for path in ("/v1/jobs", "/v1/estimate"):
        response = client.post(
            path, content=json.dumps(body), headers={"content-type": "application/json"}
        )

        assert response.status_code == 422, response.text
        error = response.json()["detail"][0]
        assert error["msg"].startswith(f"{place}: is not Unicode text (")
        assert "a lone surrogate, '\\u" in error["msg"]
    assert stored(controller) == before


def test_malformed_json_and_bad_headers_are_refused(client: httpx.Client) -> None:
    not_json = client.post("/v1/jobs", content=b"{", headers={"content-type": "application/json"})
    long_key = client.post("/v1/jobs", json=MLP, headers={"Idempotency-Key": "k" * 300})

    assert not_json.status_code == 422
    assert long_key.status_code == 422
    assert "Idempotency-Key" in long_key.text


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"model": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", "nested deeper than the JSON reader"),
        (b'{"epochs": ' + b"9" * 5_000 + b"}", "an integer of more than 4,300 digits"),
        (b'{"model": "ml\xff"}', "not UTF-8 text: invalid start byte at byte 13"),
    ],
    ids=["too-deep", "too-many-digits", "not-utf-8"],
)
def test_a_body_json_cannot_read_is_a_422_saying_why(
    client: httpx.Client, controller: Controller, content: bytes, why: str
) -> None:
    before = stored(controller)

    for path in ("/v1/jobs", "/v1/estimate"):
        response = client.post(path, content=content, headers={"content-type": "application/json"})

        # FastAPI's 400 said only "There was an error parsing the body"; "{" was a 422.
        assert response.status_code == 422, response.text
        [error] = response.json()["detail"]
        assert (error["type"], error["loc"]) == ("json_invalid", ["body"])
        assert error["msg"] == f"JSON decode error: {error['ctx']['error']}"
        assert error["ctx"]["error"].startswith(why)
    assert stored(controller) == before


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data"]
)
def test_a_body_sent_as_another_type_than_json_is_told_so(
    client: httpx.Client, controller: Controller, content_type: str
) -> None:
    # `curl -d @job.json` sends a form's type: FastAPI read the body as bytes and said only
    # "Input should be a valid dictionary or object to extract fields from", echoing it whole.
    before = stored(controller)

    for path in ("/v1/jobs", "/v1/estimate"):
        response = client.post(
            path, content=json.dumps(MLP).encode(), headers={"content-type": content_type}
        )

        assert response.status_code == 422, response.text
        [error] = response.json()["detail"]
        assert error["loc"] == ["body"]
        assert error["msg"].startswith(f"sent as {content_type}, and a body is read as JSON only")
        assert "input" not in error
    assert stored(controller) == before


def test_unknown_and_malformed_job_ids(client: httpx.Client) -> None:
    missing = "0123456789abcdef"

    for method, path in [
        ("GET", f"/v1/jobs/{missing}"),
        ("GET", f"/v1/jobs/{missing}/model"),
        ("GET", f"/v1/jobs/{missing}/events"),
        ("DELETE", f"/v1/jobs/{missing}"),
    ]:
        response = client.request(method, path)
        assert response.status_code == 404, path
        assert response.json() == {"detail": f"job_id: no job {missing!r}", "field": None}
    assert client.get("/v1/jobs/NOT-AN-ID").status_code == 422
    assert client.get("/v1/jobs", params={"state": "sleeping"}).status_code == 422


def test_a_queued_job_has_no_model_and_a_cancelled_one_cannot_be_cancelled_into_another_state(
    client: httpx.Client,
) -> None:
    created = client.post("/v1/jobs", json=MLP)
    job_id = created.json()["job"]["job_id"]

    no_model = client.get(f"/v1/jobs/{job_id}/model")
    cancelled = client.delete(f"/v1/jobs/{job_id}")

    assert created.status_code == 201
    assert created.json()["queue_position"] == 1
    assert no_model.status_code == 409
    assert "has no model" in no_model.json()["detail"]
    assert cancelled.json()["job"]["state"] == "cancelled"
    assert cancelled.json()["queue_position"] is None


def test_a_jobs_name_is_listed_beside_its_id_and_printed_as_it_is(
    client: httpx.Client, api_url: str, admin_key: str
) -> None:
    name = "sweep [lr] ✓"
    job = client.post("/v1/jobs", json={**MLP, "name": name, "seed": 13}).json()["job"]
    unnamed = client.post("/v1/jobs", json={**MLP, "seed": 14}).json()["job"]

    listed = {j["job_id"]: j["name"] for j in client.get("/v1/jobs").json()}
    printed = CliRunner().invoke(
        app, ["jobs", "--url", api_url], env={"FAASDL_CLIENT__API_KEY": admin_key}
    )
    for job_id in (job["job_id"], unnamed["job_id"]):  # the module's others see none queued
        client.delete(f"/v1/jobs/{job_id}")

    assert job["spec"]["name"] == name
    assert job["events"][0]["message"].endswith(f"; named {name!r}")
    assert listed[job["job_id"]] == name
    assert listed[unnamed["job_id"]] is None
    assert printed.exit_code == 0, printed.output
    [row] = [line for line in printed.stderr.splitlines() if job["job_id"] in line]
    assert name in row  # its brackets too: not read as markup


def test_an_ended_job_is_deleted_whole_and_one_that_has_not_ended_is_refused(
    client: httpx.Client, controller: Controller
) -> None:
    # Arrange: a job submitted with an Idempotency-Key and cancelled (ended), and a queued one.
    key = {"Idempotency-Key": "purged-1"}
    ended = client.post("/v1/jobs", json=MLP, headers=key).json()["job"]["job_id"]
    client.delete(f"/v1/jobs/{ended}")
    queued = client.post("/v1/jobs", json={**MLP, "seed": 11}).json()["job"]["job_id"]
    purge = {"purge": "true"}

    # Execute
    refused = client.delete(f"/v1/jobs/{queued}", params=purge)
    purged = client.delete(f"/v1/jobs/{ended}", params=purge)
    again = client.delete(f"/v1/jobs/{ended}", params=purge)
    replayed = client.post("/v1/jobs", json=MLP, headers=key)
    for job_id in (queued, replayed.json()["job"]["job_id"]):  # the module's others see none
        client.delete(f"/v1/jobs/{job_id}")

    # Assert: the queued job refused and kept; the ended one gone, its key with it.
    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        f"job {queued} is queued: only an ended job can be deleted; cancel it first"
    )
    assert client.get(f"/v1/jobs/{queued}").json()["job"]["state"] == "cancelled"
    assert purged.status_code == 204, purged.text
    assert purged.content == b""
    assert client.get(f"/v1/jobs/{ended}").status_code == 404
    assert again.status_code == 404
    assert not [key for key in stored(controller) if ended in key]
    assert replayed.status_code == 201  # a new job: the key was deleted with the old one
    assert replayed.json()["job"]["job_id"] != ended


def test_a_job_deleted_while_it_is_followed_ends_its_stream_saying_so(
    client: httpx.Client, controller: Controller
) -> None:
    job_id = client.post("/v1/jobs", json={**MLP, "seed": 12}).json()["job"]["job_id"]

    with client.stream("GET", f"/v1/jobs/{job_id}/events") as stream:
        lines = stream.iter_lines()
        first = next(lines)
        # Act: deleted between two looks (the API deletes only an ended job; this queued one
        # stands for one that ended and was deleted before the stream looked again).
        delete_job(controller.store, controller.job(job_id))
        rest = list(lines)

    assert first == "id: 0"
    assert ": the job was deleted" in rest
    assert "event: end" not in rest


def test_jobs_are_listed_a_page_at_a_time_newest_first(
    client: httpx.Client, api_url: str, admin_key: str
) -> None:
    submitted = [
        client.post("/v1/jobs", json={**MLP, "tenant": "paging", "seed": seed}).json()["job"]
        for seed in range(5)
    ]
    newest_first = [
        j["job_id"] for j in sorted(submitted, key=lambda j: (j["created_ms"], j["job_id"]))
    ][::-1]

    pages, links = [], []
    params: dict[str, Any] = {"tenant": "paging", "limit": 2}
    while True:
        page = client.get("/v1/jobs", params=params)
        pages.append([j["job_id"] for j in page.json()])
        links.append(page.headers.get("link"))
        if "next" not in page.links:
            break
        params = dict(httpx.URL(page.links["next"]["url"]).params)
    unknown = client.get("/v1/jobs", params={"before": "0123456789abcdef"})
    too_many = client.get("/v1/jobs", params={"limit": 1001})
    command = ["jobs", "--tenant", "paging", "--limit", "3", "--url", api_url]
    env = {"FAASDL_CLIENT__API_KEY": admin_key}
    cli = CliRunner().invoke(app, command, env=env)
    # By name: the jobs whose name holds the words, a page at a time too.
    named = {
        name: client.post("/v1/jobs", json={**MLP, "tenant": "paging", "name": name}).json()["job"]
        for name in ("lr sweep: 0.1", "lr sweep: 0.01", "lr sweep: 1", "LR SWEEP: 2", "other")
    }
    by_name = [
        ["jobs", "--name", "sweep: 0", *option, "--url", api_url]
        for option in ([], ["--limit", "1"])
    ]
    swept, first = (CliRunner().invoke(app, command, env=env) for command in by_name)
    nameless = CliRunner().invoke(app, ["jobs", "--name", "nobody's", "--url", api_url], env=env)
    empty = client.get("/v1/jobs", params={"name": ""})

    assert pages == [newest_first[:2], newest_first[2:4], newest_first[4:]]
    assert links[0] == f'</v1/jobs?tenant=paging&limit=2&before={newest_first[1]}>; rel="next"'
    assert links[2] is None
    assert unknown.status_code == 404
    assert too_many.status_code == 422
    assert [j["job_id"] for j in json.loads(cli.stdout.splitlines()[-1])] == newest_first[:3]
    assert f"more: faasdl jobs --tenant paging --limit 3 --before {newest_first[2]}" in cli.output
    ids = [named["lr sweep: 0.01"]["job_id"], named["lr sweep: 0.1"]["job_id"]]  # newest first
    assert swept.exit_code == 0, swept.output
    assert [j["job_id"] for j in json.loads(swept.stdout)] == ids
    assert [j["name"] for j in json.loads(first.stdout)] == ["lr sweep: 0.01"]
    assert f"more: faasdl jobs --name 'sweep: 0' --limit 1 --before {ids[0]}" in first.output
    assert nameless.stderr.splitlines() == ['no jobs (name "nobody\'s")']
    assert empty.status_code == 422


def test_an_estimate_of_a_bad_data_set_path_is_refused_naming_it(client: httpx.Client) -> None:
    # A path with a NUL in it cannot name a file: refused as the spec is read, not as a path
    # is resolved (the API's fuzz test found it a 500 there).
    response = client.post("/v1/estimate", json={**MLP, "dataset": {"name": "npz", "path": "\x00"}})

    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "dataset", "npz", "path"]


def test_estimate_plans_without_storing_a_job(client: httpx.Client, controller: Controller) -> None:
    before = stored(controller)

    response = client.post("/v1/estimate", json={**MLP, "workers": 5, "epochs": 4, "sync_every": 2})

    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["train"]["containers"] == 5
    assert plan["rounds"] == 2
    assert plan["tree"] == [[[0, 1, 2, 3, 4]]]
    assert stored(controller) == before


def test_a_keras_application_is_planned_with_its_aggregators(client: httpx.Client) -> None:
    # MobileNetV2's model with Adam's moments is 26 MB: its aggregator had no room for two inputs
    # by the thesis' rule, and its every job was refused ("an aggregator of 192 MB cannot hold
    # two 26.0 MB models"). A streaming aggregator holds one input: it merges all four.
    job = {"model": "mobilenet_v2", "dataset": {"name": "synthetic"}, "workers": 4}

    response = client.post("/v1/estimate", json=job)

    assert response.status_code == 200, response.text
    plan = response.json()
    # A 26 MB model's aggregator peaked at 135-140 MB in a container (through Redis).
    assert plan["aggregate_memory_mb"] >= aggregator_memory_mb(plan["model_mb"])
    assert plan["fan_in"] == 8
    assert plan["tree"] == [[[0, 1, 2, 3]]]


@pytest.mark.parametrize(
    ("range_", "if_range", "part"),
    [
        (None, None, None),
        ("bytes=0-", None, (0, 100)),
        ("bytes=10-19", None, (10, 20)),
        ("bytes=90-500", None, (90, 100)),  # a last byte past the end: to the end
        ("bytes=-5", None, (95, 100)),
        ("bytes=-500", None, (0, 100)),
        (" bytes=99-99 ", '"etag"', (99, 100)),
        ("bytes=10-", '"another"', None),  # the body changed: the whole
        ("bytes=0-1,5-6", None, None),  # several ranges: ignored
        ("bytes=20-10", None, None),  # invalid: ignored
        ("items=0-1", None, None),
        (f"bytes={'9' * 20}-", None, None),  # more digits than any size
        ("bytes=100-", None, "from 100 on"),
        ("bytes=-0", None, "last 0 bytes"),
    ],
)
def test_a_range_header_asks_for_one_part_or_the_whole(
    range_: str | None, if_range: str | None, part: tuple[int, int] | str | None
) -> None:
    if isinstance(part, str):
        with pytest.raises(RangeNotSatisfiable, match=part):
            requested_part(range_, if_range, '"etag"', 100)
    else:
        assert requested_part(range_, if_range, '"etag"', 100) == part


def test_health_readiness_and_metrics(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {
        "ready": True,
        "store": "ok",
        "platform": "ok",
        "lease": "ok",
    }
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert "faasdl_jobs_submitted_total" in metrics.text


def test_activation_durations_are_counted_in_buckets_up_to_the_longest_time_limit() -> None:
    # prometheus_client's default buckets end at 10 s: longer training activations counted in
    # +Inf alone.
    longest_s = LocalPlatformSettings().timeout_max_ms / 1000
    metrics = Metrics()
    metrics.activation_seconds.labels(kind="train").observe(longest_s)

    bounds = re.findall(r'kind="train",le="([0-9.]+)"} 1\.0', metrics.render().decode())
    assert bounds  # a finite bucket holds it
    assert float(bounds[0]) <= 2 * longest_s


def test_no_generated_request_makes_the_api_fail(
    api_url: str, admin_key: str, client: httpx.Client
) -> None:
    # A store's first plan measures the runtime's start and sizes its model (10-20 s, once): a
    # plan made here first, rather than by the module's earlier tests, lets the generated jobs'
    # plans answer within the fuzzer's 10 s read timeout.
    assert client.post("/v1/estimate", json=MLP).status_code == 200
    schema = schemathesis.openapi.from_url(f"{api_url}/openapi.json")
    auth = {"Authorization": f"Bearer {admin_key}"}
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]

    for operation in operations:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def no_server_error(case: schemathesis.Case[Any]) -> None:
            case.call_and_validate(base_url=api_url, headers=auth, checks=CHECKS)

        no_server_error()

    assert {op.label for op in operations} >= {"POST /v1/jobs", "GET /v1/jobs/{job_id}/model"}
