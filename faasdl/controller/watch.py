"""``--watch``: a job's progress in the terminal, from its record, until it ends.

Rounds as one bar, the current round's units as one bar each (pending, running, committed, with
their attempts), and every line of the job's log as it appears: failures and recoveries included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table

#: How often the job is read while it runs.
POLL_S = 0.5
_UNIT_DONE = {"pending": 0, "running": 1, "failed": 1, "committed": 2}
_STYLE = {
    "unit_failed": "bold red",
    "recovery": "yellow",
    "limits_raised": "yellow",
    "staging_waits": "yellow",
    "failed": "bold red",
    "cancelled": "yellow",
    "done": "bold green",
}


def watch(read: Callable[[], dict[str, Any]], console: Console) -> dict[str, Any]:
    """Follow the job ``read()`` returns (its API view) until it ends; return its last view."""
    rounds = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}")
    )
    units = Progress(
        TextColumn("  {task.description}"),
        BarColumn(bar_width=20),
        TextColumn("{task.fields[info]}"),
    )
    view = read()
    total = view["job"]["plan"]["rounds"]
    overall = rounds.add_task("rounds", total=total, info="")
    bars: dict[int, TaskID] = {}
    printed = 0  # the job's log lines printed, counted from its first (the record keeps the last)
    with Live(Group(rounds, units), console=console, refresh_per_second=4, transient=False) as live:
        while True:
            job = view["job"]
            dropped = job.get("events_dropped", 0)  # absent from a controller before it
            for event in job["events"][max(0, printed - dropped) :]:
                style = _STYLE.get(event["kind"], "dim")
                live.console.print(f"[{style}]{event['kind']:>15}[/] {event['message']}")
            printed = dropped + len(job["events"])
            last = job["rounds"][-1] if job["rounds"] else None
            info = (
                f"loss {last['loss']:.4f}  accuracy {last['accuracy']:.4f}  "
                if last
                else f"queue position {view['queue_position']}  "
                if view["queue_position"]
                else ""
            )
            rounds.update(overall, completed=job["round"], info=f"{info}${job['cost_usd']:.6f}")
            for unit in view["units"]:
                shard = unit["shard"]
                if shard not in bars:
                    bars[shard] = units.add_task(f"shard {shard}", total=2, info="")
                units.update(
                    bars[shard],
                    completed=_UNIT_DONE.get(unit["state"], 0),
                    info=f"round {unit['round'] + 1}  {unit['state']}  attempt {unit['attempts']}",
                )
            if job["state"] in ("done", "failed", "cancelled"):
                return view
            time.sleep(POLL_S)
            view = read()


def summary(view: dict[str, Any], ledger: list[dict[str, Any]]) -> Table:
    """The finished job: its rounds, and what its activations (its ``ledger``) used."""
    job = view["job"]
    table = Table(title=f"job {job['job_id']}: {job['state']}")
    for column in ("round", "epochs", "train loss", "test loss", "test accuracy", "seconds"):
        table.add_column(column, justify="right")
    for r in job["rounds"]:
        table.add_row(
            str(r["round"] + 1),
            str(r["epochs"]),
            f"{r['loss']:.4f}",
            f"{r['test_loss']:.4f}",
            f"{r['accuracy']:.4f}",
            f"{(r['finished_ms'] - r['started_ms']) / 1000:.1f}",
        )
    failed = sum(a["outcome"] != "success" for a in ledger)
    table.caption = (
        f"{len(ledger)} activations ({failed} failed and recovered), "
        f"{sum(a['gb_s'] for a in ledger):.1f} GB·s, ${job['cost_usd']:.6f}"
        + (f"; error: {job['error']}" if job["error"] else "")
    )
    return table
