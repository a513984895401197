"""Every experiment's ``--quick`` run through the CLI (CI's smoke test; recovery's of one
workload, all four with ``-m slow``): its report is written whole (CSV, plots, plans, summary)
and its headline figures are the last line, as JSON. With ``FAASDL_TEST_EXPERIMENT_DIR`` set,
the reports are copied there (how the committed quick results were made)."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from faasdl.cli import app
from faasdl.errors import PlatformUnavailable, ValidationError
from faasdl.experiments.report import Result, write
from faasdl.experiments.runner import Hit, Outcome, RunReport, RunSpec
from faasdl.experiments.suite import (
    EXPERIMENTS,
    QUICK_PARAMS,
    Turns,
    _findings,
    _overhead_interval,
    _overhead_parts,
    _param_options,
    _ratios,
    _recovered,
    _recovery_figures,
    _takeover_words,
    _takeovers,
    pass_labels,
    recovery,
    settable_params,
    verdict,
    workload_params,
)
from faasdl.experiments.workloads import WORKLOADS, workload

runner = CliRunner()


def run_experiment(
    name: str, tmp_path: Path, *, workloads: tuple[str, ...] = (), more: tuple[str, ...] = ()
) -> tuple[dict[str, Any], Path]:
    """Run ``faasdl experiment NAME --quick`` with ``workloads`` and the ``more`` options."""
    options = [*(o for w in workloads for o in ("--workload", w)), *more]
    result = runner.invoke(
        app, ["experiment", name, "--quick", *options, "--output", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    # ("--passes", "3") names it "passes3", ("--param", "graph.depth=9") "graph.depth-9"
    valued = zip(more[::2], more[1::2], strict=True)
    named = [v.replace("=", "-") if o == "--param" else f"{o[2:]}{v}" for o, v in valued]
    report_name = "-".join([name, *workloads, *named])
    report = tmp_path / report_name
    command = " ".join(["faasdl experiment", name, "--quick", *options])
    assert (report / "summary.md").read_text().count(command) == 1
    assert json.loads((report / "summary.json").read_text()) == summary
    with (report / f"{report_name}.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows
    assert all(row.get("exactly_once", "True") == "True" for row in rows)
    pngs = list(report.glob("*.png"))
    assert pngs
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in pngs)
    assert not list(tmp_path.glob(".*"))  # no staging directory left behind
    copy_to = os.environ.get("FAASDL_TEST_EXPERIMENT_DIR")
    if copy_to:
        shutil.copytree(report, Path(copy_to) / report_name, dirs_exist_ok=True)
    return summary, report


def recovery_runs(
    *recoveries: float | None, ideal_s: tuple[float, ...] = (), canary_s: tuple[float, ...] = ()
) -> dict[str, dict[str, Any]]:
    """One workload's rows by label, as the recovery experiment reads them: a pass per canary
    recovery time given, its runs taking 10 s unless ``ideal_s``/``canary_s`` say otherwise."""
    runs: dict[str, dict[str, Any]] = {"retry": {"makespan_s": 12.0, "recovery_s_mean": 2.0}}
    for k, recovered in enumerate(recoveries):
        ideal, canary = pass_labels(k)
        ideal_k, canary_k = (times[k] if times else 10.0 for times in (ideal_s, canary_s))
        runs[ideal] = {"makespan_s": ideal_k, "recovery_s_mean": None, "invocations": 20}
        runs[canary] = {"makespan_s": canary_k, "recovery_s_mean": recovered, "invocations": 20}
    return runs


def test_recovery_figures_take_the_passes_that_measured_a_recovery() -> None:
    # A pass whose faults all landed after their attempts had ended measured no recovery.
    one = _recovery_figures(recovery_runs(0.2, None))
    neither = _recovery_figures(recovery_runs(None, None))

    assert one["recovery_s_mean"] == {"retry": 2.0, "canary": 0.2}
    assert one["recovery_time_reduction_vs_retry"] == 0.9
    assert neither["recovery_time_reduction_vs_retry"] is None
    assert "no failure whose recovery could be measured" in _recovered(neither)
    assert _recovered(one).startswith("recovers 90% faster than retry")


def test_recovery_figures_are_the_means_of_every_pass_and_their_spread_the_widest() -> None:
    runs = recovery_runs(0.2, 0.3, 0.4, ideal_s=(10.0, 11.0, 12.0), canary_s=(10.5, 11.0, 13.2))

    figures = _recovery_figures(runs, passes=3)

    assert list(runs) == [
        "retry", "ideal", "canary", "ideal-again", "canary-again", "ideal-pass3", "canary-pass3"
    ]  # fmt: skip
    assert figures["recovery_s_mean"] == {"retry": 2.0, "canary": 0.3}
    assert figures["overhead_vs_ideal"] == pytest.approx(34.7 / 33 - 1, abs=1e-4)
    assert figures["ideal_spread"] == pytest.approx(0.2)  # 12 s over 10 s
    assert figures["ideal_invocation_s"] == pytest.approx(11.0 / 20)
    assert figures["canary_spread"] == pytest.approx(13.2 / 10.5 - 1, abs=1e-4)
    # Two passes read only the first two.
    assert _recovery_figures(runs)["recovery_s_mean"]["canary"] == 0.25


def turns(pairs: list[tuple[float, float]], failed: set[int]) -> Turns:
    """One pass of blocks that took turns: per pair, the failure-free block's time and canary's;
    the blocks in ``failed`` had a failure injected."""

    def block(i: int, seconds: float, hit: bool) -> RunReport:
        spec = RunSpec(f"b{i}", "graph", {}, 1, "canary", first=i)
        injected = [Hit(i, f"a{i}", "kill", 0.0, None)] if hit else []
        return RunReport(spec, 0.0, seconds, [], 0.0, 0.0, 1, injected)

    ideal = [block(i, plain, False) for i, (plain, _) in enumerate(pairs)]
    canary = [block(i, ours, i in failed) for i, (_, ours) in enumerate(pairs)]
    return [("ideal", 0.0, ideal), ("canary", 0.15, canary)]


def test_the_overhead_interval_resamples_the_failures_apart() -> None:
    # Without noise in either part the interval is the overhead itself: every resample keeps
    # the plan's three failures (resampled together, the count would vary, and the interval
    # would be wide).
    steady = turns([(1.0, 1.02)] * 17 + [(1.0, 1.3)] * 3, failed={17, 18, 19})
    overhead = sum(_overhead_parts(steady).values())
    assert overhead == pytest.approx(0.062)  # (17 · 1.02 + 3 · 1.3) / 20 - 1
    low, high = _overhead_interval(steady)
    assert low == pytest.approx(overhead, abs=1e-4)
    assert high == pytest.approx(overhead, abs=1e-4)
    # With noise it holds the overhead, and the second pass narrows it.
    noisy = [(1.0, 1.02 + 0.1 * ((-1) ** i) * (i % 4)) for i in range(17)] + [(1.0, 1.3)] * 3
    once = _overhead_interval(turns(noisy, {17, 18, 19}))
    twice = _overhead_interval(turns(noisy, {17, 18, 19}), turns(noisy, {17, 18, 19}))
    overhead = sum(_overhead_parts(turns(noisy, {17, 18, 19})).values())
    assert once[0] < overhead < once[1]
    assert once[0] < twice[0] < overhead < twice[1] < once[1]


def test_a_take_over_is_the_settling_activation_invoked_after_the_hit() -> None:
    # Invocation 0: killed at t=100 s, settled by an activation invoked at 100.05 s (it waited
    # 0.4 s for a container, started cold). 1: a zombie hit at 100 s that committed itself (its
    # activation invoked at 99 s). 2: two copies killed at once, one take-over. 3: its settling
    # activation's record was never read (a lapsed lease settled it).
    outcomes = [
        Outcome(0, final_start_ms=100_450, final_wait_ms=400, final_init_ms=900),
        Outcome(1, final_start_ms=99_000, final_wait_ms=0),
        Outcome(2, final_start_ms=100_020, final_wait_ms=10),
        Outcome(3),
    ]
    hits = [
        Hit(0, "a0", "kill", 100.0, None),
        Hit(1, "a1", "zombie", 100.0, None),
        Hit(2, "a2", "kill", 100.0, None),
        Hit(2, "a2-copy", "kill", 100.0, None),
        Hit(3, "a3", "kill", 100.0, None),
    ]
    spec = RunSpec("r", "graph", {}, 4, "canary")
    report = RunReport(spec, 0.0, 1.0, outcomes, 0.0, 0.0, 6, hits)
    assert [o.index for o in _takeovers([report])] == [0, 2]
    # A take-over invoked before the hit is no take-over: the clock is the activation's start
    # less its wait, not its start.
    late = Outcome(0, final_start_ms=100_300, final_wait_ms=400)
    assert _takeovers([RunReport(spec, 0.0, 1.0, [late], 0.0, 0.0, 1, hits[:1])]) == []


def test_the_back_to_back_take_overs_are_told_per_rate_and_the_turns_are_not() -> None:
    def row(
        strategy: str, rate: float, blocks: int, wait: float | None, cold: int
    ) -> dict[str, Any]:
        return {
            "workload": "training",
            "strategy": strategy,
            "failure_rate": rate,
            "blocks": blocks,
            "failures": round(rate * 100),
            "takeover_wait_s_mean": wait,
            "takeover_wait_s_max": None if wait is None else 2 * wait,
            "takeover_cold": cold,
        }

    turns_only = [row("ideal", 0.0, 100, None, 0), row("canary", 0.15, 100, 0.01, 0)]
    assert _takeover_words("training", turns_only) is None
    rows = [
        *turns_only,
        row("canary", 0.0, 1, None, 0),
        row("canary", 0.1, 1, 0.5, 0),
        row("retry", 0.1, 1, 0.1, 10),
        row("canary", 0.5, 1, 2.0, 1),
        row("retry", 0.5, 1, 0.1, 49),
    ]
    assert _takeover_words("training", rows) == (
        "training, back to back (a run of its own per failure rate): canary's take-overs waited "
        "for a container 0.50 and 2.00 s on average at 10% and 50% failures (the longest 1.00 "
        "and 4.00 s), and in 1 of 60 failures the take-over started a container cold; retry's "
        "in 59 of 60."
    )
    assert _takeover_words("graph", rows) is None


@pytest.mark.parametrize(
    ("interval", "expected"),
    [
        ([0.01, 0.04], "met"),
        ([0.02, 0.05], "met"),  # the target itself is met
        ([0.03, 0.07], "undecided"),
        ([0.05, 0.09], "undecided"),
        ([0.051, 0.09], "missed"),
    ],
)
def test_an_overheads_verdict_is_what_its_whole_interval_says(
    interval: list[float], expected: str
) -> None:
    assert verdict(interval, 0.05) == expected


#: The recovery experiment's workloads CI runs (the lightest: a minute and a half); all four
#: (eleven to twelve minutes) run with ``-m slow``.
CI_RECOVERY_WORKLOADS = ("webservice",)


def test_recovery_quick_reports_reduction_and_overhead_per_workload(tmp_path: Path) -> None:
    # Three passes, one more than the default: a third is where the passes' labels and order
    # are no longer the first two's (some 15 s more, for the webservice); and requests of four
    # queries instead of five, which the runs' parameters must say.
    more = ("--passes", "3", "--param", "webservice.queries=4")
    workloads = CI_RECOVERY_WORKLOADS
    summary, report = run_experiment("recovery", tmp_path, workloads=workloads, more=more)
    check_recovery(summary, report, CI_RECOVERY_WORKLOADS, passes=3)
    setup = (report / "summary.md").read_text()
    assert "webservice requests=16, queries=4, rows=50000," in setup


@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.timeout(1200)  # four workloads, 100 invocations each and a warm-up: 11-12 min
def test_recovery_quick_of_all_four_workloads(tmp_path: Path) -> None:
    summary, report = run_experiment("recovery", tmp_path)
    check_recovery(summary, report, ("training", "compression", "graph", "webservice"))


def check_recovery(
    summary: dict[str, Any], report: Path, names: tuple[str, ...], passes: int = 2
) -> None:
    assert summary["passes"] == passes
    with (report / f"{report.name}.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    labels = [row["strategy"] for row in rows]
    for row in rows:
        failures, cold = int(row["failures"]), int(row["takeover_cold"])
        if failures == 0:
            assert row["takeover_wait_s_mean"] == "", row
        if row["strategy"].startswith("canary"):
            assert cold == 0, row  # it resumed on a warm replica
        else:
            assert cold <= failures, row
    # A kill that lands between an attempt's commit and its answer has no take-over; not all do.
    assert any(row["takeover_wait_s_mean"] for row in rows if row["strategy"] == "canary")
    for k in range(passes):
        for label in pass_labels(k):
            assert labels.count(label) == len(names)
    workloads = summary["workloads"]
    assert isinstance(workloads, dict)
    assert set(workloads) == set(names)
    for figures in workloads.values():
        assert isinstance(figures["recovery_time_reduction_vs_retry"], float)
        assert isinstance(figures["overhead_vs_ideal"], float)
        assert figures["ideal_spread"] >= 0
        assert figures["canary_spread"] >= 0
        assert figures["ideal_invocation_s"] > 0
        # The overhead's two parts add up to it.
        parts = figures["overhead_checkpoints"] + figures["overhead_failures"]
        assert parts == pytest.approx(figures["overhead_vs_ideal"], abs=2e-4)
        low, high = figures["overhead_ci95"]  # (the runs' times are rounded to the ms)
        assert low - 1e-3 <= figures["overhead_vs_ideal"] <= high + 1e-3
        assert figures["overhead_verdict"] == verdict([low, high], 0.05)
        # What CPU the invocations without failures took, the function's and its writer's.
        cpu = figures["cpu_s_mean"]
        assert cpu["ideal"] > 0, cpu
        assert cpu["canary"] > 0, cpu
        if Path("/proc/self/schedstat").exists():  # where the kernel keeps tasks' CPU in ns
            assert cpu["canary_writer"] > 0, cpu  # its checkpoints were written beside it
    assert summary["overhead_undecided"] == [
        n for n, w in workloads.items() if w["overhead_verdict"] == "undecided"
    ]
    assert summary["failure_rate"] == 0.15
    assert len(list((report / "plans").glob("*.json"))) == len(names)
    if "webservice" in names:
        # The setup names the database the runs' containers share, not the parameter's default.
        shared = "database=<experiment directory>/webservice-50000.db"
        assert shared in (report / "summary.md").read_text()


def test_replication_prints_time_and_cost_ratios(tmp_path: Path) -> None:
    summary, report = run_experiment("replication", tmp_path)
    rows = check_comparison(summary, report, "replication")
    assert "passes" not in summary
    assert all("pass" not in row for row in rows)


def test_baselines_in_passes_give_each_ratio_an_interval(tmp_path: Path) -> None:
    # Two passes of a lighter workload (two files an invocation, not six): about as long as
    # one pass of the default, and where the passes' labels, order and figures are checked.
    more = ("--passes", "2", "--param", "compression.files=2")
    summary, report = run_experiment("baselines", tmp_path, more=more)
    rows = check_comparison(summary, report, "baselines-passes2-compression.files-2")

    assert summary["passes"] == 2
    strategies = ["canary", "request_replication", "active_standby", "retry"]
    # Each pass ran every strategy, the second in the mirrored order of the first; the same
    # failure-free work once more after them.
    order = [(row["strategy"], row["pass"]) for row in rows]
    first = [("ideal", "1"), *((s, "1") for s in strategies)]
    assert order == [*first, *((s, "2") for s, _ in reversed(first)), ("ideal-again", "")]
    base = summary["relative_to"]
    time_s = {(row["strategy"], row["pass"]): float(row["makespan_s"]) for row in rows}
    for name in strategies:
        per_pass = [time_s[name, k] / time_s[base, k] for k in ("1", "2")]
        assert summary["time_ratio_passes"][name] == pytest.approx(per_pass, abs=1e-4)
        ratio = summary["time_ratio"][name]
        assert ratio == pytest.approx((per_pass[0] * per_pass[1]) ** 0.5, abs=1e-4)
        low, high = summary["time_ratio_ci95"][name]
        assert low - 1e-4 <= ratio <= high + 1e-4
        assert len(summary["cost_ratio_ci95"][name]) == 2
    assert summary["time_ratio_ci95"][base] == [1.0, 1.0]
    text = (report / "summary.md").read_text()
    assert "Every run was made 2 times, in passes" in text
    assert "passes' ratios, called even where its 95% interval holds 1." in text


def check_comparison(summary: dict[str, Any], report: Path, name: str) -> list[dict[str, str]]:
    """What a strategy comparison's report must hold; its CSV's rows."""
    base = summary["relative_to"]
    assert isinstance(base, str)
    for key in ("time_ratio", "cost_ratio"):
        ratios = summary[key]
        assert isinstance(ratios, dict)
        assert ratios[base] == 1.0
        assert len(ratios) >= 3  # the base and the others
    # The failure-free work was run first and last: how far apart is the noise.
    with (report / f"{name}.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    ideal, again = (next(r for r in rows if r["strategy"] == k) for k in ("ideal", "ideal-again"))
    noise = summary["noise"]
    assert isinstance(noise, dict)
    assert noise["time"] == pytest.approx(
        abs(float(again["makespan_s"]) / float(ideal["makespan_s"]) - 1), abs=1e-4
    )
    assert "## Findings" in (report / "summary.md").read_text()
    return rows


def test_a_strategy_is_better_or_worse_than_another_only_beyond_the_noise() -> None:
    # Arrange: the two failure-free runs came out 1% apart in time, 2% in cost.
    summary = {
        "relative_to": "canary",
        "failure_rate": 0.15,
        "noise": {"time": 0.01, "cost": 0.02},
        "time_ratio": {"canary": 1.0, "a": 0.995, "b": 0.9, "c": 1.005, "d": 1.1},
        "cost_ratio": {"canary": 1.0, "a": 1.2, "b": 0.97, "c": 0.985, "d": 1.1},
    }

    # Execute
    a, b, c, d, noise = _findings(summary, "Canary")

    # Assert
    assert a == (
        "a: 0.995× the time (even: within the 1.0% noise) and 1.200× the cost (dearer) of "
        "canary at 15% failures — Canary wins on cost, is even on time."
    )
    assert b.endswith(
        "0.900× the time (faster) and 0.970× the cost (cheaper) of canary at 15% failures — "
        "Canary **loses on time and cost**."
    )
    assert c.endswith("— Canary is even on time and cost.")
    assert "(even: within the 2.0% noise)" in c
    assert d.endswith("— Canary wins on time and cost.")
    assert noise.endswith("1.0% in time, 2.0% in cost; a ratio within it is called even.")


def comparison_rows(times: dict[str, list[float]]) -> list[dict[str, Any]]:
    """A comparison's rows at 15% failures, a pass per time given for each strategy (their
    costs the times over 1000), with the failure-free runs first and last."""
    rows: list[dict[str, Any]] = []
    for k in range(len(times["canary"])):
        rows.append({"strategy": "ideal", "failure_rate": 0.0, "makespan_s": 9.0, "pass": k + 1})
        rows += [
            {
                "strategy": name,
                "failure_rate": 0.15,
                "makespan_s": t[k],
                "cost_usd": t[k] / 1000,
                "recovery_s_mean": None if name == "retry" else 0.5,
                "pass": k + 1,
            }
            for name, t in times.items()
        ]
    rows[0]["cost_usd"] = 0.009
    rows.append(
        {"strategy": "ideal-again", "failure_rate": 0.0, "makespan_s": 9.9, "cost_usd": 0.0099}
    )
    return rows


def test_a_comparison_in_passes_gives_each_ratio_its_mean_and_a_95_percent_interval() -> None:
    # Arrange: three passes. "steady" is 10% slower than canary in every one; "noisy" as fast on
    # average, 20% faster in one pass and 20% slower in another.
    rows = comparison_rows(
        {
            "canary": [10.0, 12.0, 11.0],
            "steady": [11.0, 13.2, 12.1],
            "noisy": [8.0, 14.4, 11.0],
            "retry": [20.0, 24.0, 22.0],
        }
    )

    # Execute
    summary = _ratios("baselines", "quick", rows, "canary", 0.15)

    # Assert: each ratio is the passes' geometric mean, each against canary's run of the same
    # pass (noisy's: the cube root of 0.8 × 1.2 × 1.0).
    assert summary["passes"] == 3
    assert summary["time_ratio"] == {"canary": 1.0, "steady": 1.1, "noisy": 0.9865, "retry": 2.0}
    assert summary["time_ratio_passes"]["noisy"] == [0.8, 1.2, 1.0]
    assert summary["time_ratio_ci95"]["steady"] == pytest.approx([1.1, 1.1], abs=1e-4)
    # Student's t with two degrees of freedom over the logarithms (scipy's t.interval there).
    assert summary["time_ratio_ci95"]["noisy"] == pytest.approx([0.5957, 1.6337], abs=1e-4)
    assert summary["recovery_ratio"]["retry"] is None  # a pass had nothing to divide
    assert summary["noise"]["time"] == pytest.approx(0.1)
    # The interval decides, not the failure-free runs' 10% apart: steady's 10% is a loss for
    # the other strategy, noisy's mean is even however its passes differ.
    steady, noisy, retry, words = _findings(summary, "Canary")[:4]
    assert steady.startswith(
        "steady: 1.100× the time (slower: 95% interval [1.100, 1.100]) and 1.100× the cost "
        "(dearer: 95% interval [1.100, 1.100])"
    )
    assert steady.endswith("— Canary wins on time and cost.")
    assert "0.987× the time (even: its 95% interval [0.596, 1.634] holds 1)" in noisy
    assert retry.endswith("— Canary wins on time and cost.")
    assert words.endswith(
        "each ratio is the geometric mean of its 3 passes' ratios, called even where its 95% "
        "interval holds 1."
    )


def test_one_pass_has_no_interval_and_is_judged_by_the_noise() -> None:
    rows = [
        {k: v for k, v in r.items() if k != "pass"}
        for r in comparison_rows({"canary": [10.0], "steady": [11.0]})
    ]

    summary = _ratios("baselines", "quick", rows, "canary", 0.15)

    assert "passes" not in summary
    assert "time_ratio_ci95" not in summary
    assert summary["time_ratio"] == {"canary": 1.0, "steady": 1.1}
    # 10% slower is within the two failure-free runs' 10% apart.
    assert "(even: within the 10.0% noise)" in _findings(summary, "Canary")[0]


def test_cost_counts_replicas_in_passes(tmp_path: Path) -> None:
    # Two passes of two files an invocation, not the compared workload's six: the summary must
    # say so; about as long as one pass of four files.
    more = ("--passes", "2", "--param", "compression.files=2")
    summary, report = run_experiment("cost", tmp_path, more=more)
    text = (report / "summary.md").read_text()
    assert 0 < summary["replica_share_of_canary_cost"] < 1
    noise = summary["noise"]
    assert isinstance(noise, dict)
    assert f"cost {noise['cost']:.1%} apart from its first run" in text
    assert "compression files=2, file_kb=512, level=6." in text
    # The costs are the passes' means; the saving and the overhead the passes' ratios' geometric
    # means, each inside its interval.
    with (report / "cost-passes2-compression.files-2.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["pass"]]
    cost = {(r["strategy"], r["pass"]): float(r["cost_usd"]) for r in rows}
    assert summary["passes"] == 2
    for name in ("ideal", "retry", "canary"):
        mean = (cost[name, "1"] + cost[name, "2"]) / 2
        assert summary["cost_usd"][name] == pytest.approx(mean, abs=1e-7)
    to_retry = [cost["canary", k] / cost["retry", k] for k in ("1", "2")]
    saved = summary["cost_reduction_vs_retry"]
    assert saved == pytest.approx(1 - (to_retry[0] * to_retry[1]) ** 0.5, abs=2e-4)
    low, high = summary["cost_reduction_vs_retry_ci95"]
    assert low <= saved <= high
    low, high = summary["cost_overhead_vs_ideal_ci95"]
    assert low <= summary["cost_overhead_vs_ideal"] <= high
    assert "Over the 2 passes" in text


def test_scale_checks_the_large_run_from_the_store(tmp_path: Path) -> None:
    summary, _ = run_experiment("scale", tmp_path)
    large = summary["large_run"]
    assert isinstance(large, dict)
    assert large["exactly_once"] is True
    assert large["committed"] == large["units_in_store"] == large["invocations"] == 250
    assert large["failures"] > 0
    # A kill that lands after the commit costs no attempt: the unit is not run again.
    assert large["invocations"] < large["attempts"] <= large["invocations"] + large["failures"]
    assert large["controller_peak_rss_mb"] > 0
    assert large["controller_cpu_s"] > 0


@pytest.mark.tensorflow
def test_disdel_compares_environments_pool_limits_and_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_training_bench: dict[str, Any]
) -> None:
    # Arrange: the experiment's first section is the training benchmark's quick variant, which
    # this session has measured already (for its own test): the experiment is handed that result.
    asked: list[bool] = []

    def measured(*, quick: bool, seeds: int, progress: object) -> dict[str, Any]:
        asked.append(quick)
        return quick_training_bench

    monkeypatch.setattr("faasdl.experiments.disdel.run_training_bench", measured)

    # Execute
    summary, _ = run_experiment("disdel", tmp_path)

    # Assert: the environments are the benchmark's; the pool limits and the batch ran here.
    assert asked == [True]
    (bench,) = quick_training_bench["workloads"]
    assert summary["environments"] == {
        env: {k: e[k] for k in ("makespan_s", "peak_mb_per_action")}
        for env, e in bench["environments"].items()
    }
    assert set(summary["pool_limit_makespan_s"]) == {"1024", "4096"}
    assert all(s > 0 for s in summary["pool_limit_makespan_s"].values())
    assert summary["batch"]["jobs"] == 8
    assert summary["batch"]["batch_makespan_s"] >= summary["batch"]["job_makespan_s_mean"] > 0


def test_an_unknown_experiment_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    result = runner.invoke(app, ["experiment", "nope", "--output", str(tmp_path)])
    assert result.exit_code != 0
    assert "name: unknown experiment 'nope'" in result.output
    assert "recovery" in result.output
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["recovery", "--workload", "training", "--workload", "nope"],
            "--workload: unknown workload 'nope'",
        ),
        (["cost", "--workload", "training"], "--workload: only the recovery experiment runs"),
        (
            ["scale", "--passes", "3"],
            "--passes: only the recovery, replication, baselines and cost experiments run in",
        ),
        (["baselines", "--passes", "1"], "Invalid value for '--passes'"),
        (["recovery", "--passes", "1"], "Invalid value for '--passes'"),
        (["disdel", "--param", "graph.depth=9"], "--param: the disdel experiment runs training"),
        (
            ["scale", "--param", "compression.files=2"],
            "--param compression.files: 'compression' is not a workload of this run (graph)",
        ),
        (["recovery", "--param", "epochs=3"], "--param: expected WORKLOAD.FIELD=VALUE"),
        (
            ["recovery", "--workload", "graph", "--param", "training.epochs=3"],
            "--param training.epochs: 'training' is not a workload of this run (graph)",
        ),
        (["recovery", "--param", "graph.nope=1"], "--param graph.nope: graph has no such"),
        (["recovery", "--param", "graph.seed=1"], "--param graph.seed: it is each invocation's"),
        (["recovery", "--param", "webservice.database=x"], "webservice.database: the experiment"),
        (["recovery", "--param", "graph.depth=0"], "--param graph.depth: Input should be greater"),
        (["recovery", "--param", "training.model=vgg"], "training.model: Input should be"),
        (
            ["recovery", "--param", "graph.depth=9", "--param", "graph.depth=8"],
            "--param graph.depth: given twice",
        ),
    ],
)
def test_a_bad_workload_passes_or_param_option_is_refused_before_anything_runs(
    args: list[str], message: str, tmp_path: Path
) -> None:
    result = runner.invoke(app, ["experiment", *args, "--output", str(tmp_path)])
    assert result.exit_code != 0
    assert message in result.output
    assert not list(tmp_path.iterdir())


def test_an_output_that_cannot_be_written_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    # The report is written at the end: a run of minutes had failed there.
    (tmp_path / "a-file").write_text("")
    output = tmp_path / "a-file" / "results"

    result = runner.invoke(app, ["experiment", "scale", "--output", str(output)])

    assert result.exit_code == 2
    assert f"--output: {output}: cannot write a report there: Not a directory" in " ".join(
        result.output.split()
    )
    assert "scale:" not in result.output  # no progress: nothing ran
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


@pytest.mark.parametrize(
    "raised", [PlatformUnavailable("the platform went away"), KeyboardInterrupt()]
)
def test_a_run_that_does_not_finish_leaves_no_folder_it_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raised: BaseException
) -> None:
    def stopped(*_: object, **__: object) -> Result:
        raise raised

    monkeypatch.setitem(EXPERIMENTS, "scale", stopped)  # a failure, or Ctrl-C, mid-run
    (tmp_path / "kept").mkdir()
    output = tmp_path / "kept" / "new" / "results"

    result = runner.invoke(app, ["experiment", "scale", "--output", str(output)])

    assert result.exit_code != 0
    if isinstance(raised, PlatformUnavailable):
        assert "error: the platform went away" in result.output
    # The folders made to check the report could be written went; the one that was there stays.
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*")] == [Path("kept")]


def test_the_recovery_experiment_refuses_fewer_than_two_passes() -> None:
    with pytest.raises(ValidationError, match="passes: at least 2"):
        recovery("quick", Console(quiet=True), ("graph",), passes=1)


def test_a_report_is_named_by_its_options_and_keeps_the_whole_ones(tmp_path: Path) -> None:
    whole = Result("recovery", "full", [{"workload": "graph", "makespan_s": 1.0}], {"a": 1})
    part = Result(
        "recovery",
        "full",
        [{"workload": "training", "makespan_s": 2.0}],
        {"a": 2},
        options=("--workload", "training", "--passes", "4"),
    )

    write(whole, tmp_path)
    written = write(part, tmp_path)

    assert written == tmp_path / "recovery-training-passes4"
    summary = (written / "summary.md").read_text()
    assert "    faasdl experiment recovery --full --workload training --passes 4\n" in summary
    # No failure plans: no empty folder of them, and no link to one.
    assert not (written / "plans").exists()
    assert "Data: [`recovery-training-passes4.csv`](recovery-training-passes4.csv).\n" in summary
    assert (written / "recovery-training-passes4.csv").read_text().splitlines()[1] == "training,2.0"
    assert json.loads((tmp_path / "recovery" / "summary.json").read_text()) == {"a": 1}


def test_a_summary_names_the_settings_its_run_took_from_the_environment_secrets_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = Result("cost", "quick", [{"workload": "graph", "cost_usd": 1.0}], {})
    for var in [v for v in os.environ if v.startswith("FAASDL_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("FAASDL_TEST_MARK", "1")  # the test suite's own: not a setting

    said = (write(result, tmp_path) / "summary.md").read_text()
    assert ", FAASDL_ variables none.\n" in said

    monkeypatch.setenv("FAASDL_LOCAL__WARMUP_NICE", "5")
    monkeypatch.setenv("FAASDL_STORE__URL", "redis://:s3cret-word@cache:6379/0")
    monkeypatch.setenv("FAASDL_STORE__PASSWORD", "pw")
    said = (write(result, tmp_path) / "summary.md").read_text()
    named = (
        "FAASDL_LOCAL__WARMUP_NICE=5 FAASDL_STORE__PASSWORD='***' "
        "FAASDL_STORE__URL='redis://:***@cache:6379/0'"
    )
    assert f", FAASDL_ variables {named}.\n" in said
    assert "s3cret-word" not in said


def test_a_workloads_parameters_from_the_options_are_read_as_its_model_reads_them() -> None:
    options = ["training.model=mlp", "training.epochs=8", "graph.every=1024"]

    found = workload_params(options, ["training", "graph"])
    result = Result("recovery", "quick", [], {}, options=_param_options(found))

    assert found == {"training": {"model": "mlp", "epochs": 8}, "graph": {"every": 1024}}
    assert result.command.endswith(
        " --param training.model=mlp --param training.epochs=8 --param graph.every=1024"
    )
    assert result.report_name == "recovery-training.model-mlp-training.epochs-8-graph.every-1024"


def test_the_readme_documents_every_parameter_the_options_can_set() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()

    for name in WORKLOADS:
        full = workload(name).params()
        for field in settable_params(name):
            default = str(getattr(full, field))
            quick = str(QUICK_PARAMS[name].get(field, default))
            row = f"| `{name}` | `{field}` | "
            assert row in readme, f"{name}.{field} undocumented"
            shown = [cell.strip("` ") for cell in readme.split(row, 1)[1].split("|")[:2]]
            assert shown == [default, "" if quick == default else quick], f"{name}.{field}"
