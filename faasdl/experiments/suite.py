"""``faasdl experiment NAME``: the thesis' evaluations of Canary (Chapter 6) and DiSDeL (Chapter
4) as commands, each with a ``quick`` size (minutes on 2 cores; CI's smoke test) and a ``full``
one. Every run is checked from the store: each invocation committed exactly once with the result
its failure-free run commits.

The machine is small (2 cores), so by default one invocation runs at a time (``concurrency`` 1):
the other core is the platform's, the store's and the warm replicas' — on a cluster those run
beside the invokers, not on the cores the functions use. The replication experiment runs two at
a time, so that its strategies differ (with one active invocation every strategy keeps one
replica), and pays for it in contention.
"""

from __future__ import annotations

import math
import shlex
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic import ValidationError as PydanticValidationError
from rich.console import Console
from scipy.stats import bootstrap
from scipy.stats import t as t_dist

from faasdl.canary.strategies import ReplicationMode, StrategyName
from faasdl.config import Settings
from faasdl.errors import ValidationError
from faasdl.experiments.disdel import disdel
from faasdl.experiments.inject import FailurePlan
from faasdl.experiments.lab import Lab, Ledger, ledger, open_lab
from faasdl.experiments.measure import recovery_s
from faasdl.experiments.report import Plot, Result, Size
from faasdl.experiments.runner import Outcome, RunReport, RunSpec
from faasdl.experiments.workloads import WORKLOADS, run_steps, workload
from faasdl.training.usage import peak_rss_mb, reset_peak_rss

PRICE_PER_GB_S = Settings.model_fields["price_per_gb_s"].default
#: Per workload, its parameters in a quick run (a full run takes the workloads' defaults):
#: invocations of 0.8-1.9 s in 6-32 steps of 50-220 ms, a checkpoint after each, on the machine
#: they were chosen on (a faster one ran them in 0.29-0.65 s, steps of 20-46 ms: the sizes are
#: work, not time, so the checkpoints' share depends on the machine). A failure costs
#: Canary a fixed part (the kill seen, a replica's attempt started: 15-45 ms) and the steps redone
#: and slowed after it (its replacement warming up beside it), so its share of an invocation's
#: time falls as invocations get longer; a checkpoint's cost is a share of its step's time.
#: Training: six epochs of the CNN. Compression: 16 files of 512 KiB (the default's files, half
#: their size). Graph: the default's tree (depth 20, a checkpoint every 65,536 vertices: 32 steps;
#: frontiers of up to 4 MiB). Web service: 16 requests.
QUICK_PARAMS: dict[str, dict[str, Any]] = {
    "training": {"epochs": 6},
    "compression": {"files": 16, "file_kb": 512},
    "graph": {"depth": 20, "every": 65_536},
    "webservice": {"requests": 16},
}
#: The light workload of the scale experiment: a BFS of 8,191 vertices in 8 steps (~30 ms).
LIGHT: tuple[str, dict[str, Any]] = ("graph", {"depth": 12, "every": 1024})
#: The workload the strategy comparisons run and its parameters, the same in their quick and full
#: runs (which differ in invocations and failure rates): six files of 512 KiB, a checkpoint every
#: ~70 ms, ~0.45 s an invocation (smaller than the recovery experiment's: they make many runs).
COMPARED: tuple[str, dict[str, Any]] = ("compression", {"files": 6, "file_kb": 512})
#: Invocations per block when the recovery experiment interleaves runs (:meth:`_Bench.interleaved`):
#: one, as this machine's speed changes by up to half within seconds.
BLOCK = 1
TARGETS = {"recovery_time_reduction_vs_retry": 0.90, "overhead_vs_ideal": 0.05}
#: Passes of the recovery experiment's interleaved runs by default (and at least: how far apart
#: two measure is the noise left). Its overhead's 95% interval narrows as √passes: on this
#: machine a quick run's is ±4.5-5 points with two (``faasdl bench steadiness``).
PASSES = 2


def _params(name: str, size: Size) -> dict[str, Any]:
    return QUICK_PARAMS[name] if size == "quick" else {}


def workload_params(options: Sequence[str], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The ``--param WORKLOAD.FIELD=VALUE`` options of a run of the workloads ``names``: per
    workload, the fields they set, with their values as its parameters read them (``8`` a
    number, ``mlp`` a name). Raises ``ValidationError`` naming the option at fault: a workload
    not in the run, a field it does not have, one set twice, the seed (each invocation's index),
    one the experiment sets itself (a file its containers share), or a value out of range."""
    found: dict[str, dict[str, str]] = {}
    for option in options:
        key, eq, value = option.partition("=")
        name, dot, name_of_field = key.partition(".")
        if not (eq and dot and name and name_of_field):
            raise ValidationError(f"expected WORKLOAD.FIELD=VALUE, got {option!r}", field="--param")
        field = f"--param {key}"
        if name not in names:
            known = ", ".join(names)
            raise ValidationError(f"{name!r} is not a workload of this run ({known})", field=field)
        params = workload(name).params
        settable = settable_params(name)
        if name_of_field not in settable:
            if name_of_field not in params.model_fields:
                why = f"{name} has no such parameter"
            elif name_of_field == "seed":
                why = "it is each invocation's index"
            else:
                why = "the experiment sets it (a file the containers share)"
            raise ValidationError(f"{why} (settable: {', '.join(settable)})", field=field)
        if name_of_field in found.get(name, {}):
            raise ValidationError("given twice", field=field)
        found.setdefault(name, {})[name_of_field] = value
    typed: dict[str, dict[str, Any]] = {}
    for name, changes in found.items():
        try:
            model = workload(name).params.model_validate(changes)
        except PydanticValidationError as exc:
            error = exc.errors()[0]
            place = ".".join(str(p) for p in error["loc"])
            raise ValidationError(error["msg"], field=f"--param {name}.{place}") from None
        read = model.model_dump(mode="json")
        typed[name] = {k: read[k] for k in changes}
    return typed


def settable_params(name: str) -> list[str]:
    """The parameters of workload ``name`` a ``--param`` option may set: all but those every run
    sets itself (the seed, each invocation's index; a file its containers share: see
    :func:`_shared`)."""
    found = workload(name)
    own = {"seed", *found.shared(found.params(), Path("."))}
    return [f for f in found.params.model_fields if f not in own]


def _param_options(params: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    """``params`` (see :func:`workload_params`) as the ``--param`` options that give them."""
    return tuple(
        o
        for name, changes in params.items()
        for k, v in changes.items()
        for o in ("--param", shlex.quote(f"{name}.{k}={v}"))
    )


@dataclass
class _Bench:
    """One lab's runs of one workload: the failure-free run is the reference of the others."""

    lab: Lab
    workload: str
    params: dict[str, Any]
    invocations: int
    concurrency: int
    #: The failure-free outcomes by invocation, the first measured of each: the reference.
    ideal: dict[int, Outcome] = field(default_factory=dict)

    def warm_up(self) -> None:
        """Warm the containers the runs share. With checkpoints: a container starts its
        checkpoint writer the first time it checkpoints (a replica, as it warms up), and that
        start (~0.5 s) is the container's, not the first run's that checkpoints."""
        self.run("warm-up", "canary", invocations=2 * self.concurrency)

    def run(
        self,
        label: str,
        strategy: StrategyName,
        plan: FailurePlan | None = None,
        *,
        invocations: int | None = None,
        first: int = 0,
        replication: ReplicationMode = "dynamic",
        concurrency: int | None = None,
    ) -> RunReport:
        n = invocations or self.invocations
        expected: dict[int, float] = {}
        if self.ideal:
            # Faults are timed from an attempt's first heartbeat: its work, not its latency
            # (an invocation not measured yet: the typical one's).
            work = {
                i: o.final["step_ends"][-1] - o.final["started_at"] for i, o in self.ideal.items()
            }
            typical = statistics.median(work.values())
            expected = {i: work.get(i, typical) for i in range(first, first + n)}
        return self.lab.run(
            RunSpec(
                run_id=f"{self.workload}-{label}",
                workload=self.workload,
                params=self.params | _shared(self.workload, self.params, self.lab.shared_dir),
                invocations=n,
                strategy=strategy,
                plan=plan or FailurePlan(),
                concurrency=concurrency or self.concurrency,
                replication=replication,
                expected_s=expected,
                first=first,
            )
        )

    def reference(
        self, label: str = "ideal", *, invocations: int | None = None, first: int = 0
    ) -> RunReport:
        """A failure-free run without checkpoints; its outcomes are the reference where none
        was measured before."""
        report = self.run(label, "retry", invocations=invocations, first=first)
        for o in report.outcomes:
            self.ideal.setdefault(o.index, o)
        return report

    def interleaved(
        self, labels: tuple[str, str], plan: FailurePlan, *, canary_first: bool
    ) -> tuple[list[RunReport], list[RunReport]]:
        """The failure-free run and canary's run under ``plan``, in blocks of :data:`BLOCK`
        invocations that take turns (ideal, canary, canary, ideal, ideal, ... or, with
        ``canary_first``, the mirror), so that both meet the same changes of the machine's
        speed; the blocks of each (labelled ``labels``: ideal's, canary's)."""
        ideal: list[RunReport] = []
        canary: list[RunReport] = []
        for k, first in enumerate(range(0, self.invocations, BLOCK)):
            n = min(BLOCK, self.invocations - first)
            for ideal_turn in (True, False) if (k % 2 == 0) != canary_first else (False, True):
                if ideal_turn:
                    ideal.append(self.reference(f"{labels[0]}-b{k}", invocations=n, first=first))
                else:
                    canary.append(
                        self.run(f"{labels[1]}-b{k}", "canary", plan, invocations=n, first=first)
                    )
        return ideal, canary

    def row(self, reports: RunReport | list[RunReport], label: str, rate: float) -> dict[str, Any]:
        """One row of the results: a run, or the blocks of one (their times and costs summed)."""
        blocks = reports if isinstance(reports, list) else [reports]
        expected = {i: o.result or "" for i, o in self.ideal.items()}
        found = [
            ledger(self.lab.store, r.spec.run_id, {i: expected[i] for i in r.spec.indices})
            for r in blocks
        ]
        recoveries = [
            s
            for r in blocks
            for hit in r.injected
            if (s := recovery_s(hit, r.outcome(hit.invocation))) is not None
        ]
        injected = sum(len(r.injected) for r in blocks)
        planned = sum(_planned(r) for r in blocks)
        takeovers = _takeovers(blocks)
        waits = [o.final_wait_ms / 1000 for o in takeovers]
        activation_gb_s = sum(r.activation_gb_s for r in blocks)
        replica_gb_s = sum(r.replica_gb_s for r in blocks)
        invocations = sum(r.spec.invocations for r in blocks)
        return {
            "workload": self.workload,
            "strategy": label,
            "failure_rate": rate,
            "invocations": invocations,
            "concurrency": blocks[0].spec.concurrency,
            "blocks": len(blocks),
            "makespan_s": round(sum(r.makespan_s for r in blocks), 3),
            "planned": planned,
            "failures": injected,
            "attempts": sum(f.attempts for f in found),
            "recovery_s_mean": round(statistics.mean(recoveries), 4) if recoveries else None,
            "recovery_s_total": round(sum(recoveries), 3) if injected else 0.0,
            "takeover_wait_s_mean": round(statistics.mean(waits), 3) if waits else None,
            "takeover_wait_s_max": round(max(waits), 3) if waits else None,
            "takeover_cold": sum(o.final_init_ms is not None for o in takeovers),
            "activation_gb_s": round(activation_gb_s, 3),
            "replica_gb_s": round(replica_gb_s, 3),
            "cost_usd": round((activation_gb_s + replica_gb_s) * PRICE_PER_GB_S, 7),
            "exactly_once": all(f.exactly_once for f in found)
            and sum(f.committed for f in found) == invocations,
        }


def _planned(report: RunReport) -> int:
    """The faults the run's plan aimed at its invocations (``failures``: those that landed; a
    blow timed for a point its attempt had already passed misses)."""
    return sum(f.invocation in report.spec.indices for f in report.spec.plan.faults)


def _takeovers(blocks: list[RunReport]) -> list[Outcome]:
    """The invocations a fault hit whose settling activation was invoked after the hit: the
    attempt that took over (not the hit one, which a zombie or a store restart leaves to commit,
    nor a copy that ran beside it). One each, however many faults hit it."""
    found: dict[tuple[str, int], Outcome] = {}
    for r in blocks:
        for hit in r.injected:
            outcome = r.outcome(hit.invocation)
            invoked = outcome.final_invoked_at
            if invoked is not None and invoked >= hit.at:
                found[r.spec.run_id, hit.invocation] = outcome
    return list(found.values())


def _plan(seed: int, invocations: int, rate: float, copies: int = 1) -> FailurePlan:
    return FailurePlan.random(seed=seed, invocations=invocations, rate=rate, copies=copies)


def _check(rows: list[dict[str, Any]]) -> None:
    bad = [
        f"{r['workload']}/{r['strategy']}/{r['failure_rate']}"
        for r in rows
        if not r["exactly_once"]
    ]
    if bad:
        raise RuntimeError(f"runs not committed exactly once (read from the store): {bad}")


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


# ---- recovery -------------------------------------------------------------------------------


def recovery(
    size: Size,
    progress: Console,
    workloads: Sequence[str] = (),
    passes: int = PASSES,
    params: Sequence[str] = (),
) -> Result:
    """Total execution and recovery time against the failure rate, ideal vs retry vs canary,
    per workload (thesis Figs 6.3, 6.5, 6.6): those named in ``workloads``, or all of them;
    the failure-free run and canary's at 15% take turns in ``passes`` passes (at least two).
    ``params``: ``WORKLOAD.FIELD=VALUE`` options that change a workload's parameters from its
    size's (see :func:`workload_params`)."""
    if passes < PASSES:
        raise ValidationError(f"passes: at least {PASSES} (their spread is the noise): {passes}")
    names = list(workloads or WORKLOADS)
    changed = workload_params(params, names)
    sized = {name: _params(name, size) | changed.get(name, {}) for name in names}
    n = 20 if size == "quick" else 100
    rates = [0.15] if size == "quick" else [0.0, 0.10, 0.15, 0.25, 0.50]
    rows: list[dict[str, Any]] = []
    plans: dict[str, FailurePlan] = {}
    per_workload: dict[str, dict[str, Any]] = {}
    for name in names:
        with open_lab() as lab:
            bench = _Bench(lab, name, sized[name], n, concurrency=1)
            progress.print(f"recovery: {name}: warm-up")
            bench.warm_up()
            # The failure-free run and canary at 15% failures take turns, in passes whose order
            # is mirrored each time: the machine's CPU speed changes by up to half within
            # seconds here, far more than the overhead measured; so it weighs on both alike.
            plan = plans[f"{name}-0.15"] = _plan(1015, n, 0.15)
            turns = [_taking_turns(bench, 0, plan, progress)]
            for rate in rates:
                plan_at = plans.setdefault(
                    f"{name}-{rate:.2f}", _plan(1000 + int(rate * 100), n, rate)
                )
                for strategy in ("canary", "retry") if rate != 0.15 else ("retry",):
                    progress.print(f"recovery: {name}: {strategy} at {rate:.0%} failures")
                    report = bench.run(f"{strategy}-{rate}", strategy, plan_at)
                    rows.append(bench.row(report, strategy, rate))
            turns += [_taking_turns(bench, k, plan, progress) for k in range(1, passes)]
            rows.extend(
                bench.row(blocks, label, rate) for turn in turns for label, rate, blocks in turn
            )
        per_workload[name] = (
            _recovery_figures(
                {
                    r["strategy"]: r
                    for r in rows
                    if r["workload"] == name
                    and r["failure_rate"] == (0.0 if r["strategy"].startswith("ideal") else 0.15)
                },
                passes,
            )
            | _overhead_parts(*turns)
            | _cpu_figures(*turns)
            | {"overhead_ci95": (interval := _overhead_interval(*turns))}
            | {"overhead_verdict": verdict(interval, TARGETS["overhead_vs_ideal"])}
        )
    _check(rows)
    reductions = [w["recovery_time_reduction_vs_retry"] for w in per_workload.values()]
    # None where no failure's recovery could be read (every fault landed after its attempt).
    worst_reduction = None if None in reductions else min(reductions)
    worst_overhead = max(w["overhead_vs_ideal"] for w in per_workload.values())
    summary = {
        "experiment": "recovery",
        "size": size,
        "invocations": n,
        "failure_rate": 0.15,
        "passes": passes,
        "workloads": per_workload,
        "recovery_time_reduction_vs_retry": worst_reduction,
        "overhead_vs_ideal": worst_overhead,
        "targets": TARGETS,
        "met": worst_reduction is not None
        and worst_reduction >= TARGETS["recovery_time_reduction_vs_retry"]
        and worst_overhead <= TARGETS["overhead_vs_ideal"],
        "published": {"recovery_time_reduction_vs_retry": 0.83, "overhead_vs_ideal": 0.14},
        "overhead_undecided": [
            n for n, w in per_workload.items() if w["overhead_verdict"] == UNDECIDED
        ],
    }
    findings = [
        f"{name}: at 15% failures Canary {_recovered(w)} and takes "
        f"{w['overhead_vs_ideal']:+.1%} longer than the failure-free run (its invocations "
        f"{w['ideal_invocation_s']:.2f} s on average; 95% interval "
        f"{w['overhead_ci95'][0]:+.1%} to {w['overhead_ci95'][1]:+.1%}; retry: "
        f"{w['retry_overhead_vs_ideal']:+.1%}); measured {_times(passes)} each, the "
        f"failure-free runs came out {w['ideal_spread']:.1%} apart and canary's "
        f"{w['canary_spread']:.1%}; "
        f"of the overhead, the invocations without failures account for "
        f"{w['overhead_checkpoints']:+.1%} (the checkpoints' cost{_cpu_words(w['cpu_s_mean'])}"
        f"), those with failures for {w['overhead_failures']:+.1%}. "
        f"{_verdict_words(w['overhead_verdict'])}"
        for name, w in per_workload.items()
    ]
    findings += [words for name in names if (words := _takeover_words(name, rows))]
    return Result(
        name="recovery",
        size=size,
        rows=rows,
        summary=summary,
        plans=plans,
        findings=findings,
        setup=[
            *_setup(
                n,
                "one invocation in flight at a time",
                sized,
            ),
            "Each workload's failure-free run and canary's run at 15% failures take turns "
            "invocation by invocation (ideal, canary, canary, ideal, ...; each invocation a run "
            "of its own, canary's on its warm replicas), then retry runs, then both again in "
            f"turns, {passes} passes in all, each in the mirrored order of the one before "
            "(canary, ideal, ideal, canary, ...): this machine's CPU speed changes by up to half "
            "within seconds, and so weighs on both alike. Overhead and canary's recovery time "
            "are the means of the passes, and so is the failure-free invocation's time "
            "(ideal_invocation_s: the sizes are work, so a faster machine makes it shorter and "
            "a checkpoint's or a failure's fixed costs a larger share of it); how far apart the "
            "passes measured (ideal_spread, "
            "canary_spread: the slowest pass over the fastest) is what noise is left. The "
            "overhead is split in two that add up to it: the invocations without failures' "
            "(overhead_checkpoints) and those with failures' (overhead_failures), each over the "
            "failure-free run's time; its 95% interval (overhead_ci95) is a bootstrap over the "
            "pairs of invocations that took turns (those with failures and those without "
            "resampled apart); overhead_verdict says what that interval says of the 5% target: "
            "met or missed (all of it on one side) or undecided (the target inside it). "
            "Between two turns a run waits for the replicas still warming up (a replica that "
            "took over from a killed attempt is replaced): canary's time is that of its "
            "invocations, not of its replicas' warm-ups, which on a cluster run on other "
            "invokers.",
        ],
        plots=[
            Plot(
                "total-time.png",
                "Total execution time",
                "failure_rate",
                "makespan_s",
                "strategy",
                "workload",
                "failure rate",
                "seconds",
            ),
            Plot(
                "recovery-time.png",
                "Mean recovery time per failure",
                "failure_rate",
                "recovery_s_mean",
                "strategy",
                "workload",
                "failure rate",
                "seconds",
                bars=True,
            ),
        ],
        options=(
            *(o for name in workloads for o in ("--workload", name)),
            *(("--passes", str(passes)) if passes != PASSES else ()),
            *_param_options(changed),
        ),
    )


def _takeover_words(name: str, rows: list[dict[str, Any]]) -> str | None:
    """How long the attempts that took over from killed ones waited for a container in a
    workload's runs back to back (a run per failure rate, not the turns: a full run's), and how
    many started one cold; ``None`` without such runs."""
    runs = [
        r
        for r in rows
        if r["workload"] == name
        and r["blocks"] == 1
        and r["strategy"] in ("canary", "retry")
        and r["takeover_wait_s_mean"] is not None
    ]
    canary = [r for r in runs if r["strategy"] == "canary"]
    if not canary:
        return None
    retry = [r for r in runs if r["strategy"] == "retry"]

    def cold(found: list[dict[str, Any]]) -> str:
        return f"{sum(r['takeover_cold'] for r in found)} of {sum(r['failures'] for r in found)}"

    return (
        f"{name}, back to back (a run of its own per failure rate): canary's take-overs waited "
        f"for a container {_listed(canary, 'takeover_wait_s_mean')} s on average at "
        f"{_listed(canary, 'failure_rate', '{:.0%}')} failures (the longest "
        f"{_listed(canary, 'takeover_wait_s_max')} s), and in {cold(canary)} failures the "
        f"take-over started a container cold; retry's in {cold(retry)}."
    )


def _listed(rows: list[dict[str, Any]], key: str, form: str = "{:.2f}") -> str:
    values = [form.format(r[key]) for r in rows]
    return ", ".join(values[:-1]) + " and " + values[-1] if len(values) > 1 else values[0]


def _times(passes: int) -> str:
    return "twice" if passes == 2 else f"{passes} times"


#: An overhead's 95% interval with the target inside it: this run cannot tell met from missed.
UNDECIDED = "undecided"


def verdict(interval: list[float], target: float) -> str:
    """What an overhead's 95% interval says of ``target``: ``met`` (all of it at or under),
    ``missed`` (all of it over) or :data:`UNDECIDED` (the target inside it, where the machine's
    noise hides which side the overhead is on)."""
    low, high = interval
    if high <= target:
        return "met"
    return "missed" if low > target else UNDECIDED


def _verdict_words(found: str) -> str:
    target = f"{TARGETS['overhead_vs_ideal']:.0%} target"
    if found == UNDECIDED:
        return (
            f"The {target} lies inside the interval: at this run's precision it is neither met "
            "nor missed for sure (see `faasdl bench steadiness` for this machine's)."
        )
    return f"The whole interval says the {target} is {found}."


#: A pass of interleaved runs: per label, its failure rate and its blocks.
Turns = list[tuple[str, float, list[RunReport]]]


def pass_labels(k: int) -> tuple[str, str]:
    """The labels of the failure-free run and canary's in the recovery experiment's pass ``k``
    (from 0): ``ideal``/``canary``, then ``…-again``, then ``…-pass3`` and on."""
    suffix = ("", "-again")[k] if k < 2 else f"-pass{k + 1}"
    return f"ideal{suffix}", f"canary{suffix}"


def _taking_turns(bench: _Bench, k: int, plan: FailurePlan, progress: Console) -> Turns:
    """Pass ``k`` of the failure-free run and canary's under ``plan`` taking turns; the odd
    passes in mirrored order."""
    labels = pass_labels(k)
    progress.print(
        f"recovery: {bench.workload}: {labels[0]} and {labels[1]} at 15% failures, taking "
        f"turns ({BLOCK} invocation at a time)"
    )
    ideal, canary = bench.interleaved(labels, plan, canary_first=k % 2 == 1)
    return [(labels[0], 0.0, ideal), (labels[1], 0.15, canary)]


#: Resamples of the bootstrap that gives the overhead's 95% interval (``overhead_ci95``).
RESAMPLES = 4000


def _turned(*passes: Turns) -> Iterator[tuple[RunReport, RunReport]]:
    """The blocks that took turns, as pairs: the failure-free block, canary's."""
    for (_, _, ideal), (_, _, canary) in passes:
        yield from zip(ideal, canary, strict=True)


def _pairs(*passes: Turns) -> dict[str, np.ndarray]:
    """The blocks that took turns as pairs (the failure-free block's time, canary's), those
    without failures (``checkpoints``) and those with (``failures``) apart: arrays of n × 2."""
    pairs: dict[str, list[tuple[float, float]]] = {"checkpoints": [], "failures": []}
    for plain, checkpointed in _turned(*passes):
        part = "failures" if checkpointed.injected else "checkpoints"
        pairs[part].append((plain.makespan_s, checkpointed.makespan_s))
    return {k: np.array(v, dtype=float).reshape(-1, 2) for k, v in pairs.items()}


def _overhead_parts(*passes: Turns) -> dict[str, float]:
    """Canary's overhead over the failure-free run split in two that add up to it: the blocks
    without failures (the checkpoints' own cost) and those with (the failures' cost), each over
    the failure-free run's whole time (both passes summed)."""
    pairs = _pairs(*passes)
    total = sum(float(p[:, 0].sum()) for p in pairs.values())
    return {
        f"overhead_{k}": round(float(p[:, 1].sum() - p[:, 0].sum()) / total, 4)
        for k, p in pairs.items()
    }


def _cpu_figures(*passes: Turns) -> dict[str, dict[str, float | None]]:
    """What CPU the invocations of the blocks without failures took, on average (the pairs
    that make ``overhead_checkpoints``): the function's process's in the failure-free run
    (``ideal``) and in canary's (``canary``), and canary's checkpoint writer's beside it
    (``canary_writer``); ``None`` where no invocation's answer said."""
    answers: dict[str, list[dict[str, Any]]] = {"ideal": [], "canary": []}
    for plain, checkpointed in _turned(*passes):
        if not checkpointed.injected:
            answers["ideal"] += [o.final for o in plain.outcomes]
            answers["canary"] += [o.final for o in checkpointed.outcomes]

    def mean(kind: str, key: str) -> float | None:
        values = [float(a[key]) for a in answers[kind] if a.get(key) is not None]
        return round(statistics.mean(values), 4) if values else None

    return {
        "cpu_s_mean": {
            "ideal": mean("ideal", "cpu_s"),
            "canary": mean("canary", "cpu_s"),
            "canary_writer": mean("canary", "writer_cpu_s"),
        }
    }


def _overhead_interval(*passes: Turns) -> list[float]:
    """A 95% interval of canary's overhead over the failure-free run: a bootstrap
    (percentile) over the pairs of blocks that took turns, resampling those with failures and
    those without apart, so that every resample has as many failures as the plan. What the
    machine's noise leaves of the measurement: a target inside the interval is neither met nor
    missed for sure."""
    strata = [p for p in _pairs(*passes).values() if len(p)]

    def overhead(*picks: np.ndarray) -> float:
        chosen = [p[pick] for p, pick in zip(strata, picks, strict=True)]
        return (
            sum(float(c[:, 1].sum()) for c in chosen) / sum(float(c[:, 0].sum()) for c in chosen)
            - 1
        )

    found = bootstrap(
        [np.arange(len(p)) for p in strata],
        overhead,
        vectorized=False,
        confidence_level=0.95,
        n_resamples=RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(0),
    ).confidence_interval
    return [round(float(found.low), 4), round(float(found.high), 4)]


def _recovery_figures(runs: dict[str, dict[str, Any]], passes: int = PASSES) -> dict[str, Any]:
    """One workload's headline figures at 15% failures from its runs by label. Canary and the
    failure-free run were each measured ``passes`` times: their times are the means. With the
    failure-free invocation's mean time: the overhead's parts are shares of it, and the same
    work takes less of it on a faster machine."""
    ideal, canary = zip(*map(pass_labels, range(passes)), strict=True)

    def mean(key: str, *labels: str) -> float:
        return statistics.mean(float(runs[label][key]) for label in labels)

    def measured(key: str, *labels: str) -> float | None:
        """The mean over the runs of ``labels`` that measured ``key`` (none: ``None``)."""
        values = [float(runs[label][key]) for label in labels if runs[label][key] is not None]
        return statistics.mean(values) if values else None

    def spread(labels: tuple[str, ...]) -> float:
        """How far apart the passes of ``labels`` measured: the slowest over the fastest."""
        times = [float(runs[label]["makespan_s"]) for label in labels]
        return round(max(times) / min(times) - 1, 4)

    ideal_s = mean("makespan_s", *ideal)
    canary_recovery = measured("recovery_s_mean", *canary)
    retry_recovery = runs["retry"]["recovery_s_mean"]
    return {
        "recovery_time_reduction_vs_retry": (
            round(1 - canary_recovery / retry_recovery, 4)
            if canary_recovery is not None and retry_recovery
            else None
        ),
        "overhead_vs_ideal": round(mean("makespan_s", *canary) / ideal_s - 1, 4),
        "retry_overhead_vs_ideal": round(runs["retry"]["makespan_s"] / ideal_s - 1, 4),
        "ideal_invocation_s": round(ideal_s / int(runs[ideal[0]]["invocations"]), 4),
        "ideal_spread": spread(ideal),
        "canary_spread": spread(canary),
        "recovery_s_mean": {
            "retry": runs["retry"]["recovery_s_mean"],
            "canary": round(canary_recovery, 4) if canary_recovery is not None else None,
        },
    }


def _cpu_words(cpu: dict[str, float | None]) -> str:
    """What the CPU figures of the invocations without failures say, in words (nothing where
    an answer lacked one)."""
    if None in cpu.values():
        return ""
    return (
        f"; the function's process took {cpu['canary']:.3f} s of CPU an invocation in them "
        f"against {cpu['ideal']:.3f} s failure-free, its checkpoint writer "
        f"{cpu['canary_writer']:.3f} s beside it"
    )


def _recovered(w: dict[str, Any]) -> str:
    """How much faster than retry canary recovered, in words."""
    reduction, means = w["recovery_time_reduction_vs_retry"], w["recovery_s_mean"]
    if reduction is None:
        return (
            "had no failure whose recovery could be measured in one of the strategies (every "
            "fault landed after its attempt had ended)"
        )
    return (
        f"recovers {reduction:.0%} faster than retry (mean {means['canary']} s against "
        f"{means['retry']} s per failure)"
    )


def _setup(n: int, concurrency: str, workloads: dict[str, dict[str, Any]]) -> list[str]:
    """The setup the experiments whose rows are :meth:`_Bench.row`'s state."""
    sizes = "; ".join(
        f"{name} " + ", ".join(f"{k}={v}" for k, v in _as_run(name, params).items() if k != "seed")
        for name, params in workloads.items()
    )
    return [
        f"{n} invocations per run, {concurrency}, on faasdl's embedded platform (one node); "
        "the state store is SQLite.",
        f"Workload parameters (the seed is the invocation's index): {sizes}.",
        "A failure is a SIGKILL of the attempt's container at a uniformly random point of the "
        "first 90% of its execution (the fraction is drawn per invocation from the plan's seed; "
        "the point in time is that fraction of the invocation's failure-free duration after its "
        "first heartbeat).",
        "Recovery time: from the kill until a later attempt is back at the progress the killed "
        "one had made, as the killed one's own step marks record it (restart, restore and the "
        "work redone); ideal is the failure-free run without checkpoints; retry reruns from the "
        "start in whatever container is free (a "
        "cold one unless its own runs left one warm: the spare replicas other runs warmed are "
        "dropped before a run of a strategy without replicas); canary resumes from the newest "
        "checkpoint on a warm replica. Canary prepares its replicas as it deploys the function: "
        "a run starts once they are warm, and pays for them from then.",
        TAKEOVERS,
    ]


#: What a run's row (:meth:`_Bench.row`) says of the attempts that took over from hit ones.
TAKEOVERS = (
    "takeover_wait_s_mean and takeover_wait_s_max: how long the attempts that took over from "
    "killed ones waited for a container (their activation records' waitTime: canary's waits "
    "for a replica still warming up when the one it had is taken); takeover_cold: in how many "
    "failures the take-over started a container cold (its record has an initTime)."
)


def _shared(name: str, params: dict[str, Any], directory: Path) -> dict[str, Any]:
    """The parameters that put what a run's containers share under ``directory``."""
    found = workload(name)
    return found.shared(found.params.model_validate(params), directory)


def _as_run(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """A workload's parameters as its runs have them (what they share in the lab's directory)."""
    defaults = workload(name).params.model_validate(params).model_dump()
    return defaults | _shared(name, params, Path("<experiment directory>"))


# ---- replication ----------------------------------------------------------------------------


def replication(
    size: Size, progress: Console, params: Sequence[str] = (), passes: int = 1
) -> Result:
    """Time and cost of dynamic, aggressive and lenient replication (thesis Fig 6.8); ``params``
    change the compared workload's parameters (see :func:`workload_params`); ``passes``: how
    many times every run is made (see :func:`_compare`)."""
    compared = _Sized.of(COMPARED, params)
    n = 20 if size == "quick" else 60
    rates = [0.15] if size == "quick" else [0.10, 0.25, 0.50]
    modes: list[ReplicationMode] = ["dynamic", "aggressive", "lenient"]
    rows, plans = _compare(
        compared,
        progress,
        n,
        rates,
        [("canary", m) for m in modes],
        concurrency=2,
        label=lambda s, m: m,
        passes=passes,
    )
    return _compared(
        "replication",
        size,
        rows,
        plans,
        ("dynamic", "dynamic replication", 0.15 if size == "quick" else 0.25),
        _setup(
            n,
            "two invocations in flight (so that the modes keep different numbers of replicas)",
            {compared.name: compared.params},
        ),
        compared.options,
        passes,
    )


# ---- baselines ------------------------------------------------------------------------------


def baselines(size: Size, progress: Console, params: Sequence[str] = (), passes: int = 1) -> Result:
    """Canary against request replication (two copies of every invocation) and active-standby
    (a warm standby per active invocation, no checkpoints), retry for reference (Fig 6.9);
    ``params`` and ``passes`` as :func:`replication`'s."""
    compared = _Sized.of(COMPARED, params)
    n = 20 if size == "quick" else 60
    rates = [0.15] if size == "quick" else [0.15, 0.25, 0.50]
    strategies: list[StrategyName] = ["canary", "request_replication", "active_standby", "retry"]
    rows, plans = _compare(
        compared,
        progress,
        n,
        rates,
        [(s, "dynamic") for s in strategies],
        concurrency=1,
        label=lambda s, m: s,
        passes=passes,
    )
    return _compared(
        "baselines",
        size,
        rows,
        plans,
        ("canary", "Canary", 0.15),
        _setup(
            n,
            "one invocation in flight (request replication runs two copies of it, each "
            "killed at the failure rate independently of the other: both at its square)",
            {compared.name: compared.params},
        ),
        compared.options,
        passes,
    )


def _compared(
    name: str,
    size: Size,
    rows: list[dict[str, Any]],
    plans: dict[str, FailurePlan],
    base: tuple[str, str, float],
    setup: list[str],
    options: tuple[str, ...],
    passes: int = 1,
) -> Result:
    """A strategy comparison's report: time and cost ratios against ``base`` (its row label,
    its name in words, and the failure rate the ratios are read at), made in ``passes``."""
    label, words, rate = base
    summary = _ratios(name, size, rows, label, rate)
    setup, options = _in_passes(passes, setup, options)
    return Result(
        name=name,
        size=size,
        rows=rows,
        summary=summary,
        plans=plans,
        findings=_findings(summary, words),
        setup=setup,
        plots=_cost_time_plots(),
        options=options,
    )


def _in_passes(
    passes: int, setup: list[str], options: tuple[str, ...]
) -> tuple[list[str], tuple[str, ...]]:
    """A comparison's setup and options, saying how it ran where it ran in several passes."""
    if passes == 1:
        return setup, options
    return [*setup, _PASSES_SETUP.format(passes=passes)], ("--passes", str(passes), *options)


_PASSES_SETUP = (
    "Every run was made {passes} times, in passes: the failure-free run, then each strategy at "
    "each failure rate, each pass in the mirrored order of the one before (a change of the "
    "machine's speed weighs on all alike); a row's pass column says which. A ratio is the "
    "geometric mean of the passes' ratios (each to the base strategy's run of the same pass), "
    "with a 95% interval (Student's t over their logarithms: the summary's figures ending "
    "_ci95); the plots show the passes' means."
)


@dataclass(frozen=True)
class _Sized:
    """The workload of an experiment that runs one (:data:`COMPARED`, :data:`LIGHT`) with its
    parameters, those its ``--param`` options changed included, and those options."""

    name: str
    params: dict[str, Any]
    options: tuple[str, ...]

    @classmethod
    def of(cls, workload_and_params: tuple[str, dict[str, Any]], options: Sequence[str]) -> _Sized:
        name, params = workload_and_params
        changed = workload_params(options, [name])
        return cls(name, params | changed.get(name, {}), _param_options(changed))


def _compare(
    compared: _Sized,
    progress: Console,
    n: int,
    rates: list[float],
    variants: list[tuple[StrategyName, ReplicationMode]],
    *,
    concurrency: int,
    label: Callable[[StrategyName, ReplicationMode], str],
    passes: int = 1,
) -> tuple[list[dict[str, Any]], dict[str, FailurePlan]]:
    """The failure-free run and every variant at every rate, ``passes`` times (each pass after
    the first in the mirrored order of the one before; its rows say their ``pass``), then the
    failure-free run once more. Every pass runs the same failure plans."""
    if passes < 1:
        raise ValidationError(f"passes: at least 1: {passes}")
    rows: list[dict[str, Any]] = []
    plans: dict[str, FailurePlan] = {}
    runs: list[tuple[float, StrategyName, ReplicationMode] | None] = [
        None,  # the failure-free run
        *((rate, strategy, mode) for rate in rates for strategy, mode in variants),
    ]
    with open_lab() as lab:
        bench = _Bench(lab, compared.name, compared.params, n, concurrency=concurrency)
        bench.warm_up()
        for k in range(passes):
            # The first pass's run ids are the one-pass run's; then "-pass2" and on.
            suffix = f"-pass{k + 1}" if k else ""
            tag = {"pass": k + 1} if passes > 1 else {}
            for run in runs if k % 2 == 0 else reversed(runs):
                if run is None:
                    rows.append(bench.row(bench.reference(f"ideal{suffix}"), "ideal", 0.0) | tag)
                    continue
                rate, strategy, mode = run
                # Every container fails at the same rate: request replication's second copy
                # too, independently of the first (whose faults are every strategy's).
                copies = RunSpec.copies if strategy == "request_replication" else 1
                key = f"{compared.name}-{rate:.2f}" + (f"-{copies}-copies" if copies > 1 else "")
                plan = plans.setdefault(key, _plan(2000 + int(rate * 100), n, rate, copies))
                name = label(strategy, mode)
                progress.print(
                    f"{name} at {rate:.0%} failures"
                    + (f" (pass {k + 1} of {passes})" if passes > 1 else "")
                )
                report = bench.run(f"{name}-{rate}{suffix}", strategy, plan, replication=mode)
                rows.append(bench.row(report, name, rate) | tag)
        # The same failure-free work again, last: how far apart it comes out is the least
        # difference between the strategies that is one (:func:`_noise`).
        rows.append(bench.row(bench.reference(AGAIN), AGAIN, 0.0))
    _check(rows)
    return rows, plans


#: The label of a comparison's second failure-free run.
AGAIN = "ideal-again"


def _noise(rows: list[dict[str, Any]]) -> dict[str, float]:
    """How far apart a comparison's two failure-free runs (the same work, first and last) came
    out in time and in cost, relatively: a strategy's ratio to another within it is no
    difference the runs can tell."""
    first, again = (next(r for r in rows if r["strategy"] == k) for k in ("ideal", AGAIN))
    return {
        key: round(abs(again[column] / first[column] - 1), 4)
        for key, column in (("time", "makespan_s"), ("cost", "cost_usd"))
    }


def _ratios(
    experiment: str, size: Size, rows: list[dict[str, Any]], base: str, rate: float
) -> dict[str, Any]:
    """Time and cost of every strategy relative to ``base`` at ``rate``: in each pass, against
    the base's run of that pass; the passes' ratios' geometric mean, and where there were
    several passes each ratio's 95% interval and the passes' ratios themselves."""
    passes = _by_pass(rows, rate)
    names = list(passes[1])

    def per_pass(column: str) -> dict[str, list[float | None]]:
        return {
            k: [_ratio(at[k][column], at[base][column]) for at in passes.values()] for k in names
        }

    summary: dict[str, Any] = {
        "experiment": experiment,
        "size": size,
        "failure_rate": rate,
        "relative_to": base,
    }
    found = {key: per_pass(column) for key, column in _RATIOS.items()}
    for key, ratios in found.items():
        summary[key] = {k: _mean_ratio(v) for k, v in ratios.items()}
    summary["noise"] = _noise(rows)
    if len(passes) > 1:
        summary["passes"] = len(passes)
        for key in ("time_ratio", "cost_ratio"):
            summary[f"{key}_ci95"] = {k: _t_interval(v) for k, v in found[key].items()}
            summary[f"{key}_passes"] = found[key]
    return summary


def _by_pass(rows: list[dict[str, Any]], rate: float) -> dict[int, dict[str, dict[str, Any]]]:
    """A comparison's rows at ``rate`` by pass (1 where it ran one), each pass's by label."""
    passes: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["failure_rate"] == rate:
            passes.setdefault(r.get("pass", 1), {})[r["strategy"]] = r
    return passes


#: A comparison's ratios (summary key) and the row's column each is of.
_RATIOS = {
    "time_ratio": "makespan_s",
    "cost_ratio": "cost_usd",
    "recovery_ratio": "recovery_s_mean",
}


def _mean_ratio(ratios: list[float | None]) -> float | None:
    """The passes' ratios' geometric mean (the mean a ratio has: 0.5 and 2 average to 1);
    ``None`` if a pass had none (nothing to divide)."""
    if any(r is None for r in ratios):
        return None
    return round(statistics.geometric_mean(r for r in ratios if r is not None), 4)


def _t_interval(ratios: list[float | None]) -> list[float] | None:
    """A 95% interval of the passes' ratios' geometric mean: Student's t over their logarithms
    (for as few passes as they are), taken back; ``None`` if a pass had no ratio, or for one."""
    logs = [math.log(r) for r in ratios if r is not None]
    if len(logs) < max(len(ratios), 2):
        return None
    half = float(t_dist.ppf(0.975, len(logs) - 1)) * statistics.stdev(logs) / len(logs) ** 0.5
    centre = statistics.mean(logs)
    return [round(math.exp(centre - half), 4), round(math.exp(centre + half), 4)]


#: A strategy's time and cost against another's, in words: better (-1), even (0), worse (1).
_SIDES = {
    "time": {-1: "faster", 0: "even", 1: "slower"},
    "cost": {-1: "cheaper", 0: "even", 1: "dearer"},
}


def _findings(summary: dict[str, Any], base: str) -> list[str]:
    """Each strategy against ``base``, in time and in cost: better, worse or even. With passes,
    a ratio is even where its 95% interval holds 1; with one, where it is within the noise (how
    far apart the two failure-free runs came out)."""
    noise = summary["noise"]
    intervals: dict[str, dict[str, list[float] | None]] = {
        k: summary.get(f"{k}_ratio_ci95") or {} for k in ("time", "cost")
    }
    out = []
    for name, time_ratio in summary["time_ratio"].items():
        if name == summary["relative_to"] or time_ratio is None:
            continue
        ratios = {"time": time_ratio, "cost": summary["cost_ratio"][name]}
        # Per aspect: -1 where the other strategy is better beyond the noise (or its interval
        # lies wholly under 1), 1 where worse.
        sides: dict[str, int] = {}
        why: dict[str, str] = {}  # what the side was told by
        for k, r in ratios.items():
            interval = intervals[k].get(name)
            if interval is not None:
                low, high = interval
                sides[k] = (low > 1) - (high < 1)
                why[k] = f"95% interval [{low:.3f}, {high:.3f}]"
                if not sides[k]:
                    why[k] = f"its {why[k]} holds 1"
            else:
                sides[k] = (r > 1 + noise[k]) - (r < 1 - noise[k])
                why[k] = "" if sides[k] else f"within the {noise[k]:.1%} noise"
        told = [
            f"{ratios[k]:.3f}× the {k} ({_SIDES[k][sides[k]]}"
            + (f": {why[k]}" if why[k] else "")
            + ")"
            for k in ("time", "cost")
        ]
        clauses = [
            template.format(" and ".join(k for k, side in sides.items() if side == wanted))
            for wanted, template in (
                (-1, "**loses on {}**"),
                (1, "wins on {}"),
                (0, "is even on {}"),
            )
            if wanted in sides.values()
        ]
        verdict = f"{base} {', '.join(clauses)}"
        out.append(
            f"{name}: {told[0]} and {told[1]} of {summary['relative_to']} at "
            f"{summary['failure_rate']:.0%} failures — {verdict}."
        )
    noise_words = (
        f"The noise is how far apart the two failure-free runs of the same work, first and "
        f"last, came out: {noise['time']:.1%} in time, {noise['cost']:.1%} in cost; "
    )
    if "passes" in summary:
        noise_words += (
            f"each ratio is the geometric mean of its {summary['passes']} passes' ratios, "
            "called even where its 95% interval holds 1."
        )
    else:
        noise_words += "a ratio within it is called even."
    return [*out, noise_words]


def _cost_time_plots() -> list[Plot]:
    return [
        Plot(
            "time.png",
            "Total execution time",
            "failure_rate",
            "makespan_s",
            "strategy",
            None,
            "failure rate",
            "seconds",
            bars=True,
        ),
        Plot(
            "cost.png",
            "Cost (activations and replicas)",
            "failure_rate",
            "cost_usd",
            "strategy",
            None,
            "failure rate",
            "USD",
            bars=True,
        ),
    ]


# ---- cost -----------------------------------------------------------------------------------


def cost(size: Size, progress: Console, params: Sequence[str] = (), passes: int = 1) -> Result:
    """Dollar cost at 0.000017 USD per GB·s, replicas included, against the failure rate for
    ideal, retry and canary (thesis Fig 6.7); ``params`` and ``passes`` as
    :func:`replication`'s."""
    compared = _Sized.of(COMPARED, params)
    n = 20 if size == "quick" else 60
    rates = [0.15] if size == "quick" else [0.0, 0.15, 0.25, 0.50]
    rows, plans = _compare(
        compared,
        progress,
        n,
        rates,
        [("retry", "dynamic"), ("canary", "dynamic")],
        concurrency=1,
        label=lambda s, m: s,
        passes=passes,
    )
    at = _by_pass(rows, 0.15)
    ideal = {k: p["ideal"] for k, p in _by_pass(rows, 0.0).items() if k in at}
    canary = [p["canary"] for p in at.values()]
    # Canary's cost over retry's and over the failure-free run's, pass by pass.
    to_retry = [_ratio(p["canary"]["cost_usd"], p["retry"]["cost_usd"]) for p in at.values()]
    to_ideal = [_ratio(at[k]["canary"]["cost_usd"], ideal[k]["cost_usd"]) for k in at]
    versus_retry, versus_ideal = _mean_ratio(to_retry), _mean_ratio(to_ideal)
    if versus_retry is None or versus_ideal is None:
        raise RuntimeError(f"a run cost nothing: no ratio to take ({to_retry}, {to_ideal})")

    def usd(runs: list[dict[str, Any]]) -> float:
        return round(statistics.mean(float(r["cost_usd"]) for r in runs), 7)

    summary: dict[str, Any] = {
        "experiment": "cost",
        "size": size,
        "price_per_gb_s": PRICE_PER_GB_S,
        "failure_rate": 0.15,
        "cost_usd": {k: usd([p[k] for p in at.values()]) for k in at[1]}
        | {"ideal": usd(list(ideal.values()))},
        "replica_share_of_canary_cost": round(
            sum(r["replica_gb_s"] for r in canary)
            / sum(r["replica_gb_s"] + r["activation_gb_s"] for r in canary),
            4,
        ),
        "cost_reduction_vs_retry": round(1 - versus_retry, 4),
        "cost_overhead_vs_ideal": round(versus_ideal - 1, 4),
        "published": {"cost_reduction_vs_retry": 0.12, "cost_overhead_vs_ideal": 0.08},
        "noise": _noise(rows),
    }
    findings = [
        f"At 15% failures Canary costs {summary['cost_usd']['canary']} USD against retry's "
        f"{summary['cost_usd']['retry']} ({summary['cost_reduction_vs_retry']:+.1%} saved) and "
        f"the failure-free run's {summary['cost_usd']['ideal']} "
        f"({summary['cost_overhead_vs_ideal']:+.1%}); warm replicas are "
        f"{summary['replica_share_of_canary_cost']:.1%} of Canary's bill.",
        f"The failure-free work, run again last, cost {summary['noise']['cost']:.1%} apart from "
        "its first run: a difference within that is noise.",
    ]
    if passes > 1:
        summary["passes"] = passes
        summary["cost_reduction_vs_retry_ci95"] = [
            round(1 - r, 4) for r in reversed(_t_interval(to_retry) or [])
        ]
        summary["cost_overhead_vs_ideal_ci95"] = [
            round(r - 1, 4) for r in _t_interval(to_ideal) or []
        ]
        low, high = summary["cost_reduction_vs_retry_ci95"]
        over_low, over_high = summary["cost_overhead_vs_ideal_ci95"]
        findings.append(
            f"Over the {passes} passes (the costs above are their means; the saving and the "
            "overhead the geometric means of the passes' ratios): the saving's 95% interval is "
            f"{low:+.1%} to {high:+.1%}, the overhead's {over_low:+.1%} to {over_high:+.1%}."
        )
    setup, options = _in_passes(
        passes,
        [
            *_setup(n, "one invocation in flight at a time", {compared.name: compared.params}),
            "Cost: each activation's duration × its memory limit, plus the memory the warm "
            f"replicas held while wanted, at {PRICE_PER_GB_S} USD per GB·s.",
        ],
        compared.options,
    )
    return Result(
        name="cost",
        size=size,
        rows=rows,
        summary=summary,
        plans=plans,
        findings=findings,
        setup=setup,
        plots=_cost_time_plots()[1:],
        options=options,
    )


# ---- scale ----------------------------------------------------------------------------------


def scale(size: Size, progress: Console, params: Sequence[str] = ()) -> Result:
    """Increasing invocations and workers at 15% failures, retry against canary, and one large
    run of a light workload checked unit by unit from the store (thesis Figs 6.10, 6.11);
    ``params`` change the light workload's parameters (see :func:`workload_params`)."""
    light = _Sized.of(LIGHT, params)
    name, params_of = light.name, light.params
    sizes = [50, 100] if size == "quick" else [200, 400, 800, 1000]
    large = 250 if size == "quick" else 5000
    found = workload(name)
    typed = found.params.model_validate(params_of)
    context_cache: dict[int, str] = {}

    def expected(n: int) -> dict[int, str]:
        for i in range(len(context_cache), n):
            p = typed.model_copy(update={"seed": i})
            context_cache[i] = run_steps(found, p, found.context(p)).result()
        return {i: context_cache[i] for i in range(n)}

    rows: list[dict[str, Any]] = []
    plans: dict[str, FailurePlan] = {}
    with open_lab() as lab:
        bench = _Bench(lab, name, params_of, sizes[0], concurrency=2)
        bench.warm_up()
        bench.reference()  # the failure-free durations the faults are timed by
        for n in sizes:
            plan = plans[f"{name}-{n}"] = _plan(3000 + n, n, 0.15)
            variants: list[tuple[StrategyName, int]] = [("retry", 2), ("canary", 1), ("canary", 2)]
            for strategy, workers in variants:
                progress.print(f"scale: {n} invocations, {strategy}, {workers} in flight")
                report = bench.run(
                    f"{strategy}-{workers}-{n}", strategy, plan, invocations=n, concurrency=workers
                )
                read = ledger(lab.store, report.spec.run_id, expected(n))
                rows.append(_scale_row(report, read, strategy, workers))
        progress.print(f"scale: {large} invocations with canary, 2 in flight, 15% failures")
        plan = plans[f"{name}-{large}"] = _plan(3000 + large, large, 0.15)
        reset_peak_rss()
        cpu, wall = time.process_time(), time.perf_counter()
        report = bench.run(
            f"canary-large-{large}", "canary", plan, invocations=large, concurrency=2
        )
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        peak = peak_rss_mb()
        checked = ledger(lab.store, report.spec.run_id, expected(large))
        big = _scale_row(report, checked, "canary", 2)
        rows.append(big)
    if not all(r["exactly_once"] for r in rows):
        raise RuntimeError("a scale run was not committed exactly once (read from the store)")
    summary = {
        "experiment": "scale",
        "size": size,
        "large_run": {
            "invocations": large,
            "failures": big["failures"],
            "attempts": checked.attempts,
            "units_in_store": checked.units,
            "committed": checked.committed,
            "wrong_results": len(checked.wrong),
            "missing": len(checked.missing),
            "exactly_once": checked.exactly_once and checked.committed == large,
            "makespan_s": big["makespan_s"],
            "controller_peak_rss_mb": round(peak, 1),
            "controller_cpu_s": round(cpu, 2),
            "controller_cpu_share": round(cpu / wall, 3),
        },
    }
    findings = [
        f"{large} invocations, {big['failures']} killed: {checked.committed} units committed "
        f"in the store, each once with its failure-free result ({checked.attempts} attempts); "
        f"the controlling process peaked at {peak:.0f} MB and used {cpu:.1f} s of CPU in "
        f"{wall:.0f} s.",
        "Kills that landed, of those planned (a blow timed for a point its invocation had "
        "already passed misses): "
        + "; ".join(
            f"{r['series']}, {r['invocations']}: {r['failures']} of {r['planned']}" for r in rows
        )
        + ".",
    ]
    return Result(
        name="scale",
        size=size,
        rows=rows,
        summary=summary,
        plans=plans,
        findings=findings,
        setup=[
            f"The light workload: {name} with {params_of} ({found.steps(typed)} steps an "
            "invocation; by default a BFS of 8,191 vertices).",
            "The controlling process is the experiment's own: its runner (the controller's part "
            "for these invocations), the runtime manager and the embedded platform's invoker "
            "threads; the containers are other processes and are not counted. Peak RSS is the "
            "process's high-water mark, reset before the large run.",
        ],
        options=light.options,
        plots=[
            Plot(
                "recovery-time.png",
                "Total recovery time",
                "invocations",
                "recovery_s_total",
                "series",
                None,
                "invocations",
                "seconds",
            ),
            Plot(
                "time.png",
                "Total execution time",
                "invocations",
                "makespan_s",
                "series",
                None,
                "invocations",
                "seconds",
            ),
        ],
    )


def _scale_row(report: RunReport, found: Ledger, strategy: str, workers: int) -> dict[str, Any]:
    recovered = [o.latency_s for o in report.outcomes if o.failures]
    clean = statistics.median(o.latency_s for o in report.outcomes if not o.failures)
    return {
        "series": f"{strategy}, {workers} in flight",
        "strategy": strategy,
        "workers": workers,
        "invocations": report.spec.invocations,
        "planned": _planned(report),
        "failures": len(report.injected),
        "attempts": found.attempts,
        "makespan_s": round(report.makespan_s, 3),
        # A failed invocation's latency beyond a failure-free one's (the median of the run's).
        "recovery_s_total": round(sum(max(r - clean, 0.0) for r in recovered), 3),
        "cost_usd": round((report.activation_gb_s + report.replica_gb_s) * PRICE_PER_GB_S, 7),
        "exactly_once": found.exactly_once and found.committed == report.spec.invocations,
    }


class Experiment(Protocol):
    """``faasdl experiment NAME``'s function: a report of the ``size`` asked, progress on
    ``progress``; ``params``: ``--param`` options (:func:`workload_params`) of its workloads."""

    def __call__(self, size: Size, progress: Console, *, params: Sequence[str] = ()) -> Result: ...


#: The strategy comparisons that run in passes (``--passes``): name → function (size,
#: progress, params, passes).
COMPARISONS = {"replication": replication, "baselines": baselines, "cost": cost}
#: The experiments ``--passes`` is for, in the order the CLI names them.
PASSES_TAKEN = ("recovery", *COMPARISONS)


def experiment_workloads(name: str, workloads: Sequence[str] = ()) -> list[str]:
    """The workloads experiment ``name`` runs (recovery: ``workloads``, or all four), whose
    parameters ``--param`` options may change; none for disdel (training jobs)."""
    if name == "recovery":
        return list(workloads or WORKLOADS)
    return {"scale": [LIGHT[0]], "disdel": []}.get(name, [COMPARED[0]])


EXPERIMENTS: dict[str, Experiment] = {
    "recovery": recovery,
    "replication": replication,
    "baselines": baselines,
    "scale": scale,
    "cost": cost,
    "disdel": disdel,
}
