"""Writing a file the user named whole or not at all."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def written_whole(path: Path) -> Iterator[BinaryIO]:
    """A file to write ``path``'s bytes into: beside it (``NAME.partial``), renamed to ``path``
    when the block ends, removed if it raises; never half a file under that name. A path that is
    there and is no file (``/dev/null``, a pipe) is opened and written as it is: renamed over,
    ``/dev/null`` became a file holding what was written (as root, for every program)."""
    try:
        special = not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # not there (or not to be looked at: opening it says why)
        special = False
    if special:
        with path.open("wb") as out:
            yield out
        return
    partial = path.with_name(path.name + ".partial")
    try:
        with partial.open("wb") as out:  # a place that cannot be written fails first
            yield out
        partial.replace(path)
    finally:
        with contextlib.suppress(OSError):  # gone, or never made (a name too long)
            partial.unlink()
