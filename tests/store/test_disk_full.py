"""Full disks: a write a SQLite store's disk or the upload directory's refuses is ``StoreFull``,
and leaves nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from faasdl.config import ApiSettings, StoreSettings
from faasdl.controller.datasets import store_upload
from faasdl.errors import StoreFull
from faasdl.store import make_store
from faasdl.store.sqlite import SqliteStore


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB file system of its own (tmpfs), mounted for the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (root with CAP_SYS_ADMIN): {mounted.stderr}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.parametrize("spill", [False, True], ids=["chunks", "spill-file"])
def test_a_write_a_full_disk_refuses_is_store_full_and_keeps_nothing(
    small_disk: Path, spill: bool
) -> None:
    # Arrange: a store on the small disk; with spill, blobs over 1 MiB go to a spill file there.
    settings = StoreSettings(
        chunk_bytes=256 * 1024,
        spill_bytes=2**20 if spill else 0,
        spill_dir=str(small_disk / "spill"),
    )
    with make_store(settings, f"sqlite:///{small_disk}/state.db") as store:
        assert isinstance(store, SqliteStore)
        store.put_blob("fits", os.urandom(2**20))  # four chunks: 1 MiB is not over the spill's

        # Execute: a blob the disk has no room for, then the room made again.
        with pytest.raises(StoreFull) as refused:
            store.put_blob("too-large", os.urandom(3 * 2**20))
        chunks = sorted(p.name for p in store.chunk_dir.iterdir())
        spilled = [p for p in (small_disk / "spill").rglob("*") if p.is_file()]
        store.delete_blob("fits")
        store.put_blob("after", os.urandom(2**20))

    # Assert: the refusal says what to do; nothing of the refused write is left (no chunk, no
    # half-written file), and writes go on once there is room.
    assert "the store's disk is full: a write to" in str(refused.value)
    assert "FAASDL_CONTROLLER__JOB_RETENTION_DAYS" in str(refused.value)
    assert len(chunks) == 4
    assert not any(name.endswith(".tmp") for name in chunks)
    assert spilled == []


def test_an_upload_the_disk_has_no_room_for_is_refused_and_leaves_nothing(small_disk: Path) -> None:
    api = ApiSettings(upload_dir=str(small_disk))

    async def body() -> AsyncIterator[bytes]:
        for _ in range(80):  # 5 MiB, as it arrives
            yield bytes(65536)

    with pytest.raises(StoreFull) as refused:
        asyncio.run(store_upload(api, "alice", "big", body()))

    assert "the controller's disk for uploads is full: delete an upload of yours" in str(
        refused.value
    )
    assert list((small_disk / "alice").iterdir()) == []  # not the part that fitted
