"""A job record's bounded lists: its log and its failure reports keep their newest entries and
count the ones they dropped, so that what a reader saw can be numbered from the job's first; and
its ledger, read from a round on."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from faasdl.store.records import (
    ActivationUse,
    FailureReport,
    JobEvent,
    JobInfo,
    ledger,
    ledger_key,
)
from faasdl.store.sqlite import SqliteStore


def failure(n: int) -> FailureReport:
    return FailureReport(
        t_ms=n,
        kind="train",
        round=0,
        unit=0,
        attempt=n,
        activation_id=f"{n:032x}",
        classification="crash",
        message="killed",
        detected_by="platform",
        recovery="resume",
    )


def test_a_job_keeps_its_newest_failure_reports_and_counts_the_others() -> None:
    job = JobInfo(job_id="a" * 16)

    for n in range(1, 26):
        job = job.with_failure(failure(n), kept=10)

    assert [f.attempt for f in job.failures] == list(range(16, 26))
    assert job.failures_dropped == 15


def test_a_job_keeps_its_newest_log_lines_numbered_from_its_first() -> None:
    job = JobInfo(job_id="a" * 16)

    for n in range(25):
        job = job.with_event(JobEvent(t_ms=n, kind="log", message=f"line {n}"), kept=10, round=n)

    assert [e.message for e in job.events] == [f"line {n}" for n in range(15, 25)]
    assert job.events_dropped == 15
    assert job.round == 24  # the update given with the line


class CountingStore(SqliteStore):
    """A SQLite store that counts the records its scans fetch."""

    fetched = 0

    def _scan(self, prefix: str, low: str) -> Iterable[tuple[str, bytes, int]]:
        rows = list(super()._scan(prefix, low))
        self.fetched += len(rows)
        return rows


@pytest.mark.parametrize("by_round", [True, False], ids=["by round", "from before"])
def test_a_ledger_read_from_a_round_on_fetches_only_those_rounds_lines_where_kept_by_round(
    tmp_path: Path, by_round: bool
) -> None:
    # Arrange: a 50-round job's three lines a round, kept by round or, as a job from before
    # lines were kept by round kept them, by activation alone (ids that do not sort by round).
    job = JobInfo(job_id="a" * 16, ledger_by_round=by_round)
    with CountingStore(path=tmp_path / "state.db") as store:
        for round_ in range(50):
            for unit in range(3):
                use = ActivationUse(
                    job_id=job.job_id,
                    activation_id=f"{(unit * 50 + round_) * 7919 % 150:032x}",
                    kind="train",
                    round=round_,
                    unit=unit,
                    memory_mb=512,
                    start_ms=1_000 * round_ + unit,
                    duration_ms=900,
                    outcome="success",
                    gb_s=0.45,
                    cost_usd=0.0,
                )
                key = ledger_key(job.job_id, use.activation_id, round_ if by_round else None)
                assert store.put_if_absent(key, use.model_dump(mode="json"))

        # Execute
        latest = ledger(store, job, round_from=48)
        fetched = store.fetched
        whole = ledger(store, job)

    # Assert
    assert [(a.round, a.unit) for a in latest] == [(r, u) for r in (48, 49) for u in range(3)]
    assert latest == whole[-6:]
    assert len(whole) == 150
    assert fetched == (6 if by_round else 150)
