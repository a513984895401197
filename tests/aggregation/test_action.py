"""The aggregation action in process, on the SQLite store: what it holds as it merges."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np

from faasdl.aggregation.action import AggregateArgs, aggregate
from faasdl.aggregation.average import CHUNK, weighted_average
from faasdl.config import StoreSettings
from faasdl.store import make_store
from faasdl.training.tensors import decode, pack

MIB = 1024 * 1024


def test_inputs_are_read_an_array_at_a_time_beside_the_mean_never_whole(tmp_path: Path) -> None:
    # Traced allocations over three 48 MiB inputs (weights and Adam's moments, arrays of 4 MiB):
    # the float64 mean is two copies of a model; holding each input whole as it was added, the
    # aggregator held a third.
    url = f"sqlite:///{tmp_path / 'state.db'}"
    rng = np.random.default_rng(2)
    models = [[rng.standard_normal(MIB, dtype=np.float32) for _ in range(4)] for _ in range(3)]
    size = 3 * sum(a.nbytes for a in models[0])
    with make_store(StoreSettings(), url) as store:
        for i, weights in enumerate(models):
            store.put_blob(f"in/{i}", pack(weights, metadata={"arch": "x"}, opt=weights + weights))
        chunk = store.chunk_bytes
    args = AggregateArgs(
        store_url=url,
        output="out",
        inputs=[{"weights": f"in/{i}", "examples": i + 1} for i in range(3)],
    )

    tracemalloc.start()
    try:
        result = aggregate(args)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    with make_store(StoreSettings(), url) as store:
        groups, metadata = decode(store.get_blob("out"))
    expected = weighted_average(list(zip(models, (1, 2, 3), strict=True)))
    assert result["examples"] == 6
    assert metadata == {"arch": "x"}
    assert all(np.allclose(a, b) for a, b in zip(groups["w"], expected, strict=True))
    # Beside the mean: an input's array, the piece it is read from and the chunk read, the
    # float64 part of an array being added, and a MiB for the rest (headers, records).
    beside = 4 * MIB + 2 * chunk + 8 * CHUNK + MIB
    assert peak < 2 * size + beside, f"held {peak / MIB:.0f} MiB, a model {size / MIB:.0f} MiB"
