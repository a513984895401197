"""Writing a file the user named whole or not at all."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

#: The most of a tag file read (an ETag is a quoted SHA-256).
TAG_BYTES = 256


@contextlib.contextmanager
def written_whole(path: Path) -> Iterator[BinaryIO]:
    """A file to write ``path``'s bytes into: beside it (``NAME.partial``), renamed to ``path``
    when the block ends, removed if it raises; never half a file under that name. A path that is
    there and is no file (``/dev/null``, a pipe) is opened and written as it is: renamed over,
    ``/dev/null`` became a file holding what was written (as root, for every program)."""
    if _special(path):
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


def _special(path: Path) -> bool:
    """Whether ``path`` is there and is no file (a device, a pipe)."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # not there (or not to be looked at: opening it says why)
        return False


class Download:
    """Bytes written to ``out`` as they come (:attr:`written` of them), and the tag of what they
    are of (:attr:`tag`: an ETag)."""

    def __init__(self, out: BinaryIO | None = None) -> None:
        self._out = out
        self.written = 0
        self.tag: str | None = None

    def write(self, data: bytes) -> None:
        assert self._out is not None, "a download is written to only while its file is open"
        self._out.write(data)
        self.written += len(data)

    def tagged(self, tag: str | None) -> None:
        """The bytes written from now on are of ``tag`` (``None``: unknown)."""
        self.tag = tag

    def start_over(self, tag: str | None) -> None:
        """Drop what is written, the bytes from now on being of ``tag``."""
        assert self._out is not None, "a download starts over only while its file is open"
        self._out.seek(0)
        self._out.truncate()
        self.written = 0
        self.tagged(tag)


class Resumable(Download):
    """A download to ``path`` that a run cut short leaves for the next to go on from.

    It is written beside ``path`` (``NAME.partial``) and renamed to it when whole, as
    :func:`written_whole` writes; the tag of what it is written from (an ETag) is kept beside
    that (``NAME.partial.tag``), recorded before the bytes it tags. A block that raises after
    writing tagged bytes keeps both (:attr:`kept`), and the next :meth:`writing` of ``path``
    starts with them (:attr:`written` bytes of :attr:`tag`); one that raises before removes them
    (a refusal before a byte came keeps what a run before had kept). A path that is no file is
    written to as it is, from its start."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self._tag_file = path.with_name(path.name + ".partial.tag")
        self.kept = False
        self._tags = False  # whether tags are kept (not for a pipe or a device)

    @contextlib.contextmanager
    def writing(self) -> Iterator[Resumable]:
        if _special(self.path):
            with self.path.open("wb") as self._out:
                yield self
            return
        self._tags = True
        # Opened without truncating it, for another download of it may be writing it (a second
        # `faasdl model -o` of the same file): refused, before a byte of it is changed.
        descriptor = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not os.path.samestat(os.fstat(descriptor), os.stat(self.partial)):
                raise BlockingIOError  # renamed to its name by the download that held it
        except (BlockingIOError, FileNotFoundError):
            os.close(descriptor)
            busy = f"another download is writing it ({self.partial.name})"
            raise OSError(errno.EBUSY, busy, str(self.path)) from None
        # Appended to where it goes on (start_over still drops it all). Its names are changed
        # while it is held (the tag's first: a download that takes the name next starts clean).
        with os.fdopen(descriptor, "ab") as self._out:
            try:
                self.tag = self._kept_tag()
                self.written = os.fstat(descriptor).st_size if self.tag else 0
                if not self.tag:
                    self._out.truncate(0)
                yield self
                self._tag_file.unlink(missing_ok=True)
                self.partial.replace(self.path)
            except BaseException:
                self.kept = self.written > 0 and self.tag is not None
                if not self.kept:
                    for name in (self._tag_file, self.partial):
                        with contextlib.suppress(OSError):  # gone, or never made
                            name.unlink()
                raise
            finally:
                self._out = None

    def tagged(self, tag: str | None) -> None:
        super().tagged(tag)
        if not self._tags:
            return
        if tag is None:
            with contextlib.suppress(FileNotFoundError):
                self._tag_file.unlink()
        else:
            self._tag_file.write_text(tag)

    def _kept_tag(self) -> str | None:
        """The tag of the bytes a run before kept in the partial file; ``None`` where there are
        none to go on from."""
        try:
            with self._tag_file.open("rb") as kept:
                tag = kept.read(TAG_BYTES).decode("ascii").strip()
            kept_file = stat.S_ISREG(os.stat(self.partial).st_mode)
        except (OSError, UnicodeDecodeError):
            return None
        # A tag goes into a header (If-Range): visible ASCII only (an ETag's), else none.
        return tag if kept_file and re.fullmatch(r"[\x21-\x7e]+", tag) else None
