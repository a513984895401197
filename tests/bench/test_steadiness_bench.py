"""The steadiness bench: its figures from series whose answers are known, and its command."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from typer.testing import CliRunner

from faasdl import __version__
from faasdl.bench.steadiness import adjacent_spread, summarize
from faasdl.cli import app
from faasdl.redact import MASK


def test_a_steady_machine_has_no_slow_runs_and_no_spread() -> None:
    figures = summarize(np.full(20_000, 0.002))  # 40 s: ten pairs of 2 s windows

    assert figures["slow_share"] == 0
    assert figures["run_ms"]["p5"] == figures["run_ms"]["p95"] == 2.0
    assert set(figures["adjacent_spread"].values()) == {0.0}
    assert figures["overhead_resolution_95"] == 0.0


def test_slow_runs_are_those_well_over_the_fastest() -> None:
    rng = np.random.default_rng(3)
    slow = rng.random(5000) < 0.4  # a vCPU at half speed two runs in five
    times = np.where(slow, 0.004, 0.002) * rng.uniform(0.98, 1.02, 5000)

    assert summarize(times)["slow_share"] == pytest.approx(slow.mean(), abs=1e-4)


def test_the_adjacent_spread_compares_windows_two_by_two() -> None:
    # Windows of 1 s (100 runs of 10 ms), each pair's second slower or faster by a known share.
    changes = [0.10, -0.05, 0.20, -0.15, -0.10]  # their sum 0: a mean run of 10 ms
    windows = [w for c in changes for w in (1.0, 1.0 + c)]
    times = np.concatenate([np.full(100, 0.01 * w) for w in windows])

    spread, pairs = adjacent_spread(times, 1.0)

    assert pairs == len(changes)
    assert spread == pytest.approx(np.std(changes, ddof=1), rel=0.02)
    resolution = summarize(times, pairs=40)["overhead_resolution_95"]
    assert resolution == pytest.approx(1.96 * np.std(changes, ddof=1) / math.sqrt(40), abs=2e-3)


def test_too_short_a_sample_is_refused() -> None:
    with pytest.raises(ValueError, match="too short"):
        summarize(np.full(10, 0.002))


def test_the_command_prints_its_figures_last_with_what_they_were_measured_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: a setting a benchmark's platform takes from the environment, and a secret.
    monkeypatch.setenv("FAASDL_LOCAL__WARMUP_NICE", "5")
    monkeypatch.setenv("FAASDL_OPENWHISK__AUTH", "user:s3cret")

    result = CliRunner().invoke(app, ["bench", "steadiness", "--duration", "5", "--pairs", "10"])

    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["runs"] > 100
    assert figures["pairs"] == 10
    assert figures["adjacent_pairs"]["0.25"] >= 3
    machine = figures["environment"]
    assert (machine["faasdl"], machine["cpus"]) == (__version__, os.cpu_count())
    assert machine["settings"] == {
        "FAASDL_LOCAL__WARMUP_NICE": "5",
        "FAASDL_OPENWHISK__AUTH": MASK,
    }
    assert "s3cret" not in result.output


def test_the_command_refuses_too_short_a_run() -> None:
    result = CliRunner().invoke(app, ["bench", "steadiness", "--duration", "1"])

    assert result.exit_code == 2
    assert "--duration" in result.output
