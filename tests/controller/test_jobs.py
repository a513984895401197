"""End to end: the REST API, the controller and real TensorFlow actions on the embedded platform
with a SQLite store."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import httpx

from faasdl.controller.jobs import Controller

pytestmark = pytest.mark.tensorflow

DIGITS_JOB: dict[str, Any] = {
    "model": "mlp",
    "dataset": {"name": "digits"},
    "workers": 4,
    "epochs": 3,
    "batch_size": 32,
}


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


def test_a_four_unit_job_completes_and_its_model_evaluates(
    client: httpx.Client, controller: Controller
) -> None:
    response = client.post("/v1/jobs", json=DIGITS_JOB)
    assert response.status_code == 201, response.text
    job_id = response.json()["job"]["job_id"]
    assert response.headers["location"] == f"/v1/jobs/{job_id}"

    events = follow(client, job_id)

    assert events[-1] == ("end", {"state": "done", "error": None, "round": 3})
    kinds = [kind for kind, _ in events]
    assert kinds.count("unit_committed") == 12
    assert kinds.count("round_finished") == 3
    job = client.get(f"/v1/jobs/{job_id}").json()["job"]
    assert job["plan"]["train"]["containers"] == 4
    assert [r["round"] for r in job["rounds"]] == [0, 1, 2]
    ledger = job["activations"]
    assert sorted({a["kind"] for a in ledger}) == ["aggregate", "evaluate", "train"]
    assert all(a["outcome"] == "success" and a["cost_usd"] > 0 for a in ledger)
    assert job["cost_usd"] == pytest.approx(sum(a["cost_usd"] for a in ledger))

    model = client.get(f"/v1/jobs/{job_id}/model")
    assert model.status_code == 200
    assert model.headers["content-type"] == "application/octet-stream"
    from faasdl.training.datasets import DigitsSpec, load_dataset
    from faasdl.training.loop import TrainConfig, Trainer
    from faasdl.training.models import build_model
    from faasdl.training.tensors import TrainState, unpack

    data = load_dataset(DigitsSpec())
    trainer = Trainer(
        build_model("mlp", data.input_shape, data.classes, seed=0), TrainConfig(32, 1)
    )
    trainer.load(TrainState(weights=unpack(model.content)["w"]))
    score = trainer.evaluate(data.x_test, data.y_test)
    assert score["accuracy"] == pytest.approx(job["rounds"][-1]["accuracy"], abs=1e-6)
    assert score["accuracy"] > 0.8
