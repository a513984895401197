"""The faasdl command: it runs, and bad settings or options fail with a message naming them."""

from __future__ import annotations

import inspect
import io
import json
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.table import Table
from typer.testing import CliRunner

from faasdl import __version__
from faasdl.cli import LOG_WIDTH, CompareOrder, _lowest_said, _ranked, app, stderr_console
from faasdl.config import EstimatorSettings, StoreSettings
from faasdl.controller.client import ControllerClient
from faasdl.errors import PlatformUnavailable
from faasdl.store import make_store
from tests.conftest import PAGE_BYTES, Served, web_server

runner = CliRunner()


def test_version() -> None:
    result = runner.invoke(app, ["version"])

    assert result.exit_code == 0
    assert result.stdout.strip() == __version__


def compared(
    job_id: str, of: str | None, lowest: float | None, test: float | None
) -> dict[str, Any]:
    """A row of ``compare``'s of job ``job_id``: its lowest loss, of ``of``, and its test loss."""
    return {
        "job_id": job_id,
        "accuracy": None,
        "lowest_loss": lowest,
        "lowest_loss_of": of,
        "test_loss_at_lowest": test,
        "cost_usd": 0.0,
    }


def test_compare_sorts_lowest_losses_of_different_sets_by_their_test_losses_saying_so() -> None:
    # Arrange: two jobs chosen by their validation losses, one by its test loss, one without a
    # round; by their lowest losses, the test-chosen one would rank first.
    rows = [
        compared("a", "validation", 0.30, 0.20),
        compared("b", "test", 0.10, 0.10),
        compared("c", None, None, None),
        compared("d", "validation", 0.20, 0.05),
    ]

    # Execute
    mixed, caveat = _ranked(rows, CompareOrder.loss)
    alike, none = _ranked([r for r in rows if r["lowest_loss_of"] != "test"], CompareOrder.loss)

    # Assert
    assert [r["job_id"] for r in mixed] == ["d", "b", "a", "c"]
    assert caveat == (
        "their lowest losses are of different sets (validation for 2, test for 1), which do not "
        "compare: sorted by the test loss of each one's round of its lowest loss"
    )
    assert [r["job_id"] for r in alike] == ["d", "a", "c"]
    assert none is None
    assert _ranked(rows, CompareOrder.cost)[1] is None
    # The table shows the test loss they were sorted by beside a validation loss, among both.
    rows[0]["lowest_at_round"] = 7
    assert _lowest_said(rows[0], mixed=True) == "0.3000 validation (round 7; test 0.2000)"
    assert _lowest_said(rows[0], mixed=False) == "0.3000 validation (round 7)"
    assert _lowest_said(rows[2], mixed=True) == ""


def test_platform_info_prints_the_limits_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAASDL_LOCAL__POOL_MEMORY_MB", "3072")

    result = runner.invoke(app, ["platform", "info"])

    assert result.exit_code == 0, result.output
    limits = json.loads(result.stdout)
    assert limits["pool_memory_mb"] == 3072
    assert limits["memory_enforcement"] in ("cgroup-v1", "cgroup-v2", "rss-watchdog")


def test_bad_settings_exit_non_zero_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAASDL_LOCAL__POOL_MEMORY_MB", "lots")

    result = runner.invoke(app, ["platform", "info"])

    assert result.exit_code == 2
    assert "FAASDL_LOCAL__POOL_MEMORY_MB" in result.output


def test_bad_option_is_refused() -> None:
    result = runner.invoke(app, ["platform", "serve", "--port", "99999"])

    assert result.exit_code == 2
    assert "--port" in result.output


def test_unreachable_openwhisk_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAASDL_PLATFORM", "openwhisk")
    monkeypatch.setenv("FAASDL_OPENWHISK__API_HOST", "http://127.0.0.1:9")
    monkeypatch.setenv("FAASDL_OPENWHISK__RETRY_MAX_WAIT_S", "0.1")  # the eight attempts' waits

    result = runner.invoke(app, ["platform", "info"])

    assert result.exit_code == 2
    assert "cannot read OpenWhisk's limits from http://127.0.0.1:9" in result.output


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--model", "gpt"], "model: unknown model 'gpt'"),
        (["--model", "mlp", "--batch-size", "0"], "batch_size: Input should be greater than"),
        (["--model", "mlp", "--dataset", "npz", "--path", "/nonexistent.npz"], "dataset.path"),
        (["--model", "mlp", "--dataset", "imagenet"], "dataset"),
        (["--model", "resnet50"], "needs images of at least 32×32"),
        (["--model", "mlp", "--expected-cost", "inf"], "expected_cost: Input should be a finite"),
        (["--model", "mlp", "--shape", "32x-1x3"], "'32x-1x3' is not a shape: sizes joined by x"),
        (["--model", "mlp", "--shape", "0x3"], "dataset.shape: Value error, must be 1"),
        (["--model", "mlp", "--path", "/nonexistent.npz"], "dataset.path: no such file"),
        (["--model", "mlp", "--epochs", "2", "--sync-every", "4"], "sync_every: Value error, is"),
        (["--model", "mlp", "--workers", "64"], "batch_size: batch size 32 is larger than a shard"),
        # An argument's byte the terminal could not decode reads as a lone surrogate.
        (["--model", "mlp\udcff"], "model: is not Unicode text (a lone surrogate, '\\udcff' at 3)"),
        (["--model", "mlp", "--path", "/" + "x" * 300], "dataset.path: no such file here"),
    ],
    ids=[
        "unknown-model",
        "batch-size",
        "missing-npz",
        "unknown-dataset",
        "shape-mismatch",
        "infinite-cost",
        "shape-not-sizes",
        "shape-of-zero",
        "path-alone",
        "rounds-over-epochs",
        "shards-under-a-batch",
        "not-unicode",
        "path-too-long",
    ],
)
def test_estimate_refuses_bad_input_naming_the_field(
    args: list[str], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAASDL_STORE__URL", f"sqlite:///{tmp_path / 'state.db'}")

    result = runner.invoke(app, ["estimate", *args])

    assert result.exit_code == 2
    assert named in " ".join(result.output.split())
    assert not any(tmp_path.iterdir())  # nothing was written for a rejected job


def test_estimate_plans_the_job_file_submit_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAASDL_STORE__URL", f"sqlite:///{tmp_path / 'state.db'}")
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "model: mlp\ndataset: {name: digits}\nepochs: 5\nsync_every: 2\nworkers: 3\nseed: 7\n"
        "optimizer: sgd\ntenant: team-a\nfault_tolerance: {policy: retry, max_attempts: 2}\n"
    )

    result = runner.invoke(app, ["estimate", "--spec", str(spec), "--workers", "4"])

    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout.splitlines()[-1])
    assert (plan["rounds"], plan["epochs_per_round"]) == (3, 2)  # the job's epochs, in rounds
    assert plan["train"]["containers"] == 4  # the option over the file's field
    assert plan["tree"] == [[[0, 1, 2, 3]]]
    assert plan["examples"] + plan["test_examples"] == 1797  # the digits, split
    # The table, for a reader: each part in words.
    said = " ".join(result.stderr.split())
    memory, timeout = plan["train"]["memory_mb"], plan["train"]["timeout_ms"] / 1000
    assert f"training actions │ 4 × {memory} MB, time limit {timeout:g} s (the platform's" in said
    assert "rounds │ 3 of 2 epoch(s)" in said
    assert "from the model's measured sizes" in said
    # The store named is not there: planned without history, and none made (it was).
    assert [p.name for p in tmp_path.iterdir()] == ["job.yaml"]
    # The same job from standard input, planned the same.
    piped = runner.invoke(
        app, ["estimate", "--spec", "-", "--workers", "4"], input=spec.read_text()
    )
    assert piped.exit_code == 0, piped.output
    # The runtime's baseline, measured again: its peak and its cold start, and the memory class
    # its peak rounds up to (two probes beside another worker's tests crossed one: 704, 768 MB).
    measured = ("memory_estimate_mb", "memory_parts", "median_cold_start_ms", "memory_mb")

    def planned(plan: dict[str, Any]) -> dict[str, Any]:
        train = {k: v for k, v in plan["train"].items() if k not in measured}
        return {**plan, "train": train}

    again = json.loads(piped.stdout.splitlines()[-1])
    assert planned(again) == planned(plan)
    step = EstimatorSettings().memory_step_mb
    for made in (plan, again):  # each the class of its own estimate, which it shows to 0.1 MB
        memory, estimate = made["train"]["memory_mb"], made["train"]["memory_estimate_mb"]
        assert memory % step == 0
        assert memory - step < estimate + 0.05  # 704.0 shown, 768 MB: over 704 by under 0.05
        assert estimate - 0.05 <= memory


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"- not\n- a mapping\n", "must hold a mapping"),
        (b"model: mlp\nepochs: [\n", "is not valid YAML or JSON"),
        # The parser's own words, brackets and all (rich read "[mlp ... ']" as a style tag).
        (b"model: [mlp\n", "model: [mlp ^ expected ',' or ']', but got '<stream end>'"),
        (b"model: mlp\n# \xff\n", "is not UTF-8 text: invalid start byte at byte 13"),
        (b"model: mlp\nexpected_cost: .inf\n", "expected_cost: Input should be a finite number"),
        # A field the job does not take is told the one it is closest to, or those it may be.
        (
            b"model: mlp\nepoch: 3\n",
            "epoch: Extra inputs are not permitted (did you mean 'epochs'?)",
        ),
        (
            b"model: mlp\nEPOCHS: 3\n",
            "EPOCHS: Extra inputs are not permitted (did you mean 'epochs'?)",
        ),
        (
            b"model: mlp\ndataset: {name: npz, path: a.npz, pathh: b}\n",
            "dataset.pathh: Extra inputs are not permitted (did you mean 'path'?)",
        ),
        # A data set's kind is its name: without it, or as a word, the names are told.
        (
            b"model: mlp\ndataset: {kind: digits}\n",
            "dataset: needs 'name' (one of 'digits', 'synthetic', 'npz')",
        ),
        (b"model: mlp\ndataset: digits\n", "dataset: should be a mapping, {name: digits}"),
        (b"model: mlp\ndataset: {name: npz}\n", "dataset.path: Field required"),
        (
            b"model: mlp\nfault_tolerance: {strategy: retry}\n",
            "fault_tolerance.strategy: Extra inputs are not permitted (expected one of: "
            "checkpoint_interval_s, copies, heartbeat_s, max_attempts, policy, replication)",
        ),
        # What JSON cannot hold, and what would stop the CLI: each a traceback or a hang before.
        (
            b"model: mlp\nname: &n [*n]\n",
            "line 2, column 11: an alias (*n) is not read in a job's fields: write its value out",
        ),
        (
            b"model: mlp\nname: !!binary aGk=\n",
            "line 2, column 7: a tag (!!binary) is not read in a job's fields: write the value",
        ),
        (b"model: mlp\n1: x\n", "line 2, column 1: a field's name is 1, not text (quote it)"),
        (b"model: mlp\nname: " + b"[" * 400 + b"]" * 400 + b"\n", "nested deeper than 32 levels"),
        (b"model: mlp\nepochs: " + b"9" * 5_000 + b"\n", "an integer of more than 4,300 digits"),
        # A job file is read up to 1 MiB (/dev/zero was read until memory ran out).
        (b"model: mlp\n#" + b" " * 2**20 + b"\n", "holds over 1,048,576 bytes: a job is a few"),
    ],
    ids=[
        "not-a-mapping",
        "not-yaml",
        "brackets",
        "not-utf-8",
        "infinite-cost",
        "misspelt",
        "capitals",
        "misspelt-in-a-union",
        "no-name",
        "a-name-alone",
        "missing-in-a-union",
        "not-close",
        "alias-in-itself",
        "bytes",
        "number-as-a-name",
        "too-deep",
        "too-many-digits",
        "too-long",
    ],
)
@pytest.mark.parametrize("command", ["estimate", "submit"])
def test_a_bad_spec_file_is_refused_naming_it(
    content: bytes, named: str, command: str, tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_bytes(content)
    args = {
        "estimate": ["estimate", "--spec", str(spec)],
        "submit": ["submit", str(spec), "--url", "http://127.0.0.1:9"],  # never reached
    }[command]

    result = runner.invoke(app, args)

    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert named in output
    if not named.startswith(("expected_cost", "epoch", "EPOCHS", "dataset", "fault")):  # its own
        assert f"error: {'--spec' if command == 'estimate' else 'spec'}: {spec}" in output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("job_id", ["", "../../etc", "0123456789ABCDEF", "0123456789abcde"])
@pytest.mark.parametrize("command", ["status", "ledger", "cancel", "finish", "model", "delete"])
def test_what_is_not_a_job_id_is_refused_before_the_controller_is_asked(
    command: str, job_id: str, tmp_path: Path
) -> None:
    # An empty id asked for /v1/jobs/, "../../etc" for the controller's /etc.
    extra = ["--output", str(tmp_path / "model.safetensors")] if command == "model" else []

    result = runner.invoke(app, [command, job_id, "--url", "http://127.0.0.1:9", *extra])

    assert result.exit_code == 2, result.output
    assert f"{job_id!r} is not a job's id" in " ".join(result.output.split())
    assert "unreachable" not in result.output
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--before", "../x"], "'../x' is not a job's id"),
        (["--state", "Done"], "'--state': Value error, 'Done' is not one of 'queued',"),
        (["--limit", "0"], "'--limit': Input should be greater than or equal to 1"),
        (["--limit", "1001"], "'--limit': Input should be less than or equal to 1000"),
        (["0123456789abcdef", "--from-round", "0"], "'--from-round': Input should be greater"),
        (
            ["--name", "sweep \udcff"],
            "name: is not Unicode text (a lone surrogate, '\\udcff' at 6)",
        ),
    ],
)
def test_a_bad_page_of_jobs_or_of_a_ledger_is_refused_before_the_controller_is_asked(
    options: list[str], message: str
) -> None:
    command = "ledger" if "--from-round" in options else "jobs"
    result = runner.invoke(app, [command, *options, "--url", "http://127.0.0.1:9"])

    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_a_store_url_of_an_unknown_scheme_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAASDL_STORE__URL", "bogus://x")

    result = runner.invoke(app, ["keys", "list"])

    assert result.exit_code == 2
    assert "unknown scheme 'bogus'" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    "command",
    [
        ["demo"],
        ["experiment", "recovery", "--quick"],
        ["bench", "recovery", "--quick"],
        ["bench", "training", "--quick"],
        ["bench", "estimator", "--quick"],
        ["bench", "api", "--quick"],
        ["bench", "steadiness", "--duration", "5"],
        ["jobs"],
    ],
    ids=" ".join,
)
def test_every_command_refuses_a_misspelt_setting_before_it_starts(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The demo, experiments and benchmarks make settings of their own: they failed with a
    # traceback, or (api, steadiness) ran without the setting meant.
    monkeypatch.setenv("FAASDL_LOCAL__POOL_MEMORY", "2048")

    result = runner.invoke(app, command)

    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "error: invalid settings: unknown setting(s) FAASDL_LOCAL__POOL_MEMORY (did you mean "
        "FAASDL_LOCAL__POOL_MEMORY_MB?): Extra inputs are not permitted"
    ]


def test_a_section_check_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAASDL_OPENWHISK__API_HOST", "ow.example:31001")

    result = runner.invoke(app, ["jobs"])

    assert result.exit_code == 2
    assert " ".join(result.output.split()) == (
        "error: invalid settings: FAASDL_OPENWHISK__API_HOST: 'ow.example:31001' is not an "
        "http:// or https:// URL of a server"
    )


def test_keys_say_which_store_and_read_none_that_is_not_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sqlite:///tmp/x.db is relative (SQLAlchemy's convention): a user's keys went to
    # ./tmp/x.db, and a list of a store not there made it and showed none.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAASDL_STORE__URL", "sqlite:///tmp/state.db")

    listed = runner.invoke(app, ["keys", "list"])
    revoked = runner.invoke(app, ["keys", "revoke", "0123456789abcdef"])
    made_before = list(tmp_path.iterdir())
    created = runner.invoke(app, ["keys", "create", "--tenant", "team-a"])
    listed_after = runner.invoke(app, ["keys", "list"])

    for refused in (listed, revoked):
        assert refused.exit_code == 2, refused.output
        said = " ".join(refused.output.split())
        assert f"no store at {tmp_path / 'tmp/state.db'}" in said
        assert "sqlite:/// is relative to the working directory, sqlite://// absolute" in said
    assert made_before == []
    assert created.exit_code == 0, created.output
    assert f"store: sqlite:///{tmp_path / 'tmp/state.db'}" in created.output
    assert listed_after.exit_code == 0, listed_after.output
    assert json.loads(listed_after.stdout)[0]["tenant"] == "team-a"


def test_a_list_of_no_keys_says_so_rather_than_draw_an_empty_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    with make_store(StoreSettings(), url):
        pass  # there, and empty
    monkeypatch.setenv("FAASDL_STORE__URL", url)

    listed = runner.invoke(app, ["keys", "list"])

    assert listed.exit_code == 0, listed.output
    assert listed.stderr.splitlines() == [
        f"store: {url}",
        "no API keys: make one with faasdl keys create --tenant TENANT",
    ]
    assert json.loads(listed.stdout) == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret-pw@cache:6379/0", "redis://cache:6379/0"),
        ("rediss://app:s3cret-pw@cache:6380/1", "rediss://app@cache:6380/1"),
        ("ignite://a:10800,b:10800?prefix=x", "ignite://a:10800,b:10800?prefix=x"),
        ("sqlite:////srv/state.db", "sqlite:////srv/state.db"),
    ],
)
def test_a_store_is_shown_without_its_password(url: str, shown: str) -> None:
    from faasdl.store import shown_url

    assert shown_url(url) == shown


def test_the_python_clients_wait_asks_an_unreachable_controller_again_then_gives_up() -> None:
    from faasdl.controller.client import ControllerClient
    from faasdl.errors import PlatformUnavailable

    with ControllerClient(url="http://127.0.0.1:9", reconnect_s=0.5) as client:
        started = time.monotonic()
        with pytest.raises(PlatformUnavailable, match=r"http://127\.0\.0\.1:9 is unreachable"):
            client.wait("0123456789abcdef")
        waited = time.monotonic() - started

    assert waited >= 0.5  # asked again for reconnect_s before it gave up


def test_submit_refuses_a_bad_job_before_contacting_the_controller(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("model: mlp\nepochs: 2\nsync_every: 3\n")

    result = runner.invoke(app, ["submit", str(spec), "--url", "http://127.0.0.1:9"])
    piped = runner.invoke(app, ["submit", "-", "--url", "http://127.0.0.1:9"], input="- a list\n")

    assert result.exit_code == 2
    assert "sync_every" in result.output
    assert "unreachable" not in result.output
    assert piped.exit_code == 2
    assert "error: spec: <stdin> must hold a mapping of job fields" in piped.output


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["epochs"], "--set: expected FIELD=VALUE (FIELD dotted for a field of a mapping: "),
        (["=3"], "--set: expected FIELD=VALUE"),
        (["dataset..name=digits"], "--set: expected FIELD=VALUE"),
        (["model.name=mlp"], "--set model.name: model is 'mlp', not a mapping of fields"),
        (["epochs=[1"], "--set epochs: '[1' is not a YAML value"),
        (["name=!!set {a}"], "--set name: '!!set {a}': a tag (!!set) is not read in a job's"),
        (["epochs=many"], "epochs: Input should be a valid integer"),
        (["sync_every=3", "epochs=4", "epochs=2"], "sync_every"),  # in order: the last wins
        (
            ["dataset.size=3"],
            "dataset.size: Extra inputs are not permitted (expected one of: name,",
        ),
    ],
)
def test_a_bad_set_option_is_refused_naming_it_before_the_controller_is_asked(
    tmp_path: Path, options: list[str], said: str
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("model: mlp\ndataset: {name: digits}\nepochs: 2\n")
    sets = [arg for option in options for arg in ("--set", option)]

    results = [
        runner.invoke(app, [*command, *sets, "--url", "http://127.0.0.1:9"])
        for command in (["submit", str(spec)], ["estimate", "--spec", str(spec)])
    ]

    for result in results:
        assert result.exit_code == 2
        assert said in " ".join(result.output.split()), result.output
        assert "unreachable" not in result.output


@pytest.mark.parametrize("key", ["run\n7", " run-7", "run-\u043a", "", "k" * 256])
def test_an_idempotency_key_no_header_carries_is_refused_before_it_is_sent(
    tmp_path: Path, key: str
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("model: mlp\ndataset: {name: digits}\n")

    result = runner.invoke(
        app, ["submit", str(spec), "--idempotency-key", key, "--url", "http://127.0.0.1:9"]
    )

    # requests raised UnicodeEncodeError (a traceback), or refused a newline or a leading space
    # as if the controller were unreachable.
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "error: Idempotency-Key: must be 1 to 255 printable characters of ISO-8859-1" in said
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_job_file_s_date_and_exponent_are_read_as_json_reads_them(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("model: mlp\ndataset: {name: digits}\nname: 2026-12-04\nlearning_rate: 1e-3\n")

    result = runner.invoke(app, ["submit", str(spec), "--url", "http://127.0.0.1:9"])

    # Past the job's checks (a date was no name, before), as far as the controller.
    assert result.exit_code == 2
    assert "the controller at http://127.0.0.1:9 is unreachable" in " ".join(result.output.split())


def test_a_url_that_answers_web_pages_is_told_not_the_controller_s(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("model: mlp\ndataset: {name: digits}\n")
    with web_server() as url:
        listed = runner.invoke(app, ["jobs", "--url", url])
        status = runner.invoke(app, ["status", "0123456789abcdef", "--url", url])
        submitted = runner.invoke(app, ["submit", str(spec), "--url", url])

    # A page for a list ended in requests' JSONDecodeError (a traceback); a 404 page was "no
    # job"; a proxy's 502 page was printed whole.
    said = [" ".join(r.output.split()) for r in (listed, status, submitted)]
    assert all(r.exit_code == 2 for r in (listed, status, submitted)), said
    assert listed.exception is None or isinstance(listed.exception, SystemExit)
    assert (
        f"{url} answered GET /v1/jobs with {PAGE_BYTES} bytes of text/html, not the controller's "
        "JSON: is it the controller's URL?" in said[0]
    )
    assert (
        f"HTTP 404 from {url}, not the controller's answer ({PAGE_BYTES} bytes of text/html): is "
        "it the controller's URL, or a proxy before it failing?" in said[1]
    )
    assert f"HTTP 502 from {url}, not the controller's answer ({PAGE_BYTES} bytes" in said[2]
    assert "no job" not in said[1]
    assert "Welcome" not in said[2]


def test_an_https_url_of_a_server_without_tls_is_told_to_be_http() -> None:
    with web_server() as url:
        result = runner.invoke(app, ["jobs", "--url", url.replace("http://", "https://")])

    # It said only "[SSL: WRONG_VERSION_NUMBER] wrong version number".
    assert result.exit_code == 2
    assert "(the server answered without TLS: is its URL http://?)" in " ".join(
        result.output.split()
    )


def test_an_unreachable_controller_is_one_clear_line() -> None:
    result = runner.invoke(app, ["status", "0123456789abcdef", "--url", "http://127.0.0.1:9"])

    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "the controller at http://127.0.0.1:9 is unreachable: [Errno 111] Connection" in said
    assert "Max retries" not in result.output  # requests' wrapping, no use to a user


def test_a_controller_that_does_not_answer_is_named_with_the_time_waited() -> None:
    with socket.socket() as silent:  # listens, so a connection is made, and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"

        client = ControllerClient(url=url, timeout_s=0.2)
        with closing(client), pytest.raises(PlatformUnavailable) as raised:
            client.datasets()

    assert str(raised.value) == f"the controller at {url} did not answer in 0.2 s"


def test_the_controllers_url_is_the_option_else_the_setting_and_must_be_http(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAASDL_CLIENT__URL", "http://127.0.0.1:9")
    from_setting = runner.invoke(app, ["status", "0123456789abcdef"])
    from_option = runner.invoke(app, ["status", "0123456789abcdef", "--url", "http://127.0.0.2:9"])
    bad_option = runner.invoke(app, ["status", "0123456789abcdef", "--url", "localhost:8080"])
    monkeypatch.setenv("FAASDL_CLIENT__URL", "127.0.0.1:8080")
    bad_setting = runner.invoke(app, ["jobs"])

    assert "the controller at http://127.0.0.1:9 is unreachable" in from_setting.output
    assert "the controller at http://127.0.0.2:9 is unreachable" in from_option.output
    assert bad_option.exit_code == 2
    assert "--url: 'localhost:8080' is not an http:// or https:// URL" in bad_option.output
    assert bad_setting.exit_code == 2
    assert (
        "FAASDL_CLIENT__URL: '127.0.0.1:8080' is not an http:// or https:// URL"
        in bad_setting.output
    )
    assert "unreachable" not in bad_option.output + bad_setting.output


def test_platform_deploy_puts_every_variant_in_the_image_once(
    monkeypatch: pytest.MonkeyPatch, make_served: Callable[..., Served]
) -> None:
    # Arrange: the platform behind its REST API, with faasdl's action image.
    served = make_served(images=["faasdl/action:test"])
    monkeypatch.setenv("FAASDL_PLATFORM", "openwhisk")
    monkeypatch.setenv("FAASDL_OPENWHISK__API_HOST", served.url)
    monkeypatch.setenv("FAASDL_OPENWHISK__ACTION_IMAGE", "faasdl/action:test")
    args = ["platform", "deploy", "--memory-mb", "256", "--memory-mb", "512", "--timeout-s", "30"]

    # Execute: twice, then with one of the memory classes another.
    first = runner.invoke(app, args)
    versions = {a.name: a.version for a in served.local.list_actions()}
    again = runner.invoke(app, args)
    after = {a.name: a.version for a in served.local.list_actions()}
    more = runner.invoke(app, [*args[:2], "--memory-mb", "512", "--memory-mb", "1024", *args[-2:]])

    # Assert: train and aggregate × two memory classes, blackbox in the image, left alone after,
    # and the output says which were deployed.
    assert first.exit_code == 0, first.output
    deployed = json.loads(first.stdout.splitlines()[-1])
    assert deployed["image"] == "faasdl/action:test"
    assert sorted(deployed["actions"]) == sorted(deployed["deployed"]) == sorted(versions)
    assert len(versions) == 4
    assert {served.local.get_action(n).exec.kind for n in versions} == {"blackbox"}
    assert "4 action variants in faasdl/action:test: 4 deployed, 0 already there" in first.output
    assert again.exit_code == 0, again.output
    assert after == versions
    assert json.loads(again.stdout.splitlines()[-1])["deployed"] == []
    assert "0 deployed, 4 already there as asked" in again.output
    assert json.loads(more.stdout.splitlines()[-1])["deployed"] == [
        "faasdl-train-m1024-t30s",
        "faasdl-aggregate-m1024-t30s",
    ]
    assert "2 deployed, 2 already there as asked" in more.output


def test_platform_deploy_refuses_a_class_outside_the_limits_and_deploys_nothing(
    monkeypatch: pytest.MonkeyPatch, make_served: Callable[..., Served]
) -> None:
    served = make_served()
    monkeypatch.setenv("FAASDL_PLATFORM", "openwhisk")
    monkeypatch.setenv("FAASDL_OPENWHISK__API_HOST", served.url)

    result = runner.invoke(
        app, ["platform", "deploy", "--memory-mb", "256", "--memory-mb", "99999"]
    )

    assert result.exit_code == 2
    assert "--memory-mb 99999 is outside the platform's" in result.output
    assert served.local.list_actions() == []


def test_output_that_is_not_a_terminal_is_laid_out_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log or a pipe gets :data:`LOG_WIDTH` columns, not rich's 80; ``COLUMNS`` wins."""
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.delenv("COLUMNS", raising=False)
    table = Table(*(f"column {i}" for i in range(9)))
    table.add_row(*(f"value {i:07d}" for i in range(9)))

    console = stderr_console()
    console.print(table)

    assert console.width == LOG_WIDTH
    assert "value 0000008" in log.getvalue()  # no cell wrapped
    monkeypatch.setenv("COLUMNS", "100")
    assert stderr_console().width == 100


def _groups(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every group of commands under ``command`` (itself first), with its words on the line."""
    if hasattr(command, "commands"):
        yield path, command
        for name, sub in command.commands.items():
            yield from _groups(sub, (*path, name))


def test_every_groups_help_lists_each_commands_summary_whole_on_its_line() -> None:
    """A command's summary (its docstring's first paragraph) is one paragraph in its group's
    list, whatever lines the docstring wraps it on; its backticks are markup."""
    groups = list(_groups(typer.main.get_command(app)))
    assert [path for path, _ in groups] == [(), ("platform",), ("bench",), ("keys",), ("datasets",)]
    for path, group in groups:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
        assert result.exit_code == 0, result.output
        lines = [" ".join(line.strip("│ ").split()) for line in result.output.splitlines()]
        for name, command in group.commands.items():
            summary = " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())
            expected = f"{name} {summary.replace('`', '')}"
            assert expected in lines, f"faasdl {' '.join(path)} --help: {name}"


def test_every_command_is_in_the_readmes_table_of_commands() -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    table = readme[readme.index("## Commands") : readme.index("## Configuration")]
    commands = [
        " ".join((*path, name))
        for path, group in _groups(typer.main.get_command(app))
        for name, command in group.commands.items()
        if not hasattr(command, "commands")  # a group: its commands are listed
    ]

    assert len(commands) > 20
    assert [
        c for c in commands if f"`faasdl {c} " not in table and f"`faasdl {c}`" not in table
    ] == []


def test_a_model_download_fails_before_asking_where_it_cannot_be_written(tmp_path: Path) -> None:
    unwritable = tmp_path / "no-such-dir" / "model.safetensors"
    nowhere = runner.invoke(
        app, ["model", "0123456789abcdef", "-o", str(unwritable), "--url", "http://127.0.0.1:9"]
    )
    writable = tmp_path / "model.safetensors"
    unreachable = runner.invoke(
        app, ["model", "0123456789abcdef", "-o", str(writable), "--url", "http://127.0.0.1:9"]
    )

    assert nowhere.exit_code == 2
    reason = f"--output: cannot write {unwritable}: No such file or directory"
    assert reason in " ".join(nowhere.output.split())
    assert unreachable.exit_code == 2
    assert "is unreachable" in unreachable.output
    assert not any(tmp_path.iterdir())  # no .partial left behind


def test_a_model_download_to_a_name_the_file_system_cannot_hold_is_one_line(
    tmp_path: Path,
) -> None:
    # Path.is_dir raised ENAMETOOLONG (a traceback) where os.path.isdir says no.
    too_long = tmp_path / ("m" * 300)

    result = runner.invoke(
        app, ["model", "0123456789abcdef", "-o", str(too_long), "--url", "http://127.0.0.1:9"]
    )

    assert result.exit_code == 2, result.output
    output = "".join(result.output.split())  # the long name is wrapped where it is shown
    assert f"--output:cannotwrite{too_long}:Filenametoolong" in output
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("auth", "host", "warned"),
    [
        ("none", "0.0.0.0", True),
        ("none", "controller.example", True),
        ("none", "127.0.0.1", False),
        ("none", "::1", False),
        ("none", "localhost", False),
        ("keys", "0.0.0.0", False),
    ],
)
def test_serve_warns_of_a_controller_without_authentication_beyond_this_machine(
    auth: str, host: str, warned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from faasdl.cli import _open_to_all
    from faasdl.config import Settings

    monkeypatch.setenv("FAASDL_API__AUTH", auth)

    warning = _open_to_all(Settings(), host)

    assert (warning is not None) == warned
    if warning:
        assert warning.startswith(
            f"API auth none on {host}: whoever reaches it is an administrator"
        )


@pytest.mark.parametrize(
    ("url", "bundle", "warned"),
    [
        ("ignite://ignite:10800", None, True),
        ("ignite://ignite:10800", __file__, False),
        ("rediss://redis:6380/0", None, False),  # redis-py checks it by the system's CAs
    ],
    ids=["ignite", "ignite-with-a-ca-bundle", "rediss"],
)
def test_serve_warns_of_a_password_sent_to_an_ignite_whose_certificate_is_not_checked(
    url: str, bundle: str | None, warned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from faasdl.cli import _unchecked_store
    from faasdl.config import Settings

    monkeypatch.setenv("FAASDL_STORE__URL", url)
    monkeypatch.setenv("FAASDL_STORE__USERNAME", "faasdl")
    monkeypatch.setenv("FAASDL_STORE__PASSWORD", "s3cret")
    if bundle:
        monkeypatch.setenv("FAASDL_STORE__TLS_CA_FILE", bundle)

    warning = _unchecked_store(Settings())

    assert (warning is not None) == warned
    if warning:
        assert "without its nodes' certificates being checked" in warning


@pytest.mark.parametrize(
    ("host", "auth", "warned"),
    [
        ("0.0.0.0", None, True),
        ("127.0.0.1", None, False),
        ("0.0.0.0", "someone:a-key-of-our-own", False),
    ],
)
def test_platform_serve_warns_of_the_published_guest_key_beyond_this_machine(
    host: str, auth: str | None, warned: bool
) -> None:
    from faasdl.cli import _published_key
    from faasdl.config import ServerSettings

    server = ServerSettings(host=host, **({"auth": auth} if auth else {}))

    warning = _published_key(server)

    assert (warning is not None) == warned
    if warning:
        assert f"published guest key: whoever reaches {host} runs code here" in warning


def ended_view(state: str, error: str | None = None) -> dict[str, Any]:
    """A job's view as the API gives it, as much of it as its summary reads."""
    job = {
        "job_id": "0" * 16,
        "state": state,
        "spec": {"model": "mlp", "dataset": {"name": "npz", "path": "cancer.npz"}},
        "plan": {"train": {"containers": 2, "memory_mb": 704}, "rounds": 1},
        "started_ms": 1_000,
        "finished_ms": 6_400,
        "rounds": [],
        "cost_usd": 0.0,
        "error": error,
    }
    return {"job": job}


@pytest.mark.parametrize(
    ("state", "said"), [("done", "2 failed and recovered"), ("failed", "2 failed")]
)
def test_a_jobs_summary_calls_its_failures_recovered_only_if_it_is_done(
    state: str, said: str
) -> None:
    from faasdl.controller.watch import summary

    error = "shard 0 failed 4 time(s) in a row" if state == "failed" else None
    ledger = [{"outcome": "crash", "gb_s": 1.0}] * 2 + [{"outcome": "success", "gb_s": 1.0}]

    caption = str(summary(ended_view(state, error), ledger).caption).splitlines()

    assert caption[0] == "mlp on cancer.npz: 2 worker(s) of 704 MB, 5.4 s"  # what ran, how long
    assert caption[1].startswith(f"3 activations ({said}), 3.0 GB·s")


def test_a_jobs_words_are_printed_as_they_are_brackets_and_all() -> None:
    # rich read "[...]" in a job's error or log line as its own markup: "[red]" went missing and
    # "[/]", closing nothing, raised.
    from rich.console import Console

    from faasdl.controller.watch import summary, watch

    said = "application error: ValueError('[red] is not a shape [/]')"
    view = ended_view("failed", said)
    view["job"].update(round=0, events=[{"kind": "failed", "message": said}], events_dropped=0)
    view["job"]["spec"]["name"] = "sweep [lr]"
    out = io.StringIO()
    console = Console(file=out, width=300)

    watch(lambda _: {**view, "queue_position": None, "waiting_for": None, "units": []}, console)
    console.print(summary(view, []))

    lines = [" ".join(line.split()) for line in out.getvalue().splitlines()]
    assert f"failed {said}" in lines  # the log line
    assert f"$0.000000; error: {said}" in " ".join(lines)  # the summary's caption, wrapped
    assert f"job {'0' * 16} (sweep [lr]): failed" in lines  # its title, with the job's name


@pytest.mark.parametrize("duration", ["inf", "nan", "4", "3601"])
def test_the_steadiness_bench_refuses_a_duration_it_could_not_finish_or_use(duration: str) -> None:
    # `--duration inf` ran for good: the option had a floor and no ceiling.
    result = runner.invoke(app, ["bench", "steadiness", "--duration", duration])

    assert result.exit_code == 2
    assert "Invalid value for '--duration'" in " ".join(result.output.split())


@pytest.mark.parametrize("output", ["-", "DIR"])
def test_a_model_download_to_stdout_or_a_directory_is_refused_before_it_is_asked_for(
    output: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `-o -` wrote a file named "-"; `-o DIR` downloaded the model, then failed to rename it.
    monkeypatch.chdir(tmp_path)
    given = str(tmp_path) if output == "DIR" else output
    args = ["model", "0123456789abcdef", "-o", given, "--url", "http://127.0.0.1:9"]

    result = runner.invoke(app, args)

    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "error: --output: " in said
    assert "unreachable" not in said  # refused before the controller was asked
    assert list(tmp_path.iterdir()) == []


def test_a_watch_says_what_a_queued_job_waits_for_once_each_time_it_changes() -> None:
    from rich.console import Console

    from faasdl.controller.watch import watch

    pool = "the platform's pool memory: it needs 2,816 MB, 1,408 of 4,096 MB free"
    views = iter([pool, pool, "job 1234, first in line, to start", None])

    def read(round_from: int) -> dict[str, Any]:
        assert round_from == 0  # no round has finished
        waiting = next(views)
        view = ended_view("queued" if waiting else "done")
        view["job"].update(round=0, events=[], events_dropped=0)
        return {
            **view,
            "queue_position": 1 if waiting else None,
            "waiting_for": waiting,
            "units": [],
        }

    out = io.StringIO()
    watch(read, Console(file=out, width=200))

    said = [" ".join(line.split()) for line in out.getvalue().splitlines()]
    assert [line for line in said if line.startswith("waiting")] == [
        f"waiting for {pool}",
        "waiting for job 1234, first in line, to start",
    ]


def test_a_watch_reads_a_running_jobs_latest_round_and_every_round_once_it_has_ended() -> None:
    from rich.console import Console

    from faasdl.controller.watch import watch

    # A job at rounds 5, 6 and 7 of 7 at each look, as the API gives it from round_from on.
    looks = iter([(5, "running"), (6, "running"), (7, "done")])
    asked: list[int] = []

    def read(round_from: int) -> dict[str, Any]:
        asked.append(round_from)
        finished, state = next(looks, (7, "done"))  # then the ended job, read again
        view = ended_view(state)
        rounds = [
            {"round": n, "loss": 1.0 / (n + 1), "accuracy": 0.5}
            for n in range(round_from, finished)
        ]
        view["job"].update(round=finished, rounds=rounds, events=[], events_dropped=0, cost_usd=0.0)
        view["job"]["plan"]["rounds"] = 7
        return {**view, "queue_position": None, "waiting_for": None, "units": []}

    last = watch(read, Console(file=io.StringIO(), width=200))

    assert asked == [0, 4, 5, 0]  # whole, the last finished round on at each look, whole
    assert [r["round"] for r in last["job"]["rounds"]] == list(range(7))


def test_a_job_stopped_before_its_last_round_says_why_in_its_summary() -> None:
    from faasdl.controller.watch import summary

    view = ended_view("done")
    why = "finished by request after round 3/200: its model is that round's (test accuracy 0.9)"
    view["job"] |= {"stopped_early": True, "events": [{"kind": "done", "message": why}]}

    caption = str(summary(view, []).caption).splitlines()

    assert caption[-1] == why


def test_a_job_on_a_budget_that_stopped_at_it_says_so_in_its_summary() -> None:
    from faasdl.controller.watch import summary

    view = ended_view("done")
    why = "stopped early: its cost reached max_cost_usd (0.000332 of 0.000300 USD as round 4 ended)"
    view["job"]["spec"]["max_cost_usd"] = 0.0003
    view["job"] |= {"cost_usd": 0.000341, "stopped_early": True}
    view["job"]["events"] = [{"kind": "done", "message": why}]

    caption = str(summary(view, []).caption).splitlines()

    assert (
        caption[1]
        == "0 activations (0 failed and recovered), 0.0 GB·s, $0.000341 of its $0.000300 budget"
    )
    assert caption[-1] == why


def test_a_job_trained_on_from_another_says_so_in_its_summary() -> None:
    from faasdl.controller.watch import summary

    view = ended_view("done")
    view["job"]["spec"]["init_model"] = "f" * 16

    caption = str(summary(view, []).caption).splitlines()

    assert (
        caption[0] == f"mlp on cancer.npz from job {'f' * 16}'s model: 2 worker(s) of 704 MB, 5.4 s"
    )


@pytest.mark.parametrize("kept", [True, False], ids=["its record's totals", "its ledger's"])
def test_a_cancelled_jobs_summary_counts_its_stopped_activations_apart_from_failures(
    kept: bool,
) -> None:
    from faasdl.controller.watch import needs_ledger, summary

    view = ended_view("cancelled")
    ledger = [{"outcome": "stopped", "gb_s": 9.0}] * 3 + [{"outcome": "crash", "gb_s": 1.0}]
    if kept:  # a job's record keeps its ledger's totals; one from before they were kept does not
        view["job"] |= {
            "activation_count": 4,
            "ledger_totals": {"failed": 1, "stopped": 3, "gb_s": 28.0},
        }

    caption = str(summary(view, None if kept else ledger).caption).splitlines()

    assert needs_ledger(view) is not kept
    assert caption[1].startswith("4 activations (1 failed, 3 stopped), 28.0 GB·s")


def test_the_summary_of_a_record_without_totals_and_no_ledger_is_refused_saying_so() -> None:
    from faasdl.controller.watch import summary

    with pytest.raises(ValueError, match="keeps no totals: its summary needs its ledger"):
        summary(ended_view("done"))


@pytest.mark.parametrize(("rounds", "listed"), [(20, list(range(41, 61))), (0, list(range(1, 61)))])
def test_a_long_jobs_summary_lists_its_latest_rounds_unless_asked_for_every_one(
    rounds: int, listed: list[int]
) -> None:
    from faasdl.controller.watch import summary

    view = ended_view("done")
    one = {"epochs": 1, "loss": 0.5, "test_loss": 0.6, "accuracy": 0.9}
    view["job"]["rounds"] = [
        one | {"round": r, "started_ms": 1_000 * r, "finished_ms": 1_000 * r + 500}
        for r in range(60)
    ]

    table = summary(view, [], rounds=rounds)

    assert [int(str(cell)) for cell in table.columns[0].cells] == listed
    caption = str(table.caption).splitlines()
    said = f"the latest 20 of 60 rounds listed: faasdl status {'0' * 16} --rounds 0 lists every one"
    assert (caption[-1] == said) == (rounds == 20)


def test_status_refuses_a_negative_count_of_rounds_before_asking_the_controller() -> None:
    result = runner.invoke(app, ["status", "0" * 16, "--rounds", "-1"])

    assert result.exit_code == 2
    assert "Invalid value for '--rounds'" in " ".join(result.output.split())


def test_status_help_says_the_summarys_default_count_of_rounds() -> None:
    # The option's default is the summary's, whose module the CLI imports only when it shows one.
    from faasdl.controller.watch import SUMMARY_ROUNDS

    status = typer.main.get_command(app).commands["status"]  # type: ignore[attr-defined]
    (option,) = [p for p in status.params if p.name == "rounds"]

    assert f"(default: {SUMMARY_ROUNDS}; 0: every one)" in (option.help or "")
