"""The training benchmark's small variant: real jobs through the controller, real TensorFlow."""

from __future__ import annotations

import multiprocessing
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

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        score = pool.apply(bare_metal, ("mlp", {"name": "digits"}, 1, 32, 0, str(private)))

    generated = "__autograph_generated_file*"
    assert score["accuracy"] > 0.5
    assert list(system.iterdir()) == []
    assert list(private.glob(generated))  # where they went, to go with the directory
