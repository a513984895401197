"""A job record's bounded lists: its log and its failure reports keep their newest entries and
count the ones they dropped, so that what a reader saw can be numbered from the job's first."""

from __future__ import annotations

from faasdl.store.records import FailureReport, JobEvent, JobInfo


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
