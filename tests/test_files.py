"""Files written whole or not at all, and downloads kept to go on from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from faasdl.files import Resumable


def write(path: Path, parts: list[bytes], tag: str | None, stop: BaseException | None) -> Resumable:
    """A download to ``path`` of ``parts`` tagged ``tag``, stopped by ``stop`` after them."""
    into = Resumable(path)
    with into.writing():
        if into.tag is None:  # nothing kept: as the client tags the first answer
            into.tagged(tag)
        elif into.tag != tag:  # kept of another: as the client starts over
            into.start_over(tag)
        for part in parts:
            into.write(part)
        if stop is not None:
            raise stop
    return into


def test_a_download_stopped_after_tagged_bytes_keeps_them_for_the_next_to_go_on_from(
    tmp_path: Path,
) -> None:
    # Arrange
    out = tmp_path / "model.bin"

    # Execute: Ctrl-C after two parts; the next goes on, of the same tag, and ends whole.
    with pytest.raises(KeyboardInterrupt):
        write(out, [b"ab", b"cd"], '"etag-1"', KeyboardInterrupt())
    kept = sorted(p.name for p in tmp_path.iterdir())
    again = Resumable(out)
    with again.writing():
        went_on_from = (again.written, again.tag)
        again.write(b"ef")

    # Assert
    assert kept == ["model.bin.partial", "model.bin.partial.tag"]
    assert went_on_from == (4, '"etag-1"')
    assert out.read_bytes() == b"abcdef"
    assert sorted(tmp_path.iterdir()) == [out]


@pytest.mark.parametrize(
    "tag", ['"etag"\r\nX-Other: 1', "", "é"], ids=["two lines", "empty", "not ascii"]
)
def test_a_kept_tag_that_is_no_etag_is_not_gone_on_from(tmp_path: Path, tag: str) -> None:
    # Arrange: a part kept with a tag file that is not one (an If-Range header of two lines
    # made requests raise InvalidHeader).
    out = tmp_path / "model.bin"
    (tmp_path / "model.bin.partial").write_bytes(b"abc")
    (tmp_path / "model.bin.partial.tag").write_text(tag)

    # Execute
    into = Resumable(out)
    with into.writing():
        went_on_from = (into.written, into.tag)
        into.write(b"whole")

    # Assert: written from its start, nothing kept beside it.
    assert went_on_from == (0, None)
    assert out.read_bytes() == b"whole"
    assert sorted(tmp_path.iterdir()) == [out]


@pytest.mark.parametrize(
    ("parts", "tag"),
    [([], '"etag-1"'), ([b"ab"], None)],
    ids=["no bytes", "no tag"],
)
def test_a_download_stopped_with_nothing_to_go_on_from_leaves_nothing(
    tmp_path: Path, parts: list[bytes], tag: str | None
) -> None:
    # Execute
    with pytest.raises(ConnectionError):
        write(tmp_path / "model.bin", parts, tag, ConnectionError("cut"))

    # Assert
    assert not any(tmp_path.iterdir())


def test_a_kept_part_of_another_tag_is_dropped_and_a_pipe_is_written_as_it_is(
    tmp_path: Path,
) -> None:
    # Arrange: a part kept of tag 1; a FIFO with a reader.
    out, fifo = tmp_path / "model.bin", tmp_path / "fifo"
    with pytest.raises(ConnectionError):
        write(out, [b"old"], '"etag-1"', ConnectionError("cut"))
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)

    # Execute
    write(out, [b"new"], '"etag-2"', None)
    try:
        piped = write(fifo, [b"xyz"], '"etag-3"', None)
        received = os.read(reader, 10)
    finally:
        os.close(reader)

    # Assert: tag 2's bytes alone; the pipe's without a part or a tag beside it.
    assert out.read_bytes() == b"new"
    assert (piped.written, received) == (3, b"xyz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "model.bin"]


def test_a_second_download_to_a_file_being_written_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    # Arrange: a download under way (two `faasdl model -o` of one file: the second truncated
    # the first's part, or appended to it, and the file renamed was neither model).
    out = tmp_path / "model.bin"
    first = Resumable(out)

    # Execute
    with first.writing():
        first.tagged('"etag-1"')
        first.write(b"ab")
        second = Resumable(out)
        busy = r"another download is writing it \(model.bin.partial\)"
        with pytest.raises(OSError, match=busy), second.writing():
            pass
        first.write(b"cd")

    # Assert: the first's whole, and nothing beside it.
    assert out.read_bytes() == b"abcd"
    assert sorted(tmp_path.iterdir()) == [out]
