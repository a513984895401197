"""The ``faasdl`` command.

Every command reads its settings from the environment (``FAASDL_…``, see ``faasdl.config``);
options given on the command line win. Errors print one line naming the problem and exit non-zero.
"""

from __future__ import annotations

import contextlib
import copy
import ipaddress
import json
import logging
import os
import re
import shlex
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, NoReturn

import typer
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import ErrorDetails
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from faasdl import __version__
from faasdl.config import (
    GUEST_API_KEY,
    ServerSettings,
    Settings,
    http_url_problem,
    image_problem,
)
from faasdl.errors import FaasdlError, PlatformUnavailable, ValidationError
from faasdl.store.records import BestRound, JobState

if TYPE_CHECKING:
    from faasdl.controller.client import ControllerClient
    from faasdl.controller.plan import JobPlan
    from faasdl.store import StateStore

#: The commands' help is Markdown: their docstrings quote commands in backticks, and a summary
#: that spans lines of its docstring is one paragraph in a group's list of commands (rich mode
#: kept its line breaks there).
HELP_MARKUP: Final = "markdown"

app = typer.Typer(
    name="faasdl",
    help="Train deep-learning models on Apache OpenWhisk, through failures.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=HELP_MARKUP,
)
platform_app = typer.Typer(
    help="The platform: serve the embedded one behind OpenWhisk's REST API; deploy faasdl's "
    "actions to the configured one (FAASDL_PLATFORM), write their wskdeploy manifest, print its "
    "limits.",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)
bench_app = typer.Typer(
    help="Benchmarks; each prints its figures as JSON on its last line, with the machine and "
    "the FAASDL_ variables they were measured with under 'environment'.",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)
keys_app = typer.Typer(
    help="API keys of the controller, made and revoked in its state store (FAASDL_STORE__URL).",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)
datasets_app = typer.Typer(
    help="Your uploaded .npz data sets, which jobs name as `{name: npz, path: NAME.npz}`.",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)
app.add_typer(platform_app, name="platform")
app.add_typer(bench_app, name="bench")
app.add_typer(keys_app, name="keys")
app.add_typer(datasets_app, name="datasets")

#: How wide output that is not a terminal (a log file, a pipe) is laid out: rich would take 80
#: columns and squeeze a bench's table into columns a few letters wide. ``COLUMNS`` set wins.
LOG_WIDTH = 160


def stderr_console() -> Console:
    """A console on stderr: the terminal's width, or :data:`LOG_WIDTH` where there is none."""
    found = Console(stderr=True)
    if not found.is_terminal and "COLUMNS" not in os.environ:
        found.width = LOG_WIDTH
    return found


console = stderr_console()


def _show(table: Table, empty: str, *, width: int | None = None) -> None:
    """``table`` on stderr, or where it has no rows the line ``empty`` (a frame of headings
    alone says nothing)."""
    if table.row_count:
        console.print(table, width=width)
    else:
        console.print(empty, markup=False)


def fail(message: str, code: int = 2) -> NoReturn:
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def echo_bench(result: dict[str, Any]) -> None:
    """A benchmark's last line: its figures, and under ``environment`` the machine and the
    ``FAASDL_`` variables they were measured with (secrets masked): the benchmark's platform and
    store take every setting it does not choose from them."""
    from faasdl.provenance import environment

    typer.echo(json.dumps({**result, "environment": environment()}))


def load_settings() -> Settings:
    try:
        return Settings()
    except PydanticValidationError as exc:
        fail(f"invalid settings: {'; '.join(map(_settings_problem, exc.errors()))}")


def _settings_problem(error: ErrorDetails) -> str:
    """One setting's problem as its variable and what is wrong: a section's own check names a
    field of it first (``api_host: …``), the unknown-variables check none."""
    message = error["msg"].removeprefix("Value error, ")
    loc = [str(part) for part in error["loc"]]
    if len(loc) == 1 and (named := re.match(r"([a-z_]+): (.*)", message, re.S)):
        loc.append(named[1])
        message = named[2]
    return f"FAASDL_{'__'.join(loc).upper()}: {message}" if loc else message


@app.callback()
def _settings_first(ctx: typer.Context) -> None:
    # Every command but version checks the FAASDL_ variables before it starts: the commands
    # that make settings of their own (the demo, experiments, benchmarks) failed with a
    # traceback on a misspelt one, or ran without it.
    if ctx.invoked_subcommand != "version":
        load_settings()


@app.command()
def version() -> None:
    """Print faasdl's version."""
    typer.echo(__version__)


@platform_app.command("serve")
def platform_serve(
    host: Annotated[str | None, typer.Option(help="Interface to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 3233).", min=0, max=65535)] = None,
    pool_memory_mb: Annotated[
        int | None, typer.Option(help="Container pool user memory in MB.", min=128)
    ] = None,
) -> None:
    """Serve the embedded platform behind OpenWhisk's REST API v1 (for wsk and REST clients)."""
    import uvicorn

    from faasdl.platform.local import LocalPlatform
    from faasdl.platform.local.server import create_app

    settings = load_settings()
    server = settings.server.model_copy(
        update={k: v for k, v in (("host", host), ("port", port)) if v is not None}
    )
    local = settings.local
    if pool_memory_mb is not None:
        try:
            local = type(local).model_validate(
                local.model_dump() | {"pool_memory_mb": pool_memory_mb}
            )
        except PydanticValidationError as exc:
            fail(f"--pool-memory-mb: {exc.errors()[0]['msg']}")
    platform = LocalPlatform(settings=local)
    console.print(
        f"embedded OpenWhisk on {server.scheme}://{server.host}:{server.port}/api/v1 "
        f"(namespace '{local.namespace}', pool {local.pool_memory_mb} MB)"
    )
    if warning := _published_key(server):
        console.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False)
    uvicorn.run(
        create_app(platform, server),
        host=server.host,
        port=server.port,
        log_level="info",
        ssl_certfile=server.tls_cert_file,
        ssl_keyfile=server.tls_key_file,
    )


MemoryClasses = Annotated[
    list[int] | None,
    typer.Option("--memory-mb", help="A memory class, in MB (repeat it). Default 512, 1024, 2048."),
]
TimeClasses = Annotated[
    list[int] | None,
    typer.Option("--timeout-s", help="A time class, in seconds (repeat it). Default 60, 300."),
]


@platform_app.command("deploy")
def platform_deploy(memory_mb: MemoryClasses = None, timeout_s: TimeClasses = None) -> None:
    """Deploy faasdl's actions to the configured platform, one variant per memory and time class
    (OpenWhisk limits are per action), in FAASDL_OPENWHISK__ACTION_IMAGE when set. Idempotent:
    variants already there are left alone (their warm containers with them). The controller
    deploys any other class it needs when a job needs it. JSON last."""
    from faasdl.actions import MEMORY_CLASSES_MB, TIME_CLASSES_S, deploy_variants
    from faasdl.platform import make_platform
    from faasdl.store import action_environment

    memories, timeouts = memory_mb or MEMORY_CLASSES_MB, timeout_s or TIME_CLASSES_S
    settings = load_settings()
    try:
        with make_platform(settings) as platform:
            limits = platform.limits()
            for mb in memories:
                if not limits.memory_min_mb <= mb <= limits.memory_max_mb:
                    fail(
                        f"--memory-mb {mb} is outside the platform's "
                        f"{limits.memory_min_mb}–{limits.memory_max_mb} MB"
                    )
            for s in timeouts:
                if not limits.timeout_min_ms <= s * 1000 <= limits.timeout_max_ms:
                    fail(
                        f"--timeout-s {s} is outside the platform's "
                        f"{limits.timeout_min_ms / 1000:g}–{limits.timeout_max_ms / 1000:g} s"
                    )
            environment = action_environment(settings.store)
            done = deploy_variants(platform, memories, timeouts, environment)
            image = platform.action_image
    except FaasdlError as exc:
        fail(str(exc))
    deployed = [name for name, changed in done if changed]
    where = f" in {image}" if image else ""
    console.print(
        f"{len(done)} action variants{where}: {len(deployed)} deployed, "
        f"{len(done) - len(deployed)} already there as asked",
        markup=False,
    )
    actions = [name for name, _ in done]
    typer.echo(json.dumps({"actions": actions, "deployed": deployed, "image": image}))


def _checked_image(value: str | None) -> str | None:
    if value is not None and (problem := image_problem(value)):
        raise typer.BadParameter(problem)
    return value


@platform_app.command("manifest")
def platform_manifest(
    image: Annotated[
        str | None,
        typer.Option(
            help="The action image (deploy/docker/action.Dockerfile); default: "
            "FAASDL_OPENWHISK__ACTION_IMAGE. None at all: python:3.11 actions.",
            callback=_checked_image,
        ),
    ] = None,
    memory_mb: MemoryClasses = None,
    timeout_s: TimeClasses = None,
    output: Annotated[
        Path | None,
        typer.Option(
            help="Write it there (next to openwhisk_actions/train and aggregate, which its "
            "`function` paths name); default: print it."
        ),
    ] = None,
) -> None:
    """wskdeploy's manifest of the variants `faasdl platform deploy` deploys, for
    `wskdeploy -m openwhisk_actions/manifest.yaml`."""
    import yaml

    from faasdl.actions import MEMORY_CLASSES_MB, TIME_CLASSES_S, wskdeploy_manifest

    for mb in memory_mb or []:
        if mb <= 0:
            fail(f"--memory-mb {mb} must be positive")
    for s in timeout_s or []:
        if s <= 0:
            fail(f"--timeout-s {s} must be positive")
    manifest = wskdeploy_manifest(
        image or load_settings().openwhisk.action_image,
        memory_mb or MEMORY_CLASSES_MB,
        timeout_s or TIME_CLASSES_S,
    )
    text = MANIFEST_HEADER + yaml.safe_dump(manifest, sort_keys=False)
    if output is None:
        typer.echo(text, nl=False)
        return
    from faasdl.files import written_whole

    try:
        with written_whole(output) as out:
            out.write(text.encode())
    except OSError as exc:
        fail(f"--output {output}: {exc.strerror or exc}")
    console.print(f"wrote {output}", markup=False)


#: The comment on top of a generated wskdeploy manifest.
MANIFEST_HEADER = """\
# faasdl's actions for wskdeploy, one variant per memory and time class (OpenWhisk limits are
# per action), in OpenWhisk's default package where the controller invokes them. Generated by
# `faasdl platform manifest --image IMAGE --output openwhisk_actions/manifest.yaml`; deploy with
# `wskdeploy -m openwhisk_actions/manifest.yaml` (or `faasdl platform deploy`, the same actions).
"""


@platform_app.command("info")
def platform_info() -> None:
    """Print the configured platform's limits as JSON."""
    from faasdl.platform import make_platform

    settings = load_settings()
    try:
        with make_platform(settings) as platform:
            typer.echo(json.dumps(platform.limits().model_dump(), indent=2))
    except FaasdlError as exc:
        fail(str(exc))


@bench_app.command("platform")
def bench_platform(
    samples: Annotated[int, typer.Option(help="Samples per latency figure.", min=3)] = 30,
    tf_samples: Annotated[int, typer.Option(help="Samples for the TensorFlow figures.", min=1)] = 3,
    throughput_activations: Annotated[
        int, typer.Option(help="Activations in the throughput run.", min=10)
    ] = 500,
) -> None:
    """Cold, warm and prewarmed start latency, REST overhead and throughput of the platform."""
    from faasdl.bench.platform import run_platform_bench

    try:
        result = run_platform_bench(
            samples=samples,
            tf_samples=tf_samples,
            throughput_activations=throughput_activations,
            progress=console,
        )
    except FaasdlError as exc:
        fail(str(exc))
    echo_bench(result)


@bench_app.command("store")
def bench_store(
    backend: Annotated[
        str | None, typer.Option(help="sqlite or redis (default: --url's, else sqlite).")
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            help="An existing store (sqlite:// or redis://); default: a temporary one (a "
            "private redis-server)."
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Runs per blob size (median kept).", min=1)] = 5,
    cas_ops: Annotated[int, typer.Option(help="CAS increments timed.", min=10)] = 2000,
    checkpoints: Annotated[
        int, typer.Option(help="Checkpoint-sized blobs (512 KiB) timed.", min=10)
    ] = 200,
    writers: Annotated[
        int,
        typer.Option(
            help="Processes checkpointing every 20 ms and beating every 0.5 s at once, whose "
            "waits are timed (0: none).",
            min=0,
            max=64,
        ),
    ] = 8,
    contention_s: Annotated[
        float, typer.Option(help="How long the writers run (s).", min=1.0, max=3600.0)
    ] = 20.0,
) -> None:
    """Blob throughput (1, 16, 100 MiB), CAS rate against the raw client, the cost of a
    checkpoint's blob, and a heartbeat's wait beside writers checkpointing; JSON last."""
    from faasdl.bench.store import run_store_bench

    try:
        result = run_store_bench(
            backend=backend,
            url=url,
            repeats=repeats,
            cas_ops=cas_ops,
            checkpoints=checkpoints,
            writers=writers,
            contention_s=contention_s,
            progress=console,
        )
    except FaasdlError as exc:
        fail(str(exc))
    echo_bench(result)


@contextlib.contextmanager
def _store(*, existing: bool = False) -> Iterator[StateStore]:
    """The configured state store, open; its errors end the command with one line. Which store
    it is goes to stderr (a key made in one the controller does not read is refused there), and
    with ``existing`` a SQLite file that is not there is refused rather than made empty."""
    from faasdl.store import make_store, shown_url, sqlite_path

    settings = load_settings().store
    path = sqlite_path(settings.url)
    if existing and path is not None and not os.path.exists(path):  # a too long name: False
        fail(
            f"store url: no store at {path} (FAASDL_STORE__URL is {settings.url}; sqlite:/// is "
            "relative to the working directory, sqlite://// absolute)"
        )
    try:
        store = make_store(settings)
    except FaasdlError as exc:
        fail(str(exc))
    console.print(f"store: {shown_url(settings.url)}", highlight=False, markup=False)
    try:
        store.open()
        yield store
    except FaasdlError as exc:
        fail(str(exc))
    finally:
        store.close()


#: A key's life as --expires-in takes it: a whole number of days, hours or minutes.
_LIFE = re.compile(r"(\d{1,7})([dhm])")
_LIFE_S = {"d": 86_400, "h": 3_600, "m": 60}


def _key_life(value: str) -> float:
    """``--expires-in``'s seconds."""
    from faasdl.controller.auth import MAX_KEY_LIFE_S, MIN_KEY_LIFE_S

    found = _LIFE.fullmatch(value.strip())
    if found is None:
        raise typer.BadParameter(f"{value!r} is not a duration: days, hours or minutes (90d, 12h)")
    life_s = int(found[1]) * _LIFE_S[found[2]]
    if not MIN_KEY_LIFE_S <= life_s <= MAX_KEY_LIFE_S:
        raise typer.BadParameter(f"{value!r}: a key's life is 1 minute to 10 years")
    return life_s


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The tenant whose jobs the key submits and sees.")],
    admin: Annotated[bool, typer.Option(help="May see every tenant's jobs and /metrics.")] = False,
    name: Annotated[str, typer.Option(help="A note on what the key is for.")] = "",
    life_s: Annotated[
        float | None,
        typer.Option(
            "--expires-in",
            help="Refused from this long on: days, hours or minutes (90d, 12h, 30m; 1 minute to "
            "10 years). Default: valid until revoked.",
            parser=_key_life,
            metavar="DURATION",
        ),
    ] = None,
) -> None:
    """Make a key; it is printed once (JSON) and kept only as a hash."""
    from faasdl.controller.auth import create_key

    with _store() as store:
        record, key = create_key(store, tenant=tenant, admin=admin, name=name, expires_in_s=life_s)
    console.print("[bold]keep the key now[/]: it is not stored and cannot be shown again")
    if record.expires_ms is not None:
        ends = datetime.fromtimestamp(record.expires_ms / 1000).strftime("%Y-%m-%d %H:%M")
        console.print(f"it expires at {ends} (this machine's time)", highlight=False)
    made = {"key_id": record.key_id, "tenant": tenant, "admin": admin, "key": key}
    typer.echo(json.dumps({**made, "expires_ms": record.expires_ms}))


@keys_app.command("list")
def keys_list() -> None:
    """Every key (never a secret); JSON last."""
    from faasdl.controller.auth import list_keys

    with _store(existing=True) as store:
        found = list_keys(store)
    lines = [k.model_dump(exclude={"secret_sha256"}) for k in found]
    table = Table(title="API keys")
    for column in ("key_id", "tenant", "admin", "name", "revoked", "expires"):
        table.add_column(column)
    now = datetime.now()
    for k in found:
        ends = None if k.expires_ms is None else datetime.fromtimestamp(k.expires_ms / 1000)
        expires = "" if ends is None else ends.strftime("%Y-%m-%d %H:%M")  # this machine's time
        if ends is not None and ends <= now:
            expires = f"expired {expires}"
        revoked = "yes" if k.revoked_ms else ""
        table.add_row(k.key_id, k.tenant, str(k.admin), Text(k.name), revoked, expires)
    _show(table, "no API keys: make one with faasdl keys create --tenant TENANT")
    typer.echo(json.dumps(lines))


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key's id (keys list).")]) -> None:
    """Revoke a key: every request with it is refused from now on."""
    from faasdl.controller.auth import revoke_key

    with _store(existing=True) as store:
        record = revoke_key(store, key_id)
    typer.echo(json.dumps({"key_id": record.key_id, "revoked_ms": record.revoked_ms}))


def _checked_shape(value: str | None) -> str | None:
    """``--shape`` as whole sizes joined by x (their ranges are the job's validator's)."""
    if value is not None and not re.fullmatch(r"\d+(x\d+)*", value.lower()):
        raise typer.BadParameter(f"{value!r} is not a shape: sizes joined by x, e.g. 32x32x3")
    return value


@app.command()
def estimate(
    spec: Annotated[
        Path | None,
        typer.Option(
            help="A job: the YAML or JSON file faasdl submit takes (-: standard input); the "
            "options below set or override its fields."
        ),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model of the zoo (mlp, small_cnn, …).")] = None,
    dataset: Annotated[
        str | None,
        typer.Option(
            help="digits, synthetic (with --shape) or npz (with --path); --shape or "
            "--path alone implies it."
        ),
    ] = None,
    path: Annotated[str | None, typer.Option(help="The .npz file of --dataset npz.")] = None,
    shape: Annotated[
        str | None,
        typer.Option(
            help="Synthetic example shape, e.g. 32x32x3 (of --dataset synthetic).",
            callback=_checked_shape,
        ),
    ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Batch size.")] = None,
    epochs: Annotated[int | None, typer.Option(help="Epochs of training in all.")] = None,
    sync_every: Annotated[
        int | None,
        typer.Option(help="Epochs per round (each training action's); 0: one round of all."),
    ] = None,
    workers: Annotated[int | None, typer.Option(help="Actions (default: estimated).")] = None,
    expected_cost: Annotated[
        float | None, typer.Option(help="Expected cost in the price unit (sizes timeouts).")
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            help="Ask this controller (POST /v1/estimate: its platform, its history, your "
            "uploads, your tenant's limits); default: FAASDL_CLIENT__URL's, where it is set. "
            "The API key is FAASDL_CLIENT__API_KEY or the file FAASDL_CLIENT__API_KEY_FILE "
            "names."
        ),
    ] = None,
    local: Annotated[
        bool,
        typer.Option(
            "--local",
            help="Plan here, with this machine's settings and store (its history; none if "
            "FAASDL_STORE__URL's SQLite file is not there, and none is made), not a controller's.",
        ),
    ] = False,
    set_: SetOption = None,
    architecture: ArchitectureOption = None,
) -> None:
    """Print a job's plan (its training actions' memory and timeout, rounds, aggregation tree)
    without running it, as the controller would plan it; JSON last."""
    from faasdl.controller.plan import JobPlan, held_out, over_budget, plan_job
    from faasdl.controller.validator import JobSpec
    from faasdl.estimator.planner import check_workers
    from faasdl.estimator.sizer import Sizer, checked_facts
    from faasdl.platform import make_platform
    from faasdl.store import make_store, sqlite_path
    from faasdl.training.datasets import NpzSpec

    if url is not None and local:
        fail("--url and --local: give one (--url asks a controller, --local plans here)")
    if architecture is not None and model not in (None, "custom"):
        fail(f"--model {model} and --architecture: give one (--architecture trains model custom)")
    if spec is not None and str(spec) == str(architecture) == "-":
        fail("--spec and --architecture: both from standard input; give one of them a file")

    fields: dict[str, Any] = {}
    if spec is not None:
        fields = _read_spec(spec, given_as="--spec")
    fields = _with_set(fields, set_ or [])  # then the options above, where given
    options_data: dict[str, Any] = {"name": dataset, "path": path}
    if shape is not None:
        options_data["shape"] = [int(size) for size in shape.lower().split("x")]
    if given := {key: value for key, value in options_data.items() if value is not None}:
        # The options change the spec's data set; one that is not a mapping, validation names.
        data = fields.get("dataset")
        data = {**(data if isinstance(data, dict) else {}), **given}
        for key, implied in (("shape", "synthetic"), ("path", "npz")):
            if key in data:  # --shape alone means a synthetic set, --path alone an .npz
                data.setdefault("name", implied)
        fields["dataset"] = data
    options: dict[str, Any] = {
        "model": model,
        "batch_size": batch_size,
        "epochs": epochs,
        "sync_every": sync_every,
        "workers": workers,
        "expected_cost": expected_cost,
    }
    fields |= {key: value for key, value in options.items() if value is not None}
    fields = _with_architecture(fields, architecture)
    try:
        job = JobSpec.model_validate(fields)
    except PydanticValidationError as exc:
        fail(str(ValidationError.from_pydantic(exc, model=JobSpec)))
    settings = load_settings()
    if not local and (url is not None or settings.client.url is not None):
        with _controller(url) as client:
            plan = JobPlan.model_validate(client.estimate(fields))
    else:
        # os.path's: Path.is_file raises for a name too long for the file system.
        if isinstance(job.dataset, NpzSpec) and not os.path.isfile(job.dataset.path):
            fail(
                f"dataset.path: no such file here: {job.dataset.path} (an upload lives on the "
                "controller, which plans it: --url or FAASDL_CLIENT__URL)"
            )
        db = sqlite_path(settings.store.url)
        try:
            facts = checked_facts(job)
            # Before the store is opened: a refused job writes nothing.
            check_workers(job, held_out(job, facts))
            with contextlib.ExitStack() as stack:
                store_url = None
                if db is not None and not db.exists():  # no history: none is made here either
                    folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="faasdl-"))
                    store_url = f"sqlite:///{folder}/state.db"
                platform = stack.enter_context(make_platform(settings))
                store = stack.enter_context(make_store(settings.store, store_url))
                sizer = Sizer(platform=platform, store=store, settings=settings)
                plan = plan_job(sizer, job, facts, max_fan_in=settings.controller.max_fan_in)
        except FaasdlError as exc:
            fail(str(exc))
    console.print(_plan_table(plan, title=f"plan: {job.model} on {job.dataset.name}"))
    if short := over_budget(job, plan):
        console.print(f"[bold yellow]warning:[/] {escape(short)}", highlight=False)
    typer.echo(plan.model_dump_json())


#: Where a plan's training memory and time limit came from, in words.
MEMORY_SOURCES = {"model": "from the model's measured sizes", "history": "from past runs"}
TIMEOUT_SOURCES = {
    "history": "from past runs",
    "expected_cost": "from expected_cost",
    "platform_max": "the platform's longest: no past run, no expected_cost",
}


def _plan_table(plan: JobPlan, *, title: str) -> Table:
    """A job's plan as a reader takes it in: each part in words, its figures (the JSON has them
    all)."""
    from faasdl.training.datasets import dims

    train = plan.train
    parts = " + ".join(f"{name} {mb:g}" for name, mb in train.memory_parts.items())
    rows = {
        "training actions": f"{train.containers} × {train.memory_mb} MB, time limit "
        f"{train.timeout_ms / 1000:g} s ({TIMEOUT_SOURCES[train.timeout_source]})",
        "memory estimate": f"{train.memory_estimate_mb:g} MB = {parts} "
        f"({MEMORY_SOURCES[train.memory_source]}), rounded up to a class",
        "shards": f"{train.shard_examples:,} examples each ({plan.examples:,} in all; "
        + (
            f"{plan.validation_examples:,} held out to validate, "
            if plan.validation_examples
            else ""
        )
        + f"{plan.test_examples:,} test)",
        "rounds": f"{plan.rounds} of {plan.epochs_per_round} epoch(s)",
        "data": f"examples of shape {dims(plan.input_shape)}, {plan.classes} classes"
        + (f", SHA-256 {plan.data_sha256[:12]}…" if plan.data_sha256 else ""),
        "model": f"{plan.model_mb:g} MB with its optimizer state",
        "aggregation": f"{plan.aggregate_memory_mb} MB"
        + (
            f" ({plan.aggregate_memory_estimate_mb:g} MB for the float64 mean and one input, "
            "rounded up to a class)"
            if plan.aggregate_memory_estimate_mb is not None
            else ""
        )
        + f", time limit {plan.aggregate_timeout_ms / 1000:g} s, fan-in {plan.fan_in}, "
        f"{len(plan.tree)} level(s): {plan.tree}",
        "evaluation": "one a round, "
        + (
            f"{plan.evaluate_memory_mb} MB of its own: its largest set "
            f"({max(plan.test_examples, plan.validation_examples):,} examples) is more than "
            "a trainer holds"
            if plan.evaluate_memory_mb
            else "on the trainers' containers"
        ),
        "signature": f"{train.signature} (the history's key)",
        "expected cost": _expected_cost(plan),
    }
    table = Table(title=title, show_header=False)
    for name, value in rows.items():
        table.add_row(name, value)
    return table


def _expected_cost(plan: JobPlan) -> str:
    """What a plan's actions cost by past runs, in words."""
    train, cost = plan.train, plan.train_cost_usd
    start, epoch = train.median_overhead_ms, train.median_epoch_ms
    if cost is None or start is None or epoch is None:
        return "unknown: no past run of its signature (a first job measures it)"
    training = (
        f"its training actions ${cost:.6f} ({start / 1000:g} s an action's start and end, "
        f"{epoch / 1000:g} s an epoch)"
    )
    if plan.expected_cost_usd is None:
        return (
            f"{training}, by the medians of past runs; cold starts, aggregation, evaluation "
            "and warm replicas come on top"
        )
    aggregate_ms, evaluate_ms = train.median_aggregate_ms or 0, train.median_evaluate_ms or 0
    merge = plan.expected_cost_usd - cost
    aggregations = (
        f"{plan.aggregations} aggregation(s) of {aggregate_ms / 1000:g} s and "
        if plan.aggregations
        else ""
    )
    said = (
        f"${plan.expected_cost_usd:.6f} by the medians of past runs: {training}, each round's "
        f"{aggregations}evaluation of {evaluate_ms / 1000:g} s ${merge:.6f}"
    )
    cold, start_ms = plan.expected_cost_cold_usd, train.median_cold_start_ms
    if cold is None or start_ms is None:
        return f"{said}; cold starts and warm replicas come on top"
    build_ms, aggregator_ms = train.median_build_ms, train.median_aggregate_cold_start_ms
    build = "" if build_ms is None else f" and {build_ms / 1000:g} s to build its trainer"
    aggregator = "" if aggregator_ms is None else f", an aggregator's {aggregator_ms / 1000:g} s"
    return (
        f"{said}; ${cold:.6f} with each of its containers starting cold once "
        f"({plan.cold_starts_said()}; {start_ms / 1000:g} s a start{build}{aggregator}); warm "
        "replicas come on top"
    )


def _with_architecture(fields: dict[str, Any], path: Path | None) -> dict[str, Any]:
    """``fields`` training the Keras model whose config the file at ``path`` holds, if given."""
    if path is None:
        return fields
    return {**fields, "model": "custom", "architecture": _read_architecture(path)}


def _read_architecture(path: Path) -> dict[str, Any]:
    """The Keras model's config a file holds (``-``: standard input), read as JSON; refused
    naming ``--architecture``. Read up to the controller's default body limit, 1 MiB: what is
    larger could not be sent."""
    from faasdl import jobfile

    path, raw = _read_up_to(path, jobfile.MAX_BYTES + 1, given_as="--architecture")
    if len(raw) > jobfile.MAX_BYTES:
        fail(f"--architecture: {path} holds over {jobfile.MAX_BYTES:,} bytes: too large to send")
    try:
        loaded = json.loads(raw)
    except ValueError as exc:  # not JSON, or not UTF-8 (UnicodeDecodeError)
        fail(f"--architecture: {path} is not JSON: {exc}")
    except RecursionError:
        fail(f"--architecture: {path} is nested too deep to read")
    if not isinstance(loaded, dict):
        fail(
            f"--architecture: {path} holds a JSON {type(loaded).__name__}: a Keras model's "
            "config is an object, as model.to_json() writes it"
        )
    return loaded


def _read_up_to(path: Path, size: int, *, given_as: str) -> tuple[Path, bytes]:
    """Up to ``size`` bytes of a file (``-``: standard input, then named ``<stdin>``), and its
    name as errors give it; one that cannot be read is refused naming ``given_as``."""
    try:
        if str(path) == "-":
            return Path("<stdin>"), sys.stdin.buffer.read(size)
        with path.open("rb") as opened:
            return path, opened.read(size)
    except OSError as exc:
        fail(f"{given_as}: cannot read {path}: {exc.strerror}")


def _read_spec(path: Path, *, given_as: str) -> dict[str, Any]:
    """The job fields of a YAML or JSON file (``-``: standard input); an error names it as the
    command's ``given_as``."""
    import yaml

    from faasdl import jobfile

    path, raw = _read_up_to(path, jobfile.MAX_BYTES + 1, given_as=given_as)
    if len(raw) > jobfile.MAX_BYTES:
        fail(f"{given_as}: {path} holds over {jobfile.MAX_BYTES:,} bytes: a job is a few lines")
    try:
        loaded = jobfile.load(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        fail(f"{given_as}: {path} is not UTF-8 text: {exc.reason} at byte {exc.start}")
    except jobfile.Refused as exc:
        fail(f"{given_as}: {path}, {exc.said()}")
    except yaml.YAMLError as exc:
        fail(f"{given_as}: {path} is not valid YAML or JSON: {exc}")
    if not isinstance(loaded, dict):
        fail(f"{given_as}: {path} must hold a mapping of job fields")
    return loaded


def _with_set(fields: dict[str, Any], options: list[str]) -> dict[str, Any]:
    """The job's ``fields`` with each ``--set FIELD=VALUE`` applied, in order: FIELD a field, or
    a dotted path to one in a mapping (``dataset.name``, ``fault_tolerance.policy``); VALUE read
    as YAML (``8`` a number, ``true`` a boolean, ``[1, 2]`` a list, other text as it is)."""
    import yaml

    from faasdl import jobfile

    changed = copy.deepcopy(fields)
    for option in options:
        key, eq, text = option.partition("=")
        path = key.split(".")
        if not eq or not all(part.strip() for part in path):
            fail(
                f"--set: expected FIELD=VALUE (FIELD dotted for a field of a mapping: "
                f"dataset.name=digits), got {option!r}"
            )
        try:
            value = jobfile.load(text)
        except jobfile.Refused as exc:
            fail(f"--set {key}: {text!r}: {exc.problem}")
        except yaml.YAMLError as exc:
            fail(f"--set {key}: {text!r} is not a YAML value: {exc}")
        where = changed
        for depth, part in enumerate(path[:-1], 1):
            inner = where.setdefault(part, {})
            if not isinstance(inner, dict):
                fail(f"--set {key}: {'.'.join(path[:depth])} is {inner!r}, not a mapping of fields")
            where = inner
        where[path[-1]] = value
    return changed


#: A job's view asked from this round on has none of its rounds (past any job's last): what
#: reads a job's spec or log alone asks for, rather than a long job's every round record.
NO_ROUNDS: Final = 2**31 - 1

ArchitectureOption = Annotated[
    Path | None,
    typer.Option(
        help="Train a Keras model of your own: the file its config was saved to, the JSON "
        "model.to_json() writes (-: standard input); sets model to custom and this architecture.",
    ),
]
IdempotencyKeyOption = Annotated[
    str | None, typer.Option(help="Sent as Idempotency-Key: a replay returns the same job.")
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="FIELD=VALUE",
        help="Set or override a field of the job: FIELD=VALUE, FIELD dotted for a field of a "
        "mapping (dataset.name=digits), VALUE read as YAML (0.01 a number, true a boolean); "
        "repeat it for more.",
        show_default=False,
    ),
]


@bench_app.command("estimator")
def bench_estimator(
    quick: Annotated[
        bool, typer.Option(help="Three configurations (two small, ResNet50), not twelve.")
    ] = False,
    naive: Annotated[
        bool, typer.Option(help="Also run the naive retry policy for real (slow: minutes).")
    ] = True,
) -> None:
    """First-attempt failures, overprovision and timeouts of the estimator on real activations."""
    from faasdl.bench.estimator import run_estimator_bench

    try:
        result = run_estimator_bench(quick=quick, naive=naive, progress=console)
    except FaasdlError as exc:
        fail(str(exc))
    echo_bench(result)


@bench_app.command("training")
def bench_training(
    quick: Annotated[bool, typer.Option(help="Digits only, one seed, two epochs.")] = False,
    seeds: Annotated[int, typer.Option(help="Seeds per configuration.", min=1, max=10)] = 3,
) -> None:
    """Accuracy against single-worker training, and the three execution environments."""
    from faasdl.bench.training import run_training_bench

    try:
        result = run_training_bench(quick=quick, seeds=seeds, progress=console)
    except FaasdlError as exc:
        fail(str(exc))
    echo_bench(result)


@bench_app.command("steadiness")
def bench_steadiness(
    duration: Annotated[
        float,
        typer.Option(
            help="Seconds of timing (the 2 s windows want a minute or more).",
            min=5,
            max=3600,
        ),
    ] = 120.0,
    pairs: Annotated[
        int, typer.Option(help="Pairs of 1 s invocations the resolution is given for.", min=1)
    ] = 40,
) -> None:
    """How steady this machine's CPU speed is: the noise between two adjacent invocations, and
    the finest overhead a timing comparison of N pairs of invocations (--pairs) can resolve here."""
    from faasdl.bench.steadiness import run_steadiness_bench

    echo_bench(run_steadiness_bench(duration, pairs=pairs, progress=console))


@bench_app.command("recovery")
def bench_recovery(
    quick: Annotated[bool, typer.Option(help="A few failures of each kind (CI).")] = False,
) -> None:
    """Canary's takeover, detection, checkpoint stall and failure-free overhead."""
    from faasdl.bench.recovery import run_recovery_bench

    try:
        result = run_recovery_bench(quick=quick, progress=console)
    except FaasdlError as exc:
        fail(str(exc))
    echo_bench(result)


@bench_app.command("api")
def bench_api(
    quick: Annotated[bool, typer.Option(help="20 s of load instead of 60 s.")] = False,
    store: Annotated[
        str, typer.Option(help="The controller's store: sqlite, or redis (a private server).")
    ] = "sqlite",
) -> None:
    """50 clients (status polls, event streams, submissions) against a controller while a job
    trains; requests, errors and latency as JSON last."""
    from faasdl.bench.api import run_api_bench

    try:
        if store not in ("sqlite", "redis"):
            fail(f"--store: unknown store '{store}'; use sqlite or redis")
        result = run_api_bench(quick=quick, store=store, progress=console)
    except FaasdlError as exc:
        fail(str(exc))
    echo_bench(result)


@app.command()
def demo(
    workers: Annotated[int, typer.Option(help="Concurrent training actions.", min=1, max=16)] = 4,
    epochs: Annotated[int, typer.Option(help="Epochs, one per round.", min=1, max=50)] = 4,
    kills: Annotated[
        int,
        typer.Option(
            help="Training activations to kill mid-run (at most 19: the job's attempts, at most "
            "20, allow all of them to land on one unit).",
            min=0,
            max=19,
        ),
    ] = 2,
) -> None:
    """Run a real training job on the embedded platform, kill some of its containers, watch it
    recover, and show the result."""
    from faasdl.demo import run_demo

    try:
        ok = run_demo(workers=workers, epochs=epochs, kills=kills, console=Console())
    except FaasdlError as exc:
        fail(str(exc))
    if not ok:
        raise typer.Exit(1)


@contextlib.contextmanager
def _controller(url: str | None) -> Iterator[ControllerClient]:
    """A client of the controller at ``url``; its errors end the command with one line."""
    from faasdl.controller.client import ControllerClient

    settings = load_settings()
    if url is not None and (problem := http_url_problem(url)):
        fail(f"--url: {problem}")
    client = ControllerClient.from_settings(settings, url=url)
    try:
        yield client
    except FaasdlError as exc:
        fail(str(exc))
    finally:
        client.close()


def _job_id(value: str) -> str:
    """A job id as the controller makes them, checked before a request is made of it (an empty
    one asked for ``/v1/jobs/``, ``../x`` for another path)."""
    from faasdl.store.records import JOB_ID_PATTERN

    if not re.fullmatch(JOB_ID_PATTERN, value):
        raise typer.BadParameter(
            f"{value!r} is not a job's id (16 hex digits, as faasdl jobs lists them)"
        )
    return value


def _job_ids(values: list[str] | None) -> list[str]:
    return [_job_id(value) for value in values or []]


def _job_id_if_given(value: str | None) -> str | None:
    return None if value is None else _job_id(value)


JobIdArgument = Annotated[str, typer.Argument(help="The job's id.", callback=_job_id)]
UrlOption = Annotated[
    str | None,
    typer.Option(
        help="The controller's URL (default: FAASDL_CLIENT__URL, else FAASDL_CONTROLLER__HOST "
        "and __PORT). The API key is FAASDL_CLIENT__API_KEY or the file "
        "FAASDL_CLIENT__API_KEY_FILE names."
    ),
]


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Interface to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on.", min=0, max=65535)] = None,
) -> None:
    """Run the controller: its REST API (docs at /docs), admission and job runners."""
    import uvicorn

    from faasdl.controller.app import build_controller, create_app
    from faasdl.serving import HurriedServer, log_to_stderr
    from faasdl.store import shown_url

    settings = load_settings()
    log_to_stderr(settings.controller.log_level)
    try:
        controller = build_controller(settings)
        app_ = create_app(controller)
        # The store's lease now, to refuse in one line where another controller runs (the app
        # opens the store again, a no-op, and its start finds the lease held).
        controller.store.open()
        controller.lease.acquire()
        durability = controller.store.durability_warning()
    except FaasdlError as exc:
        fail(str(exc))
    try:
        # The platform now too: one it cannot reach is refused in one line, where the app's start
        # failed with a traceback (the app's open is then a no-op).
        controller.platform.open()
    except FaasdlError as exc:
        controller.lease.release()  # the controller started again need not wait it out
        fail(str(exc))
    platform = (
        f"OpenWhisk at {settings.openwhisk.api_host}"
        if settings.platform == "openwhisk"
        else "the embedded platform"
    )
    logging.getLogger("faasdl.serve").info(
        "faasdl %s: store %s, actions on %s, API auth %s",
        __version__,
        shown_url(settings.store.url),
        platform,
        settings.api.auth,
    )
    host = host or settings.controller.host
    for warning in (_open_to_all(settings, host), _unchecked_store(settings), durability):
        if warning:
            logging.getLogger("faasdl.serve").warning(warning)
    server = HurriedServer(
        uvicorn.Config(
            app_,
            host=host,
            port=settings.controller.port if port is None else port,
            log_level=settings.controller.log_level,
            ssl_certfile=settings.controller.tls_cert_file,
            ssl_keyfile=settings.controller.tls_key_file,
        ),
        hurry=controller.stop_draining,
    )
    lease = controller.lease

    def stop_once_lost() -> None:
        lease.lost.wait()
        server.should_exit = True

    threading.Thread(target=stop_once_lost, name="faasdl-lease-lost", daemon=True).start()
    try:
        server.run()
    finally:
        controller.platform.close()  # the app's stop closed it, unless it never started
    if lease.lost.is_set():
        fail(
            f"this controller lost the store's lease ({lease.loss}) and stopped: another "
            "controller runs the store's jobs",
            code=1,
        )
    if not server.started:  # as uvicorn.run: it logged why (a port in use, say)
        raise typer.Exit(3)


def _open_to_all(settings: Settings, host: str) -> str | None:
    """A warning for a controller without authentication listening beyond this machine."""
    if settings.api.auth != "none" or _loopback(host):
        return None
    return (
        f"API auth none on {host}: whoever reaches it is an administrator (every tenant's jobs, "
        "data sets and models); FAASDL_API__AUTH=keys requires an API key"
    )


def _unchecked_store(settings: Settings) -> str | None:
    """A warning for an Ignite store logged into (a user and password, over TLS) whose nodes'
    certificates are checked by no CA bundle (pyignite's default): the password goes to whoever
    answers."""
    store = settings.store
    if not store.url.startswith("ignite:") or store.username is None:
        return None
    if store.tls_ca_file or store.tls_ca_data:
        return None
    return (
        "the Ignite store is sent its password over TLS without its nodes' certificates being "
        "checked: whoever answers at its address gets it; FAASDL_STORE__TLS_CA_FILE checks them"
    )


def _published_key(server: ServerSettings) -> str | None:
    """A warning for the embedded platform's server taking OpenWhisk's published guest key
    beyond this machine: it runs any code it is sent."""
    if server.auth.get_secret_value() != GUEST_API_KEY or _loopback(server.host):
        return None
    return (
        f"the API key is OpenWhisk's published guest key: whoever reaches {server.host} runs "
        "code here; set FAASDL_SERVER__AUTH or __AUTH_FILE"
    )


def _loopback(host: str) -> bool:
    """Whether a server listening on ``host`` is reached from this machine only."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


@app.command()
def submit(
    spec: Annotated[
        Path,
        typer.Argument(help="The job: a YAML or JSON mapping of job fields (-: standard input)."),
    ],
    url: UrlOption = None,
    watch: Annotated[bool, typer.Option(help="Follow the job until it ends.")] = False,
    idempotency_key: IdempotencyKeyOption = None,
    set_: SetOption = None,
    architecture: ArchitectureOption = None,
) -> None:
    """Submit a training job; prints its id (with --watch: its progress, then its result)."""
    if str(spec) == str(architecture) == "-":
        fail("spec and --architecture: both from standard input; give one of them a file")
    fields = _with_set(_read_spec(spec, given_as="spec"), set_ or [])
    fields = _checked_job(_with_architecture(fields, architecture))
    with _controller(url) as client:
        _submit(client, fields, watch=watch, idempotency_key=idempotency_key)


@app.command()
def resubmit(
    job_id: JobIdArgument,
    url: UrlOption = None,
    watch: Annotated[bool, typer.Option(help="Follow the new job until it ends.")] = False,
    idempotency_key: IdempotencyKeyOption = None,
    set_: SetOption = None,
) -> None:
    """Submit a new job of another job's fields (any job of yours, ended or not), changed by
    --set; prints its id (with --watch: its progress, then its result)."""
    with _controller(url) as client:
        spec = client.job(job_id, round_from=NO_ROUNDS)["job"]["spec"]
        fields = _checked_job(_with_set(spec, set_ or []))
        _submit(client, fields, watch=watch, idempotency_key=idempotency_key)


def _checked_job(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields``, once they are checked to be a job (refused naming the field otherwise, before
    the controller is asked to run it)."""
    from faasdl.controller.validator import JobSpec

    try:
        JobSpec.model_validate(fields)
    except PydanticValidationError as exc:
        fail(str(ValidationError.from_pydantic(exc, model=JobSpec)))
    return fields


def _submit(
    client: ControllerClient, fields: dict[str, Any], *, watch: bool, idempotency_key: str | None
) -> None:
    """Submit the job and print its id; with ``watch``, follow it, then print its summary (exit
    status 1 unless it is done)."""
    job = client.submit(fields, idempotency_key=idempotency_key)["job"]
    typer.echo(job["job_id"])
    if not watch:
        return
    view = _watched(client, job["job_id"])
    stderr_console().print(_summary(client, view))
    for hint in _hints(view["job"]):
        stderr_console().print(hint, highlight=False, markup=False)
    if view["job"]["state"] != "done":
        raise typer.Exit(1)


def _hints(job: dict[str, Any]) -> list[str]:
    """What a job's summary is followed by: where its failures are told (:func:`log`), and how
    to have the model it kept (:func:`_model_hint`)."""
    hints = []
    if job.get("failures") or job.get("failures_dropped"):
        hints.append(f"its failures, what each cost and its recovery: faasdl log {job['job_id']}")
    if model := _model_hint(job):
        hints.append(model)
    return hints


def _model_hint(job: dict[str, Any]) -> str | None:
    """How to have the model the job kept, if it has one: a done job's, or the last finished
    round's of one that failed or was cancelled."""
    if not job.get("model"):
        return None
    download = f"faasdl model {job['job_id']} -o model.safetensors"
    if job["state"] == "done":
        return f"its model: {download}"
    return (
        f"the model of its last finished round ({job['round']}) is kept: {download}, or train "
        f"on from it (init_model: {job['job_id']})"
    )


def _summary(client: ControllerClient, view: dict[str, Any], rounds: int | None = None) -> Table:
    """The job's summary (its latest ``rounds`` rounds; default: the summary's), with its ledger
    read only for a record that keeps no totals (one from before they were kept)."""
    from faasdl.controller.watch import SUMMARY_ROUNDS, needs_ledger, summary

    ledger = client.ledger(view["job"]["job_id"]) if needs_ledger(view) else None
    return summary(view, ledger, rounds=SUMMARY_ROUNDS if rounds is None else rounds)


def _watched(client: ControllerClient, job_id: str) -> dict[str, Any]:
    """Follow the job until it ends (``--watch``); its last view. Interrupted
    (Ctrl-C), or with the controller gone past ``FAASDL_CLIENT__RECONNECT_S``, it says that the
    job goes on and how to follow it again."""
    from faasdl.controller.watch import watch

    settings = load_settings().client
    again = f"`faasdl status {job_id} --watch` follows it again"
    try:
        view = watch(
            lambda round_from: client.job(
                job_id, timeout_s=settings.watch_timeout_s, round_from=round_from
            ),
            stderr_console(),
            reconnect_s=settings.reconnect_s,
        )
    except KeyboardInterrupt:
        console.print(
            f"stopped watching job {job_id}; it goes on: {again}, `faasdl cancel {job_id}` "
            "stops it",
            highlight=False,
        )
        raise typer.Exit(130) from None
    except PlatformUnavailable as exc:
        fail(f"{exc}; job {job_id} goes on there if it is up: {again}")
    return view


@app.command()
def jobs(
    url: UrlOption = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's jobs.")] = None,
    state: Annotated[JobState | None, typer.Option(help="Only jobs in this state.")] = None,
    name: Annotated[
        str | None,
        typer.Option(help="Only the jobs whose name holds this (case matters): a sweep's part."),
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=1000, help="Jobs in a page (the newest first).")
    ] = 100,
    before: Annotated[
        str | None,
        typer.Option(
            help="The page after this job: the id the page before ends with.",
            callback=_job_id_if_given,
        ),
    ] = None,
) -> None:
    """List jobs, newest first, a page at a time; JSON last."""
    with _controller(url) as client:
        found, more = client.jobs(tenant=tenant, state=state, name=name, limit=limit, before=before)

    asked = {"tenant": tenant, "state": state, "name": name}
    filters = {field: str(value) for field, value in asked.items() if value is not None}

    table = Table(title="jobs")
    # A name column where a job of the page has one (a controller before names sends none).
    named = any(j.get("name") for j in found)
    columns = ["job", *(["name"] if named else []), "submitted", "tenant", "state", "model"]
    for column in [*columns, "round", "accuracy", "cost (USD)"]:
        table.add_column(column)
    for j in found:
        accuracy = "" if j["accuracy"] is None else f"{j['accuracy']:.4f}"
        submitted = datetime.fromtimestamp(j["created_ms"] / 1000).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(
            j["job_id"],
            *([Text(j.get("name") or "")] if named else []),  # its words as they are, [...] too
            submitted,  # this machine's time
            j["tenant"],
            j["state"],
            str(j.get("model_called") or j["model"]),  # a controller before sends none
            f"{j['round']}/{j['rounds']}",
            accuracy,
            f"{j['cost_usd']:.6f}",
        )
    said = [
        f"{field} {value!r}" if field == "name" else f"{field} {value}"
        for field, value in filters.items()
    ]
    if before:
        said.append(f"before job {before}")
    _show(table, "no jobs" + (f" ({', '.join(said)})" if said else ""), width=140)
    if more:
        again = [f"--{field} {shlex.quote(value)}" for field, value in filters.items()]
        options = " ".join([*again, f"--limit {limit}", f"--before {more}"])
        console.print(f"more: faasdl jobs {options}", markup=False)
    typer.echo(json.dumps(found))


#: The most jobs ``faasdl compare`` reads (two requests each).
COMPARED_MAX = 100


class CompareOrder(StrEnum):
    """What ``compare --sort`` puts the best first by."""

    accuracy = "accuracy"
    loss = "loss"
    cost = "cost"


def _last_if_none(value: float | None, sign: float = 1.0) -> tuple[bool, float]:
    """A sort key of ``value`` (× ``sign``), with none after every figure."""
    return (value is None, 0.0 if value is None else sign * value)


#: How ``compare --sort`` orders its rows: best first.
COMPARE_KEYS: dict[CompareOrder, Callable[[dict[str, Any]], tuple[bool, float]]] = {
    CompareOrder.accuracy: lambda row: _last_if_none(row["accuracy"], -1.0),
    CompareOrder.loss: lambda row: _last_if_none(row["lowest_loss"]),
    CompareOrder.cost: lambda row: _last_if_none(row["cost_usd"]),
}


def _loss_kinds(rows: list[dict[str, Any]]) -> Counter[str]:
    """How many of ``compare``'s ``rows`` have their lowest loss of each set."""
    return Counter(row["lowest_loss_of"] for row in rows if row["lowest_loss_of"])


def _ranked(
    rows: list[dict[str, Any]], order: CompareOrder
) -> tuple[list[dict[str, Any]], str | None]:
    """``compare``'s ``rows`` best first by ``order``, and what a reader must know of how: the
    lowest losses of jobs with a validation set and of jobs without are of different sets, which
    do not compare, so those go by the test loss of each one's round of its lowest loss."""
    kinds = _loss_kinds(rows)
    if order is not CompareOrder.loss or len(kinds) < 2:
        return sorted(rows, key=COMPARE_KEYS[order]), None
    counts = ", ".join(f"{kind} for {n}" for kind, n in sorted(kinds.items(), reverse=True))
    caveat = (
        f"their lowest losses are of different sets ({counts}), which do not compare: sorted "
        "by the test loss of each one's round of its lowest loss"
    )
    return sorted(rows, key=lambda row: _last_if_none(row["test_loss_at_lowest"])), caveat


@app.command()
def compare(
    job_ids: Annotated[
        list[str] | None, typer.Argument(help="The jobs' ids.", callback=_job_ids)
    ] = None,
    url: UrlOption = None,
    name: Annotated[
        str | None,
        typer.Option(help="And your jobs whose name holds this (case matters): a sweep's."),
    ] = None,
    sort: Annotated[
        CompareOrder | None,
        typer.Option(
            help="Best first by: accuracy (highest last test accuracy), loss (lowest "
            "validation loss, or test loss where a job holds no validation set out; jobs of "
            "both kinds by the test loss of that round), cost (cheapest); a job without the "
            "figure last. Default: as asked."
        ),
    ] = None,
) -> None:
    """Jobs side by side (a sweep's): the fields their specs differ in, and where each got to
    (rounds, last test accuracy, lowest validation or test loss, cost); JSON last."""
    given = list(dict.fromkeys(job_ids or []))
    wanted = list(given)
    with _controller(url) as client:
        before = None
        while name is not None and len(wanted) <= COMPARED_MAX:
            found, before = client.jobs(name=name, limit=COMPARED_MAX, before=before)
            wanted += [j["job_id"] for j in found if j["job_id"] not in wanted]
            if before is None:
                break
        if len(wanted) > COMPARED_MAX:
            fail(f"compare reads at most {COMPARED_MAX} jobs: {len(wanted)} or more asked")
        if len(wanted) < 2:
            matched = f" (--name {name!r} matched {len(wanted) - len(given)})"
            fail(f"compare needs two jobs or more: {len(wanted)} asked" + (matched if name else ""))
        jobs = []
        for job_id in wanted:
            job = client.job(job_id, round_from=NO_ROUNDS)["job"]
            if job["round"]:
                job = client.job(job_id, round_from=job["round"] - 1)["job"]
            jobs.append(job)
    specs = [_flat({k: v for k, v in job["spec"].items() if k != "name"}) for job in jobs]
    fields = sorted({field for spec in specs for field in spec})
    differing = [f for f in fields if len({json.dumps(s.get(f)) for s in specs}) > 1]
    rows = [_compared(job, spec, differing) for job, spec in zip(jobs, specs, strict=True)]
    if sort is not None:
        rows, caveat = _ranked(rows, sort)
        if caveat:
            console.print(caveat, markup=False)
    table = Table(title=f"{len(jobs)} jobs" + (f" (name {name!r})" if name else ""))
    named = any(row["name"] for row in rows)
    headings = ["job", *(["name"] if named else []), "state", "round", *differing]
    for heading in [*headings, "accuracy", "lowest loss", "cost (USD)"]:
        table.add_column(heading, overflow="fold")
    mixed = len(_loss_kinds(rows)) > 1
    for row in rows:
        table.add_row(
            row["job_id"],
            *([Text(row["name"] or "")] if named else []),
            row["state"],
            f"{row['round']}/{row['rounds']}",
            *[Text(_said(row["fields"][f])) for f in differing],
            "" if row["accuracy"] is None else f"{row['accuracy']:.4f}",
            _lowest_said(row, mixed),
            f"{row['cost_usd']:.6f}",
        )
    console.print(table)
    if not differing:
        console.print("their specs differ in nothing but their names", markup=False)
    typer.echo(json.dumps({"differing": differing, "jobs": rows}))


def _lowest_said(row: dict[str, Any], mixed: bool) -> str:
    """``compare``'s lowest loss of ``row``: which set's, its round, and, among jobs of both
    kinds (``mixed``), the test loss that round of one chosen by its validation loss."""
    lowest, of = row["lowest_loss"], row["lowest_loss_of"]
    if lowest is None:
        return ""
    test = f"; test {row['test_loss_at_lowest']:.4f}" if mixed and of == "validation" else ""
    return f"{lowest:.4f} {of} (round {row['lowest_at_round']}{test})"


def _flat(spec: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``spec``'s fields, those of a mapping as dotted names (``dataset.name``)."""
    flat: dict[str, Any] = {}
    for field, value in spec.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{field}.")
        else:
            flat[f"{prefix}{field}"] = value
    return flat


def _said(value: Any) -> str:
    """A spec's value as a YAML file would hold it (none, or a field the spec has not: –)."""
    return "–" if value is None else value if isinstance(value, str) else json.dumps(value)


def _compared(job: dict[str, Any], spec: dict[str, Any], differing: list[str]) -> dict[str, Any]:
    """What ``compare`` says of ``job``: its differing fields and where it got to."""
    last = job["rounds"][-1] if job["rounds"] else None
    kept = job.get("best")  # none from a controller before it was kept
    best = BestRound.model_validate(kept) if kept else None
    return {
        "job_id": job["job_id"],
        "name": job["spec"].get("name"),
        "state": job["state"],
        "round": job["round"],
        "rounds": (job["plan"] or {}).get("rounds", "?"),
        "fields": {field: spec.get(field) for field in differing},
        "accuracy": last["accuracy"] if last else None,
        # The loss its best round was chosen by: the validation set's, else the test set's.
        "lowest_loss": best.chosen_loss if best else None,
        "lowest_loss_of": best.chosen if best else None,
        "lowest_at_round": best.round if best else None,
        "test_loss_at_lowest": best.test_loss if best else None,
        "cost_usd": job["cost_usd"],
    }


@app.command()
def status(
    job_id: JobIdArgument,
    url: UrlOption = None,
    watch: Annotated[
        bool,
        typer.Option(
            help="Follow the job until it ends, as submit --watch does (exit status 1 unless "
            "it is done)."
        ),
    ] = False,
    rounds: Annotated[
        int | None,
        typer.Option(
            help="The rounds the table lists, the latest (default: 20; 0: every one); the JSON "
            "lists every one.",
            min=0,
            show_default=False,
        ),
    ] = None,
) -> None:
    """A job's state, rounds and cost; its record as JSON last (its ledger: ``faasdl ledger``)."""
    # The summary's module is imported here, as by every command that shows one: its rich and
    # tenacity parts are ~20 ms of every command's start otherwise.
    from faasdl.controller.watch import progress

    with _controller(url) as client:
        view = _watched(client, job_id) if watch else client.job(job_id)
        table = _summary(client, view, rounds)
    console.print(table, width=140)
    if line := progress(view):
        console.print(line, highlight=False, markup=False)
    for hint in _hints(view["job"]):
        console.print(hint, highlight=False, markup=False)
    if view["queue_position"]:
        waiting = f": waits for {view['waiting_for']}" if view.get("waiting_for") else ""
        console.print(
            f"queue position {view['queue_position']}{waiting}", highlight=False, markup=False
        )
    typer.echo(json.dumps(view))
    if watch and view["job"]["state"] != "done":
        raise typer.Exit(1)


@app.command()
def ledger(
    job_id: JobIdArgument,
    from_round: Annotated[
        int, typer.Option(help="Only the activations of this round and later (1: all).", min=1)
    ] = 1,
    url: UrlOption = None,
) -> None:
    """What each of a job's activations used and cost (its memory limit and peak, its time and
    the cold start's part of it); JSON last."""
    with _controller(url) as client:
        found = client.ledger(job_id, round_from=from_round - 1)
    table = Table(title=f"ledger of job {job_id}")
    columns = ("kind", "round", "unit", "attempt", "MB", "peak MB", "seconds", "init s")
    for column in (*columns, "outcome", "USD"):
        table.add_column(column)
    for a in found:
        peak = a.get("peak_memory_mb")  # none where the activation did not say (killed)
        table.add_row(
            a["kind"],
            str(a["round"] + 1),
            str(a["unit"]),
            str(a["attempt"]),
            str(a["memory_mb"]),
            "–" if peak is None else f"{peak:.0f}",
            f"{a['duration_ms'] / 1000:.2f}",
            f"{a['init_ms'] / 1000:.2f}",
            a["outcome"],
            f"{a['cost_usd']:.6f}",
        )
    since = f" from round {from_round} on" if from_round > 1 else ""
    _show(table, f"no activations of job {job_id}{since}", width=140)
    typer.echo(json.dumps(found))


@app.command()
def log(
    job_id: JobIdArgument,
    url: UrlOption = None,
    tail: Annotated[
        int | None,
        typer.Option(help="Only the newest N lines of the log (the failures all the same).", min=1),
    ] = None,
) -> None:
    """A job's log (the lines its record keeps, the newest) and its failure reports: what failed,
    how it was classified and noticed, what the failed attempt cost, the activation to look up on
    the platform and the recovery taken; JSON last."""

    def when(t_ms: int) -> str:  # this machine's time
        return datetime.fromtimestamp(t_ms / 1000).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]

    def counted(number: int | None) -> str:  # from 1, as the tables of rounds show them
        return "" if number is None else str(number + 1)

    with _controller(url) as client:
        job = client.job(job_id, round_from=NO_ROUNDS)["job"]
    lines = Table(title=f"log of job {job_id}")
    for column in ("time", "round", "unit", "kind"):
        lines.add_column(column, no_wrap=True)
    lines.add_column("message", overflow="fold")
    shown = job["events"][-tail:] if tail else job["events"]
    for e in shown:
        # the unit is a shard, counted from 0 as the job's units are
        unit = "" if e.get("unit") is None else str(e["unit"])
        lines.add_row(when(e["t_ms"]), counted(e.get("round")), unit, e["kind"], Text(e["message"]))
    captions = []
    if len(shown) < len(job["events"]):
        captions.append(f"the newest {len(shown)} of {len(job['events'])} lines kept (--tail)")
    if dropped := job.get("events_dropped", 0):
        captions.append(
            f"its first {dropped} lines are not kept (a record keeps the newest "
            "FAASDL_CONTROLLER__EVENTS_KEPT)"
        )
    lines.caption = "; ".join(captions) or None
    _show(lines, f"no log lines of job {job_id}")
    failures = Table(title=f"failures of job {job_id}")
    columns = ("time", "action", "round", "unit", "attempt", "failure", "seen by", "USD")
    for column in (*columns, "activation"):
        failures.add_column(column, no_wrap=True)
    failures.add_column("recovery")
    failures.add_column("message", overflow="fold")
    for f in job["failures"]:
        recovery = f["recovery"]
        if f.get("resume_from") is not None:
            recovery += f" from {f['resume_from']}"
        if f.get("limits"):
            recovery += f"; {f['limits']}"
        failures.add_row(
            when(f["t_ms"]),
            f["kind"],
            counted(f["round"]),
            str(f["unit"]),
            str(f["attempt"]),
            f["classification"],
            f["detected_by"],
            f"{f['cost_usd']:.6f}",
            f["activation_id"],
            Text(recovery),
            Text(f["message"]),
        )
    if dropped := job.get("failures_dropped", 0):
        failures.caption = (
            f"its first {dropped} failures are not kept (a record keeps the newest "
            "FAASDL_CONTROLLER__FAILURES_KEPT)"
        )
    _show(failures, f"no failures of job {job_id}")
    fields = ("events", "events_dropped", "failures", "failures_dropped")
    typer.echo(json.dumps({"job_id": job_id, **{k: job.get(k, 0) for k in fields}}))


@app.command()
def cancel(job_id: JobIdArgument, url: UrlOption = None) -> None:
    """Cancel a queued or running job (its activations are stopped, its record kept, and the
    model of its last finished round if one has finished)."""
    with _controller(url) as client:
        view = client.cancel(job_id)
    if hint := _model_hint(view["job"]):
        console.print(hint, highlight=False, markup=False)
    typer.echo(json.dumps({"job_id": job_id, "state": view["job"]["state"]}))


@app.command()
def finish(job_id: JobIdArgument, url: UrlOption = None) -> None:
    """End a running job now, done, with the model of its last finished round (its best
    round's with keep_model: best; the round in progress is stopped and dropped); then download
    it with faasdl model."""
    with _controller(url) as client:
        view = client.finish(job_id)
    job = view["job"]
    typer.echo(_model_hint(job), err=True)
    typer.echo(json.dumps({"job_id": job_id, "state": job["state"], "rounds": job["round"]}))


@app.command()
def delete(job_id: JobIdArgument, url: UrlOption = None) -> None:
    """Delete an ended job whole: its record, log, ledger and model (a queued or running job:
    cancel it first; refused while a job yet to stage trains on from its model)."""
    with _controller(url) as client:
        client.delete(job_id)
    typer.echo(json.dumps({"job_id": job_id, "deleted": True}))


@app.command()
def model(
    job_id: JobIdArgument,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write it.")],
    url: UrlOption = None,
) -> None:
    """Download the model a job kept (with progress): a done job's, or its last finished round's
    where it failed or was cancelled (safetensors: weights w/…, optimizer state opt/…, the
    architecture in its metadata; in Python, faasdl.training.models.load_model builds it). One
    cut short is gone on from, in this run or the next (its part kept in FILE.partial)."""
    if str(output) == "-":  # not stdout: the command's own output there is its JSON record
        fail("--output: give a file name ('-' would be a file of that name)")
    if os.path.isdir(output):  # os.path's: Path.is_dir raises for a name too long
        fail(f"--output: {output} is a directory: name the file ({output / 'model.safetensors'})")
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    try:
        with (
            _controller(url) as client,
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            ) as shown,
        ):
            task = shown.add_task(f"downloading {output.name}", total=None)

            def progress(written: int, size: int | None) -> None:
                shown.update(task, completed=written, total=size)

            size = client.save_model(job_id, output, progress=progress)
    except OSError as exc:
        fail(f"--output: cannot write {output}: {exc.strerror}")
    typer.echo(json.dumps({"job_id": job_id, "path": str(output), "bytes": size}))


def _not_a_dataset_name(value: str) -> str | None:
    """Why ``value`` is not a data set's name as the API takes them; ``None`` if it is one."""
    from faasdl.controller.datasets import DATASET_NAME_PATTERN

    if re.fullmatch(DATASET_NAME_PATTERN, value):
        return None
    return (
        f"{value!r} is not a data set's name (1-63 letters, digits, _ and -, the first a letter "
        "or digit)"
    )


def _dataset_name(value: str | None) -> str | None:
    """A data set's name, checked before a request is made of it."""
    problem = None if value is None else _not_a_dataset_name(value)
    if problem:
        raise typer.BadParameter(problem)
    return value


DatasetNameArgument = Annotated[
    str,
    typer.Argument(help="The data set's name (without .npz).", callback=_dataset_name),
]


@datasets_app.command("upload")
def datasets_upload(
    file: Annotated[
        Path,
        typer.Argument(
            help="The .npz file: x_train, y_train, x_test, y_test (np.savez or savez_compressed).",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ],
    name: Annotated[
        str | None,
        typer.Option(
            help="The name to keep it under (default: the file's, without .npz); an upload of "
            "the same name is replaced.",
            callback=_dataset_name,
        ),
    ] = None,
    url: UrlOption = None,
) -> None:
    """Upload a data set: sent as it is read (with progress), checked by the controller, kept
    whole or not at all; what it holds, then its record as JSON last. One cut short goes on from
    what the controller holds of it, in this run or the next (the file hashed first names it);
    a file the controller keeps as the name already is not sent again."""
    from rich.progress import Progress

    from faasdl.controller.client import sha256_of
    from faasdl.training.datasets import dims

    if name is None and (problem := _not_a_dataset_name(file.stem)):
        fail(f"{file.name}: {problem}: give it one with --name")
    with _controller(url) as client, Progress(console=console, transient=True) as progress:
        hashing = progress.add_task(f"hashing {file.name}", total=file.stat().st_size)
        with file.open("rb") as whole:
            sha256 = sha256_of(whole, lambda read: progress.advance(hashing, read))
        progress.remove_task(hashing)
        sending = progress.add_task(f"uploading {file.name}", total=file.stat().st_size)
        with progress.open(file, "rb", task_id=sending) as data:
            try:
                uploaded = client.upload_dataset(name or file.stem, data, sha256=sha256)
            except ValidationError as exc:  # the API names its field, the body: here, the file
                fail(f"{file.name}: {str(exc).removeprefix('body: ')}")
        # Neither read nor moved in: the controller keeps this file as the name already.
        kept = not next(t.completed for t in progress.tasks if t.id == sending)
    if kept:
        console.print(
            f"{uploaded['name']} is this file already (its SHA-256): nothing sent", markup=False
        )
    if contents := uploaded.get("contents"):
        console.print(
            f"{contents['examples']:,} training and {contents['test_examples']:,} test examples "
            f"of shape {dims(contents['input_shape'])}, {contents['classes']:,} classes"
        )
        for note in contents["notes"]:
            console.print(f"[yellow]note:[/] {escape(note)}")
    console.print(f"jobs name it as dataset: {{name: npz, path: {uploaded['path']}}}", markup=False)
    typer.echo(json.dumps(uploaded))


@datasets_app.command("list")
def datasets_list(url: UrlOption = None) -> None:
    """Your uploaded data sets, with their SHA-256 (the table shows its first 12 digits), then
    what the controller holds of uploads cut short (they count toward your quota); the data
    sets as JSON last."""
    from faasdl.training.datasets import dims

    with _controller(url) as client:
        found = client.datasets()
        cut_short = client.unfinished_uploads()
    table = Table(title="data sets")
    for column in ("name", "path", "bytes", "examples", "shape", "classes", "sha256"):
        table.add_column(column)
    for d in found:
        digest = d["sha256"][:12] + "…" if d["sha256"] else "-"
        contents = d.get("contents")
        held = (
            (
                f"{contents['examples']:,} + {contents['test_examples']:,} test",
                dims(contents["input_shape"]),
                f"{contents['classes']:,}",
            )
            if contents
            else ("-", "-", "-")
        )
        table.add_row(d["name"], d["path"], f"{d['bytes']:,}", *held, digest)
    _show(table, "no data sets: upload one with faasdl datasets upload FILE.npz")
    if cut_short:
        _show_unfinished(cut_short)
    typer.echo(json.dumps(found))


def _show_unfinished(parts: list[dict[str, Any]]) -> None:
    """The parts held of uploads cut short, and what to do with them."""
    table = Table(title="uploads cut short (the same file's upload goes on from them)")
    for column in ("name", "held bytes", "sha256", "last byte", "deleted after"):
        table.add_column(column)
    for part in parts:
        when = (
            datetime.fromtimestamp(part[key] / 1000).strftime("%Y-%m-%d %H:%M")  # this machine's
            for key in ("updated_ms", "kept_until_ms")
        )
        table.add_row(part["name"], f"{part['received']:,}", part["sha256"][:12] + "…", *when)
    console.print(table)
    console.print(
        "they count toward your quota: faasdl datasets upload FILE goes on with one, faasdl "
        "datasets delete NAME --unfinished deletes those of NAME",
        markup=False,
    )


@datasets_app.command("delete")
def datasets_delete(
    name: DatasetNameArgument,
    unfinished: Annotated[
        bool,
        typer.Option(
            "--unfinished",
            help="Delete only what the controller holds of uploads as NAME cut short (faasdl "
            "datasets list shows them); the data set stays.",
        ),
    ] = False,
    url: UrlOption = None,
) -> None:
    """Delete an uploaded data set and what is held of its uploads cut short (refused while a job
    that trains on it has not staged it, or while a file is being sent as NAME)."""
    with _controller(url) as client:
        client.delete_dataset(name, unfinished=unfinished)
    typer.echo(json.dumps({"name": name, "deleted": True, "unfinished": unfinished}))


EXPERIMENT_NAMES = ("recovery", "replication", "baselines", "scale", "cost", "disdel")


@app.command("experiment")
def experiment(
    name: Annotated[str, typer.Argument(help=f"One of: {', '.join(EXPERIMENT_NAMES)}.")],
    full: Annotated[
        bool,
        typer.Option(
            "--full/--quick",
            help="The thesis-sized run, or the few-minutes one (the default; CI's smoke test).",
        ),
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option(
            help="Where the report goes (NAME/ under it; replaced whole); default: "
            "experiments/results for --full, experiments/quick for --quick."
        ),
    ] = None,
    workload: Annotated[
        list[str] | None,
        typer.Option(
            "--workload",
            help="recovery only: run this workload alone (repeat it for more); the report goes "
            "to recovery-NAME/. Default: all four.",
        ),
    ] = None,
    passes: Annotated[
        int | None,
        typer.Option(
            min=2,
            help="recovery: passes of the failure-free run and canary's taking turns at 15% "
            "failures (default 2); the overhead's 95% interval narrows as the square root of "
            "the passes. replication, baselines, cost: make every run this many times, each "
            "pass in the mirrored order of the one before (default once), and give each ratio a "
            "95% interval over them. Each pass adds about as long as the first took.",
        ),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            metavar="WORKLOAD.FIELD=VALUE",
            help="Change a parameter of a workload the experiment runs from its size's (repeat "
            "it for more), e.g. training.epochs=8 or training.model=mlp (recovery), "
            "compression.files=12 (replication, baselines, cost), graph.depth=14 (scale); the "
            "report's name says it (recovery-training.epochs-8/). Not for disdel.",
        ),
    ] = None,
) -> None:
    """Run an experiment of the thesis' evaluation and write its report (CSV, PNG plots, failure
    plans, a Markdown summary); its headline figures are the last line, as JSON."""
    if name not in EXPERIMENT_NAMES:
        fail(f"name: unknown experiment {name!r} (known: {', '.join(EXPERIMENT_NAMES)})")
    from faasdl.experiments import report
    from faasdl.experiments.suite import (
        COMPARISONS,
        EXPERIMENTS,
        PASSES,
        PASSES_TAKEN,
        experiment_workloads,
        recovery,
        workload_params,
    )
    from faasdl.experiments.workloads import WORKLOADS

    workloads = list(dict.fromkeys(workload or []))
    if workloads and name != "recovery":
        fail(f"--workload: only the recovery experiment runs per workload, not {name}")
    if passes is not None and name not in PASSES_TAKEN:
        taken = f"{', '.join(PASSES_TAKEN[:-1])} and {PASSES_TAKEN[-1]}"
        fail(f"--passes: only the {taken} experiments run in passes, not {name}")
    if param and not experiment_workloads(name):
        fail(f"--param: the {name} experiment runs training jobs, not workloads: it takes none")
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        fail(f"--workload: unknown workload {unknown[0]!r} (known: {', '.join(WORKLOADS)})")
    try:
        workload_params(param or [], experiment_workloads(name, workloads))  # before it runs
    except FaasdlError as exc:
        fail(str(exc))
    size: report.Size = "full" if full else "quick"
    directory = output or Path("experiments") / ("results" if full else "quick")
    made: list[Path] = []
    try:
        made = report.check_writable(directory)
        if name == "recovery":
            result = recovery(size, console, workloads, passes or PASSES, param or [])
        elif name in COMPARISONS:
            result = COMPARISONS[name](size, console, param or [], passes or 1)
        else:
            result = EXPERIMENTS[name](size, console, params=param or [])
    except BaseException as exc:  # a failure, or Ctrl-C: the folders made for the report go
        report.unmake(made)
        if isinstance(exc, FaasdlError):
            fail(str(exc))
        raise
    written = report.write(result, directory)
    for finding in result.findings:
        console.print(f"• {finding}", markup=False)
    console.print(f"report: {written / 'summary.md'}", markup=False)
    typer.echo(json.dumps(result.summary))
