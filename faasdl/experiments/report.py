"""An experiment's report: a CSV of its rows, PNG plots, the failure plans it used, and a Markdown
summary with the exact command and the environment it ran in. Written whole into a fresh
directory that replaces the old one only at the end (a failed run leaves the old report)."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from faasdl.errors import ValidationError
from faasdl.experiments.inject import FailurePlan
from faasdl.provenance import environment

#: An experiment's size: minutes on 2 cores (CI's smoke test), or the thesis-sized run.
Size = Literal["quick", "full"]


@dataclass(frozen=True)
class Plot:
    """A figure of ``y`` against ``x``, one line (or group of bars) per value of ``series``, one
    panel per value of ``panel`` (if any), from the rows that have all of them (the mean of the
    rows that share an ``x``, a series and a panel)."""

    file: str
    title: str
    x: str
    y: str
    series: str
    panel: str | None = None
    xlabel: str = ""
    ylabel: str = ""
    bars: bool = False


@dataclass
class Result:
    name: str
    size: Size
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    plots: list[Plot] = field(default_factory=list)
    #: Findings in words, where faasdl loses included.
    findings: list[str] = field(default_factory=list)
    plans: dict[str, FailurePlan] = field(default_factory=dict)
    #: What differs from the thesis' setup, said once.
    setup: list[str] = field(default_factory=list)
    #: The run's options beyond its size, each with its value (``("--workload", "training")``):
    #: they are in its command, and name its report (``recovery-training``, ``recovery-passes8``),
    #: which sits beside the whole experiment's as the default run made it.
    options: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        """The command that regenerates the report."""
        return " ".join(["faasdl experiment", self.name, f"--{self.size}", *self.options])

    @property
    def report_name(self) -> str:
        """The report's directory (and CSV's) name."""
        pairs = zip(self.options[::2], self.options[1::2], strict=True)
        return "-".join([self.name, *(_named(o, v) for o, v in pairs)])


def _named(option: str, value: str) -> str:
    """An option's part of a report's name: ``training``, ``passes8``, ``training.epochs-8``."""
    if option == "--workload":
        return value
    if option == "--param":  # as the command quotes it (shlex), unquoted
        return re.sub(r"[^A-Za-z0-9._-]", "_", shlex.split(value)[0].replace("=", "-", 1))
    return f"{option.removeprefix('--')}{value}"


def check_writable(directory: Path) -> list[Path]:
    """Make ``directory`` if need be and write a file in it, before an experiment runs for
    minutes only to fail at :func:`write`; the folders it made, deepest first (for
    :func:`unmake`). Raises ``ValidationError`` naming ``--output``."""
    made = [p for p in (directory, *directory.parents) if not os.path.isdir(p)]
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ValidationError(
            f"{directory}: cannot write a report there: {reason}", field="--output"
        ) from exc
    return made


def unmake(made: list[Path]) -> None:
    """Remove the folders :func:`check_writable` made, deepest first, while they are empty: an
    experiment that did not finish leaves none behind."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): what is in it stays
            return


def write(result: Result, directory: Path) -> Path:
    """Write the report into ``directory/<report name>`` (replaced whole); returns that
    directory."""
    name = result.report_name
    target = directory / name
    staging = directory / f".{name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _csv(result.rows, staging / f"{name}.csv")
    if result.plans:
        (staging / "plans").mkdir()
    for label, plan in result.plans.items():
        plan.write(staging / "plans" / f"{label}.json")
    for plot in result.plots:
        _plot(plot, result.rows, staging / plot.file)
    (staging / "summary.md").write_text(_markdown(result))
    (staging / "summary.json").write_text(json.dumps(result.summary, indent=1) + "\n")
    old = directory / f".{name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def _csv(rows: list[dict[str, Any]], path: Path) -> None:
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, columns)
        writer.writeheader()
        writer.writerows(rows)


def _plot(plot: Plot, rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    used = [plot.x, plot.y, plot.series, *([plot.panel] if plot.panel else [])]
    rows = [r for r in rows if all(r.get(k) is not None for k in used)]
    panels = sorted({r[plot.panel] for r in rows}, key=str) if plot.panel else [None]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.2 * len(panels) + 1, 3.6), squeeze=False, sharey=False
    )
    for ax, panel in zip(axes[0], panels, strict=True):
        mine = [r for r in rows if plot.panel is None or r[plot.panel] == panel]
        series = list(dict.fromkeys(r[plot.series] for r in mine))
        xs = list(dict.fromkeys(r[plot.x] for r in mine))
        width = 0.8 / max(len(series), 1)
        for k, name in enumerate(series):
            points = _means([(r[plot.x], r[plot.y]) for r in mine if r[plot.series] == name])
            if plot.bars:
                ax.bar(
                    [xs.index(x) + (k - (len(series) - 1) / 2) * width for x, _ in points],
                    [y for _, y in points],
                    width,
                    label=str(name),
                )
            else:
                ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=str(name))
        if plot.bars:
            ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.set_title(f"{plot.title}" + (f": {panel}" if panel is not None else ""), fontsize=10)
        ax.set_xlabel(plot.xlabel or plot.x)
        ax.set_ylabel(plot.ylabel or plot.y)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _means(points: list[tuple[Any, float]]) -> list[tuple[Any, float]]:
    """One point per ``x``: the mean of its ``y`` values (a run made in several passes has a
    row per pass), in the order the ``x`` values first came."""
    found: dict[Any, list[float]] = {}
    for x, y in points:
        found.setdefault(x, []).append(y)
    return [(x, statistics.mean(ys)) for x, ys in found.items()]


def _markdown(result: Result) -> str:
    env = environment()
    given = env.pop("settings")
    env["FAASDL_ variables"] = " ".join(f"{k}={shlex.quote(v)}" for k, v in given.items()) or "none"
    csv_name = f"{result.report_name}.csv"
    columns: list[str] = []
    for row in result.rows:
        columns.extend(k for k in row if k not in columns)
    lines = [
        f"# Experiment `{result.name}`",
        "",
        "Regenerate with:",
        "",
        f"    {result.command}",
        "",
        "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()) + ".",
        "",
    ]
    if result.setup:
        lines += ["## Setup", "", *(f"- {s}" for s in result.setup), ""]
    if result.findings:
        lines += ["## Findings", "", *(f"- {s}" for s in result.findings), ""]
    lines += ["## Headline figures", "", "```json", json.dumps(result.summary, indent=1), "```", ""]
    for plot in result.plots:
        lines += [f"![{plot.title}]({plot.file})", ""]
    lines += [
        "## Every run",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in result.rows),
        "",
        f"Data: [`{csv_name}`]({csv_name})"
        + ("; failure plans (seeded, replayable): [`plans/`](plans/)." if result.plans else "."),
        "",
    ]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
