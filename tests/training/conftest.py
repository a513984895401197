from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from faasdl.config import LocalPlatformSettings, StoreSettings
from faasdl.platform.local import LocalPlatform
from faasdl.store import StateStore, make_store


@pytest.fixture(scope="module")
def tf_platform() -> Iterator[LocalPlatform]:
    """An embedded platform for TensorFlow actions, shared by a module so that containers stay
    warm between its tests (each cold start imports TensorFlow)."""
    settings = LocalPlatformSettings(pool_memory_mb=4096, memory_max_mb=2048)
    with LocalPlatform(settings=settings) as platform:
        yield platform


@pytest.fixture(scope="module")
def tf_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StateStore, str]]:
    """A SQLite store and its absolute URL, which actions (other processes) open too."""
    root: Path = tmp_path_factory.mktemp("store")
    url = f"sqlite:///{root / 'state.db'}"
    with make_store(StoreSettings(spill_dir=str(root / "spill")), url) as store:
        yield store, url
