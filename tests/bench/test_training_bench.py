"""The training benchmark's small variant: real jobs through the controller, real TensorFlow."""

from __future__ import annotations

from typing import Any

import pytest

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
