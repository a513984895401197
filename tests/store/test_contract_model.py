"""The StateStore contract as a model: random sequences of record and blob calls on a real store
(SQLite, a real redis-server, Ignite where FAASDL_TEST_IGNITE_URL is set), each answer checked
against a dictionary's. The keys are short texts of the characters at the edges of the stores'
orderings and prefix ranges (U+007F, U+D7FF, U+E000, U+FFFF, U+10FFFF, non-ASCII), so that a scan
from a prefix or a key is tried where code point, UTF-16 and UTF-8 orders could differ."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from faasdl.errors import BlobNotFound
from faasdl.store import StateStore
from faasdl.store.base import MANIFEST_PREFIX
from tests.store.conftest import StoreFactory

CHARACTERS = ["a", "b", "z", "0", " ", "-", "/", "\x01", "\x7f", "é", "\ud7ff", "\ue000"]
CHARACTERS += ["\uffff", "\U0010ffff"]
TEXT = st.lists(st.sampled_from(CHARACTERS), max_size=4).map("".join)
#: A record's key or a blob's name (a record's key never a blob manifest's, which are records).
KEYS = TEXT.filter(lambda k: bool(k) and not k.startswith(MANIFEST_PREFIX))
VALUES: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=3), st.lists(st.integers(0, 3))
)
#: A version relative to the key's: one behind, the same, one ahead (never below 1).
MOVES = st.integers(-1, 1)


class StoreAsDict(RuleBasedStateMachine):
    """One sequence of calls on ``store`` (empty as it starts; emptied again as it ends) against
    ``records`` (key → value, version) and ``blobs`` (name → bytes)."""

    def __init__(self, store: StateStore) -> None:
        super().__init__()
        self.store = store
        self.records: dict[str, tuple[Any, int]] = {}
        self.blobs: dict[str, bytes] = {}

    def version(self, key: str, move: int) -> int:
        held = self.records.get(key)
        return max(1, (held[1] if held else 1) + move)

    @rule(key=KEYS, value=VALUES)
    def put(self, key: str, value: Any) -> None:
        expected = self.version(key, 1) if key in self.records else 1

        version = self.store.put(key, value)

        assert version == expected
        self.records[key] = (value, version)

    @rule(key=KEYS, value=VALUES)
    def put_if_absent(self, key: str, value: Any) -> None:
        created = self.store.put_if_absent(key, value)

        assert created == (key not in self.records)
        if created:
            self.records[key] = (value, 1)

    @rule(key=KEYS, value=VALUES, move=MOVES)
    def compare_and_set(self, key: str, value: Any, move: int) -> None:
        expected = self.version(key, move)

        written = self.store.compare_and_set(key, expected, value)

        held = self.records.get(key)
        assert written == (held is not None and held[1] == expected)
        if written:
            self.records[key] = (value, expected + 1)

    @rule(key=KEYS, move=st.none() | MOVES)
    def delete(self, key: str, move: int | None) -> None:
        expected = None if move is None else self.version(key, move)

        deleted = self.store.delete(key, expected_version=expected)

        held = self.records.get(key)
        assert deleted == (held is not None and expected in (None, held[1]))
        if deleted:
            del self.records[key]

    @rule(key=KEYS)
    def get(self, key: str) -> None:
        found = self.store.get(key)

        assert (None if found is None else (found.value, found.version)) == self.records.get(key)

    @rule(prefix=TEXT, low=TEXT)
    def scan(self, prefix: str, low: str) -> None:
        found = self.store.scan(prefix, from_key=low)
        versions = self.store.scan_versions(prefix)

        records = [(k, v.value, v.version) for k, v in found if not k.startswith(MANIFEST_PREFIX)]
        expected = [(k, *self.records[k]) for k in sorted(self.records)]
        assert records == [r for r in expected if r[0].startswith(prefix) and r[0] >= low]
        of_records = [(k, n) for k, n in versions if not k.startswith(MANIFEST_PREFIX)]
        assert of_records == [(k, n) for k, _, n in expected if k.startswith(prefix)]

    @rule(name=KEYS, data=st.binary(max_size=3000))
    def put_blob(self, name: str, data: bytes) -> None:
        # Written across three chunks at most, or (over 2,048 bytes) to the spill tier.
        self.store.put_blob(name, data)

        self.blobs[name] = data

    @rule(name=KEYS)
    def get_blob(self, name: str) -> None:
        try:
            found: bytes | None = bytes(self.store.get_blob(name))
        except BlobNotFound:
            found = None

        assert found == self.blobs.get(name)

    @rule(name=KEYS)
    def delete_blob(self, name: str) -> None:
        deleted = self.store.delete_blob(name)

        assert deleted == (name in self.blobs)
        self.blobs.pop(name, None)

    @rule(prefix=TEXT)
    def blob_names(self, prefix: str) -> None:
        names = self.store.blob_names(prefix)

        assert names == sorted(n for n in self.blobs if n.startswith(prefix))

    @rule()
    def collect_garbage(self) -> None:
        self.store.collect_garbage(grace_s=0)  # nothing written is in flight: no grace

        assert {n: bytes(self.store.get_blob(n)) for n in self.blobs} == self.blobs

    def teardown(self) -> None:
        for name in self.store.blob_names(""):
            self.store.delete_blob(name)
        for key, _ in self.store.scan(""):
            self.store.delete(key)
        assert self.store.scan("") == []


def test_a_store_answers_every_sequence_of_calls_as_a_dictionary_would(
    make_store_for: StoreFactory,
) -> None:
    # Small chunks and a low spill threshold, so that blobs of a few KiB take every path.
    store = make_store_for(chunk_bytes=1024, spill_bytes=2048)

    class OnThisStore(StoreAsDict):
        def __init__(self) -> None:
            super().__init__(store)

    run_state_machine_as_test(
        OnThisStore,
        settings=settings(
            max_examples=100,
            stateful_step_count=40,
            deadline=None,
            derandomize=True,  # the same sequences in every run: a failure is repeatable
            database=None,  # and nothing kept of them between runs
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
