"""The training benchmark's small variant: real jobs through the controller, real TensorFlow."""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from faasdl.bench.training import bare_metal

pytestmark = pytest.mark.tensorflow


def test_the_quick_variant_measures_accuracy_environments_and_overhead(
    quick_training_bench: dict[str, Any],
) -> None:
    result = quick_training_bench  # run with seeds=3, which the quick variant overrides

    (row,) = result["workloads"]
    assert result["seeds"] == 1
    for key in ("accuracy_single", "accuracy_periodic", "accuracy_one_shot"):
        assert len(row[key]) == 1
        assert 0.5 < row[key][0] <= 1.0  # two epochs on digits: learnt, not perfect
    envs = row["environments"]
    assert [envs[e]["actions"] for e in ("bare_metal", "default_serverless", "faasdl")] == [1, 1, 4]
    assert all(e["makespan_s"] > 0 and e["peak_mb_per_action"] > 100 for e in envs.values())
    assert envs["faasdl"]["activations"] == 2 * (4 + 1 + 1)  # 2 rounds: trainers, root, evaluation
    assert 0 <= result["controller_overhead_ratio"] < 0.5


def train_then_vanish(pipe: Connection, private: str) -> None:
    pipe.send(bare_metal("mlp", {"name": "digits"}, 1, 32, 0, private))
    os._exit(0)


def test_bare_metal_training_leaves_no_file_in_the_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pool's worker ends without its exit hooks: AutoGraph's generated modules of every run
    # were left in /tmp (three a run). The worker's system temporary directory is one of the
    # test's own, where no other process writes.
    system, private = tmp_path / "system", tmp_path / "private"
    system.mkdir()
    private.mkdir()
    monkeypatch.setenv("TMPDIR", str(system))  # the spawned worker's tempfile.gettempdir()

    # A process that ends as a killed worker does, without its exit hooks, every time: a pool's
    # worker told to quit first runs them, and AutoGraph's would delete what this test looks for.
    ours, theirs = multiprocessing.Pipe()
    worker = multiprocessing.get_context("spawn").Process(
        target=train_then_vanish, args=(theirs, str(private))
    )
    worker.start()
    assert ours.poll(300), "the worker's score"
    score = ours.recv()
    worker.join(60)

    generated = "__autograph_generated_file*"
    assert score["accuracy"] > 0.5
    assert list(system.iterdir()) == []
    assert list(private.glob(generated))  # where they went, to go with the directory
