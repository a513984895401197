"""``--watch``: a job's progress in the terminal, from its record, until it ends.

Rounds as one bar, the current round's units as one bar each (pending, running, committed, with
their attempts), and every line of the job's log as it appears: failures and recoveries included.
A controller that stops answering (a restart) is asked again for a while: the job goes on
without the watch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from faasdl.controller.client import ENDED
from faasdl.errors import PlatformUnavailable
from faasdl.store.records import LedgerTotals
from faasdl.training.models import model_called

#: How often the job is read while it runs.
POLL_S = 0.5
#: The rounds a finished job's summary lists, its latest: every round of a long job would be
#: screens of rows (its JSON lists them all, and ``faasdl status --rounds 0`` does).
SUMMARY_ROUNDS = 20
_UNIT_DONE = {"pending": 0, "running": 1, "failed": 1, "committed": 2}
_STYLE = {
    "unit_failed": "bold red",
    "recovery": "yellow",
    "limits_raised": "yellow",
    "staging_waits": "yellow",
    "resumed": "yellow",
    "platform_retried": "yellow",
    "paused": "yellow",
    "failed": "bold red",
    "cancelled": "yellow",
    "done": "bold green",
}


def watch(
    read: Callable[[int], dict[str, Any]], console: Console, *, reconnect_s: float = 120.0
) -> dict[str, Any]:
    """Follow the job ``read(round_from)`` returns (its API view, with its rounds from that one
    on) until it ends; return its last view, with every round. A ``read`` that raises
    ``PlatformUnavailable`` (the controller unreachable, or answering 502-504) is tried again
    for up to ``reconnect_s`` seconds, saying so, before it is raised."""
    view = _read_through_outages(read, 0, console, reconnect_s)
    picture = _Picture(rounds=view["job"]["plan"]["rounds"])
    latest = 0
    try:
        with Live(picture.group, console=console, refresh_per_second=4, transient=False) as live:
            while True:
                picture.show(view, live.console)
                if view["job"]["state"] in ENDED:
                    if latest == 0:
                        return view
                    return _read_through_outages(read, 0, live.console, reconnect_s)
                time.sleep(POLL_S)
                # The last finished round is all the picture shows of the rounds: a long job's
                # are not read again at each look.
                latest = max(0, view["job"]["round"] - 1)
                view = _read_through_outages(read, latest, live.console, reconnect_s)
    finally:
        if not console.is_terminal:
            console.line()  # Live ends its last picture with a newline on a terminal only


class _Picture:
    """The watch's bars: the rounds, and each unit of the current round."""

    def __init__(self, *, rounds: int) -> None:
        self.rounds = Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}")
        )
        self.units = Progress(
            TextColumn("  {task.description}"),
            BarColumn(bar_width=20),
            TextColumn("{task.fields[info]}"),
        )
        self.group = Group(self.rounds, self.units)
        self.overall = self.rounds.add_task("rounds", total=rounds, info="")
        self.bars: dict[int, TaskID] = {}
        self.printed = 0  # the job's log lines printed, from its first (its record keeps the last)
        self.waiting: str | None = None  # what the queued job waits for, as last said

    def show(self, view: dict[str, Any], console: Console) -> None:
        """Print the log lines of ``view``'s job not yet printed, and set the bars to it."""
        job = view["job"]
        dropped = job.get("events_dropped", 0)  # absent from a controller before it
        for event in job["events"][max(0, self.printed - dropped) :]:
            style = _STYLE.get(event["kind"], "dim")
            console.print(f"[{style}]{event['kind']:>15}[/] {escape(event['message'])}")
        self.printed = dropped + len(job["events"])
        waiting = view.get("waiting_for")  # absent from a controller before it
        if waiting and waiting != self.waiting:
            console.print(f"[yellow]{'waiting':>15}[/] for {escape(str(waiting))}", highlight=False)
        self.waiting = waiting
        last = job["rounds"][-1] if job["rounds"] else None
        info = (
            f"loss {last['loss']:.4f}  accuracy {last['accuracy']:.4f}  "
            if last
            else f"queue position {view['queue_position']}  "
            if view["queue_position"]
            else ""
        )
        self.rounds.update(
            self.overall, completed=job["round"], info=f"{info}${job['cost_usd']:.6f}"
        )
        if job["state"] in ENDED:
            # No round in progress: its units' bars would say what the last look saw (a unit
            # running, of a round since finished).
            for bar in self.bars.values():
                self.units.remove_task(bar)
            self.bars.clear()
            return
        for unit in view["units"]:
            shard = unit["shard"]
            if shard not in self.bars:
                self.bars[shard] = self.units.add_task(f"shard {shard}", total=2, info="")
            self.units.update(
                self.bars[shard],
                completed=_UNIT_DONE.get(unit["state"], 0),
                info=f"round {unit['round'] + 1}  {unit['state']}  attempt {unit['attempts']}",
            )


def _read_through_outages(
    read: Callable[[int], dict[str, Any]], round_from: int, console: Console, reconnect_s: float
) -> dict[str, Any]:
    """``read(round_from)``, tried again while the controller is unavailable, for up to
    ``reconnect_s`` seconds (waits growing from 0.25 s to 2 s); the outage and its end are said
    once each."""
    began: float | None = None

    def say_once(state: RetryCallState) -> None:
        nonlocal began
        if began is None:
            began = time.monotonic()
            error = state.outcome.exception() if state.outcome else None
            console.print(
                f"[yellow]{'unreachable':>15}[/] {escape(str(error))}; asking again for up to "
                f"{reconnect_s:g} s (FAASDL_CLIENT__RECONNECT_S): the job goes on without "
                "this watch",
                highlight=False,
            )

    retrying = Retrying(
        retry=retry_if_exception_type(PlatformUnavailable),
        stop=stop_after_delay(reconnect_s),
        wait=wait_exponential(multiplier=0.25, max=2.0),
        before_sleep=say_once,
        reraise=True,
    )
    view: dict[str, Any] = retrying(read, round_from)
    if began is not None:
        console.print(
            f"[yellow]{'reconnected':>15}[/] after {time.monotonic() - began:.1f} s",
            highlight=False,
        )
    return view


def progress(view: dict[str, Any]) -> str | None:
    """Where a running job is, in a line: its round, its units' states and its last log line."""
    job = view["job"]
    if job["state"] != "running":
        return None
    states = [u["state"] for u in view["units"]]
    units = ", ".join(f"{states.count(s)} {s}" for s in _UNIT_DONE if s in states)
    line = f"round {job['round'] + 1}/{job['plan']['rounds']}: {units or 'no units yet'}"
    if job["events"]:
        line += f"; last: {job['events'][-1]['kind']} {job['events'][-1]['message']}"
    return line


def needs_ledger(view: dict[str, Any]) -> bool:
    """Whether :func:`summary` of the job needs its ledger: its record keeps the ledger's totals,
    but one from before they were kept does not."""
    return view["job"].get("ledger_totals") is None


def summary(
    view: dict[str, Any],
    ledger: list[dict[str, Any]] | None = None,
    *,
    rounds: int = SUMMARY_ROUNDS,
) -> Table:
    """The finished job: its latest ``rounds`` rounds (0: every one), and what its activations
    used (the totals its record keeps; its ``ledger``'s, where :func:`needs_ledger`)."""
    job = view["job"]
    if not needs_ledger(view):
        count, totals = job["activation_count"], LedgerTotals.model_validate(job["ledger_totals"])
    elif ledger is not None:
        count, totals = len(ledger), LedgerTotals.of((a["outcome"], a["gb_s"]) for a in ledger)
    else:
        raise ValueError(
            f"job {job['job_id']}'s record keeps no totals: its summary needs its ledger"
        )
    named = f" ({job['spec']['name']})" if job["spec"].get("name") else ""
    table = Table(title=escape(f"job {job['job_id']}{named}: {job['state']}"))
    listed = job["rounds"][-rounds:] if rounds else job["rounds"]
    validated = any(r.get("validation_loss") is not None for r in listed)
    columns = ["round", "epochs", "train loss", "test loss", "test accuracy", "seconds"]
    if validated:  # a job that holds out a validation set (validation_fraction)
        columns[3:3] = ["validation loss", "validation accuracy"]
    for column in columns:
        table.add_column(column, justify="right")
    for r in listed:
        scores = [f"{r['test_loss']:.4f}", f"{r['accuracy']:.4f}"]
        if validated:
            scores[:0] = [_four(r.get("validation_loss")), _four(r.get("validation_accuracy"))]
        table.add_row(
            str(r["round"] + 1),
            str(r["epochs"]),
            f"{r['loss']:.4f}",
            *scores,
            f"{(r['finished_ms'] - r['started_ms']) / 1000:.1f}",
        )
    recovered = " and recovered" if job["state"] == "done" else ""  # a failed job's last was not
    caption = (
        f"{_what(job)}\n"
        f"{count} activations ({totals.failed} failed{recovered}"
        + (f", {totals.stopped} stopped" if totals.stopped else "")
        + "), "
        f"{totals.gb_s:.1f} GB·s, ${job['cost_usd']:.6f}"
        + (f" of its ${budget:.6f} budget" if (budget := job["spec"].get("max_cost_usd")) else "")
        + (f"; error: {job['error']}" if job["error"] else "")
    )
    if len(listed) < len(job["rounds"]):
        caption += (
            f"\nthe latest {len(listed)} of {len(job['rounds'])} rounds listed: "
            f"faasdl status {job['job_id']} --rounds 0 lists every one"
        )
    ended = [e["message"] for e in job.get("events", []) if e["kind"] == "done"]
    # Why it stopped before its last round, and which round's model it kept (keep_model: best).
    if (job.get("stopped_early") or job["spec"].get("keep_model") == "best") and ended:
        caption += f"\n{ended[-1]}"
    table.caption = escape(caption)  # its words as they are: a path or an error may hold [...]
    return table


def _four(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def _what(job: dict[str, Any]) -> str:
    """What the job trained on how many workers, and how long it took once started."""
    spec, plan = job["spec"], job["plan"]
    data = spec["dataset"]
    named = data["path"] if data["name"] == "npz" else data["name"]
    line = f"{model_called(spec['model'], spec.get('architecture'))} on {named}"
    if spec.get("init_model"):
        line += f" from job {spec['init_model']}'s model"
    if plan:  # a record has one from its submission on
        line += f": {plan['train']['containers']} worker(s) of {plan['train']['memory_mb']} MB"
    if job["started_ms"] and job["finished_ms"]:
        line += f", {(job['finished_ms'] - job['started_ms']) / 1000:.1f} s"
    return line
