"""Settings: the FAASDL_ environment, nested sections, and validators that refuse nonsense."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from faasdl.config import (
    GUEST_API_KEY,
    YEAR_S,
    OpenWhiskSettings,
    Settings,
    _setting_names,
    http_url_problem,
    image_problem,
    private_settings,
)
from faasdl.platform import PLATFORMS, make_platform
from faasdl.platform.local import LocalPlatform
from faasdl.platform.openwhisk import OpenWhiskPlatform


def test_defaults_need_no_configuration() -> None:
    settings = Settings()

    assert settings.platform == "local"
    assert settings.local.pool_memory_mb >= settings.local.memory_max_mb
    assert settings.price_per_gb_s == 0.000017


def test_environment_with_nested_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAASDL_PLATFORM", "openwhisk")
    monkeypatch.setenv("FAASDL_LOCAL__POOL_MEMORY_MB", "8192")
    monkeypatch.setenv("FAASDL_OPENWHISK__API_HOST", "https://ow.example:31001")

    settings = Settings()

    assert settings.platform == "openwhisk"
    assert settings.local.pool_memory_mb == 8192
    assert settings.openwhisk.api_host == "https://ow.example:31001"


@pytest.mark.parametrize(
    ("image", "valid"),
    [
        ("faasdl-action", True),
        ("registry.example.com:5000/team/faasdl-action:0.1.0", True),
        (f"ghcr.io/o/faasdl@sha256:{'a' * 64}", True),
        ("localhost/x:tag_1.2", True),
        ("Faasdl", False),  # a name in upper case
        ("x:", False),
        ("-x", False),
        ("a" * 256, False),
    ],
)
def test_an_image_reference_is_checked_as_docker_reads_one(image: str, valid: bool) -> None:
    assert (image_problem(image) is None) is valid


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://127.0.0.1:8080", None),
        ("https://ow.example/api/faasdl", None),  # behind a proxy, under a path
        ("http://[::1]:8080", None),
        ("ftp://x", "'ftp://x' is not an http:// or https:// URL of a server"),
        # Each failed at the first request: a traceback, or "unreachable: Failed to parse".
        ("http://[::1", "(Invalid IPv6 URL)"),
        ("http://127.0.0.1:99999", "(Port out of range 0-65535)"),
        ("http://127.0.0.1:x", "(Port could not be cast to integer value as 'x')"),
        ("http://127.0.0.1:0", "(port 0)"),
        ("http://exa mple.com", "(it holds white space or a control character)"),
        ("http://127.0.0.1:8080\n", "(it holds white space or a control character)"),
        # … a query or fragment made every path a 404; a user and password replaced the key.
        ("http://h:8080/?x=1", "'http://h:8080/?x=1' has a query or fragment"),
        ("http://h:8080#top", "has a query or fragment"),
        ("http://me:s3cret@h:8080", "'http://h:8080' holds a user or password (not shown)"),
    ],
)
def test_a_server_s_url_is_checked_as_it_is_read(url: str, said: str | None) -> None:
    problem = http_url_problem(url)

    assert problem is None if said is None else said in (problem or "")
    assert "s3cret" not in (problem or "")


def test_factory_builds_the_named_platform_without_io() -> None:
    assert isinstance(make_platform(Settings()), LocalPlatform)
    assert isinstance(make_platform(Settings(platform="openwhisk")), OpenWhiskPlatform)
    assert set(PLATFORMS) == {"local", "openwhisk"}


@pytest.mark.parametrize(
    ("env", "value", "text"),
    [
        ("FAASDL_PLATFORM", "lambda", "local"),
        ("FAASDL_LOCAL__POOL_MEMORY_MB", "-1", "greater than or equal to 128"),
        ("FAASDL_LOCAL__MEMORY_STD_MB", "4000", "memory_min_mb <= memory_std_mb <= memory_max_mb"),
        ("FAASDL_OPENWHISK__AUTH", "no-colon-here", "uuid:key"),
        ("FAASDL_NOT_A_SETTING", "1", "Extra inputs are not permitted"),
        # inf passes gt=0 and failed as a socket's timeout.
        ("FAASDL_OPENWHISK__REQUEST_TIMEOUT_S", "inf", "openwhisk.request_timeout_s\n.*finite"),
        ("FAASDL_PRICE_PER_GB_S", "inf", "finite number"),
        # A misspelt setting of a group left its default in force.
        ("FAASDL_LOCAL__POOL_MEMORY", "2048", "unknown setting.*FAASDL_LOCAL__POOL_MEMORY "),
        # … with the setting it is closest to, where one is close.
        ("FAASDL_STORE__URI", "x", r"FAASDL_STORE__URI \(did you mean FAASDL_STORE__URL\?\):"),
        ("FAASDL_API__AUTHENTICATION", "none", "FAASDL_API__AUTHENTICATION: Extra inputs"),
        # Each failed at its first use, as "No connection adapters" or wskdeploy's error.
        ("FAASDL_OPENWHISK__API_HOST", "ow.example:31001", "api_host: 'ow.example:31001' is not"),
        ("FAASDL_OPENWHISK__ADMIN_URL", "ftp://x", "admin_url: 'ftp://x' is not an http"),
        ("FAASDL_OPENWHISK__ACTION_IMAGE", "My Image", "action_image: 'My Image' is not an image"),
        # A key no header can carry: requests raised UnicodeEncodeError (a traceback), or said
        # the controller was unreachable, quoting the key.
        ("FAASDL_CLIENT__API_KEY", "fdl_ключ", "api_key: holds a character not ASCII at 4: a key"),
        ("FAASDL_OPENWHISK__AUTH", "uuid:k\ney", "auth: holds a newline at 6"),
        ("FAASDL_SERVER__AUTH", "uuid:k\x01y", "auth: holds a control character at 6"),
        # redis-py raised TypeError (a traceback) for a CA bundle on redis://.
        ("FAASDL_STORE__TLS_CA_FILE", "/etc/hostname", "store's URL is sqlite://"),
        # Read at the first connection, or by uvicorn as it started: a traceback.
        ("FAASDL_OPENWHISK__CA_FILE", "/nonexistent/ca.pem", "ca_file: cannot read /nonexistent"),
        ("FAASDL_SERVER__TLS_CERT_FILE", "/etc/hostname", "tls_key_file: give both, a certificate"),
        ("FAASDL_SERVER__TLS_KEY_FILE", "/etc/hostname", "tls_key_file: give both, a certificate"),
        ("FAASDL_CONTROLLER__TLS_CERT_FILE", "/etc/hostname", "tls_key_file: give both"),
        ("FAASDL_CLIENT__CA_FILE", "/nonexistent/ca.pem", "ca_file: cannot read /nonexistent"),
        # Names that went into a URL or a label selector and failed at their first use.
        ("FAASDL_OPENWHISK__NAMESPACE", "team/a", "'team/a' is not an OpenWhisk name"),
        ("FAASDL_OPENWHISK__NAMESPACE", "team ", "'team ' is not an OpenWhisk name"),
        ("FAASDL_LOCAL__NAMESPACE", "", "'' is not an OpenWhisk name"),
        ("FAASDL_KUBERNETES__NAMESPACE", "Open_Whisk", "'Open_Whisk' is not a Kubernetes name"),
        ("FAASDL_KUBERNETES__RELEASE", "a,b", "'a,b' is not a Kubernetes label's value"),
        # A chunk is held whole: a spilled blob's read asked for 1 TB at once (MemoryError).
        ("FAASDL_STORE__CHUNK_BYTES", str(10**12), "less than or equal to 536870912"),
        # Read as the platform is made: an AES-128 key's base64.
        ("FAASDL_LOCAL__PARAMETER_STORAGE_KEY", "s3cret!", "(?s)parameter_storage_key.*not base64"),
        ("FAASDL_LOCAL__PARAMETER_STORAGE_KEY", "a2V5", "(?s)storage_key.*of 3 bytes: AES-128's"),
    ],
)
def test_nonsense_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, text: str
) -> None:
    monkeypatch.setenv(env, value)

    with pytest.raises(ValidationError, match=text):
        Settings()


DURATIONS = [
    name
    for name in _setting_names(Settings)
    if name.endswith(("_S", "_MS")) and not name.startswith("FAASDL_PRICE")
]


@pytest.mark.parametrize("env", DURATIONS)
def test_a_duration_past_a_year_is_refused(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    # 1e300 s passed gt=0, and ended in a socket's or a lock's OverflowError where it was
    # waited for (FAASDL_STORE__TIMEOUT_S on Redis, FAASDL_OPENWHISK__REQUEST_TIMEOUT_S).
    past = YEAR_S * (1000 if env.endswith("_MS") else 1) + 1
    monkeypatch.setenv(env, str(past))

    with pytest.raises(ValidationError, match="less than or equal to"):
        Settings()


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"fdl_0123.secret \n", "holds a space at 15: a key sent in a header is visible ASCII"),
        (b"fdl_0123.se\ncret\n", "holds a newline at 11"),
        (b"fdl_" + b"x" * 70_000, "is over 64 KiB: not a key"),  # read whole before
        (b"\n", "is empty"),
    ],
)
def test_a_key_file_that_holds_no_key_is_refused_naming_it_not_the_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, content: bytes, said: str
) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(content)
    monkeypatch.setenv("FAASDL_CLIENT__API_KEY_FILE", str(key_file))

    with pytest.raises(ValidationError) as refused:
        Settings()

    assert f"api_key_file: {key_file} {said}" in str(refused.value)
    assert "secret" not in str(refused.value)


def test_a_ca_bundle_is_read_for_a_rediss_store_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAASDL_STORE__URL", "rediss://127.0.0.1:6390/0")
    monkeypatch.setenv("FAASDL_STORE__TLS_CA_FILE", "/nonexistent/ca.pem")

    with pytest.raises(ValidationError, match=r"tls_ca_file: cannot read /nonexistent/ca\.pem"):
        Settings()
    monkeypatch.setenv("FAASDL_STORE__TLS_CA_FILE", __file__)  # readable: taken as it is
    assert Settings().store.tls_ca_file == __file__


@pytest.mark.parametrize(
    ("url", "bundle", "said"),
    [
        ("redis://127.0.0.1:6390/0", {"TLS_CA_FILE": __file__}, "tls_ca_file: a CA bundle"),
        ("redis://127.0.0.1:6390/0", {"TLS_CA_DATA": "PEM"}, "tls_ca_data: a CA bundle"),
        ("sqlite:///x.db", {"TLS_CA_DATA": "PEM"}, "tls_ca_data: .* URL is sqlite://"),
        ("rediss://127.0.0.1:6390/0", {"TLS_CA_DATA": ""}, "tls_ca_data\n.*at least 1 char"),
        (
            "rediss://127.0.0.1:6390/0",
            {"TLS_CA_FILE": __file__, "TLS_CA_DATA": "PEM"},
            "tls_ca_file and tls_ca_data: give the CA bundle once, not both",
        ),
    ],
)
def test_a_ca_bundle_is_given_once_and_for_a_tls_store_only(
    monkeypatch: pytest.MonkeyPatch, url: str, bundle: dict[str, str], said: str
) -> None:
    monkeypatch.setenv("FAASDL_STORE__URL", url)
    for name, value in bundle.items():
        monkeypatch.setenv(f"FAASDL_STORE__{name}", value)

    with pytest.raises(ValidationError, match=said):
        Settings()


def test_a_private_store_takes_the_environments_settings_but_not_the_users_stores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A bench's or a lab's settings: sections given as objects replaced the environment's whole
    # (its FAASDL_LOCAL__ and FAASDL_ESTIMATOR__ went unread while the figures named them), and
    # given as fields the user's CA bundle was refused beside the private SQLite store.
    # Arrange: the environment of a user whose store is a TLS Redis with a password.
    given = {
        "FAASDL_STORE__URL": "rediss://cache:6380/0",
        "FAASDL_STORE__TLS_CA_FILE": __file__,
        "FAASDL_STORE__USERNAME": "faasdl",
        "FAASDL_STORE__PASSWORD": "s3cret",
        "FAASDL_STORE__CHUNK_BYTES": "65536",
        "FAASDL_LOCAL__WARMUP_NICE": "7",
        "FAASDL_LOCAL__MEMORY_MAX_MB": "1024",
        "FAASDL_ESTIMATOR__MEMORY_STEP_MB": "128",
    }
    for name, value in given.items():
        monkeypatch.setenv(name, value)

    # Execute
    settings = private_settings(
        local={"memory_max_mb": 4096}, store={"url": "sqlite:///own.db", "spill_dir": "own"}
    )

    # Assert: the chosen fields, the environment's others, none naming the user's store.
    assert (settings.local.memory_max_mb, settings.local.warmup_nice) == (4096, 7)
    assert settings.estimator.memory_step_mb == 128
    store = settings.store
    assert (store.url, store.spill_dir, store.chunk_bytes) == ("sqlite:///own.db", "own", 65536)
    assert (store.tls_ca_file, store.username, store.password) == (None, None, None)


def test_secrets_do_not_show_in_reprs() -> None:
    settings = OpenWhiskSettings()

    assert GUEST_API_KEY.split(":")[1] not in repr(settings)
    assert GUEST_API_KEY.split(":")[1] not in str(Settings().model_dump())


def test_readme_documents_every_setting() -> None:
    from pathlib import Path

    from pydantic import BaseModel

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    sections: dict[str, type[BaseModel]] = {"FAASDL_": Settings}
    for name, field in Settings.model_fields.items():
        if isinstance(field.default_factory, type) and issubclass(field.default_factory, BaseModel):
            sections[f"FAASDL_{name.upper()}__"] = field.default_factory
    assert len(sections) >= 6  # the top level and its nested sections
    for prefix, model in sections.items():
        for name, field in model.model_fields.items():
            if field.default_factory is None:
                assert f"`{prefix}{name.upper()}`" in readme, f"{prefix}{name.upper()} undocumented"
