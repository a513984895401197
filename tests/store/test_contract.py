"""The StateStore contract, run against SQLite and a real redis-server in every run, and against
Ignite wherever FAASDL_TEST_IGNITE_URL is set (the ``store_url`` fixture)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from faasdl.errors import BlobCorrupted, BlobNotFound, StoreError, ValidationError
from faasdl.store import StateStore
from faasdl.store.base import MANIFEST_PREFIX, Streamed
from faasdl.store.records import FunctionInfo, JobInfo, create, fn_key, load, replace
from tests.conftest import write_and_die
from tests.store.conftest import StoreFactory


def test_versioned_records(store: StateStore) -> None:
    assert store.get("job/a") is None
    assert store.put_if_absent("job/a", {"n": 1})
    assert not store.put_if_absent("job/a", {"n": 2})
    assert store.get("job/a").value == {"n": 1}  # type: ignore[union-attr]
    assert store.compare_and_set("job/a", 1, {"n": 3})
    assert not store.compare_and_set("job/a", 1, {"n": 4})  # a stale version loses
    assert not store.compare_and_set("job/missing", 1, {"n": 4})
    assert store.put("job/a", {"n": 5}) == 3
    assert store.get("job/a").version == 3  # type: ignore[union-attr]
    assert not store.delete("job/a", expected_version=2)
    assert store.delete("job/a", expected_version=3)
    assert not store.delete("job/a")
    assert store.put("job/b", [1, "two", None]) == 1


def test_eight_processes_of_cas_increments_lose_nothing(store_url: str, store: StateStore) -> None:
    # Prepare
    store.put_if_absent("counter", {"n": 0})
    worker = """
        import sys
        from faasdl.config import StoreSettings
        from faasdl.store import make_store
        with make_store(StoreSettings(), sys.argv[1]) as store:
            done = 0
            while done < 500:
                current = store.get("counter")
                if store.compare_and_set("counter", current.version, {"n": current.value["n"] + 1}):
                    done += 1
    """

    # Execute
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(worker), store_url])
        for _ in range(8)
    ]
    codes = [p.wait(timeout=600) for p in procs]

    # Assert
    assert codes == [0] * 8
    final = store.get("counter")
    assert final is not None
    assert final.value == {"n": 4000}
    assert final.version == 4001


def test_racing_put_if_absent_has_exactly_one_winner(make_store_for: StoreFactory) -> None:
    stores = [make_store_for() for _ in range(16)]
    barrier = threading.Barrier(len(stores))
    wins: list[int] = []

    def race(i: int) -> None:
        barrier.wait()
        if stores[i].put_if_absent("fn/race", {"winner": i}):
            wins.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert len(wins) == 1
    assert stores[0].get("fn/race").value == {"winner": wins[0]}  # type: ignore[union-attr]


def test_scan_returns_every_key_of_a_prefix_exactly_once(store: StateStore) -> None:
    for i in range(250):
        store.put(f"job/{i:04d}", {"i": i})
    store.put("jobs-elsewhere", {})
    store.put("fn/x", {})
    store.put("job*/glob", {"not": "matched by job/"})

    found = store.scan("job/")

    assert [k for k, _ in found] == [f"job/{i:04d}" for i in range(250)]
    assert [v.value["i"] for _, v in found] == list(range(250))
    assert [k for k, _ in store.scan("job*")] == ["job*/glob"]


def test_scan_follows_deletes_and_non_ascii_keys(store: StateStore) -> None:
    store.put("ledger/é/1", {"n": 1})
    store.put("ledger/é/2", {"n": 2})
    store.put("ledger/é\U0010ffff", {"n": 3})  # the largest code point, still under the prefix
    store.put("ledger/f/1", {"n": 4})
    assert store.put_if_absent("ledger/é/3", {"n": 5})
    versioned = store.get("ledger/é/2")
    assert versioned is not None

    assert store.delete("ledger/é/1")
    assert store.delete("ledger/é/2", versioned.version)

    assert [k for k, _ in store.scan("ledger/é")] == ["ledger/é/3", "ledger/é\U0010ffff"]
    assert [k for k, _ in store.scan("ledger/")] == [
        "ledger/f/1",
        "ledger/é/3",
        "ledger/é\U0010ffff",
    ]


def test_a_scan_from_a_key_has_the_prefix_s_records_from_that_key_on(store: StateStore) -> None:
    # Arrange: a job's lines under their rounds (over the Redis backend's batch of 500), a key
    # after the rounds', a non-ASCII one, and neighbours under other prefixes.
    for i in range(620):
        store.put(f"ledger/j/{i:05d}/a", {"i": i})
    store.put("ledger/j/zz", {"i": -1})
    store.put("ledger/j/é", {"i": -2})
    store.put("ledger/i/99999/a", {})
    store.put("ledger/k/00000/a", {})

    # Execute
    found = store.scan("ledger/j/", from_key="ledger/j/00600/")

    # Assert
    rest = [f"ledger/j/{i:05d}/a" for i in range(600, 620)] + ["ledger/j/zz", "ledger/j/é"]
    assert [k for k, _ in found] == rest
    assert [v.value["i"] for _, v in found] == [*range(600, 620), -1, -2]
    assert store.scan_raw("ledger/j/", from_key="ledger/j/00600/") == [
        (k, v) for k, v in store.scan_raw("ledger/j/") if k in rest
    ]
    assert [k for k, _ in store.scan("ledger/j/", from_key="ledger/j/zz")] == rest[-2:]
    assert [k for k, _ in store.scan("ledger/j/", from_key="ledger/j/z")] == rest[-2:]
    assert [k for k, _ in store.scan("ledger/j/", from_key="ledger/j/é")] == rest[-1:]
    # A key before the prefix's reads it whole, one after its none.
    assert store.scan("ledger/j/", from_key="ledger/") == store.scan("ledger/j/")
    assert store.scan("ledger/j/", from_key="ledger/k/") == []


def test_a_scan_of_versions_has_the_keys_and_versions_a_scan_of_records_has(
    store: StateStore,
) -> None:
    # Arrange: records written once, changed, deleted, and under other prefixes.
    for i in range(600):  # over the Redis backend's batch of 500
        store.put(f"job/{i:04d}", {"i": i})
    for i in range(0, 600, 3):
        current = store.get(f"job/{i:04d}")
        assert current is not None
        assert store.compare_and_set(f"job/{i:04d}", current.version, {"i": -i})
    for i in range(0, 600, 7):
        assert store.delete(f"job/{i:04d}")
    store.put("jobs-elsewhere", {})
    store.put("job*/glob", {})

    # Execute
    versions = store.scan_versions("job/")

    # Assert
    assert versions == [(key, found.version) for key, found in store.scan_raw("job/")]
    assert len(versions) == 600 - len(range(0, 600, 7))
    assert dict(versions)["job/0003"] == dict(versions)["job/0001"] + 1  # changed once


def test_blob_round_trip_and_replace(make_store_for: StoreFactory) -> None:
    store = make_store_for(chunk_bytes=64 * 1024)
    first = bytes(range(256)) * 1000  # 256 000 bytes: 4 chunks
    second = b"\x07" * 70_000

    manifest = store.put_blob("ckpt/a", first)
    assert store.get_blob("ckpt/a") == first
    store.put_blob("ckpt/a", second)

    assert len(manifest.chunk_sha256) == 4
    assert store.get_blob("ckpt/a") == second
    assert store.collect_garbage(grace_s=0) == 0  # the first blob's chunks went with the replace
    assert store.delete_blob("ckpt/a")
    assert not store.delete_blob("ckpt/a")
    with pytest.raises(BlobNotFound):
        store.get_blob("ckpt/a")


def test_a_store_without_a_spill_tier_keeps_every_blob_in_chunks(
    make_store_for: StoreFactory, tmp_path: Path
) -> None:
    # FAASDL_STORE__SPILL_BYTES=0, as on Kubernetes, where no directory is shared.
    store = make_store_for(chunk_bytes=64 * 1024, spill_bytes=0)
    data = os.urandom(3 * 2**20)

    manifest = store.put_blob("jobs/x/global/00001", data)

    assert manifest.spill_path is None
    assert len(manifest.chunk_sha256) == 48
    assert store.get_blob("jobs/x/global/00001") == data
    assert not (tmp_path / "spill").exists()


@pytest.mark.parametrize("spill_bytes", [256 * 1024 * 1024, 10_000])
def test_a_blob_written_from_pieces_reads_back_as_their_join(
    make_store_for: StoreFactory, spill_bytes: int
) -> None:
    store = make_store_for(chunk_bytes=1024, spill_bytes=spill_bytes)
    array = np.arange(5000, dtype=np.float32)  # 20 000 bytes: chunks within it are views of it
    pieces = (b"head", b"", array.data, memoryview(bytes(range(256)) * 20)[1:], bytearray(b"x"))
    expected = b"".join(bytes(memoryview(p).cast("B")) for p in pieces)  # 25 124 bytes

    manifest = store.put_blob("ckpt/p", pieces)

    assert manifest.size == len(expected)
    if manifest.spill_path is None:  # chunks across the pieces' ends, in four backend writes
        assert len(manifest.chunk_sha256) == 25
    back = store.get_blob("ckpt/p")
    assert back == expected
    assert len(store.get_blob("ckpt/p")) == manifest.size


@pytest.mark.parametrize("spill_bytes", [256 * 1024 * 1024, 1000])
def test_a_streamed_blob_is_made_as_it_is_written_and_refused_whole_when_its_size_is_not_said(
    make_store_for: StoreFactory, spill_bytes: int
) -> None:
    # 20 chunks (written 8 at a time: two writes before a wrong size is seen), or a spill file.
    store = make_store_for(chunk_bytes=1024, spill_bytes=spill_bytes)
    made: list[int] = []

    def pieces(count: int) -> Iterator[bytes]:
        for i in range(count):
            made.append(i)
            yield bytes([i]) * 2000

    expected = b"".join(bytes([i]) * 2000 for i in range(10))

    streamed = Streamed(size=20_000, pieces=pieces(10))
    assert made == []  # nothing made before the write reads it
    manifest = store.put_blob("ckpt/s", streamed)

    assert made == list(range(10))
    assert manifest.size == 20_000
    assert store.get_blob("ckpt/s") == expected
    for count, said in (
        (9, "came to 18000 bytes, not the 20000"),
        (11, "more than the 20000 bytes"),
    ):
        with pytest.raises(ValidationError, match=f"{said} declared") as caught:
            store.put_blob("ckpt/s", Streamed(size=20_000, pieces=pieces(count)))
        assert caught.value.field == "data"
        assert store.get_blob("ckpt/s") == expected  # the blob as it was
        assert store.collect_garbage(grace_s=0) == 0  # and nothing of the refused write left


@pytest.mark.parametrize("spill_bytes", [256 * 1024 * 1024, 10_000])
def test_a_blob_not_forced_to_disk_reads_back_whole(
    make_store_for: StoreFactory, spill_bytes: int
) -> None:
    store = make_store_for(chunk_bytes=16 * 1024, spill_bytes=spill_bytes)
    data = bytes(range(256)) * 200  # 51 200 bytes: 4 chunks, or a spill file

    store.put_blob("ckpt/n", b"old", durable=False)
    manifest = store.put_blob("ckpt/n", data, durable=False)

    assert (manifest.spill_path is not None) == (spill_bytes < len(data))
    assert store.get_blob("ckpt/n") == data
    assert store.collect_garbage(grace_s=0) == 0  # the replaced blob went, as with any write


@pytest.mark.parametrize("spill_bytes", [256 * 1024 * 1024, 10_000])
def test_sqlite_forces_a_blob_to_disk_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spill_bytes: int
) -> None:
    from faasdl.store.sqlite import SqliteStore

    store = SqliteStore(
        path=tmp_path / "state.db",
        chunk_bytes=16 * 1024,
        spill_bytes=spill_bytes,
        spill_dir=tmp_path / "spill",
    )
    store.open()
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # the real call, recorded
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    data = bytes(range(256)) * 200  # 4 chunks of 16 KiB, or one spill file

    store.put_blob("ckpt/d", data)
    durable = len(synced)
    store.put_blob("ckpt/e", data, durable=False)

    assert durable >= (1 if spill_bytes < len(data) else 4)  # each chunk, or the spill file
    # The folder the chunks (or the spill file) were made in: else a crash can lose them.
    top = tmp_path / "spill" if spill_bytes < len(data) else store.chunk_dir
    assert str(top) in synced
    assert len(synced) == durable  # none for the blob that may be lost in a machine crash
    assert store.get_blob("ckpt/e") == data


def test_sqlite_keeps_chunks_in_one_folder_and_nothing_of_deleted_blobs(tmp_path: Path) -> None:
    from faasdl.store.sqlite import SqliteStore

    store = SqliteStore(path=tmp_path / "state.db", chunk_bytes=1024)
    store.open()
    for i in range(3):  # checkpoints: a blob of a new name each, the one before deleted
        store.put_blob(f"ckpt/u/a{i}", os.urandom(3000))
        if i:
            store.delete_blob(f"ckpt/u/a{i - 1}")
    store.put_blob("ckpt/u/a2", b"replaced")  # a new write of a name: the old write's chunks go
    kept = [(p.parent, p.is_file()) for p in store.chunk_dir.rglob("*")]

    store.delete_blob("ckpt/u/a2")

    assert kept == [(store.chunk_dir, True)]  # the one chunk, no folder
    assert list(store.chunk_dir.iterdir()) == []


def test_a_blob_write_killed_before_its_manifest_is_invisible_and_collected(
    store_url: str, make_store_for: StoreFactory, tmp_path: object
) -> None:
    # Prepare: an existing blob, then a writer that dies (SIGKILL) after its chunks are durable
    # and before it publishes the manifest.
    store = make_store_for(chunk_bytes=16 * 1024)
    store.put_blob("ckpt/b", b"old" * 10_000)

    # Execute
    write_and_die(store_url, "ckpt/b", b"new" * 50_000, chunk_bytes=16 * 1024)

    # Assert: readers still see the old blob whole, and the new write's chunks are garbage that
    # collection removes.
    assert store.get_blob("ckpt/b") == b"old" * 10_000
    assert store.collect_garbage(grace_s=3600) == 0  # too young: could be a write in flight
    assert store.collect_garbage(grace_s=0) == 10  # 150 000 bytes in 16 KiB chunks
    assert store.get_blob("ckpt/b") == b"old" * 10_000


def test_a_corrupted_chunk_is_detected_not_returned(make_store_for: StoreFactory) -> None:
    store = make_store_for(chunk_bytes=4096)
    store.put_blob("ckpt/c", b"a" * 20_000)
    manifest = store.blob_manifest("ckpt/c")
    assert manifest is not None
    # Damage chunk 2 in place, as a disk or a bad write would.
    store._write_chunks([(store._chunk_key("ckpt/c", manifest.write_id, 2), b"b" * 4096)])

    with pytest.raises(BlobCorrupted, match="chunk 2 does not match its checksum"):
        store.get_blob("ckpt/c")


def read_to_damage(pieces: Iterator[bytes]) -> tuple[int, str, BlobCorrupted]:
    """How many bytes were read, and their SHA-256, until the ``BlobCorrupted`` that ends them."""
    digest, sent = hashlib.sha256(), 0
    try:
        for piece in pieces:
            digest.update(piece)
            sent += len(piece)
    except BlobCorrupted as exc:
        return sent, digest.hexdigest(), exc
    raise AssertionError(f"all {sent} bytes were read: the damage was not found")


def test_a_blob_is_read_a_checked_chunk_at_a_time_never_held_whole(
    make_store_for: StoreFactory,
) -> None:
    store = make_store_for(chunk_bytes=64 * 1024)
    data = os.urandom(4 * 1024 * 1024)
    written = store.put_blob("model/m", data)
    store._write_chunks([(store._chunk_key("model/m", written.write_id, 40), b"x" * 65536)])

    tracemalloc.start()
    try:
        manifest, pieces = store.read_blob("model/m")
        sent, digest, damage = read_to_damage(pieces)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert manifest.size == len(data)
    assert "chunk 40 does not match its checksum" in str(damage)
    assert sent == 40 * 65536  # the good chunks before it, and nothing of it
    assert digest == hashlib.sha256(data[:sent]).hexdigest()
    assert peak < 1024 * 1024  # a few chunks (a client's buffers), not 2.5 MiB read or 4 whole


def test_a_spill_file_that_fails_its_checksum_is_read_short_of_its_last_piece(
    make_store_for: StoreFactory,
) -> None:
    store = make_store_for(chunk_bytes=4096, spill_bytes=10_000)
    manifest = store.put_blob("model/big", bytes(range(256)) * 200)  # 51 200 bytes
    assert manifest.spill_path is not None
    damaged = bytearray(Path(manifest.spill_path).read_bytes())
    damaged[-1] ^= 0xFF
    Path(manifest.spill_path).write_bytes(damaged)

    sent, digest, damage = read_to_damage(store.read_blob("model/big")[1])

    assert "the spill file does not match its checksum" in str(damage)
    assert sent == 12 * 4096  # all but the last piece, held back until the whole is checked
    assert digest == hashlib.sha256(damaged[:sent]).hexdigest()


@pytest.mark.parametrize("spill_bytes", [1 << 20, 10_000], ids=["chunks", "spill"])
def test_a_part_of_a_blob_is_read_from_its_offset_to_its_end(
    make_store_for: StoreFactory, spill_bytes: int
) -> None:
    # Arrange: five chunks and a hundred bytes (a download resumed reads from an offset on).
    store = make_store_for(chunk_bytes=4096, spill_bytes=spill_bytes)
    data = os.urandom(5 * 4096 + 100)
    store.put_blob("model/m", data)
    size = len(data)
    parts = [(0, None), (1, None), (4095, None), (4096, None), (4097, 3 * 4096 + 1), (10, 20)]
    parts += [(4090, 4100), (size - 1, None), (size, None), (0, 0), (5000, 5000), (0, size)]

    # Execute
    read = {part: b"".join(store.read_blob("model/m", *part)[1]) for part in parts}

    # Assert: each part's bytes; one outside the blob refused before a byte is read.
    for (start, end), got in read.items():
        assert got == data[start:end], (start, end)
    for start, end in [(-1, None), (size + 1, None), (10, 5), (0, size + 1)]:
        with pytest.raises(ValueError, match=f"outside blob 'model/m'.s {size} bytes"):
            store.read_blob("model/m", start, end)


def test_a_part_of_a_blob_reads_its_own_chunks_only_each_checked(
    make_store_for: StoreFactory,
) -> None:
    # Arrange: chunks 0 and 4 of six damaged.
    store = make_store_for(chunk_bytes=4096)
    data = os.urandom(5 * 4096 + 100)
    written = store.put_blob("model/m", data)
    for i in (0, 4):
        store._write_chunks([(store._chunk_key("model/m", written.write_id, i), b"x" * 4096)])

    # Execute
    middle = b"".join(store.read_blob("model/m", 4096, 4 * 4096)[1])
    sent, digest, damage = read_to_damage(store.read_blob("model/m", 3 * 4096 + 5)[1])

    # Assert: the chunks between them read and sent; a part reaching chunk 4 ends before it.
    assert middle == data[4096 : 4 * 4096]
    assert "chunk 4 does not match its checksum" in str(damage)
    assert sent == 4096 - 5
    assert digest == hashlib.sha256(data[3 * 4096 + 5 : 4 * 4096]).hexdigest()


def test_a_part_of_a_damaged_spill_file_is_read_short_of_its_last_piece(
    make_store_for: StoreFactory,
) -> None:
    # Arrange: a spill file damaged past the part read (its checksum is over it all).
    store = make_store_for(chunk_bytes=4096, spill_bytes=10_000)
    data = bytes(range(256)) * 200  # 51 200 bytes
    manifest = store.put_blob("model/big", data)
    assert manifest.spill_path is not None
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF
    Path(manifest.spill_path).write_bytes(damaged)

    # Execute
    sent, digest, damage = read_to_damage(store.read_blob("model/big", 100, 3 * 4096 + 7)[1])

    # Assert: the part's pieces but its last, held back until the whole was checked.
    assert "the spill file does not match its checksum" in str(damage)
    assert sent == 3 * 4096 - 100
    assert digest == hashlib.sha256(data[100 : 3 * 4096]).hexdigest()


@pytest.mark.parametrize("spill_bytes", [1 << 20, 10_000], ids=["chunks", "spill"])
def test_a_blob_is_copied_a_chunk_at_a_time_and_a_damaged_one_is_not_copied(
    make_store_for: StoreFactory, spill_bytes: int
) -> None:
    store = make_store_for(chunk_bytes=4096, spill_bytes=spill_bytes)
    data = os.urandom(40_000)
    source = store.put_blob("model/trainer", data)
    store.put_blob("model/global", b"before")

    copied = store.copy_blob("model/trainer", "model/global")
    store.put_blob("model/damaged", data)
    manifest = store.blob_manifest("model/damaged")
    assert manifest is not None
    damaged = bytes(b ^ 0xFF for b in data[:4096])  # every byte changed
    if manifest.spill_path is None:
        store._write_chunks([(store._chunk_key("model/damaged", manifest.write_id, 5), damaged)])
    else:
        Path(manifest.spill_path).write_bytes(data[:-4096] + damaged)
    with pytest.raises(BlobCorrupted):
        store.copy_blob("model/damaged", "model/global")

    assert (copied.spill_path is None) == (spill_bytes > len(data))
    assert copied.write_id != source.write_id
    assert copied.size == len(data)
    assert store.get_blob("model/global") == data  # the copy, and not the damaged blob
    assert store.get_blob("model/trainer") == data  # the source as it was


def test_a_blob_over_the_value_limit_goes_through_the_spill_tier(
    make_store_for: StoreFactory,
) -> None:
    store = make_store_for(spill_bytes=10_000)
    data = bytes(range(256)) * 200  # 51 200 bytes

    manifest = store.put_blob("ckpt/big", data)

    assert manifest.spill_path is not None
    assert store.get_blob("ckpt/big") == data
    assert store.get(MANIFEST_PREFIX + "ckpt/big") is not None  # only the location is stored
    assert store.delete_blob("ckpt/big")
    from pathlib import Path

    assert not Path(manifest.spill_path).exists()


def test_a_shortened_spill_file_is_detected_not_returned(make_store_for: StoreFactory) -> None:
    store = make_store_for(spill_bytes=10_000)
    manifest = store.put_blob("ckpt/big", bytes(range(256)) * 200)
    assert manifest.spill_path is not None
    Path(manifest.spill_path).write_bytes(bytes(range(256)) * 199)

    with pytest.raises(BlobCorrupted, match="does not have its 51200 bytes"):
        store.get_blob("ckpt/big")


def test_typed_records(store: StateStore) -> None:
    unit = FunctionInfo(job_id="j1", round=0, shard=3)

    assert create(store, unit)
    assert not create(store, unit)
    loaded, version = load(store, fn_key("j1", 0, 3), FunctionInfo)  # type: ignore[misc]
    fenced = loaded.model_copy(update={"owner_epoch": 1})
    assert replace(store, fenced, version)
    assert not replace(store, fenced, version)  # a zombie holding the old version loses
    assert load(store, fenced.key(), FunctionInfo)[0].owner_epoch == 1  # type: ignore[index]
    store.put("job/broken", {"job_id": 5, "surprise": True})
    with pytest.raises(StoreError, match="'job/broken' is not a valid JobInfo"):
        load(store, "job/broken", JobInfo)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.put("", 1), "key"),
        (lambda s: s.put("a\x00b", 1), "key"),
        (lambda s: s.put(42, 1), "key"),
        (lambda s: s.put("k", {1, 2}), "value of 'k'"),
        (lambda s: s.put("k", float("nan")), "value of 'k'"),
        (lambda s: s.compare_and_set("k", "1", {}), "expected_version"),
        (lambda s: s.compare_and_set("k", True, {}), "expected_version"),
        (lambda s: s.compare_and_set("k", 0, {}), "expected_version"),
        (lambda s: s.put_blob("b", "text, not bytes"), "data"),
        (lambda s: s.put_blob("b", (b"bytes", 5)), "data"),
        (lambda s: s.scan("a\x00"), "prefix"),
        (lambda s: s.scan("a", from_key="a\x00"), "from_key"),
        # A lone surrogate (JSON's "\ud800", an undecodable byte of a name) has no UTF-8.
        (lambda s: s.put("job/\ud800", 1), "key"),
        (lambda s: s.put_blob("model-\udcff", b"bytes"), "name"),
        (lambda s: s.scan("job/\udcff"), "prefix"),
    ],
)
def test_bad_input_names_the_problem(store: StateStore, call: object, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        call(store)  # type: ignore[operator]

    assert caught.value.field == field
    assert store.scan("") == []  # nothing was written


@pytest.mark.parametrize(
    ("prefix", "end"),
    [
        ("job/", "job0"),
        ("a\U0010ffff", "b"),
        ("\ud7ff", "\ue000"),
        ("\U0010ffff", None),
        ("", None),
    ],
)
def test_the_sqlite_range_of_a_prefix_ends_after_all_it_starts(
    prefix: str, end: str | None
) -> None:
    from faasdl.store.sqlite import _prefix_end

    assert _prefix_end(prefix) == end


def test_a_locked_sqlite_statement_is_tried_again_every_two_milliseconds_at_most() -> None:
    """SQLite's own busy handler pauses up to 100 ms between tries: beside busy writers a waiting
    heartbeat found the lock taken at each try for up to 1.5 s, a lease's length."""
    from faasdl.store.sqlite import busy_pauses

    pauses = list(busy_pauses(1.0))
    assert all(0.0005 <= p <= 0.002 for p in pauses)
    assert 1.0 <= sum(pauses) < 1.0 + 0.002


def test_a_sqlite_write_locked_out_past_its_timeout_fails_naming_the_store_and_writes_nothing(
    tmp_path: Path,
) -> None:
    import sqlite3

    from faasdl.errors import StoreUnavailable
    from faasdl.store.sqlite import SqliteStore

    with SqliteStore(path=tmp_path / "state.db", busy_timeout_s=0.2) as store:
        holder = sqlite3.connect(store.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process's write in progress
        with pytest.raises(StoreUnavailable, match=r"state\.db: database is locked"):
            store.put("jobs/a", {"n": 1})
        holder.execute("ROLLBACK")
        holder.close()
        assert store.get("jobs/a") is None
        store.put("jobs/a", {"n": 2})  # the lock gone, the next write lands
        assert store.get("jobs/a") is not None


def test_raw_reads_give_the_stored_json_and_its_version(store: StateStore) -> None:
    version = store.put("job/a", {"n": 1, "s": "é"})
    store.put("job/b", [1, 2])

    raw = store.get_raw("job/a")
    scanned = store.scan_raw("job/")

    assert raw is not None
    assert (json.loads(raw.value), raw.version) == ({"n": 1, "s": "é"}, version)
    assert [(k, json.loads(v.value)) for k, v in scanned] == [
        ("job/a", {"n": 1, "s": "é"}),
        ("job/b", [1, 2]),
    ]
    assert store.get_raw("job/none") is None
