"""faasdl's one settings class.

Every option is an environment variable with the prefix ``FAASDL_``; nested backends use ``__``
(``FAASDL_LOCAL__POOL_MEMORY_MB=2048``, ``FAASDL_OPENWHISK__API_HOST=https://ow.example``).
The defaults run everything on one machine with no configuration at all.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "FAASDL_"

#: OpenWhisk's well-known development key (``whisk.auth.guest``). The embedded server accepts it
#: by default because it listens on loopback only; a real deployment brings its own key.
GUEST_API_KEY = (
    "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:"
    "123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP"
)


#: The most of a secret's file read: a key is tens of bytes (a file named by mistake, a log or
#: ``/dev/zero``, is refused, not read whole).
SECRET_FILE_BYTES = 64 * 1024
#: The longest wait, timeout or interval a setting takes (in seconds; its milliseconds for one in
#: milliseconds): a year is a mistake's length already, and past some 292 years Python cannot wait
#: at all (``FAASDL_STORE__TIMEOUT_S=1e300`` ended in a socket's ``OverflowError``).
YEAR_S = 365 * 86_400
#: The bytes of an AES-128 key (the embedded platform's parameter storage key).
AES_128_KEY_BYTES = 16


def read_secret_file(path: Path, field: str) -> SecretStr:
    """A secret kept in a file (a mounted Kubernetes secret, a Docker secret): its content without
    the trailing newline editors add."""
    try:
        with path.open("rb") as file:
            data = file.read(SECRET_FILE_BYTES + 1)
        value = data.decode("utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{field}: cannot read {path}: {exc}") from exc
    if len(data) > SECRET_FILE_BYTES:
        raise ValueError(f"{field}: {path} is over {SECRET_FILE_BYTES // 1024} KiB: not a key")
    if not value:
        raise ValueError(f"{field}: {path} is empty")
    return SecretStr(value)


def header_secret_problem(secret: SecretStr) -> str | None:
    """Why ``secret`` cannot be sent in an HTTP header (an API key): its first character that is
    not visible ASCII, by kind and place, never the secret itself; ``None`` if it can."""
    for at, char in enumerate(secret.get_secret_value()):
        if not "!" <= char <= "~":
            kind = {"\n": "a newline", "\r": "a carriage return", " ": "a space"}.get(char)
            if kind is None:
                kind = "a control character" if char.isascii() else "a character not ASCII"
            return f"holds {kind} at {at}: a key sent in a header is visible ASCII"
    return None


def _check_key(secret: SecretStr, field: str, path: Path | None) -> None:
    """Raise, naming ``field`` (the file it was read from, where it was), unless ``secret`` can
    be sent in a header."""
    if (problem := header_secret_problem(secret)) is not None:
        where = f"{field}_file: {path}" if path is not None else f"{field}:"
        raise ValueError(f"{where} {problem}")


def _check_tls_pair(cert_file: Path | None, key_file: Path | None) -> None:
    """Raise unless a server's certificate and key files are given both, readable, or neither."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("tls_cert_file and tls_key_file: give both, a certificate and its key")
    for name, path in (("tls_cert_file", cert_file), ("tls_key_file", key_file)):
        if path is not None:
            _check_readable(path, name)


def _check_readable(path: str | Path, field: str) -> None:
    """Raise, naming ``field``, unless ``path`` is a file this process can read (it is read
    later, at a first connection, where its failure said less)."""
    if not os.access(path, os.R_OK) or os.path.isdir(path):
        raise ValueError(f"{field}: cannot read {path}")


#: An OpenWhisk entity's name: a namespace's, an action's, a package's (OpenWhisk's docs:
#: ``\A([\w]|[\w][\w@ .-]*[\w@.-]+)\z``, Java's ``\w`` being ASCII's), of at most 256 characters.
OPENWHISK_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9_@ .-]*[A-Za-z0-9_@.-])?"


def _matching(pattern: str, most: int, what: str) -> AfterValidator:
    """A check that a setting is ``what`` (``pattern``, whole, of at most ``most`` characters):
    each such name went into a URL or a selector and failed at its first use."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if len(value) > most or not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}, of at most {most} characters")
        return value

    return AfterValidator(check)


OpenWhiskName = Annotated[
    str,
    _matching(
        OPENWHISK_NAME,
        256,
        "an OpenWhisk name (letters, digits and _, then also spaces, @, . and -, not a space last)",
    ),
]
KubernetesName = Annotated[
    str,
    _matching(
        r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?",
        63,
        "a Kubernetes name (a-z, 0-9 and -, a letter or digit at each end)",
    ),
]
LabelValue = Annotated[
    str,
    _matching(
        r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?",
        63,
        "a Kubernetes label's value (letters, digits, -, _ and ., a letter or digit at each end)",
    ),
]
#: A wait, timeout or interval in seconds, and one in milliseconds: at most a year (:data:`YEAR_S`).
Seconds = Annotated[float, Field(le=YEAR_S)]
Milliseconds = Annotated[int, Field(le=YEAR_S * 1000)]


def http_url_problem(value: str) -> str | None:
    """Why ``value`` is not an http(s) URL of a server (a path under it may follow, as behind a
    proxy); ``None`` if it is one. Each problem failed at the first request, most as if the
    server were unreachable, a user and password by replacing the key sent with them."""
    not_a_server = f"{value!r} is not an http:// or https:// URL of a server"
    try:
        parts = urlsplit(value)
        port = parts.port  # raises for one out of range or not a number
    except ValueError as exc:
        return f"{not_a_server} ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return not_a_server
    if any(not char.isprintable() or char.isspace() for char in value):
        return f"{not_a_server} (it holds white space or a control character)"
    if parts.username is not None or parts.password is not None:
        shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        return f"{shown!r} holds a user or password (not shown): keys have settings of their own"
    if parts.query or parts.fragment:
        return f"{value!r} has a query or fragment: give the server's URL (a path may follow it)"
    if port == 0:
        return f"{not_a_server} (port 0)"
    return None


# A container image's reference as Docker's grammar (distribution/reference) has it, IPv6
# registries aside: [registry[:port]/]name[/name...][:tag][@digest].
_HOST_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_NAME_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*(?::[0-9]+)?/)?{_NAME_PART}(?:/{_NAME_PART})*"
    r"(?::\w[\w.-]{0,127})?"  # tag
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"  # digest
)


def image_problem(value: str) -> str | None:
    """Why ``value`` is not a container image's reference; ``None`` if it is one."""
    if len(value) > 255 or not IMAGE_REFERENCE.fullmatch(value):
        return (
            f"{value!r} is not an image reference: [registry[:port]/]name[:tag][@digest], the "
            "name in lower case"
        )
    return None


class Section(BaseModel):
    """A group of settings. A number must be finite: ``inf`` would pass a bound like ``gt=0``
    and fail later (a socket's timeout), and JSON has no infinity to show it with."""

    model_config = ConfigDict(allow_inf_nan=False)


class LocalPlatformSettings(Section):
    """The embedded OpenWhisk-like platform (``faasdl.platform.local``)."""

    namespace: OpenWhiskName = Field(
        "guest",
        description="Name of the single namespace the platform serves (an OpenWhisk name).",
    )
    pool_memory_mb: int = Field(
        4096, ge=128, description="Container pool user memory; every container reserves its limit."
    )
    memory_min_mb: int = Field(128, ge=16, description="Smallest action memory limit accepted.")
    memory_max_mb: int = Field(2048, ge=16, description="Largest action memory limit accepted.")
    memory_std_mb: int = Field(256, ge=16, description="Memory limit of an action that names none.")
    timeout_min_ms: Milliseconds = Field(
        100, ge=1, description="Smallest action time limit accepted."
    )
    timeout_max_ms: Milliseconds = Field(
        300_000, ge=1, description="Largest action time limit accepted."
    )
    timeout_std_ms: Milliseconds = Field(
        60_000, ge=1, description="Time limit of an action that names none."
    )
    log_max_mb: int = Field(10, ge=0, description="Largest per-activation log limit accepted.")
    images: list[str] = Field(
        default_factory=list,
        description="Blackbox images accepted and run by the platform's own Python runtime: "
        "images that hold faasdl and its actions (FAASDL_OPENWHISK__ACTION_IMAGE), nothing else.",
    )
    concurrent_invocations: int = Field(
        100, ge=1, description="In-flight plus queued activations allowed (429 beyond)."
    )
    invocations_per_minute: int = Field(
        0, ge=0, description="Activations allowed per rolling minute; 0 means no limit."
    )
    payload_max_bytes: int = Field(
        1_048_576, ge=1024, description="Largest invoke payload and action result."
    )
    code_max_bytes: int = Field(48 * 1_048_576, ge=1024, description="Largest action code.")
    idle_timeout_s: Seconds = Field(
        600.0, gt=0, description="Idle warm containers are evicted after."
    )
    memory_enforcement: Literal["auto", "cgroup", "watchdog"] = Field(
        "auto",
        description="How memory limits are enforced: a memory cgroup per container, an RSS "
        "watchdog, or 'auto' (cgroup where writable, else the watchdog).",
    )
    watchdog_interval_ms: Milliseconds = Field(
        25, ge=5, description="RSS watchdog sampling period."
    )
    container_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="How much lower the CPU priority of action containers' processes is than "
        "the platform's own process: on a cluster actions run on invoker nodes, here they share "
        "the cores with the controller, which must stay responsive. Where Linux groups sessions "
        "(autogrouping) a container's session competes with the platform's as an equal, and "
        "this orders the processes inside it only.",
    )
    warmup_nice: int = Field(
        9,
        ge=0,
        le=19,
        description="How much lower still the CPU priority of a prewarmed container is while it "
        "warms up, and its session's than the platform's where Linux groups sessions "
        "(autogrouping): a replica's warm-up is background work (on a cluster it runs on "
        "another node), running activations keep their cores. It gets the containers' priority "
        "back once warm (lifting the processes' needs CAP_SYS_NICE, the session's does not).",
    )
    container_start_timeout_s: Seconds = Field(
        30.0,
        gt=0,
        description="A container that has not started by then is a provisioning error.",
    )
    max_activation_records: int = Field(
        100_000, ge=100, description="Oldest finished activation records are dropped beyond this."
    )
    parameter_storage_key: SecretStr | None = Field(
        None,
        description="Encrypt actions' parameters at rest as OpenWhisk's parameter storage does "
        "(its `whisk.parameter-storage.key`): the base64 of a 16-byte AES-128 key. An action's "
        'record then shows each value sealed (`"encryption": "aes128"`), and its '
        "containers get them opened; values must be strings.",
    )

    @field_validator("parameter_storage_key")
    @classmethod
    def _aes_128_key(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None:
            try:
                size = len(base64.b64decode(key.get_secret_value(), validate=True))
            except binascii.Error as exc:
                raise ValueError(f"not base64 ({exc})") from None
            if size != AES_128_KEY_BYTES:
                raise ValueError(
                    f"the base64 of {size} bytes: AES-128's key is {AES_128_KEY_BYTES} bytes "
                    f"(`openssl rand -base64 {AES_128_KEY_BYTES}` makes one)"
                )
        return key

    @model_validator(mode="after")
    def _ranges(self) -> LocalPlatformSettings:
        if not self.memory_min_mb <= self.memory_std_mb <= self.memory_max_mb:
            raise ValueError(
                "memory limits must satisfy memory_min_mb <= memory_std_mb <= memory_max_mb"
            )
        if not self.timeout_min_ms <= self.timeout_std_ms <= self.timeout_max_ms:
            raise ValueError(
                "time limits must satisfy timeout_min_ms <= timeout_std_ms <= timeout_max_ms"
            )
        if self.memory_max_mb > self.pool_memory_mb:
            raise ValueError(
                f"memory_max_mb ({self.memory_max_mb}) exceeds pool_memory_mb "
                f"({self.pool_memory_mb}): such an action could never be placed"
            )
        return self


class OpenWhiskSettings(Section):
    """A real OpenWhisk reached through its REST API v1 (``faasdl.platform.openwhisk``)."""

    api_host: str = Field("http://127.0.0.1:3233", description="Base URL of the OpenWhisk API.")
    auth: SecretStr = Field(SecretStr(GUEST_API_KEY), description="API key 'uuid:key'.")
    auth_file: Path | None = Field(
        None, description="A file holding the API key (a mounted secret); replaces `auth`."
    )
    namespace: OpenWhiskName = Field(
        "_",
        description="Namespace (an OpenWhisk name); '_' is the key's default namespace.",
    )
    verify_tls: bool = Field(True, description="Verify the server's TLS certificate.")
    ca_file: Path | None = Field(
        None,
        description="CA bundle (PEM) the API's certificate is verified by, in place of the "
        "system's: a private CA's, or a self-signed certificate itself (the certificate must "
        "name `api_host`'s host in its subjectAltName). Refused with `verify_tls` false, and "
        "where it cannot be read.",
    )
    request_timeout_s: Seconds = Field(
        10.0,
        gt=0,
        description="Socket timeout of one HTTP request; a blocking invoke's is its blocking "
        "window (`blocking_wait_ms`) longer. A call that times out is retried as an unavailable "
        "one is, so an API that stops answering pauses the jobs after `retry_attempts` of them.",
    )
    blocking_wait_ms: int = Field(
        60_000, ge=1, le=60_000, description="How long a blocking invoke waits before polling."
    )
    poll_initial_s: Seconds = Field(
        0.05, gt=0, description="First delay when polling an activation."
    )
    poll_max_s: Seconds = Field(2.0, gt=0, description="Longest delay between polls.")
    retry_attempts: int = Field(8, ge=1, description="Attempts for throttled or unavailable calls.")
    retry_max_wait_s: Seconds = Field(10.0, gt=0, description="Cap of the jittered backoff.")
    lost_grace_s: Seconds = Field(
        60.0,
        ge=0,
        description="Added to twice the action timeout before a missing record is lost.",
    )
    action_image: str | None = Field(
        None,
        description="A blackbox image with faasdl and TensorFlow (deploy/docker/): faasdl's "
        "actions are deployed as blackbox actions in it (OpenWhisk's Python images have no "
        "TensorFlow); none: as python:3.11 actions.",
    )
    admin_url: str | None = Field(
        None,
        description="faasdl's platform extension endpoint (the embedded server's /faasdl/v1), "
        "used to kill containers (failure injection, a cancelled job's activations); a real "
        "OpenWhisk has none.",
    )

    @model_validator(mode="after")
    def _checked(self) -> OpenWhiskSettings:
        for field, url in (("api_host", self.api_host), ("admin_url", self.admin_url)):
            if url is not None and (problem := http_url_problem(url)):
                raise ValueError(f"{field}: {problem}")
        if self.action_image is not None and (problem := image_problem(self.action_image)):
            raise ValueError(f"action_image: {problem}")
        if self.ca_file is not None:
            if not self.verify_tls:
                raise ValueError("ca_file: verify_tls is false, so no certificate is verified")
            _check_readable(self.ca_file, "ca_file")
        if self.auth_file is not None:
            self.auth = read_secret_file(self.auth_file, "auth_file")
        uuid, sep, key = self.auth.get_secret_value().partition(":")
        if not sep or not uuid or not key:
            raise ValueError("auth must be an OpenWhisk API key of the form 'uuid:key'")
        _check_key(self.auth, "auth", self.auth_file)
        return self


class KubernetesSettings(Section):
    """The Kubernetes cluster OpenWhisk runs on (``faasdl.platform.kubernetes``, the
    ``kubernetes`` extra): the controller watches its action pods and tells Canary of an OOM-killed,
    deleted or evicted pod sooner than the activation's record."""

    watch: bool = Field(
        False, description="Watch OpenWhisk's action pods (needs the chart's RBAC)."
    )
    namespace: KubernetesName = Field(
        "openwhisk",
        description="The namespace OpenWhisk's action pods run in.",
    )
    release: LabelValue = Field(
        "owdev",
        description="The Helm release of OpenWhisk (its pods' label).",
    )
    kubeconfig: Path | None = Field(
        None, description="A kubeconfig file; none: the in-cluster service account, else ~/.kube."
    )
    retry_s: Seconds = Field(
        5.0,
        gt=0,
        description="Wait before watching again after the cluster was unreachable.",
    )
    request_timeout_s: Seconds = Field(
        10.0,
        gt=0,
        description="How long a call to the Kubernetes API waits for its answer, and the pod "
        "watch for its next line beyond its 30 s renewal; then the cluster is unreachable.",
    )


class ServerSettings(Section):
    """The embedded platform's OpenWhisk-compatible REST server (``faasdl platform serve``)."""

    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(3233, ge=0, le=65535, description="Port to listen on (0 picks a free one).")
    auth: SecretStr = Field(SecretStr(GUEST_API_KEY), description="The API key clients must send.")
    auth_file: Path | None = Field(
        None, description="A file holding the API key (a mounted secret); replaces `auth`."
    )
    blocking_wait_max_ms: Milliseconds = Field(
        60_000,
        ge=1,
        description="Longest wait of a blocking invoke before it answers 202.",
    )
    tls_cert_file: Path | None = Field(
        None,
        description="Serve HTTPS with this certificate (PEM, its chain after it), and "
        "`tls_key_file` its key: the API key clients send is then not sent in the clear.",
    )
    tls_key_file: Path | None = Field(None, description="The key of `tls_cert_file` (PEM).")

    @model_validator(mode="after")
    def _auth_from_file(self) -> ServerSettings:
        if self.auth_file is not None:
            self.auth = read_secret_file(self.auth_file, "auth_file")
        _check_key(self.auth, "auth", self.auth_file)  # what no client could send
        _check_tls_pair(self.tls_cert_file, self.tls_key_file)
        return self

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert_file else "http"


#: SQLite's ``synchronous`` settings a store may use (OFF could corrupt the database on a crash).
SqliteSynchronous = Literal["EXTRA", "FULL", "NORMAL"]


class StoreSettings(Section):
    """The state store (``faasdl.store``): the URL picks the backend."""

    url: str = Field(
        "sqlite:///.faasdl/state.db",
        description="sqlite:///relative/path.db, sqlite:////absolute/path.db, redis://host:port/db "
        "(rediss:// for TLS), or ignite://host:10800[,host2:10800][?prefix=cache-name-prefix].",
    )
    chunk_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        le=512 * 1024 * 1024,
        description="Blob chunk size (Ignite uses at most 1 MiB; at most 512 MiB, Redis's "
        "largest value; a chunk is held whole as it is written and read).",
    )
    spill_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        description="Blobs larger than this go to the spill directory; 0: none does (every "
        "blob goes to the store in chunks: where no directory is shared, as on Kubernetes).",
    )
    spill_dir: str = Field(
        ".faasdl/spill", description="The spill tier: a directory every worker can read."
    )
    sqlite_synchronous: SqliteSynchronous = Field(
        "FULL",
        description="SQLite's syncing: FULL forces every commit to disk; NORMAL only the "
        "write-ahead log's checkpoints (a machine crash may lose the latest commits, never "
        "consistency). Canary's checkpoint writers use NORMAL.",
    )
    username: str | None = Field(
        None, description="Ignite user name, or a Redis ACL user's (none: Redis's default user)."
    )
    password: SecretStr | None = Field(None, description="Redis AUTH or Ignite password.")
    password_file: Path | None = Field(
        None, description="A file holding the password (a mounted secret); replaces `password`."
    )
    tls_ca_file: str | None = Field(
        None,
        description="CA bundle to verify a rediss:// server's certificate, or an ignite:// "
        "store's nodes' (over TLS then; their host names are not checked: pyignite gives none "
        "to TLS); refused for another store's URL, and where it cannot be read, as it is read.",
    )
    tls_ca_data: str | None = Field(
        None,
        min_length=1,
        description="The CA bundle's PEM text, in place of `tls_ca_file`: how faasdl's actions "
        "get the controller's bundle (their containers lack its file).",
    )
    timeout_s: Seconds = Field(
        10.0,
        gt=0,
        description="How long a Redis or Ignite request waits for an answer (its socket "
        "timeout). One that times out is not asked again, so a store that stops answering is "
        "unavailable after this long: the API answers 503 naming it, the jobs pause.",
    )
    ignite_replicated: bool = Field(
        True, description="Ignite caches REPLICATED (else PARTITIONED with ignite_backups)."
    )
    ignite_backups: int = Field(1, ge=0, description="Backups of a PARTITIONED Ignite cache.")

    @model_validator(mode="after")
    def _password_from_file(self) -> StoreSettings:
        if self.password_file is not None:
            self.password = read_secret_file(self.password_file, "password_file")
        given = [name for name in ("tls_ca_file", "tls_ca_data") if getattr(self, name)]
        if len(given) == 2:
            raise ValueError("tls_ca_file and tls_ca_data: give the CA bundle once, not both")
        if given:  # redis-py raised TypeError for it on redis://
            scheme = self.url.partition(":")[0]
            if scheme not in ("rediss", "ignite"):
                raise ValueError(
                    f"{given[0]}: a CA bundle verifies a rediss:// or an ignite:// store's "
                    f"servers; the store's URL is {scheme}://"
                )
        if self.tls_ca_file is not None:
            _check_readable(self.tls_ca_file, "tls_ca_file")
        return self


class EstimatorSettings(Section):
    """How faasdl sizes training actions."""

    memory_step_mb: int = Field(
        64, ge=1, description="Memory classes are multiples of this; each class is one action."
    )
    baseline_runtime: str = Field(
        "python-tf", description="Name under which the runtime's measured baseline is kept."
    )


class ControllerSettings(Section):
    """The controller (``faasdl serve``): its REST API, admission and job runner."""

    host: str = Field("127.0.0.1", description="Interface the REST API listens on.")
    port: int = Field(8080, ge=0, le=65535, description="Port of the REST API (0: a free one).")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="The least severe of `faasdl serve`'s log lines written to stderr (its own "
        "and uvicorn's).",
    )
    max_fan_in: int = Field(
        8, ge=2, le=1024, description="Most models one aggregation action merges."
    )
    scheduler_tick_s: float = Field(
        1.0, gt=0, le=60, description="Longest pause between admission passes (submit wakes it)."
    )
    events_kept: int = Field(500, ge=10, description="Log lines kept in a job's record.")
    failures_kept: int = Field(
        200,
        ge=10,
        description="Failure reports kept in a job's record, the newest (failures_dropped counts "
        "the others).",
    )
    keep_job_data: bool = Field(
        False,
        description="An ended job keeps all it wrote to the store (its shards and test set, each "
        "round's trained and merged weights); false: only its model stays, with its record and "
        "ledger (deleted as the job ends, and by the controller's housekeeping: what a controller "
        "that stopped in between left).",
    )
    drain_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="A controller that stops (SIGTERM, Ctrl-C) on the embedded platform, whose "
        "activations die with it, first starts nothing new and waits up to this long for the "
        "running ones to end and be booked; those still running are then killed and resumed by "
        "the next controller from their checkpoints (a second Ctrl-C stops waiting). 0: no "
        "wait. On OpenWhisk activations outlive the controller: it never waits.",
    )
    lease_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="The store's controller lease: a controller renews it every third of this "
        "and deletes it as it closes; one that starts and finds it waits this long for it to "
        "lapse (a controller that died), and refuses to start if it is renewed meanwhile "
        "(another controller runs on the store). One whose lease another took stops running "
        "jobs (`faasdl serve` exits 1).",
    )
    job_retention_days: float = Field(
        0.0,
        ge=0,
        description="Days an ended job is kept after it ended; then housekeeping deletes it "
        "whole: its record, ledger, unit records, model and Idempotency-Key (0: kept for good, "
        "or until `faasdl delete` deletes it). A job whose model a queued job is to train on "
        "from (init_model) is kept until that job has copied it.",
    )
    housekeeping_interval_s: Seconds = Field(
        3600.0,
        ge=1,
        description="Pause between the controller's housekeeping passes (the first as it "
        "starts): each deletes the jobs past job_retention_days, what ended jobs left in the "
        "store (see keep_job_data), the chunks and spill files of blob writes that never "
        "published (a writer killed mid-write) and the temporary files of uploads cut short "
        "(those kept to go on from, after api.upload_keep_s); and it hashes the uploads whose "
        "SHA-256 is not kept (made before it was).",
    )
    garbage_grace_s: Seconds = Field(
        3600.0,
        ge=0,
        description="Age under which housekeeping leaves an unpublished chunk or spill file, or "
        "an upload's temporary file, alone: it may belong to a write still in flight.",
    )
    tls_cert_file: Path | None = Field(
        None,
        description="Serve the REST API over HTTPS with this certificate (PEM, its chain after "
        "it), and `tls_key_file` its key: API keys then do not go in the clear beyond loopback "
        "(behind an ingress or a proxy that ends TLS, leave it unset).",
    )
    tls_key_file: Path | None = Field(None, description="The key of `tls_cert_file` (PEM).")

    @model_validator(mode="after")
    def _checked_tls(self) -> ControllerSettings:
        _check_tls_pair(self.tls_cert_file, self.tls_key_file)
        return self

    @property
    def url(self) -> str:
        """Where the REST API is served, as a client on this machine reaches it."""
        return f"{'https' if self.tls_cert_file else 'http'}://{self.host}:{self.port}"


class ApiSettings(Section):
    """Who may use the controller's REST API, and how much of it (``faasdl.controller.auth``)."""

    auth: Literal["keys", "none"] = Field(
        "keys",
        description="keys: every request but /healthz and /readyz needs `Authorization: Bearer "
        "<key>` of a key made by `faasdl keys create`; none: no authentication, every caller is "
        "an administrator (only for a controller on loopback, as `faasdl demo` runs it).",
    )
    max_body_bytes: int = Field(
        1_048_576, ge=1024, description="Largest request body (uploads excepted); 413 beyond."
    )
    submissions_per_minute: int = Field(
        60, ge=0, description="Job submissions one key may make per minute (429 beyond); 0: any."
    )
    estimates_per_minute: int = Field(
        60,
        ge=0,
        description="Estimates one key may ask for per minute (429 beyond; each new model, input "
        "shape and classes runs a probe action at the platform's largest memory); 0: any.",
    )
    uploads_per_minute: int = Field(
        10, ge=0, description="Data set uploads one key may make per minute (429 beyond); 0: any."
    )
    tenant_max_running_jobs: int = Field(
        4, ge=0, description="Jobs of one tenant running at once (more wait queued); 0: any."
    )
    tenant_max_queued_jobs: int = Field(
        100, ge=0, description="Jobs of one tenant waiting in the queue (429 beyond); 0: any."
    )
    tenant_max_memory_mb: int = Field(
        0,
        ge=0,
        description="Action memory one tenant's running jobs hold at once (more wait queued; a "
        "job larger than this is refused); 0: any.",
    )
    dataset_roots: list[Path] = Field(
        default_factory=list,
        description="Directories whose .npz files jobs may name (after resolving symbolic links); "
        "empty: only uploaded data sets and the built-in ones. In the environment a JSON list: "
        "'[\"/data\"]'.",
    )
    upload_dir: Path = Field(
        Path(".faasdl/datasets"),
        description="Where uploaded data sets are kept, one directory per tenant, made as "
        "needed (where none can be, an upload is a 503 saying so).",
    )
    max_upload_bytes: int = Field(
        1 << 30, ge=1024, description="Largest data set upload (413 beyond, nothing kept)."
    )
    tenant_max_upload_bytes: int = Field(
        10 << 30,
        ge=0,
        description="What one tenant's uploads may hold together, the parts kept of uploads cut "
        "short included (an upload beyond it is refused, 403, nothing kept); 0: any.",
    )
    upload_keep_s: Seconds = Field(
        86_400.0,
        ge=0,
        description="How long the part of an upload cut short is kept after its last byte came, "
        "for the upload to go on from there (one sent with its SHA-256, `Repr-Digest`, as "
        "`faasdl datasets upload` sends it): housekeeping deletes it after.",
    )
    stream_max_s: Seconds = Field(
        3600.0,
        gt=0,
        description="An event stream is closed after this long (clients reconnect).",
    )
    stream_keepalive_s: Seconds = Field(
        15.0,
        gt=0,
        description="A quiet event stream sends a comment this often (to find dead peers).",
    )
    worker_threads: int = Field(
        8,
        ge=1,
        le=256,
        description="Requests served at once by blocking handlers (more wait their turn): a few "
        "threads answer a burst sooner than many that take turns at Python's interpreter lock.",
    )
    max_streams_per_key: int = Field(
        8, ge=1, description="Event streams one key may hold open at once (429 beyond)."
    )
    metrics_key_grace_s: Seconds = Field(
        900.0,
        ge=0,
        description="While the store cannot be reached (where the API keys are), `/metrics` "
        "takes an administrator's key the store accepted within this many seconds, so that an "
        "outage's metrics can be scraped; a key refused since is not taken; 0: none is.",
    )


class ClientSettings(Section):
    """The CLI as a client of a controller (``faasdl submit``, ``jobs``, ``status``, …)."""

    url: str | None = Field(
        None,
        description="The controller's URL that the CLI's commands call (their `--url` overrides "
        "it; `faasdl estimate` asks it for plans unless `--local`); unset: "
        "http://FAASDL_CONTROLLER__HOST:FAASDL_CONTROLLER__PORT (https:// with its "
        "`tls_cert_file`; and estimate plans here). A "
        "path after the host is kept (a proxy's); a query, a fragment, a user or password (the "
        "key has its setting) and a port out of range are refused as it is read, as they are in "
        "`--url` and the OpenWhisk URLs.",
    )
    api_key: SecretStr | None = Field(
        None, description="The API key sent as a bearer token (from `faasdl keys create`)."
    )
    api_key_file: Path | None = Field(
        None, description="A file holding the API key; replaces `api_key`."
    )
    ca_file: Path | None = Field(
        None,
        description="CA bundle (PEM) an https:// controller's certificate is verified by, in "
        "place of the system's (a private CA's, or its self-signed certificate itself).",
    )
    reconnect_s: Seconds = Field(
        120.0,
        ge=0,
        description="How long `--watch` (and the Python client's `wait`) asks again a "
        "controller that stopped answering (a restart) before it gives up; the job goes on "
        "without the watch.",
    )
    watch_timeout_s: Seconds = Field(
        30.0,
        gt=0,
        description="How long `--watch` waits for one answer: a controller that hangs longer "
        "is asked again, as one that does not answer.",
    )

    @model_validator(mode="after")
    def _key_from_file(self) -> ClientSettings:
        if self.url is not None and (problem := http_url_problem(self.url)):
            raise ValueError(f"url: {problem}")
        if self.api_key_file is not None:
            self.api_key = read_secret_file(self.api_key_file, "api_key_file")
        if self.api_key is not None:
            _check_key(self.api_key, "api_key", self.api_key_file)
        if self.ca_file is not None:
            _check_readable(self.ca_file, "ca_file")
        return self


class Settings(BaseSettings):
    """All of faasdl's configuration."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
        allow_inf_nan=False,
    )

    platform: Literal["local", "openwhisk"] = Field(
        "local", description="Which platform runs actions (see faasdl.platform.PLATFORMS)."
    )
    local: LocalPlatformSettings = Field(default_factory=LocalPlatformSettings)
    openwhisk: OpenWhiskSettings = Field(default_factory=OpenWhiskSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    estimator: EstimatorSettings = Field(default_factory=EstimatorSettings)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    client: ClientSettings = Field(default_factory=ClientSettings)
    price_per_gb_s: float = Field(
        0.000017, ge=0, description="Price of one GB-second of action memory, in USD."
    )

    def secrets(self) -> list[str]:
        """Every secret value configured: what logs and answers must never show."""
        found = [self.openwhisk.auth, self.server.auth, self.store.password, self.client.api_key]
        values = [s.get_secret_value() for s in found if s is not None]
        url_password = urlsplit(self.store.url).password
        return [*values, *([url_password] if url_password else [])]

    @model_validator(mode="after")
    def _no_unknown_variables(self) -> Settings:
        # pydantic-settings ignores variables it does not know; a misspelt one would silently
        # leave a default in force. FAASDL_TEST_* is the test suite's own namespace.
        unknown = [
            var
            for var in given_variables()
            if not _is_setting(type(self), var[len(ENV_PREFIX) :].split("__"))
        ]
        if unknown:
            known = _setting_names(type(self))
            named = [f"{var}{_did_you_mean(var, known)}" for var in unknown]
            raise ValueError(
                f"unknown setting(s) {', '.join(named)}: Extra inputs are not permitted"
            )
        return self


#: The store settings that name the user's store (where it is, who logs in, how it is verified).
STORE_CONNECTION = frozenset(
    {"url", "username", "password", "password_file", "tls_ca_file", "tls_ca_data"}
)


def private_settings(
    *, store: dict[str, Any] | None = None, users_store: bool = False, **sections: dict[str, Any]
) -> Settings:
    """The environment's settings for a run on a store of its own (a benchmark's, an
    experiment's lab), so that its figures are measured with the ``FAASDL_`` variables they
    name: each of ``sections``' fields over the environment's section, and a store of
    ``store``'s fields that takes the environment's other store settings (its chunks, spill
    threshold, timeouts) but none of :data:`STORE_CONNECTION`: those are the user's store's
    (a CA bundle for a ``rediss://`` store was refused beside a private SQLite one), taken
    only where ``users_store`` says ``store``'s URL names that store."""
    given = Settings()
    chosen: dict[str, Any] = {
        name: type(getattr(given, name)).model_validate(getattr(given, name).model_dump() | fields)
        for name, fields in sections.items()
    }
    dropped = {"password_file"} | (set() if users_store else STORE_CONNECTION)  # read already
    chosen["store"] = StoreSettings.model_validate(
        given.store.model_dump(exclude=dropped) | (store or {})
    )
    return given.model_copy(update=chosen)


def _setting_names(model: type[BaseModel], prefix: str = ENV_PREFIX) -> list[str]:
    """The variable of every setting of ``model``, its sections' included."""
    names = []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, Section):
            names += _setting_names(field.annotation, f"{prefix}{name.upper()}__")
        else:
            names.append(f"{prefix}{name.upper()}")
    return names


def given_variables() -> list[str]:
    """This process's ``FAASDL_`` variables, sorted; the test suite's own ``FAASDL_TEST_`` ones
    left out."""
    return sorted(
        var
        for var in os.environ
        if var.startswith(ENV_PREFIX) and not var.startswith(f"{ENV_PREFIX}TEST_")
    )


def secret_variables(model: type[BaseModel] = Settings, prefix: str = ENV_PREFIX) -> set[str]:
    """The variables of ``model``'s secrets (its sections' included): ``FAASDL_OPENWHISK__AUTH``."""
    names: set[str] = set()
    for name, field in model.model_fields.items():
        variable = f"{prefix}{name.upper()}"
        if isinstance(field.annotation, type) and issubclass(field.annotation, Section):
            names |= secret_variables(field.annotation, f"{variable}__")
        elif field.annotation is SecretStr or SecretStr in get_args(field.annotation):
            names.add(variable)
    return names


def _did_you_mean(var: str, known: list[str]) -> str:
    close = difflib.get_close_matches(var, known, n=1, cutoff=0.8)
    return f" (did you mean {close[0]}?)" if close else ""


def _is_setting(model: type[BaseModel], names: list[str]) -> bool:
    """Whether a variable's ``__``-separated names lead to a setting of ``model``
    (``LOCAL__POOL_MEMORY_MB``), not to a group of them or past one."""
    field = model.model_fields.get(names[0].lower())
    if field is None:
        return False
    section = field.annotation
    if isinstance(section, type) and issubclass(section, Section):
        return len(names) > 1 and _is_setting(section, names[1:])
    return len(names) == 1
