"""What an embedded platform leaves when it is killed before it can close: its containers' working
directories and its memory cgroups. Each is named ``faasdl-PID-TAG`` after the process that made
it, and the next embedded platform to open removes those whose process is gone, as a container
engine removes a dead container's files when it starts again."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

_NAME = re.compile(r"faasdl-(\d+)-[0-9a-f]{6}")


def new_tag() -> str:
    """The ``PID-TAG`` part of the names one platform gives what it makes."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:6]}"


def workdir_root(tag: str) -> Path:
    """The directory that holds the working directories of a platform's containers."""
    return Path(tempfile.gettempdir()) / f"faasdl-{tag}"


def owner_gone(path: Path) -> bool:
    """Whether ``path`` is named after a process that no longer runs. A process that reuses the
    number started after the owner died, so after ``path`` last changed."""
    match = _NAME.fullmatch(path.name)
    if match is None:
        return False
    try:
        started = psutil.Process(int(match[1])).create_time()
        return started > path.stat().st_mtime
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, OSError):
        return False  # cannot tell: keep it


def remove_leftovers(cgroup_roots: tuple[Path, ...]) -> None:
    """Remove the working directories and memory cgroups (under ``cgroup_roots``) of platforms
    whose process is gone. A cgroup that still holds a process (one of its containers, which
    exits within a second of its platform) stays for the next platform."""
    for path in Path(tempfile.gettempdir()).glob("faasdl-*"):
        if path.is_dir() and owner_gone(path):
            log.info("removing %s, left by an embedded platform that was killed", path)
            shutil.rmtree(path, ignore_errors=True)
    for root in cgroup_roots:
        for base in root.glob("faasdl-*") if root.is_dir() else ():
            if not owner_gone(base):
                continue
            log.info("removing the memory cgroup %s, left by an embedded platform", base)
            for child in base.iterdir():
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                base.rmdir()
