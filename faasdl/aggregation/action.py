"""The aggregation action's logic, behind ``openwhisk_actions/aggregate/__main__.py``.

``{"store_url", "inputs": [{"weights": blob, "examples": n}, …], "output": blob}``: reads each
input model in turn, writes their weighted mean to ``output`` (every group of arrays the inputs
hold: the weights ``w`` and the optimizer state ``opt``; the metadata they agree on: the model's
architecture) and returns the total example count, which weighs this aggregate at the next level
of the tree. NumPy only: no TensorFlow to import.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from faasdl.actionkit import action_store, serve
from faasdl.aggregation.average import WeightedMean
from faasdl.errors import AggregationError
from faasdl.training.tensors import decode, encode
from faasdl.training.usage import (
    Phases,
    map_large_allocations,
    peak_rss_mb,
    return_free_memory,
)


class Input(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weights: str
    examples: int = Field(ge=1)


class AggregateArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    store_url: str
    inputs: list[Input] = Field(min_length=1)
    output: str


def main(args: dict[str, Any]) -> dict[str, Any]:
    return serve(args, lambda a: aggregate(AggregateArgs.model_validate(a)))


def aggregate(args: AggregateArgs) -> dict[str, Any]:
    # A warm aggregator's peak is its sizing's two copies of the mean and one input, not these
    # and what earlier activations left in the heap (the Redis client's parsed chunks, small
    # arrays): big blocks are unmapped as they are freed, the rest handed back at the end.
    map_large_allocations()
    phases = Phases()
    store = action_store(args.store_url)
    means: dict[str, WeightedMean] = {}
    agreed: dict[str, str] | None = None
    for item in args.inputs:
        with phases("load"):
            groups, metadata = decode(store.get_blob(item.weights), what=item.weights)
        agreed = metadata if agreed is None else dict(agreed.items() & metadata.items())
        if means and set(groups) != set(means):
            raise AggregationError(
                f"{item.weights} holds {sorted(groups)}, the other inputs {sorted(means)}"
            )
        with phases("average"):
            _add(means, groups, item.examples)
        del groups  # the input's bytes (its arrays are views of them): one input held at a time
    with phases("save"):
        means_out = {n: m.result() for n, m in means.items()}
        store.put_blob(args.output, encode(means_out, metadata=agreed))
    peak = peak_rss_mb()
    del means, means_out
    return_free_memory()
    return {
        "examples": sum(item.examples for item in args.inputs),
        "weights": args.output,
        "peak_rss_mb": round(peak, 1),
        "phases_s": {name: round(s, 4) for name, s in phases.seconds.items()},
    }


def _add(means: dict[str, WeightedMean], groups: dict[str, list[Any]], examples: int) -> None:
    """Add an input's groups of arrays to their means. A function, so that no loop variable holds
    the input's arrays (and so its bytes) while the next input is read."""
    for name, arrays in groups.items():
        means.setdefault(name, WeightedMean()).add(arrays, examples)
