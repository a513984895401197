"""The dashboard (GET /ui) in a real browser: Debian's Chromium driven by Playwright, while a real
job trains on the embedded platform and one of its training containers is killed."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import requests

from faasdl.canary.inject import Chaos
from faasdl.config import Settings, StoreSettings
from faasdl.controller import auth
from faasdl.controller.app import create_app
from faasdl.controller.auth import create_key
from faasdl.controller.jobs import Controller
from faasdl.controller.plan import JobPlan
from faasdl.controller.validator import JobSpec
from faasdl.platform.local import LocalPlatform
from faasdl.serving import AppThread
from faasdl.store import StateStore, make_store
from faasdl.store.records import (
    ActivationUse,
    BestRound,
    FunctionInfo,
    JobEvent,
    JobInfo,
    JobState,
    UnitState,
    create,
    job_key,
    update,
)
from faasdl.training.models import model_called
from tests.conftest import eventually, keras_architecture
from tests.controller.conftest import round_result

pytestmark = pytest.mark.tensorflow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Chromium as root on a machine without a network (see the env notes: without the background
#: networking flags its connection attempts are refused, many at a time).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Where the screenshots go besides the test's own directory (the README's are made this way).
SCREENSHOTS = os.environ.get("FAASDL_TEST_SCREENSHOT_DIR")
JOB: dict[str, Any] = {
    "model": "small_cnn",
    "dataset": {"name": "digits"},
    "workers": 3,
    "epochs": 5,
    "sync_every": 1,
    "batch_size": 8,
    "seed": 11,
    "fault_tolerance": {"checkpoint_interval_s": 0.25, "heartbeat_s": 1.0},
}


@pytest.fixture(scope="module")
def served(
    tf_platform: LocalPlatform, tf_store: tuple[StateStore, str]
) -> Iterator[tuple[Controller, str, str]]:
    """A controller with its REST API and dashboard on loopback, and a tenant's key."""
    store, url = tf_store
    settings = Settings(controller={"scheduler_tick_s": 0.1})
    with (
        Controller(settings=settings, platform=tf_platform, store=store, store_url=url) as c,
        serving(c) as base,
    ):
        yield c, base, create_key(store, tenant="default")[1]


@contextlib.contextmanager
def serving(controller: Controller) -> Iterator[str]:
    """The controller's REST API and dashboard on loopback: its URL."""
    server = AppThread(create_app(controller, owns=False), host="127.0.0.1", port=0, name="ui")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("no chromium on the PATH: `make test` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(SCREENSHOTS) / name)
    return path


def sign_in(page: Any, base: str, key: str) -> None:
    """Enter the API key on the dashboard's page, as a user does."""
    page.goto(f"{base}/ui")
    page.get_by_label("API key").fill(key)
    page.get_by_label("API key").press("Enter")


def has_focus(page: Any, job_id: str) -> bool:
    """Whether the job's link in the list has the focus, asked in one step in the page: the list
    is rebuilt every 2 s, and a locator's `evaluate` takes the element first and evaluates after,
    so a rebuild between the two would ask a row already gone (it failed CI so once)."""
    return bool(
        page.evaluate(
            "id => document.activeElement?.matches(`#jobs tbody tr[data-job='${id}'] a`) ?? false",
            job_id,
        )
    )


def accessibility_violations(page: Any) -> list[str]:
    from axe_playwright_python.sync_playwright import Axe  # type: ignore[import-untyped]

    result = Axe().run(page)
    return [f"{v['id']}: {v['help']}" for v in result.response["violations"]]


def test_the_page_and_its_assets_are_served_with_caching_and_no_secret(
    served: tuple[Controller, str, str],
) -> None:
    _, base, key = served

    page = requests.get(f"{base}/ui", timeout=10)
    script = page.text.split('src="', 1)[1].split('"', 1)[0]
    asset = requests.get(base + script, timeout=10)
    again = requests.get(
        base + script, headers={"If-None-Match": asset.headers["ETag"]}, timeout=10
    )
    missing = requests.get(f"{base}/ui/static/../../etc/passwd", timeout=10)

    assert page.status_code == 200
    assert page.headers["Cache-Control"] == "no-cache"
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert key not in page.text
    assert "?v=" in script
    assert asset.status_code == 200
    assert "immutable" in asset.headers["Cache-Control"]
    assert asset.headers["Content-Type"].startswith("text/javascript")
    assert again.status_code == 304
    assert missing.status_code == 404


def test_a_refused_key_is_said_why_on_the_page(
    served: tuple[Controller, str, str], browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrange: a key for a day, the clock at its expiry (the page said "the key was refused"
    # alone, for an expired key as for a mistyped one).
    controller, base, _ = served
    record, expiring = create_key(controller.store, tenant="default", expires_in_s=86_400)
    monkeypatch.setattr(auth, "_now_ms", lambda: record.expires_ms)
    page = browser.new_page()

    # Execute
    said = {}
    for name, key in [("expired", expiring), ("unknown", "fdl_0123456789abcdef." + "A" * 43)]:
        sign_in(page, base, key)
        status = page.locator("#key-status")
        status.filter(has_text="the key was refused").wait_for()
        said[name] = status.text_content()
    page.close()

    # Assert
    assert said["expired"].startswith(f"the key was refused (the API key {record.key_id} expired")
    assert said["expired"].endswith("make another (faasdl keys create)): enter another")
    assert said["unknown"] == (
        "the key was refused (the API key is not valid (unknown, malformed or revoked)): enter "
        "another"
    )


def test_a_job_with_a_killed_container_followed_live_from_the_job_list_to_done(
    served: tuple[Controller, str, str], browser: Any, tmp_path: Path
) -> None:
    # Arrange: a job whose training containers are killed once, and a browser on the dashboard.
    controller, base, key = served
    name = "<b>CNN</b> & [digits]"  # shown as text, not read as markup
    job_id = controller.submit(JobSpec.model_validate({**JOB, "name": name})).job.job_id
    platform = controller.platform
    assert isinstance(platform, LocalPlatform)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    # A browser without the File System Access API (Firefox's, Safari's): the model is handed
    # over whole (Chromium's writes it as it arrives, as a test below shows).
    page.add_init_script("delete window.showSaveFilePicker")
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    with Chaos(platform, controller.store, job_id, 1, seed=2, delay_s=(0.05, 0.3)) as chaos:
        # Execute: enter the key, find the job in the list, open it with the keyboard alone.
        sign_in(page, base, key)
        row = page.locator(f'tr[data-job="{job_id}"]')
        row.wait_for(timeout=10_000)
        list_violations = accessibility_violations(page)
        assert row.get_by_role("link", name=job_id).count() == 1, "a link named by the job's id"
        listed_name = row.locator(".name").text_content()
        for _ in range(20):
            page.keyboard.press("Tab")
            if has_focus(page, job_id):
                break
        assert has_focus(page, job_id), "the job link by Tab"
        # The list is rebuilt every 2 s: the rebuilt row's link has the focus.
        page.wait_for_function("row => !row.isConnected", arg=row.element_handle())
        assert has_focus(page, job_id), "the focus kept"
        page.keyboard.press("Enter")
        page.wait_for_url(f"**/ui#job={job_id}")

        # The units' lanes appear with the job's training activations in them.
        page.locator('[data-kind="lane"]').nth(JOB["workers"]).wait_for(timeout=10_000)
        title = page.locator("#job-title").text_content()
        page.locator('[data-kind="running"], [data-kind="activation"]').first.wait_for(
            timeout=30_000
        )

        # The kill and the recovery show in the killed unit's lane within a few seconds.
        eventually(lambda: len(chaos.done) == 1, timeout_s=120, what="a container killed")
        [kill] = chaos.done
        shard = int(kill.unit.rsplit("/", 1)[1])
        page.locator(f'[data-kind="failure"][data-unit="{shard}"]').wait_for(timeout=5_000)
        failure_shown_s = time.time() - kill.at
        page.locator(
            f'[data-unit="{shard}"][data-attempt="{kill.token + 1}"]'
            ':is([data-kind="running"], [data-kind="activation"])'
        ).first.wait_for(timeout=5_000)
        recovery_shown_s = time.time() - kill.at
        screenshot(page, tmp_path, "dashboard-recovery.png")

        # The loss curve gains points as rounds finish, live, until the job is done (a warm
        # round can take less than the page's refresh, so two may land in one refresh).
        seen: list[int] = []
        points = page.locator("circle.loss-point")
        deadline = time.monotonic() + 600
        while page.locator("#summary-state").text_content() != "done":
            assert time.monotonic() < deadline, "the job did not end in time"
            seen.append(points.count())
            page.wait_for_timeout(100)
        seen.append(points.count())
        plotted = [int(r) for r in points.evaluate_all("ps => ps.map(p => p.dataset.round)")]
        # Done: its model is downloaded from the page, read with the key.
        with page.expect_download() as downloading:
            page.get_by_role("button", name="Download the model").click()
        download = downloading.value
        downloaded = Path(download.path()).read_bytes()
    job = controller.job(job_id)
    path = screenshot(page, tmp_path, "dashboard-job.png")
    job_violations = accessibility_violations(page)
    page.close()

    # Assert
    assert job.state is JobState.DONE, job.error
    assert listed_name == name
    assert title == f"Job {job_id}: {name}"
    assert failure_shown_s < 10
    assert recovery_shown_s < 10
    rounds = len(job.rounds)
    assert rounds == JOB["epochs"]
    assert plotted == list(range(rounds))  # a point per round, in order
    assert seen == sorted(seen), f"points seen {seen}"  # the curve only grows
    assert len({n for n in seen if 0 < n < rounds}) >= 2, f"points seen {seen}"  # live
    assert seen[-1] == rounds
    assert job.model is not None
    assert downloaded == bytes(controller.store.get_blob(job.model))
    assert download.suggested_filename == f"{job_id}.safetensors"
    assert errors == []
    assert list_violations == []
    assert job_violations == []
    assert path.stat().st_size > 10_000


def test_the_job_list_says_when_it_shows_only_the_newest_jobs_and_filters_older_ones_in(
    served: tuple[Controller, str, str], browser: Any
) -> None:
    # Arrange: 101 ended jobs more than the list's page of 100, as records in the store; two
    # of them named as a sweep's, the oldest one of those, and one of them failed.
    controller, base, key = served
    spec = JobSpec.model_validate({**JOB, "epochs": 1})
    plan = controller.estimate(spec).model_dump(mode="json")
    names = {0: "lr sweep: 0.1", 7: "lr sweep: 0.01"}
    ended = [
        JobInfo(
            job_id=f"{i:016x}",
            state=JobState.FAILED if i == 7 else JobState.DONE,
            spec=spec.model_dump(mode="json") | {"name": names.get(i)},
            plan=plan,
            created_ms=1_000 + i,
        )
        for i in range(101)
    ]
    for job in ended:
        assert create(controller.store, job)
    page = browser.new_page(viewport={"width": 1280, "height": 900})

    def rows(count: int) -> list[str]:
        """The list's jobs once it shows ``count`` of them."""
        page.wait_for_function(
            "n => document.querySelectorAll('#jobs tbody tr').length === n",
            arg=count,
            timeout=10_000,
        )
        found: list[str] = page.locator("#jobs tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.job)"
        )
        return found

    # Execute: the list; then filtered by name, by state too, and by a name no job holds.
    sign_in(page, base, key)
    page.get_by_role("status").filter(has_text="the 100 newest jobs").wait_for(timeout=10_000)
    shown = rows(100)
    page.get_by_label("Name holds").fill("lr sweep")
    swept = rows(2)
    swept_said = page.get_by_role("status").text_content()
    page.get_by_label("State").select_option("failed")
    failed = rows(1)
    page.reload()  # the filters kept for the browser session
    reloaded = rows(1)
    kept = (page.get_by_label("Name holds").input_value(), page.get_by_label("State").input_value())
    page.get_by_label("Name holds").fill("nobody's")
    page.get_by_role("status").filter(has_text="no jobs match").wait_for(timeout=10_000)
    nothing = rows(0)
    page.close()

    # Assert: a page of the newest, the oldest of the 101 not among it; the sweep's two, the
    # oldest too, newest first (all there are: nothing said), and the failed one of them.
    assert len(shown) == 100
    assert ended[0].job_id not in shown
    assert swept == [ended[7].job_id, ended[0].job_id]
    assert swept_said == ""
    assert failed == [ended[7].job_id]
    assert reloaded == failed
    assert kept == ("lr sweep", "failed")
    assert nothing == []


def stored_job(
    controller: Controller, *, epochs: int = 1, **fields: Any
) -> tuple[JobInfo, JobPlan]:
    """A job of the page's spec of ``epochs`` epochs (a round each) as a store holds one, its
    record's ``fields`` given."""
    spec = JobSpec.model_validate({**JOB, "epochs": epochs})
    plan = controller.estimate(spec)
    job = JobInfo(spec=spec.model_dump(mode="json"), plan=plan.model_dump(mode="json"), **fields)
    return job, plan


def test_a_cancelled_jobs_page_draws_no_running_attempt_and_names_each_log_line(
    served: tuple[Controller, str, str], browser: Any
) -> None:
    # Arrange: a job cancelled in its first round, as the store holds one: its units' records
    # still say running (a cancel stops the attempts, not the records).
    controller, base, key = served
    t = 1_795_000_000_000
    cancelled, plan = stored_job(
        controller,
        job_id="c" * 16,
        state=JobState.CANCELLED,
        created_ms=t,
        started_ms=t + 5,
        finished_ms=t + 9_000,
        events=[
            JobEvent(t_ms=t, kind="submitted", message="3 worker(s)"),
            JobEvent(t_ms=t + 1, kind="admitted", message="after 0.0 s in the queue"),
            JobEvent(t_ms=t + 9_000, kind="cancelled", message="cancelled by request"),
        ],
    )
    assert create(controller.store, cancelled)
    for shard in range(plan.train.containers):
        unit = FunctionInfo(
            job_id=cancelled.job_id, round=0, shard=shard, state=UnitState.RUNNING, attempts=1
        )
        assert create(controller.store, unit)
        stopped = ActivationUse(
            job_id=cancelled.job_id,
            activation_id=f"stopped{shard}",
            kind="train",
            round=0,
            unit=shard,
            memory_mb=plan.train.memory_mb,
            start_ms=t + 10,
            duration_ms=8_990,
            outcome="stopped",
            gb_s=1.0,
            cost_usd=0.0,
        )
        assert create(controller.store, stopped)
    page = browser.new_page(viewport={"width": 1280, "height": 900})

    # Execute
    sign_in(page, base, key)
    page.goto(f"{base}/ui#job={cancelled.job_id}")
    page.locator('[data-kind="lane"]').nth(plan.train.containers).wait_for(timeout=10_000)
    page.locator("#events li").nth(2).wait_for(timeout=10_000)
    page.locator('[data-kind="activation"]').nth(plan.train.containers - 1).wait_for(timeout=10_000)
    running = page.locator('[data-kind="running"]').count()
    marks = page.locator('[data-kind="activation"] rect:is(.stopped, .failure)')
    outcomes = marks.evaluate_all("rs => rs.map(r => r.getAttribute('class'))")
    kinds = page.locator("#events li .kind").all_inner_texts()
    lines = page.locator("#events li").all_inner_texts()
    evaluate_limit = page.locator('tr[data-action="evaluate"] td').nth(1).inner_text()
    aggregate_estimate = page.locator('tr[data-action="aggregate"] td').nth(0).inner_text()
    no_model = page.locator("#job-model").is_hidden()
    page.close()

    # Assert: no attempt drawn as running on (to the page's clock), the stopped ones ended with
    # a stop's mark, not a failure's; each log line names its kind
    # ("after 0.0 s in the queue" alone said nothing); evaluation's limit is the trainer's;
    # aggregation's estimate is the plan's (it showed none).
    assert running == 0
    assert outcomes == ["stopped"] * plan.train.containers  # not drawn as failures
    assert kinds == ["submitted", "admitted", "cancelled"]
    said = [" ".join(line.split()) for line in lines]
    for line, event in zip(said, cancelled.events, strict=True):
        assert line.endswith(f"{event.kind} {event.message}"), line  # after the time of day
    assert evaluate_limit == str(plan.train.memory_mb)
    assert no_model  # cancelled in its first round: it kept none, and offers none
    assert plan.aggregate_memory_estimate_mb is not None
    assert aggregate_estimate == f"{plan.aggregate_memory_estimate_mb:.0f}"


@pytest.fixture
def unstarted(
    served: tuple[Controller, str, str], own_store: tuple[StateStore, str]
) -> Iterator[tuple[StateStore, str, str]]:
    """A store of its own, the API and dashboard of a controller on it that has not started (a
    started one would admit its queued jobs and carry its running ones on), and a tenant's key:
    jobs shown as the store holds them."""
    controller = served[0]
    store, url = own_store
    viewer = Controller(
        settings=controller.settings, platform=controller.platform, store=store, store_url=url
    )
    with serving(viewer) as base:
        yield store, base, create_key(store, tenant="default")[1]


def test_a_resumed_jobs_running_attempt_is_drawn_from_its_claim_not_the_resumption(
    served: tuple[Controller, str, str], browser: Any, unstarted: tuple[StateStore, str, str]
) -> None:
    # Arrange: a running job a new controller carried on a minute in: shard 0's attempt claimed
    # before the restart and still running, shard 1's claimed after.
    controller = served[0]
    store, base, key = unstarted
    t = int(time.time() * 1000) - 120_000
    resumed, _ = stored_job(
        controller,
        job_id="d" * 16,
        state=JobState.RUNNING,
        created_ms=t,
        started_ms=t,
        events=[
            JobEvent(t_ms=t, kind="round_started", message="round 1/1", round=0),
            JobEvent(t_ms=t + 60_000, kind="resumed", message="by a new controller"),
            JobEvent(t_ms=t + 60_000, kind="round_started", message="round 1/1", round=0),
        ],
    )
    assert create(store, resumed)
    for shard, claimed in ((0, t + 1_000), (1, t + 61_000)):
        unit = FunctionInfo(
            job_id=resumed.job_id,
            round=0,
            shard=shard,
            state=UnitState.RUNNING,
            attempts=1,
            claimed_ms=claimed,
        )
        assert create(store, unit)
    page = browser.new_page(viewport={"width": 1280, "height": 900})

    # Execute
    sign_in(page, base, key)
    page.goto(f"{base}/ui#job={resumed.job_id}")
    bars = page.locator('[data-kind="running"] rect.running')
    bars.nth(1).wait_for(timeout=10_000)
    widths = bars.evaluate_all("rs => rs.map(r => Number(r.getAttribute('width')))")
    page.close()

    # Assert: shard 0's bar spans the two minutes since its claim, shard 1's the one since its
    # own (both were drawn from the last round_started line: one minute each).
    assert len(widths) == 2
    assert 1.7 < widths[0] / widths[1] < 2.3, widths


def test_a_long_jobs_lanes_draw_its_latest_rounds_read_from_its_ledger_a_window_at_a_time(
    served: tuple[Controller, str, str], browser: Any, unstarted: tuple[StateStore, str, str]
) -> None:
    # Arrange: a running 40-round job 29 rounds in, as the store holds one, its ledger's lines
    # of those rounds (the first round's the highest peaks).
    controller = served[0]
    store, base, key = unstarted
    t = int(time.time() * 1000) - 600_000
    long, plan = stored_job(
        controller,
        epochs=40,
        job_id="a" * 16,
        state=JobState.RUNNING,
        round=29,
        rounds=[round_result(n) for n in range(29)],
        created_ms=t,
        started_ms=t,
        events=[JobEvent(t_ms=t, kind="admitted", message="after 0.0 s in the queue")],
        ledger_by_round=True,  # its lines read from a round on, as the store keeps them
    )
    assert create(store, long)
    workers = plan.train.containers

    kinds: list[tuple[Literal["train", "aggregate", "evaluate"], int]] = [
        ("train", workers),
        ("aggregate", 1),
        ("evaluate", 1),
    ]

    def line(
        kind: Literal["train", "aggregate", "evaluate"], round_: int, unit: int, **fields: Any
    ) -> ActivationUse:
        return ActivationUse(
            job_id=long.job_id,
            activation_id=f"{kind}{round_}x{unit}",
            kind=kind,
            round=round_,
            unit=unit,
            memory_mb=plan.train.memory_mb,
            start_ms=t + 10_000 * round_ + 1_000 * unit,
            duration_ms=900,
            peak_memory_mb=500.0 if round_ == 0 else 300.0,
            outcome="success",
            gb_s=1.0,
            cost_usd=0.0,
        ).model_copy(update=fields)

    def book(round_: int) -> None:
        for kind, units in kinds:
            for unit in range(units):
                assert create(store, line(kind, round_, unit))

    def finish_round(job: JobInfo | None) -> JobInfo:
        assert job is not None
        event = JobEvent(t_ms=t + 300_000, kind="round_finished", message="round 30/40", round=29)
        return job.with_round(round_result(29), round=30).with_event(event, kept=100)

    def cancel(job: JobInfo | None) -> JobInfo:
        assert job is not None
        event = JobEvent(t_ms=t + 310_000, kind="cancelled", message="cancelled by request")
        return job.with_event(event, kept=100, state=JobState.CANCELLED, finished_ms=t + 310_000)

    for round_ in range(29):
        book(round_)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    asked: list[str] = []  # the ledger's reads
    viewed: list[str] = []  # the job's
    page.on("request", lambda r: asked.append(r.url) if "/ledger" in r.url else None)
    page.on("request", lambda r: viewed.append(r.url) if "/v1/jobs/a" in r.url else None)
    points = page.locator('[data-kind="curves"] circle.loss-point')
    drawn = page.locator('[data-kind="activation"]')
    window = page.locator('[data-kind="window"]')
    train = page.locator('tr[data-action="train"] td')

    # Execute: the page, then round 30 finishing, then the job cancelled and an attempt of round
    # 4 booked late (one that could not be stopped, booked as it ended)
    sign_in(page, base, key)
    page.goto(f"{base}/ui#job={long.job_id}")
    window.wait_for(timeout=10_000)
    before = drawn.evaluate_all("gs => gs.map(g => Number(g.dataset.round))")
    said_before, count_before = window.text_content(), train.nth(3).inner_text()
    points_before = points.count()
    book(29)
    update(store, job_key(long.job_id), JobInfo, finish_round)
    # Both at once: a refresh between the booking and the round's end draws round 29's lines in
    # the lanes of rounds 11-30, as the round in progress.
    page.wait_for_function(
        """() => document.querySelector('[data-kind="window"]')?.textContent
            === 'rounds 12–31 of 40'
            && document.querySelector('[data-kind="activation"][data-round="29"]') !== null""",
        timeout=10_000,
    )
    after = drawn.evaluate_all("gs => gs.map(g => Number(g.dataset.round))")
    said_after, count_after, peak = window.text_content(), train.nth(3).inner_text(), train.nth(2)
    peak_shown = peak.inner_text()
    points_after = points.count()
    running = len(asked)
    late = line(
        "train",
        3,
        0,
        activation_id="late",
        duration_ms=280_000,
        peak_memory_mb=None,  # a stopped attempt says none
        outcome="stopped",
    )
    assert create(store, late)
    update(store, job_key(long.job_id), JobInfo, cancel)
    counted = str(30 * workers + 1)
    page.wait_for_function(
        "n => document.querySelectorAll('tr[data-action=train] td')[3]?.textContent === n",
        arg=counted,
        timeout=10_000,
    )
    page.close()
    viewed = [url for url in viewed if "round_from=" in url and "/ledger" not in url]

    # Assert: the lanes hold the 20 latest rounds, the one in progress among them; the memory
    # table every activation, the first round's peak too; the ledger was read whole once, then
    # from the round before the lanes' first.
    per_round = workers + 2
    assert sorted(set(before)) == list(range(10, 29))
    assert len(before) == 19 * per_round
    assert said_before == "rounds 11–30 of 40"
    assert sorted(set(after)) == list(range(11, 30))
    assert len(after) == 19 * per_round
    assert said_after == "rounds 12–31 of 40"
    assert (count_before, count_after) == (str(29 * workers), str(30 * workers))
    assert peak_shown == "500"
    assert asked[0].endswith("/ledger?round_from=0"), asked
    # While it ran, from the round before the lanes' first: 9 until round 30 had finished, then 10
    # (a refresh may follow the one that drew round 30 before the count is taken).
    running_from = [url.rsplit("round_from=", 1)[1] for url in asked[1:running]]
    assert "9" in running_from, asked
    assert set(running_from) <= {"9", "10"}, asked
    assert asked[-1].endswith("/ledger?round_from=0"), asked  # the late line with it
    # Its rounds: whole, then from the last finished one on, merged; whole once it has ended.
    assert (points_before, points_after) == (29, 30)
    assert viewed[0].endswith("?round_from=0"), viewed
    viewed_from = [url.rsplit("round_from=", 1)[1] for url in viewed[1:running]]
    assert "28" in viewed_from, viewed
    assert set(viewed_from) <= {"28", "29"}, viewed
    assert viewed[-1].endswith("?round_from=0"), viewed


def summary_facts(browser: Any, base: str, key: str, job_id: str, *names: str) -> list[str]:
    """The facts of a job's page that start with ``names`` (the first waited for), as read."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(page, base, key)
    page.goto(f"{base}/ui#job={job_id}")
    facts = [
        page.locator("#job-summary div").filter(
            has=page.locator("dt", has_text=re.compile(f"^{re.escape(name)}"))
        )
        for name in names
    ]
    facts[0].wait_for(timeout=10_000)
    said = [" ".join(fact.inner_text().split()) for fact in facts]
    page.close()
    return said


def test_a_job_that_keeps_its_best_round_says_which_on_its_page(
    served: tuple[Controller, str, str], browser: Any, unstarted: tuple[StateStore, str, str]
) -> None:
    # Arrange: done jobs of three rounds that keep their second's model (keep_model: best),
    # one chosen by its test loss, one by its validation set's.
    store, base, key = unstarted
    tested, validated = "b" * 16, "9" * 16
    rounds = [
        round_result(n).model_copy(update={"validation_loss": v, "validation_accuracy": 0.95})
        for n, v in enumerate([0.3, 0.2, 0.25])
    ]
    for job_id, validation_loss in [(tested, None), (validated, 0.2)]:
        best = BestRound(
            round=2,
            weights=f"jobs/{job_id}/global/00002",
            test_loss=0.0521,
            accuracy=0.9833,
            validation_loss=validation_loss,
        )
        done, _ = stored_job(
            served[0],
            epochs=3,
            job_id=job_id,
            state=JobState.DONE,
            created_ms=int(time.time() * 1000),
            round=3,
            best=best,
            rounds=rounds if validation_loss else [],
        )
        assert create(store, done.model_copy(update={"spec": {**done.spec, "keep_model": "best"}}))

    # Execute
    [said] = summary_facts(browser, base, key, tested, "Kept model")
    kept, last = summary_facts(browser, base, key, validated, "Kept model", "Validation loss")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(page, base, key)
    page.goto(f"{base}/ui#job={validated}")
    points = page.locator('[data-kind="curves"] circle.validation-loss-point')
    points.first.wait_for(timeout=10_000)
    drawn = points.evaluate_all("cs => cs.map(c => c.querySelector('title').textContent)")
    page.close()

    # Assert: each says which loss chose it; the validated one's curves draw its validation loss.
    assert said == "Kept model round 2's, of its lowest test loss (0.052, test accuracy 0.983)"
    assert (
        kept == "Kept model round 2's, of its lowest validation loss (0.200, test accuracy 0.983)"
    )
    assert last == "Validation loss 0.250"
    assert drawn == [
        f"round {n}: validation loss {v}" for n, v in [(1, "0.300"), (2, "0.200"), (3, "0.250")]
    ]


def test_a_job_of_its_own_architecture_is_named_on_its_page_as_its_keras_config_names_it(
    served: tuple[Controller, str, str], browser: Any, unstarted: tuple[StateStore, str, str]
) -> None:
    # Arrange: jobs as the store holds them: a model of the zoo's, an architecture of the job's
    # own whose config names it "tiny", one whose config names it no text, and one whose config
    # names it at length
    store, base, key = unstarted
    zoo, named, unnamed, long = "d" * 16, "e" * 16, "f" * 16, "c" * 16
    nameless, lengthy = keras_architecture(), keras_architecture()
    nameless["config"]["name"] = ["tiny"]
    lengthy["config"]["name"] = "🧠" * 100  # a code point of two UTF-16 units
    own = {"model": "custom", "architecture": keras_architecture()}
    for job_id, spec in [
        (zoo, {}),
        (named, own),
        (unnamed, {**own, "architecture": nameless}),
        (long, {**own, "architecture": lengthy}),
    ]:
        made, _ = stored_job(served[0], job_id=job_id, created_ms=int(time.time() * 1000))
        assert create(store, made.model_copy(update={"spec": {**made.spec, **spec}}))

    # Execute
    said = [
        summary_facts(browser, base, key, job_id, "Model")[0]
        for job_id in (zoo, named, unnamed, long)
    ]

    # Assert: as model_called calls them
    assert said == [
        f"Model {model_called(JOB['model'])}",
        "Model custom: tiny",
        "Model custom",
        f"Model {model_called('custom', lengthy)}",
    ]
    assert said[-1].endswith("🧠" * 59 + "…")


#: Stands in for the save-file picker, which a headless browser cannot show: the file the user
#: would pick is one of the page's origin-private file system, named as the page suggests (a real
#: file, written through the same writable stream).
PICK_A_PRIVATE_FILE = """
window.showSaveFilePicker = async (options) => {
  const folder = await navigator.storage.getDirectory();
  return folder.getFileHandle(options.suggestedName, { create: true });
};
"""

#: Each text the page puts beside the button (from the observer's records: two in one task are
#: two), and each Blob it makes counted.
OBSERVE_THE_DOWNLOAD = """
window.blobs = 0;
const makeUrl = URL.createObjectURL;
URL.createObjectURL = (blob) => { window.blobs += 1; return makeUrl(blob); };
window.said = [];
document.addEventListener("DOMContentLoaded", () => {
  const progress = document.querySelector("#model-progress");
  new MutationObserver((records) => records.forEach((record) => record.addedNodes
    .forEach((node) => window.said.push(node.textContent)))).observe(progress, { childList: true });
});
"""

#: The size and SHA-256 of a file of the page's origin-private file system.
READ_A_PRIVATE_FILE = """async (name) => {
  const folder = await navigator.storage.getDirectory();
  const file = await (await folder.getFileHandle(name)).getFile();
  const digest = await crypto.subtle.digest("SHA-256", await file.arrayBuffer());
  return [file.size, [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0"))
    .join("")];
}"""


@pytest.mark.parametrize("picker", [True, False], ids=["file-picked", "blob"])
def test_a_model_is_downloaded_from_the_page_as_it_arrives_going_on_where_it_stopped(
    served: tuple[Controller, str, str],
    browser: Any,
    unstarted: tuple[StateStore, str, str],
    own_store: tuple[StateStore, str],
    tmp_path: Path,
    picker: bool,
) -> None:
    # Arrange: four done jobs whose models (as the store holds a model) are stored in 64 KiB
    # chunks: one whole; the chunk 8 of two damaged, so that their answers end after the eight
    # before it, one's mended when the page asks for the rest of it, the other's not; the chunk 0
    # of the last damaged, so that its answer is an error. 1 MiB each, or 17 MiB as a Blob: its
    # bytes put in it at each 16 MiB (GATHER_BYTES), then the rest.
    store, base, key = unstarted
    whole, resumed, cut, refused = "c" * 16, "d" * 16, "e" * 16, "f" * 16
    jobs = (whole, resumed, cut, refused)
    model = os.urandom((1 if picker else 17) * 1024 * 1024)
    size = f"{len(model) / 1e6:.1f} MB"
    settings = StoreSettings(chunk_bytes=64 * 1024, spill_dir=str(tmp_path / "spill"))
    damaged: dict[str, str] = {}
    with make_store(settings, own_store[1]) as chunked:
        for job_id in jobs:
            name = f"jobs/{job_id}/global/00001"
            manifest = chunked.put_blob(name, model)
            done, _ = stored_job(
                served[0],
                job_id=job_id,
                state=JobState.DONE,
                created_ms=int(time.time() * 1000),
                round=1,
                model=name,
            )
            assert create(store, done)
            if job_id != whole:
                chunk = 0 if job_id == refused else 8
                damaged[job_id] = chunked._chunk_key(name, manifest.write_id, chunk)
                chunked._write_chunks([(damaged[job_id], b"x" * 65536)])
    asked: dict[str, list[dict[str, str]]] = {job_id: [] for job_id in jobs}

    def mend(job_id: str, route: Any) -> None:
        # Each request for the model seen (its Range); the one to mend mended before its rest.
        headers = route.request.headers
        asked[job_id].append({h: headers[h] for h in ("range", "if-range") if h in headers})
        if job_id == resumed and "range" in headers:
            with make_store(settings, own_store[1]) as chunked:
                chunked._write_chunks([(damaged[resumed], model[8 * 65536 : 9 * 65536])])
        route.continue_()

    # Execute: each downloaded from its page, to the file picked (Chromium's), or handed over
    # whole as a Blob (a browser without the File System Access API: Firefox's, Safari's).
    said: dict[str, list[str]] = {}
    written: dict[str, list[Any]] = {}
    downloads: list[Any] = []
    blobs: list[int] = []
    for job_id in jobs:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.add_init_script(PICK_A_PRIVATE_FILE if picker else "delete window.showSaveFilePicker")
        page.add_init_script(OBSERVE_THE_DOWNLOAD)
        page.on("download", lambda download: downloads.append(download))
        page.route(f"**/v1/jobs/{job_id}/model", functools.partial(mend, job_id))
        sign_in(page, base, key)
        page.goto(f"{base}/ui#job={job_id}")
        button = page.get_by_role("button", name="Download the model")
        if picker or job_id in (cut, refused):
            button.click()
        else:
            with page.expect_download() as handed:
                button.click()
            got = Path(handed.value.path()).read_bytes()
            written[job_id] = [len(got), hashlib.sha256(got).hexdigest()]
        page.wait_for_function(
            "() => /^(saved|handed|the download stopped)/.test("
            "document.querySelector('#model-progress').textContent)"
        )
        said[job_id] = page.evaluate("window.said")
        if picker:
            written[job_id] = page.evaluate(READ_A_PRIVATE_FILE, f"{job_id}.safetensors")
        blobs.append(page.evaluate("window.blobs"))
        page.close()

    # Assert: the whole model in the file, its bytes counted as they came, asked for once.
    for job_id in (whole, resumed):
        assert written[job_id] == [len(model), hashlib.sha256(model).hexdigest()], job_id
        assert said[job_id][0] == f"downloading {job_id}.safetensors"
        assert said[job_id][-2:] == [
            f"downloading {job_id}.safetensors: {size} of {size}",
            f"saved {job_id}.safetensors ({size})"
            if picker
            else f"handed {job_id}.safetensors to the browser ({size})",
        ]
    assert asked[whole] == [{}]
    # The one mended: whole too, its rest asked for from what was written of it (the same
    # model's: If-Range), said. (Chromium drops what it holds of an answer unread when the
    # answer fails, so that may be less than the eight chunks sent, or nothing.)
    etag = f'"{manifest.sha256}"'  # the model's ETag: the same for each, of the same bytes
    [first, rest] = asked[resumed]
    start = int(rest["range"].removeprefix("bytes=").removesuffix("-"))
    assert (first, rest) == ({}, {"range": f"bytes={start}-", "if-range": etag})
    assert 0 <= start <= 8 * 65536, start
    [going_on] = [text for text in said[resumed] if "going on" in text]
    shown = re.fullmatch(
        rf"downloading {resumed}\.safetensors: (\d\.\d) MB of {size}, going on after the "
        r"download stopped \(network error\)",
        going_on,
    )
    assert shown, said[resumed]
    assert abs(float(shown[1]) - start / 1e6) <= 0.05, said[resumed]
    # The one still damaged: asked for again up to three times, then not written, saying why
    # (its chunk's damage where the rest asked for begins there, else the connection lost).
    assert 2 <= len(asked[cut]) <= 4, asked[cut]
    assert all(r == {"range": r["range"], "if-range": etag} for r in asked[cut][1:]), asked[cut]
    why = (
        "network error"
        if asked[cut][-1]["range"] != f"bytes={8 * 65536}-"
        else f"/v1/jobs/{cut}/model answered 500: blob 'jobs/{cut}/global/00001': chunk 8 does "
        "not match its checksum"
    )
    assert said[cut][-1] == (
        f"the download stopped ({why}): {cut}.safetensors was not written; download it again"
    ), said[cut]
    # The one refused: not written, its answer's detail said.
    assert asked[refused] == [{}]
    assert said[refused] == [
        f"downloading {refused}.safetensors",
        f"the download stopped (/v1/jobs/{refused}/model answered 500: blob "
        f"'jobs/{refused}/global/00001': chunk 0 does not match its checksum): "
        f"{refused}.safetensors was not written; download it again",
    ]
    # Neither written: the file picked left empty, no Blob made; no download of the browser's
    # own beside a picked file; each Blob handed over once.
    if picker:
        assert written[cut] == written[refused] == [0, hashlib.sha256(b"").hexdigest()]
        assert (blobs, downloads) == ([0, 0, 0, 0], [])
    else:
        assert (blobs, len(downloads)) == ([1, 1, 0, 0], 2)
        assert [d.suggested_filename for d in downloads] == [
            f"{whole}.safetensors",
            f"{resumed}.safetensors",
        ]


def test_a_queued_jobs_page_says_what_it_waits_for(
    served: tuple[Controller, str, str], browser: Any, unstarted: tuple[StateStore, str, str]
) -> None:
    # Arrange: a running job, and a queued one on a budget that does not fit beside it in the
    # pool (their trainers sized so, whatever the history earlier tests left says).
    controller = served[0]
    store, base, key = unstarted
    t = int(time.time() * 1000)
    pool = controller.platform.limits().pool_memory_mb or 0
    running, plan = stored_job(controller, job_id="e" * 16, state=JobState.RUNNING, created_ms=t)
    queued, _ = stored_job(controller, job_id="f" * 16, state=JobState.QUEUED, created_ms=t + 1)
    over_half = pool // (2 * plan.train.containers) + 64
    train = plan.train.model_copy(update={"memory_mb": over_half})
    # Its training's cost alone by past runs (whatever the history earlier tests left says).
    plan = plan.model_copy(
        update={
            "train": train,
            "train_cost_usd": 0.0123,
            "expected_cost_usd": None,
            "expected_cost_cold_usd": None,
        }
    )
    # The running one's plan knows its other actions' cost and its cold starts' too.
    known = plan.model_copy(update={"expected_cost_usd": 0.02, "expected_cost_cold_usd": 0.03})
    running = running.model_copy(update={"plan": known.model_dump(mode="json")})
    spec = {**queued.spec, "max_cost_usd": 0.05}
    queued = queued.model_copy(update={"plan": plan.model_dump(mode="json"), "spec": spec})
    assert create(store, running)
    assert create(store, queued)

    # Execute
    said, cost = summary_facts(browser, base, key, queued.job_id, "Waiting for", "Cost")
    [running_cost] = summary_facts(browser, base, key, running.job_id, "Cost")

    # Assert
    assert cost == "Cost (USD) 0.000000 of its 0.05 budget (its training 0.012300 by past runs)"
    assert running_cost == (
        "Cost (USD) 0.000000 (its actions 0.020000 by past runs, 0.030000 with its containers' "
        "cold starts)"
    )
    assert 2 * plan.demand_mb > pool
    free = pool - plan.demand_mb
    assert said == (
        f"Waiting for the platform's pool memory: it needs {plan.demand_mb:,} MB, {free:,} of "
        f"{pool:,} MB free beside the running jobs"
    )
