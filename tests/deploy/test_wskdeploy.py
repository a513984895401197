"""wskdeploy's manifest of faasdl's actions (openwhisk_actions/manifest.yaml): generated, within
wskdeploy's schema (apache/openwhisk-wskdeploy parsers/yamlparser.go) and the limits OpenWhisk is
given (deploy/openwhisk/values.yaml), and deployed the way wskdeploy deploys it, the very actions
the controller keeps. wskdeploy itself is not run here (no Go toolchain, no OpenWhisk)."""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from typer.testing import CliRunner
from yamllint import linter

from faasdl.actions import MANIFEST, PARAMETERS_DIGEST, action_code, variants
from faasdl.cli import app
from faasdl.config import Settings
from faasdl.store import action_environment
from tests.conftest import Served, reading_pipe
from tests.deploy.test_chart import LINT, values

ROOT = Path(__file__).parents[2]
OPENWHISK_VALUES = ROOT / "deploy" / "openwhisk" / "values.yaml"
# The keys wskdeploy's YAML structs accept (it unmarshals strictly: any other key is an error).
TOP_KEYS = {"project", "packages"}
PACKAGE_KEYS = {
    "name", "version", "license", "public", "repositories", "dependencies", "namespace",
    "credential", "apiHost", "apigwAccessToken", "actions", "triggers", "feeds", "rules",
    "inputs", "sequences", "description", "annotations", "apis",
}  # fmt: skip
ACTION_KEYS = {
    "location", "version", "function", "code", "runtime", "namespace", "credential",
    "exposedUrl", "web-export", "web", "main", "docker", "native", "conductor", "limits",
    "inputs", "outputs", "description", "annotations", "include", "exclude",
}  # fmt: skip
LIMIT_KEYS = {
    "timeout", "memorySize", "logSize", "concurrentActivations", "userInvocationRate",
    "codeSize", "parameterSize",
}  # fmt: skip
#: OpenWhisk's entity names (its REST API's EntityName).
ENTITY_NAME = re.compile(r"\A([\w]|[\w][\w@ .-]*[\w@.-]+)\Z")
runner = CliRunner()


def manifest() -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load((ROOT / MANIFEST).read_text())
    return found


def actions() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = manifest()["packages"]["default"]["actions"]
    return found


def openwhisk_limit(kind: str, bound: str) -> int:
    """A bound of OpenWhisk's action limits from our values for its chart, in MB or ms."""
    text = yaml.safe_load(OPENWHISK_VALUES.read_text())["whisk"]["limits"]["actions"][kind][bound]
    number, unit = re.fullmatch(r"(\d+)(ms|s|m|h)?", text).groups()  # type: ignore[union-attr]
    if kind == "memory":
        return int(number)  # "8192m": megabytes
    return int(number) * {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}[unit]


def test_the_committed_manifest_is_what_faasdl_generates_for_the_charts_image(
    tmp_path: Path,
) -> None:
    out = tmp_path / "manifest.yaml"
    image = values()["openwhisk"]["actionImage"]

    result = runner.invoke(app, ["platform", "manifest", "--image", image, "--output", str(out)])

    assert result.exit_code == 0, result.output
    assert out.read_text() == (ROOT / MANIFEST).read_text(), (
        "regenerate it: faasdl platform manifest --image IMAGE --output " + MANIFEST
    )
    assert not list(tmp_path.glob(".*partial"))


def test_the_manifest_passes_yamllint() -> None:
    problems = list(linter.run((ROOT / MANIFEST).read_text(), LINT))

    assert problems == []


def test_the_manifest_uses_only_keys_wskdeploy_reads_and_limits_openwhisk_allows() -> None:
    found = manifest()
    image = values()["openwhisk"]["actionImage"]

    assert set(found) <= TOP_KEYS
    assert list(found["packages"]) == ["default"]  # the default package: no package path
    assert set(found["packages"]["default"]) <= PACKAGE_KEYS
    for name, action in actions().items():
        assert ENTITY_NAME.match(name), name
        assert len(name) <= 256
        assert set(action) <= ACTION_KEYS, name
        assert set(action["limits"]) <= LIMIT_KEYS, name
        assert action["docker"] == image
        assert (ROOT / MANIFEST).parent.joinpath(action["function"]).is_file()
        memory, timeout = action["limits"]["memorySize"], action["limits"]["timeout"]
        assert openwhisk_limit("memory", "min") <= memory <= openwhisk_limit("memory", "max")
        assert openwhisk_limit("time", "min") <= timeout <= openwhisk_limit("time", "max")
    assert sorted(actions()) == sorted(variant for _, variant, _, _ in variants())


def test_a_bad_class_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    out = tmp_path / "manifest.yaml"

    result = runner.invoke(app, ["platform", "manifest", "--memory-mb", "0", "--output", str(out)])

    assert result.exit_code == 2
    assert "--memory-mb 0" in result.output
    assert not out.exists()


def test_an_output_the_file_system_cannot_name_is_one_line_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    # Its partial file could not be made either: deleting it raised again, a traceback.
    out = tmp_path / ("m" * 300)

    result = runner.invoke(app, ["platform", "manifest", "--output", str(out)])

    assert result.exit_code == 2, result.output
    assert "File name too long" in " ".join(result.output.split())
    assert not list(tmp_path.iterdir())


def test_an_output_that_is_a_pipe_is_written_not_renamed_over(tmp_path: Path) -> None:
    # Renamed over, `--output /dev/null` made /dev/null a file holding the manifest.
    plain = tmp_path / "manifest.yaml"
    with reading_pipe(tmp_path / "pipe") as (pipe, received):
        piped = runner.invoke(app, ["platform", "manifest", "--output", str(pipe)])
    written = runner.invoke(app, ["platform", "manifest", "--output", str(plain)])

    assert piped.exit_code == written.exit_code == 0, piped.output
    assert received == [plain.read_bytes()]
    assert stat.S_ISFIFO(pipe.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.yaml", "pipe"]


def test_actions_deployed_as_wskdeploy_does_are_faasdls_once_given_the_stores_settings(
    monkeypatch: pytest.MonkeyPatch, make_served: Callable[..., Served]
) -> None:
    # Arrange: a platform with the manifest's image and room for its largest classes.
    image = values()["openwhisk"]["actionImage"]
    served = make_served(
        images=[image], pool_memory_mb=4096, memory_max_mb=2048, timeout_max_ms=300_000
    )
    user, _, key = served.server_settings.auth.get_secret_value().partition(":")

    # Execute: what wskdeploy sends for each action (parsers/manifest_parser.go: a `docker` image
    # makes a blackbox action, the `function` file its code), then faasdl's own deploy.
    for name, action in actions().items():
        code = (ROOT / MANIFEST).parent.joinpath(action["function"]).read_text()
        body = {
            "exec": {"kind": "blackbox", "image": action["docker"], "code": code},
            "limits": {
                "memory": action["limits"]["memorySize"],
                "timeout": action["limits"]["timeout"],
            },
        }
        response = requests.put(
            f"{served.url}/api/v1/namespaces/_/actions/{name}",
            json=body,
            auth=(user, key),
            timeout=10,
        )
        assert response.status_code == 200, response.text
    # What faasdl's deploy may set: its parameters, and a digest of them among the annotations.
    changeable = {"version", "updated", "parameters", "annotations"}
    deployed = {a.name: a.model_dump(exclude=changeable) for a in served.local.list_actions()}
    noted = {a.name: a.annotations for a in served.local.list_actions()}
    monkeypatch.setenv("FAASDL_PLATFORM", "openwhisk")
    monkeypatch.setenv("FAASDL_OPENWHISK__API_HOST", served.url)
    monkeypatch.setenv("FAASDL_OPENWHISK__ACTION_IMAGE", image)
    result = runner.invoke(app, ["platform", "deploy"])
    kept = {a.name: a.version for a in served.local.list_actions()}
    again = runner.invoke(app, ["platform", "deploy"])

    # Assert: faasdl found every variant as it wants it but for the store's settings, which a
    # manifest cannot hold (init parameters): it set them, and then left the variants alone.
    assert result.exit_code == 0, result.output
    assert again.exit_code == 0, again.output
    assert len(deployed) == len(actions())
    for base, variant, _, _ in variants():
        assert served.local.get_action(variant, code=True).exec.code == action_code(base)
        redeployed = served.local.get_action(variant)
        assert redeployed.model_dump(exclude=changeable) == deployed[variant]
        assert [a for a in redeployed.annotations if a.key != PARAMETERS_DIGEST] == noted[variant]
        assert {p.key: p.value for p in redeployed.parameters if p.init} == action_environment(
            Settings().store
        )
    assert {a.name: a.version for a in served.local.list_actions()} == kept
    assert json.loads(again.output.splitlines()[-1])["deployed"] == []
