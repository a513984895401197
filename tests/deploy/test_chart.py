"""Static checks of the Helm chart (deploy/helm/faasdl): no cluster and no ``helm`` are needed for
most; rendering and schema validation of the rendered objects run wherever there is a ``helm``
(on the PATH, or the one ``make test`` puts beside the virtual environment's Python: see
``fetch_helm.py``), and are skipped with the reason otherwise."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from pydantic import BaseModel
from yamllint import linter
from yamllint.config import YamlLintConfig

from faasdl.config import ENV_PREFIX, GUEST_API_KEY, Settings, read_secret_file
from faasdl.store.redis_server import free_port
from tests.conftest import eventually, tls_files

CHART = Path(__file__).parents[2] / "deploy" / "helm" / "faasdl"
#: The Kubernetes the chart is rendered for and its objects validated against.
KUBE_VERSION = "1.29.0"
TEMPLATES = sorted((CHART / "templates").glob("*.yaml"))
_BESIDE_PYTHON = Path(sys.executable).parent / "helm"
HELM = shutil.which("helm") or (str(_BESIDE_PYTHON) if _BESIDE_PYTHON.is_file() else None)
LINT = YamlLintConfig(
    "extends: default\n"
    "rules:\n"
    "  line-length: {max: 110}\n"
    "  document-start: disable\n"
    "  comments: {min-spaces-from-content: 1}\n"
)
VALUE_REF = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
ENV_NAME = re.compile(r"name: (FAASDL_[A-Z0-9_]+)")


def values() -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return found


def paths(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out = set()
    for key, value in tree.items():
        out.add((*prefix, key))
        if isinstance(value, dict) and value:
            out |= paths(value, (*prefix, key))
    return out


def referenced() -> set[tuple[str, ...]]:
    return {
        tuple(m[1].lstrip(".").split("."))
        for template in [*TEMPLATES, CHART / "templates" / "_helpers.tpl"]
        for m in VALUE_REF.finditer(template.read_text())
    }


@pytest.mark.parametrize(
    "path",
    [CHART / "Chart.yaml", CHART / "values.yaml", CHART.parents[1] / "openwhisk" / "values.yaml"],
    ids=["Chart.yaml", "values.yaml", "openwhisk/values.yaml"],
)
def test_the_plain_yaml_passes_yamllint(path: Path) -> None:
    problems = list(linter.run(path.read_text(), LINT))

    assert [f"{path.name}:{p.line}: {p.message}" for p in problems] == []


def test_the_openwhisk_values_set_only_keys_its_chart_reads() -> None:
    # openwhisk-deploy-kube's keys for limits, pool and balancer (reference/openwhisk.md §3).
    known = {
        "whisk.limits.actionsInvokesPerminute",
        "whisk.limits.actionsInvokesConcurrent",
        "whisk.limits.actions.time.min",
        "whisk.limits.actions.time.max",
        "whisk.limits.actions.time.std",
        "whisk.limits.actions.memory.min",
        "whisk.limits.actions.memory.max",
        "whisk.limits.actions.memory.std",
        "whisk.limits.activation.payload.max",
        "whisk.containerPool.userMemory",
        "whisk.loadbalancer.blackboxFraction",
        "invoker.containerFactory.impl",
    }
    tree = yaml.safe_load((CHART.parents[1] / "openwhisk" / "values.yaml").read_text())
    leaves = {".".join(p) for p in paths(tree) if not isinstance(_at(tree, p), dict)}

    assert sorted(leaves - known) == []
    memory = tree["whisk"]["limits"]["actions"]["memory"]
    assert int(memory["max"].rstrip("m")) <= int(tree["whisk"]["containerPool"]["userMemory"][:-1])


def test_every_value_the_templates_use_is_in_values_yaml() -> None:
    missing = sorted(".".join(p) for p in referenced() - paths(values()))

    assert missing == []


def test_every_leaf_value_is_used_by_a_template() -> None:
    used = referenced()
    leaves = {p for p in paths(values()) if not isinstance(_at(values(), p), dict)}
    # A value is used when it, or a map holding it, is referenced (toYaml of a whole map).
    unused = sorted(".".join(p) for p in leaves if not any(p[: len(u)] == u for u in used))

    assert unused == []


def _at(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def test_every_value_is_documented_by_a_comment_above_it() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        key = re.match(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*):", line)
        if key is None:
            continue
        above = i - 1
        while above >= 0 and lines[above].strip().startswith("#") and "# --" not in lines[above]:
            above -= 1
        if above < 0 or not lines[above].strip().startswith("# --"):
            undocumented.append(f"values.yaml:{i + 1}: {key[2]}")

    assert undocumented == []


def test_every_faasdl_setting_the_templates_set_exists() -> None:
    names = {m[1] for t in TEMPLATES for m in ENV_NAME.finditer(t.read_text())}

    unknown = sorted(n for n in names if not _is_setting(n))

    assert len(names) >= 8
    assert unknown == []


def test_the_controller_writes_only_to_volumes_and_no_blob_spills_to_a_pods_own_disk() -> None:
    # The controller's root file system is read-only; OpenWhisk's action pods share no directory
    # with it, nor with each other, so a blob spilled to a file would be unreadable elsewhere.
    template = (CHART / "templates" / "controller.yaml").read_text()
    env = dict(re.findall(r'name: (FAASDL_[A-Z0-9_]+)\n\s+value: "?([^"\n]+)"?', template))
    mounts = re.findall(r"mountPath: (\S+)(\n\s+readOnly: true)?", template)
    writable = [Path(path) for path, read_only in mounts if not read_only]
    action_image = (CHART.parents[1] / "docker" / "action.Dockerfile").read_text()

    assert "readOnlyRootFilesystem: true" in template
    assert any(Path(env["FAASDL_API__UPLOAD_DIR"]).is_relative_to(w) for w in writable)
    assert env["FAASDL_STORE__SPILL_BYTES"] == "0"
    assert "FAASDL_STORE__SPILL_DIR" not in env
    assert re.search(r"^\s+FAASDL_STORE__SPILL_BYTES=0$", action_image, re.M)


def _is_setting(env_name: str) -> bool:
    model: type[BaseModel] = Settings
    parts = env_name.removeprefix(ENV_PREFIX).lower().split("__")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        annotation = field.annotation
        if i < len(parts) - 1:
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                return False
            model = annotation
    return True


def _render(*settings: str) -> list[dict[str, Any]]:
    assert HELM is not None
    rendered = subprocess.run(
        [HELM, "template", "faasdl", str(CHART), "--namespace", "faasdl"]
        # The version the objects are validated against (helm 3.8's default was 1.23, under the
        # chart's kubeVersion: it refused to render).
        + ["--kube-version", KUBE_VERSION]
        + [arg for setting in settings for arg in ("--set", setting)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


def _containers(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        c
        for d in documents
        if d["kind"] == kind
        for c in d["spec"]["template"]["spec"]["containers"]
    ]


@pytest.mark.skipif(HELM is None, reason="no helm here: make test fetches one (fetch_helm.py)")
@pytest.mark.parametrize("store", ["redis", "ignite"])
def test_the_rendered_chart_is_valid_kubernetes(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kubernetes_validate

    ignite = store == "ignite"
    documents = _render(
        f"store.kind={store}", f"ignite.enabled={ignite}", f"redis.enabled={not ignite}"
    )
    assert HELM is not None
    lint = subprocess.run([HELM, "lint", str(CHART)], capture_output=True, text=True)

    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert {d["kind"] for d in documents} >= {"Deployment", "Service", "StatefulSet"}
    for document in documents:
        kubernetes_validate.validate(document, KUBE_VERSION.rpartition(".")[0], strict=True)
    # A NetworkPolicy selects the store's pods (Ignite's only guard; Redis has a password too).
    guarded = [
        d["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component")
        for d in documents
        if d["kind"] == "NetworkPolicy"
    ]
    assert store in guarded
    # The controller's settings, as rendered, are settings faasdl starts with.
    (controller,) = [d for d in documents if d["kind"] == "Deployment"]
    (container,) = controller["spec"]["template"]["spec"]["containers"]
    for env in container["env"]:
        if not env["name"].endswith("_FILE"):  # a Secret's file, mounted in the pod
            monkeypatch.setenv(env["name"], env["value"])
    assert Settings().store.url.startswith(f"{store}://")


@pytest.mark.skipif(HELM is None, reason="no helm here: make test fetches one (fetch_helm.py)")
@pytest.mark.parametrize("auth", [True, False])
def test_redis_asks_for_the_secrets_password_and_the_controller_reads_the_same_one(
    auth: bool,
) -> None:
    # The chart's Redis had no password (a password could not reach the actions then); the
    # NetworkPolicy was its only guard, open to every pod where the network plugin ignores it.
    # Execute
    documents = _render(f"redis.auth={str(auth).lower()}")

    # Assert: Redis is started with the Secret's key as its password, its probe logs in with
    # it, and the controller reads that key's file (it gives the actions the password).
    (redis,) = _containers(documents, "StatefulSet")
    (controller,) = _containers(documents, "Deployment")
    secret = _secret_files(documents)
    from_secret = {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in redis.get("env", [])
    }
    controller_env = {e["name"]: e.get("value") for e in controller["env"]}
    assert redis["command"] == ["sh", "/etc/redis/start.sh"]
    assert "args" not in redis
    assert redis["readinessProbe"]["exec"]["command"] == ["sh", "/etc/redis/ping.sh"]
    if not auth:
        assert from_secret == {}
        assert "FAASDL_STORE__PASSWORD_FILE" not in controller_env
        return
    key = ("faasdl-secrets", "redis-password")
    assert from_secret == {"REDIS_PASSWORD": key}
    assert controller_env["FAASDL_STORE__PASSWORD_FILE"] == secret[key]


@pytest.mark.skipif(HELM is None, reason="no helm here: make test fetches one (fetch_helm.py)")
@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (["redis.enabled=false"], "store.kind is redis but redis.enabled is false"),
        (["store.kind=ignite"], "store.kind is ignite but ignite.enabled is false"),
        (["store.kind=nope"], "store.kind must be redis or ignite"),
        (
            ["redis.enabled=false", "store.url=ignite://ignite.example.com:10800"],
            "store.url's scheme is ignite://, not a redis store's (store.kind): redis:// or",
        ),
        (["store.url=redis://redis.example.com:6379/0"], "set redis.enabled=false"),
        (
            ["redis.enabled=false", "store.url=redis://r:6379/0", "store.tlsCaSecretKey=ca"],
            "a CA bundle is for a store reached with TLS, a rediss:// or ignite:// store.url",
        ),
        (["store.passwordSecretKey=pw"], "are for a store of your own (store.url)"),
        (["openwhisk.caSecretKey=ow-ca.crt"], "set openwhisk.verifyTls=true, or no certificate"),
    ],
    ids=[
        "redis-off",
        "ignite-off",
        "unknown-kind",
        "url-of-another-kind",
        "url-beside-the-charts",
        "ca-without-tls",
        "key-without-url",
        "openwhisk-ca-unverified",
    ],
)
def test_a_store_the_chart_does_not_deploy_is_refused_as_it_renders(
    settings: list[str], said: str
) -> None:
    # The controller was rendered naming the chart's Redis service where none was deployed: an
    # install that started and could never reach its store.
    # Execute
    with pytest.raises(subprocess.CalledProcessError) as refused:
        _render(*settings)

    # Assert
    assert said in refused.value.stderr


@pytest.mark.skipif(HELM is None, reason="no helm here: make test fetches one (fetch_helm.py)")
@pytest.mark.parametrize(
    ("kind", "url"),
    [
        ("redis", "rediss://app@redis.example.com:6380/0"),
        ("ignite", "ignite://ignite.example:10800"),
    ],
)
def test_a_store_of_your_own_is_reached_with_its_password_and_ca_from_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, url: str
) -> None:
    # Arrange: a managed Redis reached with TLS and an ACL user (the chart could only name its
    # own; redis.enabled=false named a Redis service that was not there), or an Ignite cluster
    # over TLS (its CA bundle was refused).

    # Execute
    documents = _render(
        "redis.enabled=false",
        f"store.kind={kind}",
        f"store.url={url}",
        "store.passwordSecretKey=redis-pw",
        "store.tlsCaSecretKey=ca.crt",
    )

    # Assert: no Redis of the chart's; the controller names the store, and reads its password
    # and CA bundle from the Secret's keys (it gives both to the actions); its settings load.
    assert not [d for d in documents if d["metadata"]["name"].endswith("-redis")]
    (controller,) = _containers(documents, "Deployment")
    mounted = {key: path for (_, key), path in _secret_files(documents).items()}
    env = {e["name"]: e["value"] for e in controller["env"]}
    assert env["FAASDL_STORE__URL"] == url
    assert env["FAASDL_STORE__PASSWORD_FILE"] == mounted["redis-pw"]
    assert env["FAASDL_STORE__TLS_CA_FILE"] == mounted["ca.crt"]
    files = {
        "redis-pw": tmp_path / "pw",
        "ca.crt": tls_files(tmp_path).ca_file,
        "openwhisk-auth": tmp_path / "auth",
    }
    files["redis-pw"].write_text("s3cret\n")
    files["openwhisk-auth"].write_text(GUEST_API_KEY)
    _set_as_mounted(env, mounted, files, monkeypatch)
    store = Settings().store
    assert store.url == url
    assert store.password is not None
    assert store.password.get_secret_value() == "s3cret"
    assert store.tls_ca_file == str(files["ca.crt"])


@pytest.mark.skipif(HELM is None, reason="no helm here: make test fetches one (fetch_helm.py)")
def test_openwhisks_certificate_is_verified_by_a_ca_bundle_from_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrange: an OpenWhisk whose certificate a private CA signed (verifyTls false was the only
    # way to reach it).

    # Execute
    documents = _render("openwhisk.verifyTls=true", "openwhisk.caSecretKey=ow-ca.crt")

    # Assert: the controller reads the bundle from the Secret's key; its settings load.
    (controller,) = _containers(documents, "Deployment")
    mounted = {key: path for (_, key), path in _secret_files(documents).items()}
    env = {e["name"]: e["value"] for e in controller["env"] if "value" in e}
    assert env["FAASDL_OPENWHISK__CA_FILE"] == mounted["ow-ca.crt"]
    assert env["FAASDL_OPENWHISK__VERIFY_TLS"] == "true"
    files = {key: tmp_path / key for key in mounted}  # each Secret's key as mounted
    files["ow-ca.crt"].write_bytes(tls_files(tmp_path / "tls").ca_file.read_bytes())
    files["openwhisk-auth"].write_text(GUEST_API_KEY)
    files["redis-password"].write_text("s3cret")
    _set_as_mounted(env, mounted, files, monkeypatch)
    openwhisk = Settings().openwhisk
    assert openwhisk.ca_file == files["ow-ca.crt"]
    assert openwhisk.verify_tls


def _set_as_mounted(
    env: dict[str, str],
    mounted: dict[str, str],
    files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Set the controller's rendered ``env`` here, each path of a Secret's key (``mounted``)
    replaced by the local file that stands for that key (``files``)."""
    for name, value in env.items():
        found = [key for key, path in mounted.items() if path == value]
        monkeypatch.setenv(name, str(files[found[0]]) if found else value)


def _secret_files(documents: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """Where the controller's container finds each ``(Secret, key)`` it mounts."""
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    (controller,) = deployment["spec"]["template"]["spec"]["containers"]
    return {
        (v["secret"]["secretName"], item["key"]): str(Path(mount["mountPath"]) / item["path"])
        for v in deployment["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
        for item in v["secret"]["items"]
        for mount in controller["volumeMounts"]
        if mount["name"] == v["name"]
    }


def _redis_files(tmp_path: Path, port: int, *, auth: bool) -> Path:
    """The chart's Redis ConfigMap written to ``tmp_path`` as it is mounted at /etc/redis, its
    ``redis.conf`` set to keep its data in ``tmp_path`` and listen on ``port`` of loopback."""
    (config_map,) = [
        d
        for d in _render(f"redis.auth={str(auth).lower()}")
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-redis")
    ]
    for name, text in config_map["data"].items():
        (tmp_path / name).write_text(text)
    conf = tmp_path / "redis.conf"
    assert conf.read_text().count("dir /data\n") == 1
    conf.write_text(
        conf.read_text().replace("dir /data\n", f"dir {tmp_path}\n")
        # Redis's arguments as it was started, not the title it writes over them.
        + f"bind 127.0.0.1\nport {port}\nset-proc-title no\n"
    )
    return tmp_path


@pytest.mark.skipif(HELM is None, reason="no helm here: make test fetches one (fetch_helm.py)")
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server here")
def test_the_charts_redis_takes_the_password_the_controller_reads_and_never_on_a_command_line(
    tmp_path: Path,
) -> None:
    # Arrange: a key made with kubectl --from-file of a file that ends with a line break (the
    # controller reads it without: Redis asked for it with, and the controller was refused),
    # quotes, a backslash and a space in it (Redis's configuration would split or unescape
    # them). Redis had it on its command line until it wrote its title over it.
    raw = "p4 ss\"w\\rd$x'\r\n"
    secret = tmp_path / "redis-password"
    secret.write_text(raw, newline="")
    password = read_secret_file(secret, "password_file").get_secret_value()
    port = free_port()
    here = _redis_files(tmp_path, port, auth=True)
    env = {**os.environ, "REDIS_PASSWORD": raw}

    # Execute: the container's command and its readiness probe, as the chart runs them.
    server = subprocess.Popen(["sh", str(here / "start.sh")], env=env, cwd=tmp_path)
    try:
        eventually(lambda: _ping(here, port, env) == 0, timeout_s=30, what="the probe's PONG")
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
        logged_in = redis.Redis(port=port, password=password).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        wrong = _ping(here, port, {**env, "REDIS_PASSWORD": "not it"})
    finally:
        server.terminate()
        server.wait(timeout=30)

    # Assert: the shell ran Redis in its place (a TERM reaches it), whose command line holds
    # no password; the controller's password logs in, none does not, and the probe is ready
    # with the Secret's and not with another (redis-cli exits 0 on NOAUTH).
    assert cmdline == [b"redis-server", str(here / "redis.conf").encode(), b"-", b""]
    assert logged_in is True
    assert wrong != 0
    assert server.returncode == 0


@pytest.mark.skipif(HELM is None, reason="no helm here: make test fetches one (fetch_helm.py)")
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server here")
def test_the_charts_redis_refuses_to_start_on_an_empty_password(tmp_path: Path) -> None:
    # Arrange: a key holding a line break only (empty to the controller).
    here = _redis_files(tmp_path, free_port(), auth=True)

    # Execute
    started = subprocess.run(
        ["sh", str(here / "start.sh")],
        env={**os.environ, "REDIS_PASSWORD": "\n"},
        capture_output=True,
        text=True,
        timeout=30,
    )

    # Assert: Redis did not start without a password where the chart asks for one.
    assert started.returncode == 1
    assert "redis-password is empty" in started.stderr


@pytest.mark.skipif(HELM is None, reason="no helm here: make test fetches one (fetch_helm.py)")
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server here")
def test_the_charts_redis_without_auth_is_ready_once_it_answers(tmp_path: Path) -> None:
    # Arrange
    port = free_port()
    here = _redis_files(tmp_path, port, auth=False)

    # Execute
    server = subprocess.Popen(["sh", str(here / "start.sh")], cwd=tmp_path)
    try:
        eventually(lambda: _ping(here, port, dict(os.environ)) == 0, timeout_s=30, what="PONG")
        answered = redis.Redis(port=port).ping()
    finally:
        server.terminate()
        server.wait(timeout=30)

    # Assert
    assert answered is True
    assert server.returncode == 0


def _ping(here: Path, port: int, env: dict[str, str]) -> int:
    """The readiness probe's exit status, against ``port``."""
    probe = ["sh", str(here / "ping.sh"), "-p", str(port)]
    return subprocess.run(probe, env=env, capture_output=True, timeout=30).returncode
