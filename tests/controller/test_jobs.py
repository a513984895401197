"""End to end: the REST API over HTTP, the controller, and real TensorFlow actions on the embedded
platform with a SQLite store."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import re
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx
import numpy as np
import pytest
import redis
import yaml
from typer.testing import CliRunner

from faasdl.aggregation.average import weighted_average
from faasdl.cli import app
from faasdl.config import ApiSettings, Settings, StoreSettings
from faasdl.controller import client as client_module
from faasdl.controller.app import create_app
from faasdl.controller.client import ControllerClient
from faasdl.controller.datasets import partial_file
from faasdl.controller.datasets import uploads as uploads_of
from faasdl.controller.events import shard_blob, validation_blob
from faasdl.controller.jobs import Controller
from faasdl.controller.plan import JobPlan
from faasdl.controller.validator import JobSpec
from faasdl.errors import JobNotFound, PlatformUnavailable
from faasdl.estimator import history
from faasdl.estimator.planner import HISTORY_MEMORY_SLACK
from faasdl.platform.local import LocalPlatform
from faasdl.platform.local.container import Container, Reply
from faasdl.serving import AppThread
from faasdl.store import StateStore, make_store, records
from faasdl.store.records import (
    ActivationUse,
    FunctionInfo,
    IdempotencyRecord,
    JobEvent,
    JobInfo,
    JobState,
    create,
    job_key,
    update,
)
from faasdl.store.redis_server import RedisServer
from faasdl.training.datasets import ONE_DATA_SET, Shard
from faasdl.training.tensors import unpack
from tests.conftest import (
    QuietHandler,
    eventually,
    keras_architecture,
    keras_layer,
    reading_pipe,
    relay,
    serving_http,
    tls_files,
    write_and_die,
)
from tests.controller.conftest import round_result

pytestmark = pytest.mark.tensorflow

runner = CliRunner()

DIGITS_JOB: dict[str, Any] = {
    "model": "mlp",
    "dataset": {"name": "digits"},
    "workers": 4,
    "epochs": 3,
    "batch_size": 32,
}


def ledger_line(job_id: str, outcome: str) -> ActivationUse:
    """A ledger line of a 2 s training activation of the job's unit 0 (512 MB, 0.5 USD)."""
    return ActivationUse(
        job_id=job_id,
        activation_id="f" * 32,
        kind="train",
        round=0,
        unit=0,
        memory_mb=512,
        start_ms=1,
        duration_ms=2000,
        outcome=outcome,
        gb_s=1.0,
        cost_usd=0.5,
    )


def numbered(client: httpx.Client, job_id: str, *, after: int | None = None) -> list[int | str]:
    """The ids of the job's server-sent events (resumed ``after`` one) until its end, which has
    none: ``"end"`` stands for it."""
    headers = {} if after is None else {"Last-Event-ID": str(after)}
    ids: list[int | str] = []
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as stream:
        for line in stream.iter_lines():
            if line.startswith("id: "):
                ids.append(int(line.removeprefix("id: ")))
            elif line == "event: end":
                ids.append("end")
    return ids


def submit(client: httpx.Client, spec: dict[str, Any], **headers: str) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=spec, headers=headers)
    assert response.status_code in (200, 201), response.text
    job: dict[str, Any] = response.json()["job"]
    return job


def follow(client: httpx.Client, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The job's server-sent events until its end."""
    events: list[tuple[str, dict[str, Any]]] = []
    with client.stream("GET", f"/v1/jobs/{job_id}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        kind = ""
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, json.loads(line.removeprefix("data: "))))
    return events


def job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    found: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
    return found


@contextmanager
def served(
    root: Path, platform: LocalPlatform, settings: Settings
) -> Iterator[tuple[StateStore, Controller, str]]:
    """A controller started on a SQLite store of its own under ``root``, and its API's URL on
    loopback."""
    url = f"sqlite:///{root / 'state.db'}"
    with make_store(StoreSettings(spill_dir=str(root / "spill")), url) as store:
        controller = Controller(settings=settings, platform=platform, store=store, store_url=url)
        with controller:
            server = AppThread(
                create_app(controller, owns=False), host="127.0.0.1", port=0, name="api"
            )
            try:
                yield store, controller, server.start()
            finally:
                server.stop()


@pytest.fixture(scope="module")
def finished(client: httpx.Client) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """A four-unit digits job, run to its end, and the events it streamed."""
    response = client.post("/v1/jobs", json=DIGITS_JOB)
    assert response.status_code == 201, response.text
    job_id = response.json()["job"]["job_id"]
    assert response.headers["location"] == f"/v1/jobs/{job_id}"
    return job_id, follow(client, job_id)


def test_a_four_unit_job_completes_and_its_model_evaluates(
    client: httpx.Client,
    controller: Controller,
    finished: tuple[str, list[tuple[str, dict[str, Any]]]],
    tmp_path: Path,
) -> None:
    job_id, events = finished

    record = job(client, job_id)["job"]
    model = client.get(f"/v1/jobs/{job_id}/model")

    assert events[-1] == ("end", {"state": "done", "error": None, "round": 3})
    kinds = [kind for kind, _ in events]
    assert kinds.count("unit_committed") == 12
    assert kinds.count("round_finished") == 3
    assert record["plan"]["train"]["containers"] == 4
    assert record["plan"]["tree"] == [[[0, 1], [2, 3]], [[0, 1]]]
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2]
    ledger = client.get(f"/v1/jobs/{job_id}/ledger").json()
    assert [a["kind"] for a in ledger].count("aggregate") == 9  # 3 rounds × 3 aggregators
    assert [a["kind"] for a in ledger].count("evaluate") == 3
    assert record["activation_count"] == len(ledger) == 12 + 9 + 3
    totals = record["ledger_totals"]  # kept as each line is booked: no summary reads the ledger
    assert (totals["failed"], totals["stopped"]) == (0, 0)
    assert totals["gb_s"] == pytest.approx(sum(a["gb_s"] for a in ledger))
    assert [a["start_ms"] for a in ledger] == sorted(a["start_ms"] for a in ledger)
    assert all(a["outcome"] == "success" and a["cost_usd"] > 0 for a in ledger)
    assert all(0 < a["peak_memory_mb"] <= a["memory_mb"] for a in ledger)
    # The module's first aggregations started cold, its first trainers built theirs: their
    # starts and builds are on its signature's record (what a plan's cost with cold starts
    # counts for each container).
    started = [a["init_ms"] for a in ledger if a["kind"] == "aggregate" and a["init_ms"] > 0]
    results = [
        activation.response.result
        for a in ledger
        if a["kind"] == "train"
        and (activation := controller.platform.get_activation(a["activation_id"])) is not None
    ]
    # A build is the trainer's building and tracing and its first step's graph's first run.
    built = [
        round(1000 * r["phases_s"]["build"] + 1000 * r["first_step_extra_s"])
        for r in results
        if not r["trainer_reused"]
    ]
    past = history.read(controller.store, record["plan"]["train"]["signature"])
    assert started
    assert len(results) == 12
    assert built  # the first units on its fresh containers (a primed replica's built before)
    assert past is not None
    assert sorted(past.aggregate_init_ms) == sorted(started)
    assert sorted(past.build_ms) == sorted(built)
    # Its trainers' cold starts are the runtime's, kept as those of a job of four at once.
    runtime = history.read_baseline(
        controller.store, controller.settings.estimator.baseline_runtime
    )
    cold = Counter(a["init_ms"] for a in ledger if a["kind"] == "train" and a["init_ms"] > 0)
    assert cold
    assert runtime is not None
    assert cold <= Counter(runtime.init_ms_by_trainers[4])
    # A long job's page reads its ledger from its latest rounds on.
    latest = client.get(f"/v1/jobs/{job_id}/ledger", params={"round_from": 2}).json()
    assert latest == [a for a in ledger if a["round"] == 2]
    assert len(latest) == 4 + 3 + 1
    assert client.get(f"/v1/jobs/{job_id}/ledger", params={"round_from": -1}).status_code == 422
    replicas = record["replica_gb_s"] * Settings().price_per_gb_s  # warm replicas held
    assert record["cost_usd"] == pytest.approx(sum(a["cost_usd"] for a in ledger) + replicas)
    assert record["failures"] == []
    assert model.status_code == 200
    assert model.headers["content-type"] == "application/octet-stream"
    # The file loads as the README says, and scores the accuracy the job reported.
    from faasdl.training.datasets import DigitsSpec, load_dataset
    from faasdl.training.loop import configure_runtime
    from faasdl.training.models import load_model

    configure_runtime()  # as every test process that runs TensorFlow does, before it runs
    data = load_dataset(DigitsSpec())
    (tmp_path / "model.safetensors").write_bytes(model.content)
    trained = load_model(tmp_path / "model.safetensors")
    predicted = trained.predict(data.x_test, verbose=0).argmax(axis=1)
    accuracy = float((predicted == data.y_test).mean())
    assert accuracy == pytest.approx(record["rounds"][-1]["accuracy"], abs=1e-6)
    assert accuracy > 0.8


#: A job of an architecture of its own: a Keras model's config, as model.to_json() writes it (by
#: hand: a hidden layer of 16, which no model of the zoo has). Two epochs of it learn the digits
#: at this learning rate.
OWN_JOB: dict[str, Any] = {
    **DIGITS_JOB,
    "model": "custom",
    "architecture": keras_architecture(),
    "workers": 2,
    "epochs": 2,
    "learning_rate": 0.01,
}


@pytest.fixture(scope="module")
def own_finished(client: httpx.Client) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """``OWN_JOB``, run to its end, and the events it streamed."""
    job_id = submit(client, OWN_JOB)["job_id"]
    return job_id, follow(client, job_id)


def test_a_job_trains_an_architecture_of_its_own_whose_model_loads_from_its_file(
    client: httpx.Client,
    own_finished: tuple[str, list[tuple[str, dict[str, Any]]]],
    tmp_path: Path,
) -> None:
    # Arrange
    from faasdl.training.datasets import DigitsSpec, load_dataset
    from faasdl.training.loop import configure_runtime
    from faasdl.training.models import custom_name, load_model

    own = OWN_JOB["architecture"]

    # Execute
    job_id, events = own_finished
    record = job(client, job_id)["job"]
    (tmp_path / "model.safetensors").write_bytes(client.get(f"/v1/jobs/{job_id}/model").content)
    configure_runtime()  # as every test process that runs TensorFlow does, before it runs
    trained = load_model(tmp_path / "model.safetensors")

    # Assert: trained as asked, sized and known by the architecture's digest, kept as given;
    # the file builds it where no job ran, and scores the accuracy the job reported
    assert events[-1] == ("end", {"state": "done", "error": None, "round": 2})
    assert record["failures"] == []
    assert (record["spec"]["model"], record["spec"]["architecture"]) == ("custom", own)
    assert record["plan"]["train"]["signature"].startswith(f"{custom_name(own)}/8x8x1/c10/")
    assert [w.shape for w in trained.get_weights()] == [(64, 16), (16,), (16, 10), (10,)]
    data = load_dataset(DigitsSpec())
    predicted = trained.predict(data.x_test, verbose=0).argmax(axis=1)
    accuracy = float((predicted == data.y_test).mean())
    assert accuracy == pytest.approx(record["rounds"][-1]["accuracy"], abs=1e-6)
    assert accuracy > 0.5  # ten classes: a tenth by chance


def test_a_job_of_its_own_architecture_is_listed_and_summed_up_as_its_keras_config_names_it(
    client: httpx.Client,
    own_finished: tuple[str, list[tuple[str, dict[str, Any]]]],
    api_url: str,
    admin_key: str,
) -> None:
    # Arrange
    job_id = own_finished[0]
    env = {"FAASDL_CLIENT__API_KEY": admin_key}

    # Execute
    [line] = [j for j in client.get("/v1/jobs").json() if j["job_id"] == job_id]
    listed = runner.invoke(app, ["jobs", "--url", api_url], env=env)
    status = runner.invoke(app, ["status", job_id, "--url", api_url], env=env)

    # Assert: "custom: tiny" (its config's name), where each said "custom" of every such job
    assert (line["model"], line["model_called"]) == ("custom", "custom: tiny")
    assert listed.exit_code == 0, listed.output
    [row] = [text for text in listed.stderr.splitlines() if job_id in text]  # the table
    assert "│ custom: tiny │" in row
    assert status.exit_code == 0, status.output
    assert "custom: tiny on digits: 2 worker(s) of " in " ".join(status.stderr.split())


def test_a_job_trains_on_from_a_model_of_its_own_architecture_and_not_of_another(
    client: httpx.Client,
    controller: Controller,
    own_finished: tuple[str, list[tuple[str, dict[str, Any]]]],
) -> None:
    # Arrange: the done job of its own architecture, and one whose hidden layer is 32 wide
    from faasdl.training.models import custom_name

    source_id = own_finished[0]
    other = keras_architecture(hidden=32)
    onward = {**OWN_JOB, "epochs": 1, "init_model": source_id}

    # Execute
    record = controller.wait(submit(client, onward)["job_id"], timeout_s=300)
    refused = client.post("/v1/jobs", json={**onward, "architecture": other})

    # Assert: its first round started from the other's model, the same architecture's; one of
    # another architecture is refused naming both
    assert record.state is JobState.DONE, record.error
    first = bytes(controller.store.get_blob(f"jobs/{record.job_id}/global/00000"))
    assert first == client.get(f"/v1/jobs/{source_id}/model").content
    assert refused.status_code == 422
    assert refused.json()["detail"] == (
        f"init_model: job {source_id} trained {custom_name(OWN_JOB['architecture'])} for 8×8×1 "
        f"inputs and 10 classes; this job is {custom_name(other)} for 8×8×1 inputs and 10 "
        "classes: they must be the same"
    )


def test_an_architecture_keras_cannot_build_for_the_data_is_refused_before_a_job_is_made(
    client: httpx.Client, controller: Controller
) -> None:
    # Arrange: one Keras builds with three logits for the digits' ten classes (only building it
    # tells), one whose input is not the digits' and one with a layer that runs code
    before = controller.store.scan_versions("job/")
    lambda_layer = keras_architecture()
    lambda_layer["config"]["layers"][1] = keras_layer("Lambda", function="lambda x: x")
    cases = {
        "outputs": keras_architecture(classes=3),
        "input": keras_architecture(shape=(4, 4, 1)),
        "code": lambda_layer,
    }

    # Execute
    said = {}
    for case, architecture in cases.items():
        spec = {**DIGITS_JOB, "model": "custom", "architecture": architecture}
        estimated = client.post("/v1/estimate", json=spec)
        submitted = client.post("/v1/jobs", json=spec)
        assert estimated.status_code == submitted.status_code == 422, submitted.text
        assert estimated.json()["detail"] == submitted.json()["detail"]
        said[case] = submitted.json()["detail"]

    # Assert: what only Keras or the data set tell, as the model is checked against them; what
    # the spec tells, as pydantic's errors are
    assert said["outputs"] == (
        "architecture: its output is [null, 3]; the data set's 10 classes need one of [null, 10]"
        " (a logit a class, no softmax)"
    )
    assert said["input"] == "architecture: its input is 4×4×1; the data set's examples are 8×8×1"
    [code] = said["code"]
    assert code["loc"] == ["body", "architecture"]
    assert code["msg"] == "holds a Lambda layer, which runs code of its own: none may"
    assert controller.store.scan_versions("job/") == before


def test_the_cli_takes_an_architecture_from_the_file_model_to_json_was_saved_to(
    api_url: str, admin_key: str, tmp_path: Path
) -> None:
    # Arrange: the file, and a job file that names a model of the zoo (the option overrides it)
    from faasdl.training.models import custom_name

    own = OWN_JOB["architecture"]
    saved = tmp_path / "tiny.json"
    saved.write_text(json.dumps(own))
    misfit = tmp_path / "misfit.json"
    misfit.write_text(json.dumps(keras_architecture(shape=(4, 4, 1))))
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps([own]))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(own)[:-1])
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(DIGITS_JOB))
    env = {"FAASDL_CLIENT__API_KEY": admin_key}
    url = ["--url", api_url]

    # Execute
    estimated = runner.invoke(app, ["estimate", "--architecture", str(saved), *url], env=env)
    submitted = runner.invoke(
        app, ["submit", str(job_file), "--architecture", str(misfit), *url], env=env
    )
    refused = {
        case: runner.invoke(app, ["estimate", *options, *url], env=env)
        for case, options in {
            "missing": ["--architecture", str(tmp_path / "none.json")],
            "list": ["--architecture", str(listed)],
            "broken": ["--architecture", str(broken)],
            "two models": ["--model", "mlp", "--architecture", str(saved)],
        }.items()
    }

    # Assert: planned by its digest; refused by the controller, and here before it is asked
    assert estimated.exit_code == 0, estimated.output
    plan = json.loads(estimated.stdout.splitlines()[-1])
    assert plan["train"]["signature"].startswith(f"{custom_name(own)}/8x8x1/c10/")
    assert submitted.exit_code == 2
    assert "architecture: its input is 4×4×1; the data set's examples are 8×8×1" in (
        submitted.stderr
    )
    said = {case: (r.exit_code, " ".join(r.stderr.split())) for case, r in refused.items()}
    assert said == {
        "missing": (
            2,
            f"error: --architecture: cannot read {tmp_path}/none.json: No such file or directory",
        ),
        "list": (
            2,
            f"error: --architecture: {listed} holds a JSON list: a Keras model's config "
            "is an object, as model.to_json() writes it",
        ),
        "broken": (
            2,
            f"error: --architecture: {broken} is not JSON: Expecting ',' delimiter: "
            f"line 1 column {len(json.dumps(own))} (char {len(json.dumps(own)) - 1})",
        ),
        "two models": (
            2,
            "error: --model mlp and --architecture: give one (--architecture trains model custom)",
        ),
    }


def test_head_answers_as_get_does_without_the_body(
    client: httpx.Client, finished: tuple[str, list[tuple[str, dict[str, Any]]]]
) -> None:
    # Arrange: what a GET of each answers (HEAD was a 405 saying which methods the path takes,
    # and of /v1/jobs "allow: POST" only: curl -I of a job's model could not learn its size).
    job_id = finished[0]
    paths = ["/v1/jobs", f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/model", "/healthz"]
    got = {path: client.get(path) for path in paths}

    # Execute
    heads = {path: client.head(path) for path in [*paths, f"/v1/jobs/{job_id}/events"]}
    unknown = client.head("/v1/jobs/0123456789abcdef")
    post_only = client.head("/v1/estimate")

    # Assert: each GET's status and headers, its Content-Length too, and no body; a stream's
    # head ends at once; a path with no GET is still a 405, and an unknown job a 404.
    for path, answer in got.items():
        head = heads[path]
        assert (head.status_code, answer.status_code) == (200, 200), path
        assert head.content == b""
        assert head.headers["content-type"] == answer.headers["content-type"]
        assert head.headers["content-length"] == str(len(answer.content))
    events = heads[f"/v1/jobs/{job_id}/events"]
    assert (events.status_code, events.content) == (200, b"")
    assert events.headers["content-type"].startswith("text/event-stream")
    assert (unknown.status_code, unknown.content) == (404, b"")
    assert post_only.status_code == 405
    assert post_only.headers["allow"] == "POST"


def test_a_model_is_sent_in_parts_a_range_asks_for(
    client: httpx.Client, finished: tuple[str, list[tuple[str, dict[str, Any]]]]
) -> None:
    # Arrange: the whole model, and its ETag (a 1.6 GB VGG16 cut at 90% started over).
    path = f"/v1/jobs/{finished[0]}/model"
    whole = client.get(path)
    size, etag = len(whole.content), whole.headers["etag"]

    # Execute
    rest = client.get(path, headers={"Range": "bytes=1000-", "If-Range": etag})
    middle = client.get(path, headers={"Range": "bytes=10-19"})
    tail = client.get(path, headers={"Range": "bytes=-5"})
    changed = client.get(path, headers={"Range": "bytes=1000-", "If-Range": '"another"'})
    several = client.get(path, headers={"Range": "bytes=0-1,5-6"})
    past = client.get(path, headers={"Range": f"bytes={size}-"})
    head = client.head(path, headers={"Range": "bytes=1000-"})

    # Assert: each part as 206 with its Content-Range; the whole where the model is another or
    # the Range asks for several; 416 past the end, saying the size.
    assert whole.headers["accept-ranges"] == "bytes"
    assert (rest.status_code, rest.content) == (206, whole.content[1000:])
    assert rest.headers["content-range"] == f"bytes 1000-{size - 1}/{size}"
    assert (middle.status_code, middle.content) == (206, whole.content[10:20])
    assert middle.headers["content-range"] == f"bytes 10-19/{size}"
    assert (tail.status_code, tail.content) == (206, whole.content[-5:])
    assert (changed.status_code, changed.content) == (200, whole.content)
    assert (several.status_code, several.content) == (200, whole.content)
    assert past.status_code == 416
    assert past.headers["content-range"] == f"bytes */{size}"
    assert past.json()["detail"] == (
        f"Range asks for bytes from {size:,} on: the model has {size:,} bytes"
    )
    assert (head.status_code, head.content) == (206, b"")
    assert head.headers["content-length"] == str(size - 1000)


def test_the_tree_gives_the_flat_weighted_mean_of_the_trainers(
    controller: Controller, finished: tuple[str, list[tuple[str, dict[str, Any]]]]
) -> None:
    job_id, _ = finished
    store = controller.store

    units = [FunctionInfo.model_validate(v.value) for _, v in store.scan(f"fn/{job_id}/00002/")]
    trained = [(unpack(store.get_blob(u.committed_result or "")), u.examples or 0) for u in units]
    merged = unpack(store.get_blob(f"jobs/{job_id}/global/00003"))

    assert len(units) == 4
    assert sum(n for _, n in trained) == controller.view(job_id).job.plan["examples"]  # type: ignore[index]
    for group in ("w", "opt"):
        flat = weighted_average([(groups[group], n) for groups, n in trained])
        for got, want in zip(merged[group], flat, strict=True):
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, atol=1e-6)


def logged(caplog: pytest.LogCaptureFixture, job_id: str) -> list[str]:
    """The controller's log lines of the job (its log, written there too)."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"job {job_id} ")]


def test_a_job_with_a_target_loss_stops_early(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="faasdl")
    spec = {**DIGITS_JOB, "epochs": 12, "target_loss": 0.6}

    job_id = submit(client, spec)["job_id"]
    follow(client, job_id)
    record = job(client, job_id)["job"]

    assert record["state"] == "done"
    assert record["stopped_early"] is True
    losses = [r["loss"] for r in record["rounds"]]
    assert len(losses) < 12
    assert losses[-1] <= 0.6
    assert all(loss > 0.6 for loss in losses[:-1])
    assert record["model"] == f"jobs/{job_id}/global/{len(losses):05d}"
    # Written by the runner just after the record (which ended the stream) was.
    eventually(
        lambda: len(logged(caplog, job_id)) == len(record["events"]),
        timeout_s=10,
        what="the job's last line logged",
    )
    said = logged(caplog, job_id)
    assert said == [f"job {job_id} {e['kind']}: {e['message']}" for e in record["events"]]
    assert said[-1] == f"job {job_id} done: stopped early: the mean loss reached target_loss"


#: The error of a job whose first round passed its ``max_cost_usd``: what it cost, of what budget.
FIRST_ROUND_PASSED = (
    r"its cost reached max_cost_usd before its first round ended \((\d\.\d{6}) of (\d\.\d{6}) USD, "
    r"its running activations and replicas counted\): the round was stopped, and no model is "
    r"kept; a larger max_cost_usd lets a round end"
)


def test_a_job_whose_first_round_passes_its_budget_is_stopped_there_and_fails(
    client: httpx.Client, controller: Controller
) -> None:
    # Arrange: twelve one-epoch rounds on a budget its trainers pass within a tenth of a second.
    spec = {**DIGITS_JOB, "epochs": 12, "max_cost_usd": 1e-6}

    # Execute
    job_id = submit(client, spec)["job_id"]
    follow(client, job_id)
    assert controller.wait_stopped(job_id, timeout_s=60)
    record = job(client, job_id)["job"]
    ledger = client.get(f"/v1/jobs/{job_id}/ledger").json()

    # Assert: failed in its first round, with no model, saying why; nothing after its trainers
    # started (no aggregation); what they ran booked and counted.
    assert record["state"] == "failed"
    said = re.fullmatch(FIRST_ROUND_PASSED, record["error"])
    assert said is not None, record["error"]
    assert float(said[1]) >= 1e-6
    assert said[2] == "0.000001"
    assert (record["rounds"], record["model"]) == ([], None)
    assert ledger
    assert {(a["kind"], a["round"]) for a in ledger} == {("train", 0)}
    replicas = record["replica_gb_s"] * Settings().price_per_gb_s
    assert record["cost_usd"] == pytest.approx(sum(a["cost_usd"] for a in ledger) + replicas)


def stopped_on_budget(
    client: httpx.Client, controller: Controller, spec: dict[str, Any], budget: float
) -> tuple[str, JobInfo]:
    """The id and record of a job of ``spec`` on ``max_cost_usd=budget``, run to its end."""
    job_id = submit(client, {**spec, "max_cost_usd": budget})["job_id"]
    follow(client, job_id)
    assert controller.wait_stopped(job_id, timeout_s=60)
    return job_id, controller.job(job_id)


def test_a_job_stops_in_the_round_that_passes_its_budget_and_trains_no_more_when_resumed(
    client: httpx.Client, controller: Controller
) -> None:
    # Arrange: 2,000 one-epoch rounds on two trainers, on a budget of three times what their
    # cold starts cost by the runtime's starts on record: its first round cost 1.6 times that
    # here (their starts, two at once, and its training), a later round ~0.000005 USD. (A fixed
    # 0.0003 USD held the first round here, 0.00022, not on a slower CI machine's, 0.0003.)
    spec = {**DIGITS_JOB, "workers": 2, "epochs": 2000}
    train = client.post("/v1/estimate", json=spec).json()["train"]
    starts_gb_s = 2 * train["memory_mb"] / 1024 * train["median_cold_start_ms"] / 1000
    budget = round(3 * starts_gb_s * controller.settings.price_per_gb_s, 6)
    job_id, record = stopped_on_budget(client, controller, spec, budget)
    # Where its first round passed that budget after all (in CI's run of a5def54, beside the
    # other worker's tests: 0.000327 of 0.000227 USD), the premise is made again from the runs:
    # a job on three times what that round had cost when it was stopped, up to three times.
    for _ in range(3):
        first = re.fullmatch(FIRST_ROUND_PASSED, record.error or "")
        if record.state is not JobState.FAILED or first is None:
            break
        budget = round(3 * float(first[1]), 6)
        job_id, record = stopped_on_budget(client, controller, spec, budget)
    used = client.get(f"/v1/jobs/{job_id}/ledger").json()

    # Execute: as if its controller had stopped after the job's reason was written, before its
    # end was: the record running again, without its last line; a runner resumes it.
    unended = {"state": JobState.RUNNING, "finished_ms": None, "events": record.events[:-1]}
    update(controller.store, job_key(job_id), JobInfo, lambda _: record.model_copy(update=unended))
    again = controller.wait(job_id, timeout_s=120)

    # Assert: done with the model of its last finished round, the round in progress stopped
    # (it ran, it has no record), saying why; resumed, it trained no more and ran nothing more.
    assert record.state is JobState.DONE, record.error
    assert record.stopped_early
    finished = record.round
    assert finished >= 1
    assert record.rounds[-1].round == finished - 1
    assert record.model == f"jobs/{job_id}/global/{finished:05d}"
    # Stopped in the round in progress; or, where the evaluation that ended a round passed the
    # budget, as that round ended, with nothing of the next one run.
    of = re.escape(f"{budget:.6f}")
    stopped_in = re.fullmatch(
        rf"stopped early: its cost reached max_cost_usd during round {finished + 1}/2000 "
        rf"\((\d\.\d{{6}}) of {of} USD, its running activations and replicas counted\): "
        rf"that round was stopped, the model is round {finished}'s",
        record.events[-1].message,
    )
    stopped_after = re.fullmatch(
        rf"stopped early: its cost reached max_cost_usd \((\d\.\d{{6}}) of {of} USD as round "
        rf"{finished} ended\)",
        record.events[-1].message,
    )
    said = stopped_in or stopped_after
    assert said is not None, record.events[-1].message
    assert float(said[1]) >= budget
    assert any(a["round"] == finished for a in used) is (stopped_in is not None)
    assert again.state is JobState.DONE
    assert [e.kind for e in again.events[-2:]] == ["resumed", "done"]
    assert again.events[-1].message == record.events[-1].message
    assert again.round == finished
    assert client.get(f"/v1/jobs/{job_id}/ledger").json() == used


#: One-epoch rounds at a learning rate whose loss stalls within a few rounds, patience 2.
PATIENT_JOB = {
    **DIGITS_JOB,
    "workers": 2,
    "epochs": 60,
    "learning_rate": 0.01,
    "patience": 2,
    "keep_model": "best",
}


def patient_end(record: dict[str, Any], of: Literal["test", "validation"]) -> tuple[int, int, str]:
    """How a ``PATIENT_JOB`` whose rounds scored as ``record``'s did (by its ``of`` set's loss)
    ends: its best round (the first of the lowest), the rounds it trains (to the first two past
    the lowest before it, or all) and its log's last line."""
    rounds = record["rounds"]
    losses = [r[f"{of}_loss"] for r in rounds]
    best = 1 + min(range(len(losses)), key=losses.__getitem__)
    lowest = [1 + min(range(n), key=losses.__getitem__) for n in range(1, len(losses) + 1)]
    stalled = [n for n, at in enumerate(lowest, start=1) if n - at >= 2]
    kept = (
        f"its model is round {best}'s, of its lowest {of} loss ({losses[best - 1]:.4f}, test "
        f"accuracy {rounds[best - 1]['accuracy']:.4f})"
    )
    why = (
        f"stopped early: its {of} loss has not fallen below round {best}'s "
        f"({losses[best - 1]:.4f}) for 2 round(s) (patience)"
        if stalled
        else "all rounds done"
    )
    return best, stalled[0] if stalled else record["plan"]["rounds"], f"{why}; {kept}"


def test_a_job_with_patience_stops_once_its_test_loss_stalls_and_keeps_its_best_round(
    client: httpx.Client, controller: Controller, api_url: str, admin_key: str
) -> None:
    # Arrange
    spec = PATIENT_JOB

    # Execute: that job; and one like it without patience, cancelled after nine rounds.
    job_id = submit(client, spec)["job_id"]
    follow(client, job_id)
    record = job(client, job_id)["job"]
    model = client.get(f"/v1/jobs/{job_id}/model")
    env = {"FAASDL_CLIENT__API_KEY": admin_key}
    status = runner.invoke(app, ["status", job_id, "--url", api_url], env=env)
    endless = submit(client, {**spec, "epochs": 2000, "patience": None})["job_id"]
    eventually(lambda: job(client, endless)["job"]["round"] >= 9, timeout_s=300, what="9 rounds")
    cancelled = client.delete(f"/v1/jobs/{endless}").json()["job"]

    # Assert: it stopped at the first round two rounds past its lowest test loss (or trained
    # every round), and kept that lowest round's model, saying so.
    assert record["state"] == "done", record["error"]
    best, trained, said = patient_end(record, "test")
    assert record["round"] == trained
    assert record["stopped_early"] is (trained < 60)
    assert record["best"] == {
        "round": best,
        "weights": f"jobs/{job_id}/global/{best:05d}",
        "test_loss": record["rounds"][best - 1]["test_loss"],
        "accuracy": record["rounds"][best - 1]["accuracy"],
        "validation_loss": None,
    }
    assert record["model"] == f"jobs/{job_id}/global/{best:05d}"
    assert record["events"][-1]["message"] == said
    assert status.exit_code == 0, status.output
    # Its summary says which round's model it kept (the caption folded to the table's width).
    assert said in " ".join(status.stderr.split())
    # Cancelled, a job keeps its best round's model as well.
    losses = [r["test_loss"] for r in cancelled["rounds"]]
    best = 1 + min(range(len(losses)), key=losses.__getitem__)
    assert cancelled["model"] == cancelled["best"]["weights"] == f"jobs/{endless}/global/{best:05d}"
    assert cancelled["events"][-1]["message"] == (
        f"cancelled by request; the model of round {best} is kept, of its lowest test loss "
        f"({losses[best - 1]:.4f}, test accuracy {cancelled['rounds'][best - 1]['accuracy']:.4f})"
    )
    assert model.status_code == 200
    assert model.content == bytes(controller.store.get_blob(record["model"]))
    # Listed, its accuracy is its model's: the kept round's, not its last round's.
    listed = client.get("/v1/jobs", params={"limit": 1000}).json()
    [line] = [j for j in listed if j["job_id"] == job_id]
    assert line["accuracy"] == record["best"]["accuracy"]


def test_a_job_with_a_validation_set_chooses_its_best_round_by_it_not_by_the_test_set(
    client: httpx.Client, controller: Controller, api_url: str, admin_key: str
) -> None:
    # Arrange: the patience job, a fifth of its training examples held out.
    spec = {**PATIENT_JOB, "epochs": 40, "validation_fraction": 0.2}

    # Execute
    job_id = submit(client, spec)["job_id"]
    follow(client, job_id)
    record = job(client, job_id)["job"]
    env = {"FAASDL_CLIENT__API_KEY": admin_key}
    status = runner.invoke(app, ["status", job_id, "--url", api_url], env=env)

    # Assert: 288 of digits' 1,438 training examples held out, the shards holding the rest;
    # each round scored on both sets, and patience and the kept model going by the validation
    # loss.
    assert record["state"] == "done", record["error"]
    plan = record["plan"]
    assert (plan["examples"], plan["validation_examples"], plan["test_examples"]) == (
        1150,
        288,
        359,
    )
    store = controller.store
    held = Shard.from_bytes(store.get_blob(validation_blob(job_id)), index=0)
    shards = [Shard.from_bytes(store.get_blob(shard_blob(job_id, i)), index=i) for i in range(2)]
    assert (held.count, sum(s.count for s in shards)) == (288, 1150)
    assert "2 shards, the validation set, and the test set are in the store" in [
        e["message"] for e in record["events"] if e["kind"] == "staged"
    ]
    rounds = record["rounds"]
    assert all(0 <= r["validation_accuracy"] <= 1 for r in rounds)
    assert all(r["validation_loss"] != r["test_loss"] for r in rounds)  # two sets, not one
    best, trained, said = patient_end(record, "validation")
    assert record["round"] == trained
    assert record["best"] == {
        "round": best,
        "weights": f"jobs/{job_id}/global/{best:05d}",
        "test_loss": rounds[best - 1]["test_loss"],
        "accuracy": rounds[best - 1]["accuracy"],
        "validation_loss": rounds[best - 1]["validation_loss"],
    }
    assert record["model"] == record["best"]["weights"]
    assert record["events"][-1]["message"] == said
    finished = [e["message"] for e in record["events"] if e["kind"] == "round_finished"]
    first = rounds[0]
    assert finished[0] == (
        f"round 1/40: loss {first['loss']:.4f}, validation loss {first['validation_loss']:.4f}, "
        f"test accuracy {first['accuracy']:.4f}"
    )
    assert status.exit_code == 0, status.output
    table = " ".join(status.stderr.split())
    assert "validation loss" in table
    kept = rounds[best - 1]
    assert f"{kept['validation_loss']:.4f} │ {kept['validation_accuracy']:.4f}" in table


def test_an_evaluation_of_a_test_set_larger_than_a_trainer_holds_runs_with_memory_of_its_own(
    client: httpx.Client, api_url: str, admin_key: str, tmp_path: Path
) -> None:
    # Arrange: 4,000 training examples on four trainers (1,000 a shard) and 20,000 to test.
    spec = {
        **DIGITS_JOB,
        "dataset": {
            "name": "synthetic",
            "shape": [16, 16, 3],
            "train_size": 4000,
            "test_size": 20000,
        },
        "epochs": 1,
    }
    file = tmp_path / "job.yaml"
    file.write_text(yaml.safe_dump(spec))

    # Execute
    env = {"FAASDL_CLIENT__API_KEY": admin_key}
    estimated = runner.invoke(app, ["estimate", "--spec", str(file), "--url", api_url], env=env)
    job_id = submit(client, spec)["job_id"]
    follow(client, job_id)
    record = job(client, job_id)["job"]
    ledger = client.get(f"/v1/jobs/{job_id}/ledger").json()

    # Assert: the plan gives the evaluation a larger class than the trainers', and it ran so.
    assert record["state"] == "done", record["error"]
    plan = record["plan"]
    assert plan["evaluate_memory_mb"] > plan["train"]["memory_mb"]
    memory = {(a["kind"], a["memory_mb"]) for a in ledger if a["outcome"] == "success"}
    assert ("evaluate", plan["evaluate_memory_mb"]) in memory
    assert ("train", plan["train"]["memory_mb"]) in memory
    assert record["rounds"][0]["accuracy"] > 0.5  # it scored the 20,000
    assert estimated.exit_code == 0, estimated.output
    assert plan_row(estimated.stderr, "evaluation") == (
        f"one a round, {plan['evaluate_memory_mb']} MB of its own: its largest set (20,000 "
        "examples) is more than a trainer holds"
    )


def trained_rates(
    client: httpx.Client, platform: LocalPlatform, job_id: str
) -> list[tuple[int, float]]:
    """Each training activation of the job that trained (one that ran out of time starting,
    beside other cold starts, reports nothing): its round, and the learning rate it reported
    (its optimizer's)."""
    ledger = client.get(f"/v1/jobs/{job_id}/ledger").json()
    trained = [a for a in ledger if a["kind"] == "train" and a["outcome"] == "success"]
    records = platform.wait([a["activation_id"] for a in trained], timeout_s=60)
    return [
        (a["round"], records[a["activation_id"]].response.result["learning_rate"]) for a in trained
    ]


def test_a_job_on_an_lr_schedule_trains_each_round_at_its_rate(
    client: httpx.Client, tf_platform: LocalPlatform
) -> None:
    # Arrange: three rounds on two trainers, the rate halved each round.
    spec = {
        **DIGITS_JOB,
        "workers": 2,
        "learning_rate": 0.002,
        "lr_schedule": "exponential",
        "lr_decay_rate": 0.5,
    }

    # Execute
    job_id = submit(client, spec)["job_id"]
    follow(client, job_id)
    record = job(client, job_id)["job"]
    trained = trained_rates(client, tf_platform, job_id)

    # Assert: each round's trainers at 0.002 × √2 × 0.5^round, as their optimizers held it.
    assert record["state"] == "done", record["error"]
    rates = [0.002 * math.sqrt(2) * 0.5**r for r in range(3)]
    started = [e["message"] for e in record["events"] if e["kind"] == "round_started"]
    assert started == [
        f"round {r + 1}/3: 2 trainers × 1 epoch(s) at learning rate {rate:.6g}"
        for r, rate in enumerate(rates)
    ]
    assert len(trained) == 6
    for round_, reported in trained:
        assert reported == pytest.approx(rates[round_], rel=1e-6)  # a float32 variable


def test_a_job_that_diverges_fails_at_once_saying_so(
    client: httpx.Client, api_url: str, admin_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="faasdl")
    # Momentum SGD at 10 × √4 on batches of one takes a shard's loss to NaN within its first
    # epoch. Training is deterministic: a retry would diverge again.
    spec = {**DIGITS_JOB, "optimizer": "sgd", "learning_rate": 10, "batch_size": 1}

    job_id = submit(client, spec)["job_id"]
    follow(client, job_id)
    record = job(client, job_id)["job"]
    env = {"FAASDL_CLIENT__API_KEY": admin_key}
    shown = runner.invoke(app, ["log", job_id, "--url", api_url], env=env)
    tail = runner.invoke(app, ["log", job_id, "--tail", "2", "--url", api_url], env=env)
    status = runner.invoke(app, ["status", job_id, "--url", api_url], env=env)

    assert record["state"] == "failed"
    error = record["error"]
    assert "training diverged: " in error
    assert "(sgd, learning rate 20 in this action): a lower learning_rate may train" in error
    assert error.endswith(
        "(the action's rate is the job's learning_rate 10 × √4 workers: lr_scaling sqrt)"
    )
    assert [f["classification"] for f in record["failures"]] == ["application_error"]
    [failure] = record["failures"]
    assert failure["recovery"] == "fail"
    # `faasdl log`: every line of its log, and the failure with the activation to look up.
    assert shown.exit_code == 0, shown.output
    fields = ("events", "events_dropped", "failures", "failures_dropped")
    assert json.loads(shown.stdout) == {"job_id": job_id, **{k: record[k] for k in fields}}
    cells = [line.split("│")[1:-1] for line in shown.stderr.splitlines() if line.startswith("│")]
    rows = [[c.strip() for c in row] for row in cells if row[0].strip()]  # not a folded line
    assert [row[3] for row in rows if len(row) == 5] == [e["kind"] for e in record["events"]]
    [row] = [row for row in rows if len(row) == 11]
    assert row[1:11] == [
        "train", "1", str(failure["unit"]), str(failure["attempt"]), "application_error",
        "platform", f"{failure['cost_usd']:.6f}", failure["activation_id"], "fail",
        row[10],
    ]  # fmt: skip
    assert failure["cost_usd"] > 0
    assert failure["message"].startswith("training diverged")
    assert row[10]
    assert failure["message"].startswith(row[10])  # its first line
    # --tail: its newest lines, saying so; the failure all the same
    tail_rows = [
        line.split("│")[4].strip() for line in tail.stderr.splitlines() if line.startswith("│ 2")
    ]
    assert tail_rows[:2] == [e["kind"] for e in record["events"][-2:]]
    said = " ".join(tail.stderr.split())
    assert f"the newest 2 of {len(record['events'])} lines kept (--tail)" in said
    assert failure["activation_id"] in tail.stderr
    # `faasdl status` says where they are told
    hint = f"its failures, what each cost and its recovery: faasdl log {job_id}"
    assert hint in status.stderr.splitlines()

    # The controller's log says so once, as a warning (it said it twice).
    def failed_lines() -> list[logging.LogRecord]:
        said = caplog.records
        return [r for r in said if r.getMessage().startswith(f"job {job_id} failed")]

    eventually(lambda: bool(failed_lines()), timeout_s=10, what="the job's failure logged")
    failed = failed_lines()
    assert [(r.levelno, r.getMessage()) for r in failed] == [
        (logging.WARNING, f"job {job_id} failed: {error}")
    ]


def test_two_jobs_that_do_not_fit_together_both_complete_the_second_queued_first(
    client: httpx.Client, controller: Controller
) -> None:
    spec = {**DIGITS_JOB, "epochs": 1}
    pool = controller.platform.limits().pool_memory_mb or 0

    first = submit(client, spec)
    # Admitted before the second comes (on a loaded machine the scheduler's pass may not have
    # run yet, and the second would be second in the queue).
    eventually(
        lambda: job(client, first["job_id"])["job"]["state"] != "queued",
        timeout_s=60,
        what="the first job admitted",
    )
    second = submit(client, {**spec, "tenant": "other"})
    queued = job(client, second["job_id"])
    follow(client, second["job_id"])
    one, two = job(client, first["job_id"])["job"], job(client, second["job_id"])["job"]

    plan = first["plan"]["train"]
    assert 2 * plan["containers"] * plan["memory_mb"] > pool
    assert queued["job"]["state"] == "queued"
    assert queued["queue_position"] == 1
    need = plan["containers"] * plan["memory_mb"]
    free = pool - need  # beside the first job
    assert queued["waiting_for"] == (
        f"the platform's pool memory: it needs {need:,} MB, {free:,} of {pool:,} MB free beside "
        "the running jobs"
    )
    assert one["state"] == two["state"] == "done"
    assert two["started_ms"] >= one["finished_ms"]
    assert [e["kind"] for e in two["events"]][:2] == ["submitted", "admitted"]


def test_a_job_trains_on_from_a_done_jobs_model_and_one_that_cannot_is_refused(
    client: httpx.Client,
    controller: Controller,
    finished: tuple[str, list[tuple[str, dict[str, Any]]]],
    tf_platform: LocalPlatform,
) -> None:
    # Arrange: the done four-unit job (three rounds from weights drawn from its seed).
    source_id = finished[0]
    source = job(client, source_id)["job"]
    refusals = {
        "unknown": {**DIGITS_JOB, "init_model": "0" * 16},
        "another model": {**DIGITS_JOB, "model": "small_cnn", "init_model": source_id},
        "another optimizer": {**DIGITS_JOB, "optimizer": "sgd", "init_model": source_id},
        "another tenant's": {**DIGITS_JOB, "tenant": "other", "init_model": source_id},
    }

    # Execute: one round on from its model at a fifth of its learning rate, queued at first
    # behind another tenant's long job (two do not fit the pool together), while the source is
    # asked to be deleted; then what cannot train on from it.
    blocker = submit(client, {**DIGITS_JOB, "epochs": 1000, "sync_every": 0, "tenant": "other"})
    eventually(
        lambda: job(client, blocker["job_id"])["job"]["state"] == "running",
        timeout_s=60,
        what="the long job admitted",
    )
    slower = {**DIGITS_JOB, "epochs": 1, "init_model": source_id, "learning_rate": 2e-4}
    onward = submit(client, slower)["job_id"]
    waiting = job(client, onward)["job"]["state"]
    kept = client.delete(f"/v1/jobs/{source_id}", params={"purge": "true"})
    client.delete(f"/v1/jobs/{blocker['job_id']}")
    record = controller.wait(onward, timeout_s=300)
    before = controller.store.scan_versions("job/")
    refused = {name: client.post("/v1/jobs", json=body) for name, body in refusals.items()}
    unplanned = client.post("/v1/estimate", json=refusals["another model"])  # as submit does

    # Assert: its first round started from the other's model (copied into its own blobs) and
    # trained on from its loss, where the other's first round started at a drawn model's.
    assert waiting == "queued"
    assert kept.status_code == 409
    assert kept.json()["detail"] == (
        f"job {source_id}'s model (init_model) is needed by job {onward}, which has not staged it "
        "yet: delete it once the job has started training, or cancel the job"
    )
    assert record.state is JobState.DONE, record.error
    first = bytes(controller.store.get_blob(f"jobs/{onward}/global/00000"))
    assert first == client.get(f"/v1/jobs/{source_id}/model").content
    assert record.rounds[0].loss < source["rounds"][-1]["loss"] * 1.5
    assert source["rounds"][0]["loss"] > 2 * record.rounds[0].loss
    staged = [e.message for e in record.events if e.kind == "staged"]
    assert f"the first round starts from job {source_id}'s model" in staged
    # At its own learning rate (× √4 workers), not the one the model's optimizer was saved at.
    rates = [rate for _, rate in trained_rates(client, tf_platform, onward)]
    assert rates == pytest.approx([4e-4] * 4, rel=1e-6)
    # Refused naming the field and why, nothing stored.
    said = {name: r.json()["detail"] for name, r in refused.items()}
    assert all(r.status_code == 422 for r in refused.values()), said
    assert said["unknown"] == f"init_model: no job {'0' * 16!r} of tenant 'default'"
    assert said["another model"].endswith(
        "this job is small_cnn for 8×8×1 inputs and 10 classes: they must be the same"
    )
    assert "use adam" in said["another optimizer"]
    assert said["another tenant's"] == f"init_model: no job {source_id!r} of tenant 'other'"
    assert unplanned.status_code == 422
    assert unplanned.json()["detail"] == said["another model"]
    assert controller.store.scan_versions("job/") == before


def test_cancel_stops_a_running_jobs_activations(
    client: httpx.Client,
    controller: Controller,
    tf_platform: LocalPlatform,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="faasdl")
    # one round of many epochs: its activations run far longer than the cancel takes
    job_id = submit(client, {**DIGITS_JOB, "epochs": 1000, "sync_every": 0})["job_id"]

    def running() -> list[str]:
        units = job(client, job_id)["units"]
        return [
            u["activation_id"]
            for u in units
            if u["activation_id"] and tf_platform.is_running(u["activation_id"])
        ]

    eventually(lambda: bool(running()), timeout_s=120, what="a unit's activation running")
    killed = running()
    response = client.delete(f"/v1/jobs/{job_id}")
    assert controller.wait_stopped(job_id, timeout_s=60)

    assert response.status_code == 200
    assert response.json()["job"]["state"] == "cancelled"
    for activation_id in killed:
        record = tf_platform.wait([activation_id], timeout_s=60)[activation_id]
        assert not record.success
    eventually(
        lambda: tf_platform.pool_stats()["busy"] == 0, timeout_s=30, what="no busy container"
    )
    record = job(client, job_id)["job"]
    assert record["state"] == "cancelled"
    assert record["rounds"] == []
    # What the stopped activations used is booked, and counted in the job's cost (it read $0).
    ledger = client.get(f"/v1/jobs/{job_id}/ledger").json()
    booked = {a["activation_id"]: a for a in ledger}
    assert set(killed) <= set(booked)
    assert all(booked[a]["outcome"] == "stopped" and booked[a]["cost_usd"] > 0 for a in killed)
    replicas = record["replica_gb_s"] * Settings().price_per_gb_s
    assert record["cost_usd"] == pytest.approx(sum(a["cost_usd"] for a in ledger) + replicas)
    assert record["activation_count"] == len(ledger)
    assert "unit_failed" not in [e["kind"] for e in record["events"]]  # stopped, not failed
    assert client.delete(f"/v1/jobs/{job_id}").json()["job"]["state"] == "cancelled"
    no_model = client.get(f"/v1/jobs/{job_id}/model")
    assert no_model.status_code == 409
    assert no_model.json()["detail"] == (
        f"job {job_id} has no model: it ended (cancelled) before a round had finished"
    )
    said = logged(caplog, job_id)
    assert said[:2] == [
        f"job {job_id} {e['kind']}: {e['message']}" for e in record["events"][:2]
    ]  # submitted, admitted
    assert said.count(f"job {job_id} cancelled: cancelled by request") == 1  # not the second


def test_finish_ends_a_running_job_done_with_its_last_finished_rounds_model(
    client: httpx.Client, controller: Controller, tf_platform: LocalPlatform
) -> None:
    # Arrange: a job of 2,000 one-epoch rounds, two of them finished; and one just submitted.
    job_id = submit(client, {**DIGITS_JOB, "workers": 2, "epochs": 2000, "sync_every": 1})["job_id"]
    eventually(lambda: job(client, job_id)["job"]["round"] >= 2, timeout_s=300, what="2 rounds")
    early = submit(client, {**DIGITS_JOB, "workers": 2, "seed": 7})["job_id"]

    # Execute
    response = client.post(f"/v1/jobs/{job_id}/finish")
    too_early = client.post(f"/v1/jobs/{early}/finish")
    assert controller.wait_stopped(job_id, timeout_s=60)
    again = client.post(f"/v1/jobs/{job_id}/finish")
    client.delete(f"/v1/jobs/{early}")
    eventually(
        lambda: tf_platform.pool_stats()["busy"] == 0, timeout_s=60, what="no busy container"
    )
    record = job(client, job_id)["job"]
    model = client.get(f"/v1/jobs/{job_id}/model")

    # Assert: done at once with the global model of the rounds it had finished, no round
    # finished after it (the one in progress stopped); its download is that model.
    assert response.status_code == 200, response.text
    finished = response.json()["job"]
    assert finished["state"] == record["state"] == "done"
    rounds = finished["round"]
    assert record["round"] == len(record["rounds"]) == rounds >= 2
    assert record["model"] == f"jobs/{job_id}/global/{rounds:05d}"
    assert record["stopped_early"] is True
    last = record["events"][-1]
    assert (last["kind"], last["message"]) == (
        "done",
        f"finished by request after round {rounds}/2000: its model is that round's (test "
        f"accuracy {record['rounds'][-1]['accuracy']:.4f})",
    )
    assert model.status_code == 200
    assert model.content == bytes(controller.store.get_blob(record["model"]))
    # Nothing to keep before a round has finished; nothing to finish once it has ended.
    assert too_early.status_code == 409
    assert "has finished no round yet" in too_early.json()["detail"]
    assert again.status_code == 409
    assert "has already ended (done): nothing to finish" in again.json()["detail"]


def test_a_cancelled_job_keeps_its_last_finished_rounds_model_to_download_and_train_on(
    api_url: str, admin_key: str, client: httpx.Client, controller: Controller
) -> None:
    # Arrange: a job of 2,000 one-epoch rounds, one of them finished.
    job_id = submit(client, {**DIGITS_JOB, "workers": 2, "epochs": 2000, "sync_every": 1})["job_id"]
    eventually(lambda: job(client, job_id)["job"]["round"] >= 1, timeout_s=300, what="a round")

    # Execute
    too_soon = client.post("/v1/jobs", json={**DIGITS_JOB, "workers": 2, "init_model": job_id})
    cancelled = runner.invoke(
        app, ["cancel", job_id, "--url", api_url], env={"FAASDL_CLIENT__API_KEY": admin_key}
    )
    assert controller.wait_stopped(job_id, timeout_s=60)
    record = job(client, job_id)["job"]
    model = client.get(f"/v1/jobs/{job_id}/model")
    onward = client.post("/v1/jobs", json={**DIGITS_JOB, "workers": 2, "init_model": job_id})
    client.delete(f"/v1/jobs/{onward.json()['job']['job_id']}")

    # Assert: its record names the global model of the rounds it had finished, which is what
    # it downloads and what a job may train on from (that the rest of its data is deleted, a
    # controller that keeps none shows: tests/canary, a store that fills).
    rounds = record["round"]
    assert record["state"] == "cancelled"
    assert rounds == len(record["rounds"]) >= 1
    assert record["model"] == f"jobs/{job_id}/global/{rounds:05d}"
    last = record["events"][-1]
    assert (last["kind"], last["message"]) == (
        "cancelled",
        f"cancelled by request; the model of round {rounds} is kept",
    )
    assert model.status_code == 200
    assert model.content == bytes(controller.store.get_blob(record["model"]))
    assert len(unpack(model.content)["w"]) > 0
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stderr.splitlines() == [
        f"the model of its last finished round ({rounds}) is kept: faasdl model {job_id} -o "
        f"model.safetensors, or train on from it (init_model: {job_id})"
    ]
    assert onward.status_code == 201, onward.text
    assert too_soon.status_code == 422
    assert too_soon.json()["detail"] == f"init_model: job {job_id} has no model yet: it is running"


def test_cancel_stops_an_attempt_whose_lease_lapsed_too(
    client: httpx.Client, controller: Controller, tf_platform: LocalPlatform
) -> None:
    # Arrange: a long round; one unit's attempt frozen until its lease lapses (abandoned: a
    # hung attempt is fenced by the next claim, not killed)
    job_id = submit(client, {**DIGITS_JOB, "epochs": 1000, "sync_every": 0})["job_id"]

    def beating() -> list[str]:  # a lease lapses only once its attempt has beaten
        units = job(client, job_id)["units"]
        return [
            u["activation_id"]
            for u in units
            if u["activation_id"]
            and u["heartbeat_ms"] is not None
            and tf_platform.is_running(u["activation_id"])
        ]

    eventually(lambda: bool(beating()), timeout_s=120, what="a unit's attempt beating")
    frozen = beating()[0]
    tf_platform.signal(frozen, signal.SIGSTOP)
    eventually(
        lambda: any(
            f["activation_id"] == frozen and f["classification"] == "hung"
            for f in job(client, job_id)["job"]["failures"]
        ),
        timeout_s=60,
        what="the frozen attempt found hung",
    )

    # Execute
    client.delete(f"/v1/jobs/{job_id}")
    assert controller.wait_stopped(job_id, timeout_s=60)

    # Assert: the frozen attempt was killed with the others (it waited for its time limit)
    record = tf_platform.wait([frozen], timeout_s=30)[frozen]
    assert not record.success


def test_an_idempotency_key_replay_returns_the_same_job(client: httpx.Client) -> None:
    spec = {**DIGITS_JOB, "epochs": 1, "seed": 7}

    first = client.post("/v1/jobs", json=spec, headers={"Idempotency-Key": "run-7"})
    replay = client.post("/v1/jobs", json=spec, headers={"Idempotency-Key": "run-7"})
    other = client.post("/v1/jobs", json={**spec, "seed": 8}, headers={"Idempotency-Key": "run-7"})
    follow(client, first.json()["job"]["job_id"])

    assert first.status_code == 201
    assert replay.status_code == 200
    assert replay.json()["job"]["job_id"] == first.json()["job"]["job_id"]
    assert other.status_code == 409
    assert "different request" in other.json()["detail"]
    jobs = client.get("/v1/jobs").json()
    assert sum(j["job_id"] == first.json()["job"]["job_id"] for j in jobs) == 1


def test_a_url_that_is_not_the_controller_s_is_told_not_a_missing_job(
    api_url: str, admin_key: str
) -> None:
    env = {"FAASDL_CLIENT__API_KEY": admin_key}

    listed = runner.invoke(app, ["jobs", "--url", f"{api_url}/v1"], env=env)
    status = runner.invoke(app, ["status", "0123456789abcdef", "--url", f"{api_url}/v1"], env=env)

    # Said "HTTP 404: Not Found", and for a job "no job '0123456789abcdef'".
    for result, path in ((listed, "/v1/jobs"), (status, "/v1/jobs/0123456789abcdef")):
        assert result.exit_code == 2
        said = " ".join(result.output.split())
        assert f"HTTP 404: {api_url}/v1 has no {path}: is it the controller's URL?" in said
        assert "no job" not in said


def test_the_cli_submits_watches_lists_downloads_and_deletes(
    api_url: str, admin_key: str, controller: Controller, tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({**DIGITS_JOB, "epochs": 4, "seed": 1}))
    sets = ["--set", "epochs=1", "--set", "seed=3", "--set", "dataset.test_fraction=0.25"]
    out = tmp_path / "model.safetensors"
    key_file = tmp_path / "key"
    key_file.write_text(admin_key + "\n")
    env = {"FAASDL_CLIENT__API_KEY": admin_key}

    keyless = runner.invoke(app, ["jobs", "--url", api_url])
    submitted = runner.invoke(
        app, ["submit", str(spec), *sets, "--watch", "--url", api_url], env=env
    )
    job_id = submitted.stdout.splitlines()[0]
    listed = runner.invoke(
        app, ["jobs", "--url", api_url], env={"FAASDL_CLIENT__API_KEY_FILE": str(key_file)}
    )
    none = runner.invoke(
        app, ["jobs", "--tenant", "nobody", "--state", "done", "--url", api_url], env=env
    )
    unused = runner.invoke(app, ["ledger", job_id, "--from-round", "9", "--url", api_url], env=env)
    status = runner.invoke(app, ["status", job_id, "--url", api_url], env=env)
    ledger = runner.invoke(app, ["ledger", job_id, "--url", api_url], env=env)
    log = runner.invoke(app, ["log", job_id, "--url", api_url], env=env)
    again = runner.invoke(app, ["resubmit", job_id, "--set", "seed=4", "--url", api_url], env=env)
    jobs_before = {key for key, _ in controller.store.scan_versions("job/")}
    unrun = runner.invoke(app, ["resubmit", job_id, "--set", "epochs=0", "--url", api_url], env=env)
    unrun_refused = {key for key, _ in controller.store.scan_versions("job/")} == jobs_before
    downloaded = runner.invoke(app, ["model", job_id, "-o", str(out), "--url", api_url], env=env)
    missing = runner.invoke(
        app, ["model", "0123456789abcdef", "-o", str(tmp_path / "none"), "--url", api_url], env=env
    )
    deleted = runner.invoke(app, ["delete", job_id, "--url", api_url], env=env)
    gone = runner.invoke(app, ["status", job_id, "--url", api_url], env=env)
    no_log = runner.invoke(app, ["log", job_id, "--url", api_url], env=env)
    left = [key for key, _ in controller.store.scan_versions("") if job_id in key]

    assert keyless.exit_code == 2
    assert "an API key is required" in keyless.output
    assert submitted.exit_code == 0, submitted.output
    assert "round_finished" in submitted.output
    # Its last picture draws no unit's bar: the job has ended, none runs.
    assert not re.search(r"shard \d+ \S+ +round \d+ ", submitted.output), submitted.output
    [row] = [j for j in json.loads(listed.stdout.splitlines()[-1]) if j["job_id"] == job_id]
    when = datetime.fromtimestamp(row["created_ms"] / 1000).strftime("%Y-%m-%d %H:%M:%S")
    assert re.search(rf"{job_id}\s*│\s*{when}", listed.output)  # submitted, in local time
    assert none.exit_code == 0, none.output
    assert none.stderr.splitlines() == ["no jobs (tenant nobody, state done)"]  # no empty table
    assert none.stdout.splitlines()[-1] == "[]"
    assert unused.stderr.splitlines() == [f"no activations of job {job_id} from round 9 on"]
    record = json.loads(status.stdout.splitlines()[-1])["job"]
    assert record["state"] == "done"
    # the file's fields as --set changed them: a number as a number, a field of the data set
    assert (record["spec"]["epochs"], record["spec"]["seed"]) == (1, 3)
    assert record["spec"]["dataset"] == {"name": "digits", "test_fraction": 0.25}
    assert "activations (0 failed and recovered)" in submitted.output
    assert f"mlp on digits: {DIGITS_JOB['workers']} worker(s) of" in submitted.output
    assert f"its model: faasdl model {job_id} -o model.safetensors" in status.output
    assert "faasdl log" not in status.output  # no failures to tell
    used = json.loads(ledger.stdout.splitlines()[-1])
    assert [a["kind"] for a in used].count("train") == DIGITS_JOB["workers"]
    first = used[0]
    row = (
        first["memory_mb"],
        f"{first['peak_memory_mb']:.0f}",
        f"{first['duration_ms'] / 1e3:.2f}",
    )
    assert re.search(r"\s*│\s*".join(map(str, row)), ledger.output)  # limit, peak, seconds
    assert f"{len(used)} activations" in status.output
    # Resubmitted: a new job of its fields, as --set changed them; refused as a submission is.
    assert again.exit_code == 0, again.output
    rerun = controller.wait(again.stdout.strip(), timeout_s=300)
    assert rerun.job_id != job_id
    assert rerun.spec == {**record["spec"], "seed": 4}
    assert rerun.state is JobState.DONE, rerun.error
    assert unrun.exit_code == 2
    assert "epochs: Input should be greater than or equal to 1" in unrun.output
    assert unrun_refused
    assert log.exit_code == 0, log.output
    assert log.stderr.splitlines()[-1] == f"no failures of job {job_id}"  # no empty table
    assert json.loads(log.stdout)["failures"] == []
    assert downloaded.exit_code == 0, downloaded.output
    assert len(unpack(out.read_bytes())["w"]) > 0
    assert json.loads(downloaded.stdout.splitlines()[-1])["bytes"] == out.stat().st_size
    assert missing.exit_code == 2
    assert not list(tmp_path.glob("none*"))  # its partial file is gone with it
    assert "no job '0123456789abcdef'" in missing.output
    assert not (tmp_path / "none").exists()
    # Deleted whole once downloaded: its record, ledger, unit and round records and blobs.
    assert deleted.exit_code == 0, deleted.output
    assert json.loads(deleted.stdout.splitlines()[-1]) == {"job_id": job_id, "deleted": True}
    assert gone.exit_code == 2
    assert f"no job '{job_id}'" in gone.output
    assert no_log.exit_code == 2
    assert f"no job '{job_id}'" in no_log.output
    assert left == []
    assert controller.store.blob_names(f"jobs/{job_id}/") == []


def test_the_python_client_submits_waits_and_saves_the_model(
    api_url: str, admin_key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAASDL_CLIENT__URL", api_url)
    monkeypatch.setenv("FAASDL_CLIENT__API_KEY", admin_key)
    out = tmp_path / "model.safetensors"

    with ControllerClient.from_settings() as client:
        job_id = client.submit({**DIGITS_JOB, "epochs": 1, "seed": 5})["job"]["job_id"]
        with pytest.raises(TimeoutError, match=rf"job {job_id} is still \w+ after 0.01 s"):
            client.wait(job_id, timeout_s=0.01)  # its trainers' cold start alone takes seconds
        view = client.wait(job_id, poll_s=0.2)
        size = client.save_model(job_id, out)
        with pytest.raises(JobNotFound, match="no job '0123456789abcdef'"):
            client.save_model("0123456789abcdef", tmp_path / "none.safetensors")
        # A pipe (or /dev/null) is written to, not renamed over: /dev/null became the model.
        with reading_pipe(tmp_path / "pipe") as (pipe, received):
            piped = client.save_model(job_id, pipe)

    assert view["job"]["state"] == "done", view["job"]["error"]
    assert len(view["job"]["rounds"]) == 1
    assert size == out.stat().st_size
    assert len(unpack(out.read_bytes())["w"]) > 0
    assert piped == size
    assert received == [out.read_bytes()]
    assert stat.S_ISFIFO((tmp_path / "pipe").stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "pipe"]


def test_the_cli_asks_the_controller_for_a_plan_with_url(
    api_url: str, admin_key: str, client: httpx.Client, tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    job = {**DIGITS_JOB, "epochs": 4, "sync_every": 2}
    spec.write_text(yaml.safe_dump(job))
    missing = tmp_path / "missing.yaml"
    missing.write_text(yaml.safe_dump({**job, "dataset": {"name": "npz", "path": "none.npz"}}))
    env = {"FAASDL_CLIENT__API_KEY": admin_key}

    set_once = env | {"FAASDL_CLIENT__URL": api_url}

    asked = runner.invoke(app, ["estimate", "--spec", str(spec), "--url", api_url], env=env)
    refused = runner.invoke(app, ["estimate", "--spec", str(missing), "--url", api_url], env=env)
    by_setting = runner.invoke(app, ["estimate", "--spec", str(spec)], env=set_once)
    here = runner.invoke(app, ["estimate", "--spec", str(missing), "--local"], env=set_once)

    assert asked.exit_code == 0, asked.output
    assert json.loads(asked.stdout.splitlines()[-1]) == client.post("/v1/estimate", json=job).json()
    assert refused.exit_code == 2
    assert "dataset.path: no upload of yours is named 'none.npz'" in " ".join(
        refused.output.split()
    )
    assert by_setting.exit_code == 0, by_setting.output
    assert by_setting.stdout == asked.stdout
    assert here.exit_code == 2
    assert (
        "dataset.path: no such file here: none.npz (an upload lives on the controller, which "
        "plans it: --url or FAASDL_CLIENT__URL)"
    ) in " ".join(here.output.split())


def test_a_plan_says_what_its_actions_cost_by_past_runs_and_warns_a_budget_below_it(
    api_url: str, admin_key: str, client: httpx.Client, controller: Controller, tmp_path: Path
) -> None:
    # Arrange: a run of the job's signature in the history; the job on a budget below what its
    # actions would cost, one of a signature never run (another batch size), and one of a
    # signature whose training alone is on record (as a history from before kept it).
    follow(client, submit(client, {**DIGITS_JOB, "epochs": 1})["job_id"])
    job = {**DIGITS_JOB, "epochs": 4, "sync_every": 2, "max_cost_usd": 1e-6}
    # An aggregator's cold start on its record too, whether or not the module's earlier jobs left
    # one warm for the run above (run on its own, this test's job starts its aggregators cold).
    run = controller.estimate(JobSpec.model_validate(job)).train
    history.record_merge_step(controller.store, run.signature, "aggregate", 90, init_ms=700)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job))
    unrun = tmp_path / "unrun.yaml"
    unrun.write_text(yaml.safe_dump({**job, "batch_size": 24}))
    trained = tmp_path / "trained.yaml"
    trained.write_text(yaml.safe_dump({**job, "batch_size": 20}))
    signature = controller.estimate(JobSpec.model_validate({**job, "batch_size": 20})).train
    history.record_run(
        controller.store, signature.signature, peak_memory_mb=300, overhead_ms=400, epoch_ms=200
    )
    env = {"FAASDL_CLIENT__API_KEY": admin_key}

    # Execute
    asked = runner.invoke(app, ["estimate", "--spec", str(spec), "--url", api_url], env=env)
    never = runner.invoke(app, ["estimate", "--spec", str(unrun), "--url", api_url], env=env)
    partly = runner.invoke(app, ["estimate", "--spec", str(trained), "--url", api_url], env=env)
    planned = json.loads(asked.stdout.splitlines()[-1])  # a budget between its two figures:
    between = round((planned["expected_cost_usd"] + planned["expected_cost_cold_usd"]) / 2, 6)
    maybe = runner.invoke(
        app,
        ["estimate", "--spec", str(spec), "--set", f"max_cost_usd={between}", "--url", api_url],
        env=env,
    )
    submitted = submit(client, job)
    client.delete(f"/v1/jobs/{submitted['job_id']}")

    # Assert: the medians of the signature's past runs, the cost they give its four epochs in
    # two rounds on four trainers, with each round's aggregations and evaluation, and the
    # warning, in the plan and as the job is submitted.
    assert asked.exit_code == 0, asked.output
    plan = json.loads(asked.stdout.splitlines()[-1])
    train = plan["train"]
    past = history.read(controller.store, train["signature"])
    assert past is not None
    assert past.runs > 0
    assert train["median_overhead_ms"] == round(statistics.median(past.overhead_ms))
    assert train["median_epoch_ms"] == round(statistics.median(past.epoch_ms))
    assert train["median_aggregate_ms"] == round(statistics.median(past.aggregate_ms))
    assert train["median_evaluate_ms"] == round(statistics.median(past.evaluate_ms))
    price = Settings().price_per_gb_s
    ms = 2 * train["median_overhead_ms"] + 4 * train["median_epoch_ms"]
    cost = 4 * train["memory_mb"] / 1024 * ms / 1000 * price
    aggregations = sum(len(level) for level in plan["tree"])
    assert aggregations >= 1
    merge_gb_ms = (
        aggregations * plan["aggregate_memory_mb"] * train["median_aggregate_ms"]
        + train["memory_mb"] * train["median_evaluate_ms"]
    ) / 1024
    merge = 2 * merge_gb_ms / 1000 * price
    runtime = history.read_baseline(
        controller.store, controller.settings.estimator.baseline_runtime
    )
    assert runtime is not None
    assert train["median_cold_start_ms"] == round(statistics.median(runtime.starts_with(4)))
    aggregator_ms, build_ms = train["median_aggregate_cold_start_ms"], train["median_build_ms"]
    assert aggregator_ms == round(statistics.median(past.aggregate_init_ms))
    assert build_ms == round(statistics.median(past.build_ms))
    aggregators = max(len(level) for level in plan["tree"])
    starts_mb_ms = (
        4 * train["memory_mb"] * (train["median_cold_start_ms"] + build_ms)
        + aggregators * plan["aggregate_memory_mb"] * aggregator_ms
    )
    starts = starts_mb_ms / 1024 / 1000 * price
    assert plan["train_cost_usd"] == pytest.approx(cost)
    assert plan["expected_cost_usd"] == pytest.approx(cost + merge)
    assert plan["expected_cost_cold_usd"] == pytest.approx(cost + merge + starts)
    shown = " ".join(asked.stderr.split())
    assert plan_row(asked.stderr, "expected cost") == (
        f"${cost + merge:.6f} by the medians of past runs: its training actions "
        f"${cost:.6f} ({train['median_overhead_ms'] / 1000:g} s an action's start and end, "
        f"{train['median_epoch_ms'] / 1000:g} s an epoch), each round's {aggregations} "
        f"aggregation(s) of {train['median_aggregate_ms'] / 1000:g} s and evaluation of "
        f"{train['median_evaluate_ms'] / 1000:g} s ${merge:.6f}; ${cost + merge + starts:.6f} "
        f"with each of its containers starting cold once (4 trainer(s), {aggregators} "
        f"aggregator(s); {train['median_cold_start_ms'] / 1000:g} s a start and "
        f"{build_ms / 1000:g} s to build its trainer, an aggregator's {aggregator_ms / 1000:g} s); "
        "warm replicas come on top"
    )
    warning = (
        f"its max_cost_usd (0.000001) is below what its actions cost by past runs "
        f"({cost + merge:.6f}): it will stop before its last round"
    )
    assert f"warning: {warning}" in shown
    assert submitted["events"][0]["message"].endswith(f"; {warning}")
    # A budget its actions fit on warm containers, not with their cold starts: it may stop.
    assert maybe.exit_code == 0, maybe.output
    assert (
        f"warning: its max_cost_usd ({between:.6f}) is below what its actions cost by past runs "
        f"with each of its containers starting cold once (4 trainer(s), {aggregators} "
        f"aggregator(s): {cost + merge + starts:.6f}; {cost + merge:.6f} on warm ones): it may "
        "stop before its last round"
    ) in " ".join(maybe.stderr.split())
    assert never.exit_code == 0, never.output
    assert json.loads(never.stdout.splitlines()[-1])["train_cost_usd"] is None
    assert "unknown: no past run of its signature (a first job measures it)" in " ".join(
        never.stderr.split()
    )
    # Its training alone on record: that, and what it leaves out.
    assert partly.exit_code == 0, partly.output
    partial = json.loads(partly.stdout.splitlines()[-1])
    assert partial["expected_cost_usd"] is None
    assert plan_row(partly.stderr, "expected cost") == (
        f"its training actions ${partial['train_cost_usd']:.6f} (0.4 s an action's start and "
        "end, 0.2 s an epoch), by the medians of past runs; cold starts, aggregation, "
        "evaluation and warm replicas come on top"
    )
    assert "below what its training actions cost by past runs" in " ".join(partly.stderr.split())


def plan_row(output: str, name: str) -> str:
    """The words of row ``name`` of the plan's table in ``output``, its wrapped lines joined."""
    words, inside = [], False
    for line in output.splitlines():
        cells = line.split("│")
        if len(cells) != 4:  # a border, or a line outside the table
            continue
        if label := cells[1].strip():
            inside = label == name
        if inside:
            words.append(cells[2].strip())
    return " ".join(words)


def test_compare_shows_a_sweeps_jobs_side_by_side(
    api_url: str, admin_key: str, client: httpx.Client
) -> None:
    # Arrange: a two-point sweep of the learning rate, and a job outside it.
    sweep = [
        submit(client, {**DIGITS_JOB, "epochs": 1, "learning_rate": rate, "name": f"cmp lr {rate}"})
        for rate in (0.01, 0.002)
    ]
    for j in sweep:
        follow(client, j["job_id"])
    records = [job(client, j["job_id"])["job"] for j in sweep]
    env = {"FAASDL_CLIENT__API_KEY": admin_key}
    ids = [r["job_id"] for r in records]

    # Execute
    by_name = runner.invoke(app, ["compare", "--name", "cmp lr", "--url", api_url], env=env)
    by_ids = runner.invoke(app, ["compare", *ids, ids[0], "--url", api_url], env=env)
    ranked = {
        order: runner.invoke(
            app, ["compare", *ids[::-1], "--sort", order, "--url", api_url], env=env
        )
        for order in ("accuracy", "loss", "cost")
    }
    alone = runner.invoke(app, ["compare", ids[0], "--url", api_url], env=env)
    none = runner.invoke(app, ["compare", "--name", "no such sweep", "--url", api_url], env=env)
    bad = runner.invoke(app, ["compare", ids[0], "../x", "--url", api_url], env=env)

    # Assert: the field they differ in, and where each got to, newest first by name; given by
    # id, in the order given, once each.
    assert by_name.exit_code == 0, by_name.output
    shown = json.loads(by_name.stdout.splitlines()[-1])
    assert shown["differing"] == ["learning_rate"]
    expected = [
        {
            "job_id": r["job_id"],
            "name": r["spec"]["name"],
            "state": "done",
            "round": 1,
            "rounds": 1,
            "fields": {"learning_rate": r["spec"]["learning_rate"]},
            "accuracy": r["rounds"][-1]["accuracy"],
            "lowest_loss": r["best"]["test_loss"],
            "lowest_loss_of": "test",
            "lowest_at_round": 1,
            "test_loss_at_lowest": r["best"]["test_loss"],
            "cost_usd": r["cost_usd"],
        }
        for r in records
    ]
    assert shown["jobs"] == expected[::-1]
    table = " ".join(by_name.stderr.split())
    assert "learning_rate" in table
    assert f"{records[0]['rounds'][-1]['accuracy']:.4f}" in table
    assert by_ids.exit_code == 0, by_ids.output
    assert json.loads(by_ids.stdout.splitlines()[-1])["jobs"] == expected
    best_first = {
        "accuracy": sorted(expected, key=lambda row: -row["accuracy"]),
        "loss": sorted(expected, key=lambda row: row["lowest_loss"]),
        "cost": sorted(expected, key=lambda row: row["cost_usd"]),
    }
    assert best_first["accuracy"] != expected[::-1]  # the higher rate's job, given last, first
    for order, result in ranked.items():
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout.splitlines()[-1])["jobs"] == best_first[order]
    assert alone.exit_code == 2
    assert "compare needs two jobs or more: 1 asked" in alone.output
    assert none.exit_code == 2
    assert "compare needs two jobs or more: 0 asked (--name 'no such sweep' matched 0)" in (
        " ".join(none.output.split())
    )
    assert bad.exit_code == 2
    assert "'../x' is not a job's id" in " ".join(bad.output.split())


def test_a_running_jobs_status_and_a_watch_stopped_with_ctrl_c_that_leaves_it_running(
    api_url: str, admin_key: str, client: httpx.Client, controller: Controller
) -> None:
    # Arrange: a job of one long round, and `faasdl status ID --watch` following it, with Ctrl-C
    # handled as in a terminal (a shell's background job, as a CI runner may run the tests in,
    # starts with SIGINT ignored, and its children inherit that).
    job_id = submit(client, {**DIGITS_JOB, "epochs": 1000, "sync_every": 0})["job_id"]
    cli = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"from faasdl.cli import app; app(['status', '{job_id}', '--watch', '--url', '{api_url}'])"
    )
    watcher = subprocess.Popen(
        [sys.executable, "-c", cli],
        env=os.environ | {"FAASDL_CLIENT__API_KEY": admin_key},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert watcher.stderr is not None
    first = watcher.stderr.readline()  # the job's first log line: the watch follows it
    workers = DIGITS_JOB["workers"]
    eventually(
        lambda: [u["state"] for u in job(client, job_id)["units"]] == ["running"] * workers,
        timeout_s=120,
        what="the job's trainers running",
    )

    # Execute: `faasdl status` of the running job, then Ctrl-C for the watch.
    env = {"FAASDL_CLIENT__API_KEY": admin_key}
    status = runner.invoke(app, ["status", job_id, "--url", api_url], env=env)
    watcher.send_signal(signal.SIGINT)
    watched, said = watcher.communicate(timeout=60)
    state = job(client, job_id)["job"]["state"]
    client.delete(f"/v1/jobs/{job_id}")
    assert controller.wait_stopped(job_id, timeout_s=60)

    # Assert: the watch stopped saying what goes on and how to follow it again; the job did not.
    assert "submitted" in first
    assert watcher.returncode == 130, said
    assert watched == ""
    assert (
        f"stopped watching job {job_id}; it goes on: `faasdl status {job_id} --watch` follows "
        f"it again, `faasdl cancel {job_id}` stops it"
    ) in " ".join(said.split())
    assert "Traceback" not in said
    assert state in ("queued", "running")
    # The status of a running job says where it is, not only its (still empty) rounds.
    assert f"round 1/1: {workers} running; last: round_started round 1/1" in status.output


@contextmanager
def cutting_proxy(
    upstream: str,
    cuts: list[int],
    *,
    drop_range: bool = False,
    asked: list[str] | None = None,
) -> Iterator[str]:
    """A proxy to ``upstream`` (its URL) whose first GETs' answers stop after ``cuts``' numbers
    of bytes of their bodies, one each, the connection closed (a link lost), and whose others
    are whole; it passes each request's headers on (but ``Range`` with ``drop_range``), and
    adds each request's method and ``Range`` to ``asked``."""

    class Proxy(QuietHandler):
        def do_GET(self) -> None:
            if asked is not None:
                asked.append(f"{self.command} {self.headers.get('Range', '')}".strip())
            dropped = {"host", "connection"} | ({"range", "if-range"} if drop_range else set())
            headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
            answer = httpx.request(self.command, upstream + self.path, headers=headers, timeout=60)
            relay(self, answer, cuts.pop(0) if cuts and self.command == "GET" else None)
            self.close_connection = True

        do_HEAD = do_GET

    with serving_http(Proxy) as url:
        yield url


def test_a_models_download_cut_short_goes_on_from_where_it_stopped(
    client: httpx.Client,
    finished: tuple[str, list[tuple[str, dict[str, Any]]]],
    api_url: str,
    admin_key: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Arrange: a link lost twice as the model comes (it was downloaded again from its start:
    # a 1.6 GB VGG16 cut at 90%), its pieces written 4 KiB at a time (1 MiB: the model's whole).
    job_id = finished[0]
    model = client.get(f"/v1/jobs/{job_id}/model").content
    monkeypatch.setattr(client_module, "DOWNLOAD_CHUNK_BYTES", 4096)
    received, again = io.BytesIO(), io.BytesIO()

    # Execute
    with (
        cutting_proxy(api_url, [50_000, 50_000]) as url,
        ControllerClient(url=url, api_key=admin_key) as api,
        caplog.at_level(logging.WARNING, "faasdl.controller.client"),
    ):
        size = api.download_model(job_id, received)
    resumed = [r.getMessage() for r in caplog.records if "going on from there" in r.getMessage()]
    with (
        cutting_proxy(api_url, [50_000], drop_range=True) as url,
        ControllerClient(url=url, api_key=admin_key) as api,
        pytest.raises(PlatformUnavailable, match="and then sent another one") as other,
    ):
        api.download_model(job_id, again)

    # Assert: the whole model, each cut resumed after what had been written; a resumed
    # download answered with a whole model (another one, or a server that ignores Range) stops.
    assert received.getvalue() == model
    assert size == len(model)
    assert [message.partition(" (")[0] for message in resumed] == [
        "the model's download stopped after 49,152 bytes",  # twelve pieces of 4 KiB
        "the model's download stopped after 98,304 bytes",
    ]
    assert "after 49,152 bytes" in str(other.value)


def test_a_models_download_cut_short_in_one_run_goes_on_in_the_next(
    client: httpx.Client,
    finished: tuple[str, list[tuple[str, dict[str, Any]]]],
    api_url: str,
    admin_key: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    # Arrange: a link lost with no going on within the run (a download stopped: Ctrl-C, a
    # laptop closed), which left nothing to go on from; 4 KiB pieces of a 1 MiB model.
    job_id = finished[0]
    whole = client.get(f"/v1/jobs/{job_id}/model")
    model, etag = whole.content, whole.headers["etag"]
    monkeypatch.setattr(client_module, "DOWNLOAD_CHUNK_BYTES", 4096)
    monkeypatch.setattr(client_module, "DOWNLOAD_RESUMES", 0)
    out = tmp_path / "model.safetensors"
    partial = tmp_path / "model.safetensors.partial"
    tag = tmp_path / "model.safetensors.partial.tag"
    asked: list[list[str]] = [[], [], [], []]
    told: list[tuple[int, int | None]] = []

    def save(cuts: list[int], asked: list[str], job: str = job_id) -> int:
        told.clear()
        with (
            cutting_proxy(api_url, cuts, asked=asked) as url,
            ControllerClient(url=url, api_key=admin_key) as api,
        ):
            return api.save_model(job, out, progress=lambda *done: told.append(done))

    # Execute: cut once, a mistyped job, then again; a kept part of another model; a whole one.
    with caplog.at_level(logging.WARNING, "faasdl.controller.client"):
        with pytest.raises(PlatformUnavailable, match="after 49,152 bytes"):
            save([50_000], asked[0])
        kept = partial.read_bytes()
        with pytest.raises(JobNotFound):
            save([], [], "0123456789abcdef")
        still_kept = partial.read_bytes()
        size = save([], asked[1])
        resumed, told_resumed = out.read_bytes(), list(told)
        partial.write_bytes(b"x" * 1000)
        tag.write_text('"0000"')
        other = save([], asked[2])
        partial.write_bytes(model)
        tag.write_text(etag)
        out.unlink()
        at_end = save([], asked[3])
    said = [r.getMessage() for r in caplog.records]

    # Assert: the part kept and gone on from, the rest asked for by Range; another model's part
    # dropped for the whole; a part kept whole renamed; nothing left beside the model.
    assert kept == model[:49_152] == still_kept
    assert asked[0] == ["GET"]
    assert asked[1] == ["GET bytes=49152-"]
    assert size == len(model)
    assert resumed == model
    # Its progress from the part kept on, by the size the 206's Content-Range gave.
    assert told_resumed == [
        (written, len(model)) for written in [*range(49_152 + 4096, len(model), 4096), len(model)]
    ]
    assert asked[2] == ["GET bytes=1000-"]  # answered whole: If-Range "0000" is another model
    assert other == len(model)
    assert asked[3] == [f"GET bytes={len(model)}-", "HEAD"]  # a 416, then its size
    assert at_end == len(model)
    assert out.read_bytes() == model
    assert sorted(tmp_path.iterdir()) == [out]
    kept_note = f"the 49,152 bytes of the model written are kept in {partial}: a download to "
    assert said[:2] == [f"{kept_note}{out} goes on from there"] * 2
    assert "going on from the 49,152 bytes kept of a download before" in said
    other_note = "the 1,000 bytes kept of a download before are of another model: downloading"
    assert f"{other_note} it whole" in said


def test_a_model_is_sent_a_checked_chunk_at_a_time_and_a_damaged_chunk_ends_its_download(
    client: httpx.Client,
    controller: Controller,
    tf_store: tuple[StateStore, str],
    api_url: str,
    admin_key: str,
    tmp_path: Path,
) -> None:
    # Arrange: a finished job whose model is stored again in 1 KiB chunks.
    job_id = submit(client, {**DIGITS_JOB, "workers": 1, "epochs": 1, "seed": 11})["job_id"]
    follow(client, job_id)
    name = controller.job(job_id).model
    assert name is not None
    out = tmp_path / "model.safetensors"
    env = {"FAASDL_CLIENT__API_KEY": admin_key}
    api = ControllerClient(url=api_url, api_key=admin_key)
    with make_store(StoreSettings(chunk_bytes=1024), tf_store[1]) as small, closing(api):
        model = bytes(small.get_blob(name))
        manifest = small.put_blob(name, model)

        # Execute: download it whole, then with chunk 3 damaged, then with chunk 0 damaged.
        whole = client.get(f"/v1/jobs/{job_id}/model")
        small._write_chunks([(small._chunk_key(name, manifest.write_id, 3), b"x" * 1024)])
        received = io.BytesIO()
        with pytest.raises(PlatformUnavailable, match="stopped sending the model"):
            api.download_model(job_id, received)
        small._write_chunks([(small._chunk_key(name, manifest.write_id, 0), b"x" * 1024)])
        refused = client.get(f"/v1/jobs/{job_id}/model")
        cli = runner.invoke(app, ["model", job_id, "-o", str(out), "--url", api_url], env=env)

    # Assert: the whole model with its length; a damaged chunk ends the answer short of its
    # length, after nothing but the good chunks before it; a damaged first chunk is an error
    # answer, and the CLI writes no file.
    assert len(manifest.chunk_sha256) > 4
    assert whole.status_code == 200
    assert whole.content == model
    assert whole.headers["content-length"] == str(len(model))
    assert len(received.getvalue()) <= 3 * 1024
    assert model.startswith(received.getvalue())
    assert refused.status_code == 500
    assert "chunk 0 does not match its checksum" in refused.json()["detail"]
    assert cli.exit_code != 0
    assert "chunk 0 does not match its checksum" in cli.output
    assert not list(tmp_path.glob("model*"))


@pytest.mark.parametrize("change", ["shapes", "content", "deletion"])
def test_a_data_set_changed_after_its_job_was_planned_fails_the_job_saying_so(
    tmp_path: Path, tf_platform: LocalPlatform, change: str
) -> None:
    # Arrange: a job planned for 8 features and 3 classes, queued while its file is replaced by
    # another (an upload of the same name does that) of other shapes or other values, or
    # deleted.
    rng = np.random.default_rng(0)
    data = tmp_path / "data" / "set.npz"
    data.parent.mkdir()

    def save(features: int, classes: int) -> str:
        x = rng.random((200, features), dtype=np.float32)
        y = np.arange(200) % classes
        np.savez(data, x_train=x, y_train=y, x_test=x[:20], y_test=y[:20])
        return hashlib.sha256(data.read_bytes()).hexdigest()[:12]

    planned = save(8, 3)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    settings = Settings(
        controller={"scheduler_tick_s": 0.1}, api={"dataset_roots": [str(data.parent)]}
    )
    spec = {"model": "mlp", "dataset": {"name": "npz", "path": str(data)}, "workers": 2}
    with make_store(StoreSettings(spill_dir=str(tmp_path / "spill")), url) as store:
        controller = Controller(settings=settings, platform=tf_platform, store=store, store_url=url)
        job_id = controller.submit(JobSpec.model_validate(spec)).job.job_id
        found = ""
        if change == "deletion":
            data.unlink()
        else:
            found = save(10, 5) if change == "shapes" else save(8, 3)

        # Execute
        with controller:
            job = controller.wait(job_id, timeout_s=300)

    # Assert: failed before any action ran, naming what changed.
    expected = {
        "shapes": f"the data set changed after the job was planned (input shape 8 → 10, classes "
        f"3 → 5, content SHA-256 {planned}… → {found}…): submit the job again to plan it for "
        "this one",
        "content": f"the data set changed after the job was planned (content SHA-256 {planned}… "
        f"→ {found}…): submit the job again to plan it for this one",
        "deletion": "the data set's file is gone since the job was planned (an upload deleted, a "
        "file moved): upload it again and submit the job again",
    }[change]
    assert job.state is JobState.FAILED
    assert job.error == f"dataset.path: {expected}"
    assert job.activation_count == 0


def test_an_ended_job_keeps_its_model_and_its_log_numbered_from_its_first_line(
    tmp_path: Path, tf_platform: LocalPlatform
) -> None:
    # Arrange: a controller whose job records keep 10 log lines, and a job that writes more.
    settings = Settings(
        controller={"scheduler_tick_s": 0.1, "events_kept": 10}, api={"auth": "none"}
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({**DIGITS_JOB, "epochs": 2, "seed": 5}))
    with served(tmp_path, tf_platform, settings) as (store, controller, api_url):
        # Execute
        watched = runner.invoke(app, ["submit", str(spec), "--watch", "--url", api_url])
        job_id = watched.stdout.splitlines()[0]
        record = controller.job(job_id)
        assert controller.wait_stopped(job_id, timeout_s=60)  # its data deleted after its end
        leftover = store.blob_names(f"jobs/{job_id}/")
        with httpx.Client(base_url=api_url, timeout=60) as http:
            resumed = numbered(http, job_id, after=record.events_dropped + 2)
            whole = numbered(http, job_id)

    # Assert: of the job's blobs only its model is left; --watch printed the lines written after
    # the record began to drop the oldest (it had stopped at the 10th); the stream numbers the
    # lines from the job's first, resumes after the one named, and starts a new follower at the
    # oldest line kept.
    assert watched.exit_code == 0, watched.output
    assert record.state is JobState.DONE
    assert leftover == [record.model]  # shards, test set, trained and merged weights deleted
    assert record.events_dropped > 0
    assert len(record.events) == 10
    for line in record.events:
        assert line.message in watched.output
    total = record.events_dropped + len(record.events)
    assert resumed == [*range(record.events_dropped + 3, total), "end"]
    assert whole == [*range(record.events_dropped, total), "end"]


def test_a_job_record_keeps_its_newest_rounds_and_its_view_every_round(
    tmp_path: Path, tf_platform: LocalPlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrange: records that keep two rounds, and a job of five.
    monkeypatch.setattr(records, "ROUNDS_KEPT", 2)
    settings = Settings(controller={"scheduler_tick_s": 0.1}, api={"auth": "none"})
    spec = {**DIGITS_JOB, "workers": 1, "epochs": 5, "sync_every": 1}
    with served(tmp_path, tf_platform, settings) as (store, controller, api_url):
        # Execute
        with httpx.Client(base_url=api_url, timeout=60) as http:
            job_id = submit(http, spec)["job_id"]
            follow(http, job_id)
            shown = job(http, job_id)["job"]
            later = {
                n: http.get(f"/v1/jobs/{job_id}", params={"round_from": n}).json()["job"]
                for n in (1, 4, 5)
            }
            refused = http.get(f"/v1/jobs/{job_id}", params={"round_from": -1}).status_code
        record = controller.job(job_id)
        kept = [v.value for _, v in store.scan(records.round_prefix(job_id))]

    # Assert: the record holds the last two rounds; each round has a record of its own, and the
    # API shows all five in order, as the record held them.
    assert record.state is JobState.DONE
    assert [r.round for r in record.rounds] == [3, 4]
    assert [r["round"] for r in kept] == [0, 1, 2, 3, 4]
    assert [r["round"] for r in shown["rounds"]] == [0, 1, 2, 3, 4]
    assert shown["rounds"][:3] == kept[:3]
    assert shown["rounds"][3:] == [r.model_dump(mode="json") for r in record.rounds]
    # A follower that has read the earlier rounds reads the later ones only: from their
    # records, or from the job's.
    assert later[1]["rounds"] == shown["rounds"][1:]
    assert later[4]["rounds"] == shown["rounds"][4:]
    assert later[5]["rounds"] == []
    assert refused == 422


def test_what_an_older_runtime_measured_is_measured_again_once_a_run_reports_another(
    tmp_path: Path, tf_platform: LocalPlatform, caplog: pytest.LogCaptureFixture
) -> None:
    # Arrange: a store whose runtime baseline and the job's peak were measured before runtimes
    # said what they are, by a heavier runtime (every store from before the training action's
    # lighter import kept 626.7 MB, its plans a memory class larger for good).
    caplog.set_level(logging.INFO, logger="faasdl.estimator")
    settings = Settings(controller={"scheduler_tick_s": 0.1}, api={"auth": "none"})
    runtime = settings.estimator.baseline_runtime
    spec = {**DIGITS_JOB, "workers": 2, "epochs": 1}
    with served(tmp_path, tf_platform, settings) as (store, controller, api_url):
        history.write_baseline(store, runtime, peak_memory_mb=1100.0, init_ms=3900)
        with httpx.Client(base_url=api_url, timeout=300) as http:
            sig = http.post("/v1/estimate", json=spec).json()["train"]["signature"]
            history.record_run(store, sig, peak_memory_mb=1000.0, overhead_ms=900, epoch_ms=90)
            history.record_failure(store, sig, memory_floor_mb=900)
            old = http.post("/v1/estimate", json=spec).json()["train"]

            # Execute: a job planned so, then a plan of the same job again.
            job_id = submit(http, spec)["job_id"]
            follow(http, job_id)
            ran = controller.job(job_id)
            stale = history.read_baseline(store, runtime)
            learned = history.read(store, sig)
            new = http.post("/v1/estimate", json=spec).json()["train"]
            measured = history.read_baseline(store, runtime)

    # Assert: the job ran as the old measures planned it; its runs reported this runtime, which
    # marked the old baseline stale and started the signature's peak (and the floor a heavier
    # runtime had failed under) from their own; the next plan measured the runtime again and
    # sized the job from what it used, smaller.
    assert ran.state is JobState.DONE
    assert ran.plan is not None
    assert ran.plan["train"]["memory_mb"] == old["memory_mb"] >= 1100
    assert stale is not None
    assert stale.stale
    assert stale.peak_memory_mb == 1100.0
    assert learned is not None
    assert learned.runtime_id.startswith("python ")
    assert "tensorflow " in learned.runtime_id
    assert learned.runs == 3
    assert learned.memory_floor_mb == 0
    assert 0 < learned.peak_memory_mb < 900
    assert measured is not None
    assert not measured.stale
    assert measured.runtime_id == learned.runtime_id
    assert 0 < measured.peak_memory_mb < 1100
    assert measured.measured_ms > stale.measured_ms
    # Its cold starts are kept (some may be of several at once): the probe's is added to them.
    assert measured.init_ms[: len(stale.init_ms)] == stale.init_ms
    assert stale.init_ms[0] == 3900
    assert new["memory_source"] == "history"
    assert learned.peak_memory_mb * HISTORY_MEMORY_SLACK <= new["memory_mb"] < old["memory_mb"]
    assert (
        f"runtime {runtime} measured again, its runs having reported another than the one "
        f"measured: {measured.peak_memory_mb:.1f} MB ({measured.runtime_id}), was 1100.0 MB "
        "(unnamed)"
    ) in caplog.messages


def test_actions_open_the_store_with_the_controllers_user_password_and_spill_settings(
    tmp_path: Path, tf_platform: LocalPlatform
) -> None:
    # A password and user set as settings (not in the URL) reached the controller's store only:
    # every action failed with "Redis at ... needs a password". And the actions spilled a blob
    # over the default 256 MiB into their own container's folder, gone with it.
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it with apt-get)")
    # Arrange: an ACL user on a Redis that lets no one else in; a job whose blobs are spilled.
    password = "user-password-of-the-store"
    settings = Settings(
        controller={"scheduler_tick_s": 0.1},
        store={
            "username": "faasdl",
            "password": password,
            "spill_bytes": 64 * 1024,
            "spill_dir": str(tmp_path / "spill"),
        },
    )
    with RedisServer(directory=tmp_path / "redis") as server:
        admin = redis.Redis.from_url(server.url)
        admin.acl_setuser(
            "faasdl", enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all"]
        )
        admin.acl_setuser("default", enabled=False)
        with (
            make_store(settings.store, server.url) as store,
            Controller(
                settings=settings, platform=tf_platform, store=store, store_url=server.url
            ) as started,
        ):
            # Execute
            job_id = started.submit(JobSpec.model_validate(DIGITS_JOB)).job.job_id
            job = started.wait(job_id, timeout_s=300)
            spilled = {
                name: manifest.spill_path
                for name in store.blob_names("")
                if (manifest := store.blob_manifest(name)) is not None and manifest.spill_path
            }
            model = store.get_blob(job.model or "")

    # Assert: it trained; the model its last aggregator wrote went where the controller's blobs
    # go (before, it went to Redis: the actions' spill threshold was the default).
    assert job.state is JobState.DONE, job.error
    assert job.model in spilled
    assert all(path.startswith(str(tmp_path / "spill")) for path in spilled.values()), spilled
    assert len(model) > 64 * 1024
    assert password not in json.dumps(job.model_dump(mode="json"))


@pytest.fixture
def sent_to_containers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Each message the embedded platform sends a container from now on (``/init`` or
    ``/run``, and the message as JSON), as it sends it."""
    sent: list[tuple[str, str]] = []
    send = Container.call

    def recorded(self: Container, path: str, message: dict[str, Any], timeout_s: float) -> Reply:
        sent.append((path, json.dumps(message)))
        return send(self, path, message, timeout_s)

    monkeypatch.setattr(Container, "call", recorded)
    return sent


def test_a_password_in_the_stores_url_reaches_the_actions_but_not_their_calls_arguments(
    tmp_path: Path, tf_platform: LocalPlatform, sent_to_containers: list[tuple[str, str]]
) -> None:
    # Every call's arguments named the store by the controller's URL, its password in it: they
    # travel through OpenWhisk's queues (and were a checkpoint writer's command line).
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it with apt-get)")
    # Arrange: a Redis with a password, written in the controller's URL only.
    password = "pass/word in the url"  # quoted in the URL, as its "/" and " " must be
    settings = Settings(controller={"scheduler_tick_s": 0.1})
    with RedisServer(directory=tmp_path / "redis") as server:
        redis.Redis.from_url(server.url).config_set("requirepass", password)
        host = server.url.removeprefix("redis://")
        url = f"redis://:{quote(password, safe='')}@{host}"
        with (
            make_store(settings.store, url) as store,
            Controller(settings=settings, platform=tf_platform, store=store, store_url=url) as c,
        ):
            # Execute
            job = c.wait(c.submit(JobSpec.model_validate(DIGITS_JOB)).job.job_id, timeout_s=300)

    # Assert: the actions opened the store (the job trained); the password went to the
    # containers' environment at /init, in no call's arguments, quoted or not.
    assert job.state is JobState.DONE, job.error
    runs = [message for path, message in sent_to_containers if path == "/run"]
    inits = [message for path, message in sent_to_containers if path == "/init"]
    assert [m for m in runs if f'"store_url": "redis://{host}"' in m]
    assert not [m for m in runs if password in m or quote(password, safe="") in m]
    assert inits
    assert all(json.dumps(password) in message for message in inits)


def test_actions_reach_a_tls_store_with_the_controllers_ca_bundle_as_text_not_its_path(
    tmp_path: Path,
    tf_platform: LocalPlatform,
    sent_to_containers: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The actions were given the bundle's path: on OpenWhisk, a file of the controller's that
    # no action pod holds (the image had to be built with it at that path).
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it with apt-get)")
    # Arrange: a Redis that speaks TLS only, verified by a CA of the test's own; the controller
    # set up from its environment, as `faasdl serve` is (the embedded platform's containers
    # inherited it: the file's variable beside the text's, refused by every action).
    tls = tls_files(tmp_path / "tls")
    with RedisServer(directory=tmp_path / "redis", tls=tls) as server:
        monkeypatch.setenv("FAASDL_STORE__URL", server.url)
        monkeypatch.setenv("FAASDL_STORE__TLS_CA_FILE", str(tls.ca_file))
        monkeypatch.setenv("FAASDL_CONTROLLER__SCHEDULER_TICK_S", "0.1")
        settings = Settings()
        with (
            make_store(settings.store) as store,
            Controller(
                settings=settings, platform=tf_platform, store=store, store_url=server.url
            ) as c,
        ):
            # Execute
            job = c.wait(c.submit(JobSpec.model_validate(DIGITS_JOB)).job.job_id, timeout_s=300)

    # Assert: the job trained, its actions given the bundle's text and no path to read.
    assert job.state is JobState.DONE, job.error
    environments = [
        json.loads(message)["value"]["env"]
        for path, message in sent_to_containers
        if path == "/init"
    ]
    assert environments
    assert all(
        env["FAASDL_STORE__TLS_CA_DATA"] == tls.ca_file.read_text()
        and "FAASDL_STORE__TLS_CA_FILE" not in env
        for env in environments
    )


def test_a_job_whose_data_set_must_wait_its_turn_says_so_and_then_stages(
    tmp_path: Path, tf_platform: LocalPlatform
) -> None:
    # Arrange: a controller, and another holder of its one data set at a time (as an upload
    # being checked would be).
    url = f"sqlite:///{tmp_path / 'state.db'}"
    settings = Settings(controller={"scheduler_tick_s": 0.1})
    with (
        make_store(StoreSettings(spill_dir=str(tmp_path / "spill")), url) as store,
        Controller(settings=settings, platform=tf_platform, store=store, store_url=url) as started,
    ):
        # Execute: a job admitted while the data set is held, then the data set let go.
        with ONE_DATA_SET:
            job_id = started.submit(JobSpec.model_validate(DIGITS_JOB)).job.job_id
            eventually(
                lambda: "staging_waits" in {e.kind for e in started.job(job_id).events},
                timeout_s=60,
                what="the job's staging waiting its turn",
            )
            staged_meanwhile = "staged" in {e.kind for e in started.job(job_id).events}
        job = started.wait(job_id, timeout_s=300)

    # Assert: its log said why it waited; it staged only once its turn came, and trained.
    kinds = [e.kind for e in job.events]
    assert not staged_meanwhile
    assert kinds.index("admitted") < kinds.index("staging_waits") < kinds.index("staged")
    assert job.state is JobState.DONE


def test_a_controller_starting_deletes_what_ended_jobs_and_killed_writers_left_but_models(
    tmp_path: Path, tf_platform: LocalPlatform
) -> None:
    # Arrange: a done and a failed job whose data a controller that stopped as they ended left
    # in the store, blobs under the name of a job the store has no record of, the chunks of a
    # blob write killed before it published, the temporary files of two uploads a killed
    # controller was receiving, two hours ago and just now, and an upload with no digest kept (as
    # one made before they were).
    url = f"sqlite:///{tmp_path / 'state.db'}"
    uploads = tmp_path / "uploads"
    (uploads / "alice").mkdir(parents=True)
    undigested = uploads / "alice" / "older.npz"
    undigested.write_bytes(b"an upload's bytes")
    partials = []
    for name in ("old", "new"):
        fd, partial = partial_file(uploads / "alice" / f"{name}.npz")
        os.close(fd)
        partials.append(Path(partial))
    two_hours_ago = time.time() - 7200
    os.utime(partials[0], (two_hours_ago, two_hours_ago))
    done, failed, unknown = "a" * 16, "c" * 16, "d" * 16
    model = f"jobs/{done}/global/00001"
    left = [
        model,
        f"jobs/{done}/data/shard-00000",
        f"jobs/{done}/r00000/trained-00000-a0001",
        f"jobs/{failed}/data/test",
        f"jobs/{unknown}/data/shard-00000",
    ]
    with make_store(StoreSettings(spill_dir=str(tmp_path / "spill")), url) as store:
        assert create(store, JobInfo(job_id=done, state=JobState.DONE, model=model))
        assert create(store, JobInfo(job_id=failed, state=JobState.FAILED))
        for name in left:
            store.put_blob(name, b"weights")
        write_and_die(url, model, b"w" * 100_000, chunk_bytes=16 * 1024)

        def start_and_close(**controller: Any) -> str:
            """The metrics of a controller started and closed (closing waits for the
            housekeeping pass that starting began)."""
            settings = Settings(controller=controller, api={"upload_dir": str(uploads)})
            with Controller(
                settings=settings, platform=tf_platform, store=store, store_url=url
            ) as started:
                pass
            return started.metrics.render().decode()

        # Execute: a controller with the default grace, then one with none.
        first = start_and_close()
        kept = store.blob_names("jobs/")
        partials_kept = [p.exists() for p in partials]
        listed = uploads_of(ApiSettings(upload_dir=str(uploads)), "alice")
        young = store.collect_garbage(grace_s=0)
        write_and_die(url, model, b"w" * 100_000, chunk_bytes=16 * 1024)
        second = start_and_close(garbage_grace_s=0)
        old = store.collect_garbage(grace_s=0)
        model_bytes = store.get_blob(model)

    # Assert: the done job's model stays, and the blobs of a job it does not know; the killed
    # write's seven chunks and the new upload's file were left while younger than the grace and
    # deleted with none, the old upload's file at once.
    assert kept == [model, f"jobs/{unknown}/data/shard-00000"]
    assert young == 7
    assert old == 0
    assert model_bytes == b"weights"
    deleted = 'faasdl_housekeeping_deleted_total{what="%s"} %.1f'
    assert deleted % ("ended_job_blobs", 3) in first
    assert deleted % ("unpublished_pieces", 0) in first
    assert deleted % ("ended_job_blobs", 0) in second
    assert deleted % ("unpublished_pieces", 7) in second
    assert partials_kept == [False, True]
    assert [(d.name, d.sha256) for d in listed] == [
        ("older", hashlib.sha256(b"an upload's bytes").hexdigest())
    ]
    assert not partials[1].exists()
    assert deleted % ("upload_partials", 1) in first
    assert deleted % ("upload_partials", 1) in second
    stamp = re.search(r"^faasdl_housekeeping_last_pass_timestamp_seconds (\S+)$", second, re.M)
    assert stamp is not None
    assert float(stamp[1]) > 0  # 0 until a pass has ended


def test_jobs_ended_longer_ago_than_their_retention_are_deleted_whole(
    tmp_path: Path, tf_platform: LocalPlatform, caplog: pytest.LogCaptureFixture
) -> None:
    # Arrange: a retention of one day; jobs that ended 3, 3 and 2 days ago (one submitted with
    # an Idempotency-Key), one that ended 12 hours ago, a running one, and a queued one (its
    # trainers do not fit the pool) that is to train on from one of those 3 days old, each with
    # a unit record, a ledger line and blobs.
    caplog.set_level(logging.INFO, logger="faasdl")
    url = f"sqlite:///{tmp_path / 'state.db'}"
    now, day = int(time.time() * 1000), 86_400_000
    jobs = {
        "a" * 16: (JobState.DONE, now - 3 * day, {}),
        "b" * 16: (JobState.CANCELLED, now - 2 * day, {}),
        "c" * 16: (JobState.FAILED, now - day // 2, {}),
        "d" * 16: (JobState.RUNNING, None, {}),
        "e" * 16: (JobState.DONE, now - 3 * day, {}),
        "f" * 16: (JobState.QUEUED, None, {"init_model": "e" * 16}),
    }
    with make_store(StoreSettings(spill_dir=str(tmp_path / "spill")), url) as store:
        for job_id, (state, finished_ms, spec) in jobs.items():
            key = "retry-1" if job_id == "a" * 16 else None
            model = f"jobs/{job_id}/global/00001"
            record = JobInfo(
                job_id=job_id,
                state=state,
                spec=spec,
                plan=plan_over(tf_platform),
                finished_ms=finished_ms,
                idempotency_key=key,
                model=model,
            )
            assert create(store, record)
            assert create(store, FunctionInfo(job_id=job_id, round=0, shard=0))
            assert create(store, ledger_line(job_id, "success"))
            store.put(records.round_key(job_id, 0), {"round": 0})
            for name in (model, f"jobs/{job_id}/data/test"):
                store.put_blob(name, b"weights")
        idem = IdempotencyRecord(
            tenant="default", idempotency_key="retry-1", job_id="a" * 16, request_sha256="0" * 64
        )
        assert create(store, idem)
        settings = Settings(controller={"job_retention_days": 1, "keep_job_data": True})
        controller = Controller(settings=settings, platform=tf_platform, store=store, store_url=url)

        # Execute
        with controller:
            pass  # closing waits for the housekeeping pass that starting began
        left = {
            prefix: sorted({key.split("/")[1] for key, _ in store.scan_versions(prefix)})
            for prefix in ("job/", "fn/", "ledger/", "round/", "idem/")
        }
        blobs = store.blob_names("jobs/")
        metrics = controller.metrics.render().decode()

    # Assert: the two jobs past their retention that no job waits for are gone, with all that
    # was theirs; the others keep everything, the one the queued job is to start from saying why.
    kept = [j * 16 for j in "cdef"]
    assert left == {"job/": kept, "fn/": kept, "ledger/": kept, "round/": kept, "idem/": []}
    assert blobs == [f"jobs/{j}/{part}" for j in kept for part in ("data/test", "global/00001")]
    assert 'faasdl_housekeeping_deleted_total{what="expired_jobs"} 2.0' in metrics
    assert (
        f"job {'e' * 16}, ended over 1 days ago, is kept until job(s) {'f' * 16} have staged its "
        "model (init_model)"
    ) in caplog.messages


def plan_over(platform: LocalPlatform) -> dict[str, Any]:
    """A job's plan whose trainers need more than the platform's pool: never admitted."""
    pool_mb = platform.limits().pool_memory_mb
    assert pool_mb is not None
    train = {
        "containers": 2,
        "shard_examples": 100,
        "signature": "mlp",
        "memory_mb": pool_mb,
        "memory_estimate_mb": pool_mb,
        "memory_parts": {},
        "memory_source": "model",
        "timeout_ms": 60_000,
        "timeout_source": "platform_max",
    }
    plan = {
        "train": train,
        "rounds": 1,
        "epochs_per_round": 1,
        "examples": 200,
        "test_examples": 50,
        "input_shape": (8, 8, 1),
        "classes": 10,
        "model_mb": 1.0,
        "aggregate_memory_mb": 256,
        "aggregate_timeout_ms": 60_000,
        "fan_in": 2,
        "tree": [],
    }
    return JobPlan.model_validate(plan).model_dump(mode="json")


def test_the_job_records_a_pass_reads_are_parsed_again_only_once_changed(
    tmp_path: Path, tf_platform: LocalPlatform
) -> None:
    # Arrange: more ended jobs than the controller keeps whole records of, each with a log and
    # rounds.
    url = f"sqlite:///{tmp_path / 'state.db'}"
    events = [JobEvent(t_ms=i, kind="log", message=f"line {i}") for i in range(50)]
    rounds = [round_result(n) for n in range(30)]
    with make_store(StoreSettings(spill_dir=str(tmp_path / "spill")), url) as store:
        for i in range(1100):
            job = JobInfo(
                job_id=f"{i:016x}", state=JobState.DONE, events=events, rounds=rounds, created_ms=i
            )
            assert create(store, job)
        controller = Controller(
            settings=Settings(), platform=tf_platform, store=store, store_url=url
        )

        def one_round_more(job: JobInfo | None) -> JobInfo:
            assert job is not None
            return job.model_copy(update={"round": job.round + 1})

        # Execute: two passes over the jobs, one job changed, a third pass.
        first = controller.jobs()
        second = controller.jobs()
        update(store, job_key(f"{7:016x}"), JobInfo, one_round_more)
        third = controller.jobs()
        whole = controller.job(f"{7:016x}")

    # Assert: the second pass parsed nothing again, the third only the changed job; the heads
    # hold no log and only the last round (what the job list shows).
    assert len(first) == 1100
    assert all(a is b for a, b in zip(first, second, strict=True))
    again = [b.job_id for a, b in zip(second, third, strict=True) if a is not b]
    assert again == [f"{7:016x}"]
    assert next(j for j in third if j.job_id == f"{7:016x}").round == 1
    assert all(j.events == [] and j.rounds == rounds[-1:] for j in third)
    assert len(whole.events) == 50  # the record itself keeps them
    assert whole.rounds == rounds


@pytest.mark.parametrize(
    "before",
    [
        "a line its totals lack",
        "a record without ledger_totals",
        "a record from before lines were kept by round",
    ],
    ids=["died between", "older record", "lines by activation"],
)
def test_a_line_booked_by_a_controller_that_died_before_adding_it_up_is_counted_once(
    tmp_path: Path, tf_platform: LocalPlatform, before: str
) -> None:
    # Arrange: a queued two-round job whose ledger already holds a line its record's totals
    # lack, as a controller that died between booking an activation and adding it to the job
    # leaves it; or one counted in a record from before the ledger's totals were kept with the
    # job; or one booked by a controller that kept a job's lines by activation alone.
    url = f"sqlite:///{tmp_path / 'state.db'}"
    settings = Settings(controller={"scheduler_tick_s": 0.1})
    by_round = before != "a record from before lines were kept by round"
    with make_store(StoreSettings(spill_dir=str(tmp_path / "spill")), url) as store:
        controller = Controller(settings=settings, platform=tf_platform, store=store, store_url=url)
        spec = JobSpec.model_validate({**DIGITS_JOB, "workers": 1, "epochs": 2, "sync_every": 1})
        job_id = controller.submit(spec).job.job_id
        orphan = ledger_line(job_id, "platform_error")
        key = records.ledger_key(job_id, orphan.activation_id, orphan.round if by_round else None)
        assert store.put_if_absent(key, orphan.model_dump(mode="json"))
        if before == "a record without ledger_totals":
            older = controller.job(job_id).model_copy(
                update={"activation_count": 1, "cost_usd": orphan.cost_usd, "ledger_totals": None}
            )
            update(store, job_key(job_id), JobInfo, lambda _: older)
        if not by_round:  # the record as such a controller wrote it: without the field
            written = controller.job(job_id).model_dump(mode="json")
            store.put(job_key(job_id), {k: v for k, v in written.items() if k != "ledger_by_round"})

        # Execute
        with controller:
            job = controller.wait(job_id, timeout_s=300)
            ledger = controller.ledger(job_id)
            latest = controller.ledger(job_id, round_from=1)
            keys = [k for k, _ in store.scan_versions(records.ledger_prefix(job_id))]

    # Assert: the totals are the ledger's, the orphan counted once, the rest of the job too.
    assert job.state is JobState.DONE, job.error
    assert ledger[0] == orphan
    assert job.activation_count == len(ledger) == 1 + 2 + 2  # orphan, trainers, evaluations
    # Its lines are kept by round, or as the job's first were, and read from a round on either way.
    assert job.ledger_by_round is by_round
    assert [k.count("/") for k in keys] == [3 if by_round else 2] * len(ledger)
    assert latest == [a for a in ledger if a.round >= 1]
    assert [a.kind for a in latest] == ["train", "evaluate"]
    assert job.ledger_totals is not None
    assert (job.ledger_totals.failed, job.ledger_totals.stopped) == (1, 0)  # the orphan's failure
    assert job.ledger_totals.gb_s == pytest.approx(sum(a.gb_s for a in ledger))
    replicas = job.replica_gb_s * settings.price_per_gb_s
    assert job.cost_usd == pytest.approx(sum(a.cost_usd for a in ledger) + replicas)
    assert job.cost_usd > orphan.cost_usd
