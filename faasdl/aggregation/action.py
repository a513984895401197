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
from faasdl.training.tensors import TensorStream, encode
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
            stream = TensorStream(store.read_blob(item.weights)[1], what=item.weights)
        metadata = stream.metadata
        agreed = metadata if agreed is None else dict(agreed.items() & metadata.items())
        if means and set(stream.shapes) != set(means):
            raise AggregationError(
                f"{item.weights} holds {sorted(stream.shapes)}, the other inputs {sorted(means)}"
            )
        with phases("average"):  # the input read as it is added
            _add(means, stream, item.examples)
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


def _add(means: dict[str, WeightedMean], stream: TensorStream, examples: int) -> None:
    """Add an input read as ``stream`` to the means of its groups of arrays, an array at a time:
    the input is never held whole beside the means."""
    adds = {
        group: means.setdefault(group, WeightedMean()).adding(
            shapes, stream.dtypes[group], examples
        )
        for group, shapes in stream.shapes.items()
    }
    for group, position, array in stream:
        adds[group](position, array)
        del array  # before the next is read
