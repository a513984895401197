"""Static checks of the images' Dockerfiles (deploy/docker): no Docker engine runs here, so they
are never built here; what can be checked without one is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCKERFILES = sorted((ROOT / "deploy" / "docker").glob("*.Dockerfile"))


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_there_are_a_controller_and_an_action_image() -> None:
    assert [p.name for p in DOCKERFILES] == ["action.Dockerfile", "controller.Dockerfile"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_base_images_and_packages_are_pinned(path: Path) -> None:
    steps = instructions(path)
    bases = [args for word, args in steps if word == "FROM"]
    tensorflow = [args for word, args in steps if word == "ARG" and args.startswith("TENSORFLOW")]

    assert bases
    tags = [base.partition(" ")[0].partition(":")[2] for base in bases]
    assert all(tags), bases
    assert not {"latest", "nightly"} & set(tags)
    assert all("==" in t for t in tensorflow)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_images_run_as_a_non_root_user(path: Path) -> None:
    users = [args for word, args in instructions(path) if word == "USER"]

    assert users, "no USER: the image would run as root"
    assert users[-1] not in ("root", "0")


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_everything_copied_is_in_the_repository_and_not_ignored(path: Path) -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    sources = [
        source
        for word, args in instructions(path)
        if word == "COPY"
        for source in args.split()[:-1]
        if not source.startswith("--")
    ]

    assert sources
    assert [s for s in sources if not (ROOT / s).exists()] == []
    assert [s for s in sources if s in ignored] == []


def test_the_controller_image_has_no_tensorflow_and_serves() -> None:
    steps = instructions(ROOT / "deploy" / "docker" / "controller.Dockerfile")
    installs = " ".join(args for word, args in steps if word == "RUN")

    assert "tensorflow" not in installs
    assert "[train" not in installs
    assert ("ENTRYPOINT", '["faasdl"]') in steps
    assert ("CMD", '["serve"]') in steps
