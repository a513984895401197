"""Failure injection's choice of targets (the injections themselves are exercised by the recovery
tests and the demo's)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from faasdl.canary.inject import Chaos, Injection
from faasdl.config import StoreSettings
from faasdl.platform.local import LocalPlatform
from faasdl.store import StateStore, make_store
from faasdl.store.records import FunctionInfo, UnitState, create, load, replace


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    with make_store(StoreSettings(spill_dir=str(tmp_path / "spill")), url) as opened:
        yield opened


def test_an_attempt_hit_once_is_no_target_until_a_newer_attempt_runs(store: StateStore) -> None:
    # Arrange: a unit whose attempt 1 was killed, and that still reads as running with it (the
    # controller has not seen the kill yet).
    unit = FunctionInfo(
        job_id="job",
        round=0,
        shard=0,
        state=UnitState.RUNNING,
        owner_epoch=1,
        activation_id="a1",
        heartbeat_ms=1,
    )
    assert create(store, unit)
    chaos = Chaos(LocalPlatform(), store, "job", count=2)
    assert chaos._target(random.Random(0)) == (unit.key(), unit)
    chaos.done.append(Injection("a1", unit.key(), token=1, at=0.0))

    # Act, assert: the killed attempt is not hit a second time ...
    assert chaos._target(random.Random(0)) is None

    # ... and the attempt that resumes the unit is a target again.
    found = load(store, unit.key(), FunctionInfo)
    assert found is not None
    resumed = unit.model_copy(update={"owner_epoch": 2, "activation_id": "a2"})
    assert replace(store, resumed, found[1])
    assert chaos._target(random.Random(0)) == (unit.key(), resumed)
