"""What an embedded platform leaves when it is killed before it can close: its containers' working
directories and its memory cgroups. A platform keeps its containers' directories in one of its own,
``faasdl-TAG`` in the temporary directory, locked for as long as its process lives, and names its
memory cgroups after the same tag. The next platform to open or close removes what a platform whose
lock is free left, as a container engine removes a dead container's files when it starts again."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

_NAME = re.compile(r"faasdl-\d+-[0-9a-f]{6}")
_LOCK = ".lock"


def new_tag() -> str:
    """A platform's tag: its process's id (for a reader) and a random part."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:6]}"


class PlatformDir:
    """The directory that holds a platform's containers' working directories. It appears under its
    name already locked, so another platform never finds it unlocked while its owner lives."""

    def __init__(self, tag: str) -> None:
        making = Path(tempfile.mkdtemp(prefix=f"faasdl-{tag}."))
        self._lock = os.open(making / _LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        self.path = making.with_name(f"faasdl-{tag}")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            making.rename(self.path)
        except BaseException:
            os.close(self._lock)
            shutil.rmtree(making, ignore_errors=True)
            raise

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)


def _remove_cgroup(base: Path) -> bool:
    for child in base.iterdir():
        if child.is_dir():
            with contextlib.suppress(OSError):
                child.rmdir()  # refused while a process is in it
    with contextlib.suppress(OSError):
        base.rmdir()
    return not base.exists()


def remove_leftovers(cgroup_roots: tuple[Path, ...]) -> None:
    """Remove what platforms whose process is gone left: their memory cgroups (under
    ``cgroup_roots``), then their directories. A cgroup that still holds a process (a container,
    which exits within a second of its platform) keeps both for the next platform to try."""
    for path in Path(tempfile.gettempdir()).glob("faasdl-*"):
        if not _NAME.fullmatch(path.name):
            continue
        try:
            lock = os.open(path / _LOCK, os.O_RDWR)
        except OSError:
            continue  # being removed
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            continue  # its platform runs
        try:
            cgroups = [root / path.name for root in cgroup_roots if (root / path.name).is_dir()]
            removed = [_remove_cgroup(base) for base in cgroups]  # each tried
            if all(removed):
                log.info("removed %s and its memory cgroups, left by a killed platform", path)
                shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(lock)
