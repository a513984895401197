"""The training action's logic, behind ``openwhisk_actions/train/__main__.py``.

Importing this module imports TensorFlow and configures it (determinism, one intra-op thread), so
that all of it happens in the container's ``/init``: a warm or prewarmed container then answers
``{"warmup": true}`` at once. Three calls:

* ``{"warmup": true}``: return immediately (used to prewarm replicas on a real OpenWhisk);
* ``{"mode": "profile", "model", "input_shape", "classes"}``: the model's sizes for the estimator;
* ``{"mode": "baseline"}``: this runtime's peak memory when it trains a tiny model in memory, the
  floor of every estimate (measured once per environment);
* ``{"mode": "train", ...}`` (:class:`TrainArgs`): read the shard and the global weights from the
  store, train, write the new weights, and report losses, peak memory and phase durations;
* ``{"mode": "evaluate", ...}`` (:class:`EvaluateArgs`): the loss and accuracy of stored weights
  on a stored data set (the controller's per-round test accuracy).

Bad arguments come back as ``{"error": "<field>: <message>"}``, OpenWhisk's application error.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from faasdl.actionkit import action_store, serve
from faasdl.training.datasets import Shard
from faasdl.training.loop import TrainConfig, Trainer, configure_runtime
from faasdl.training.models import build_model, profile_model
from faasdl.training.tensors import TrainState, pack, unpack
from faasdl.training.usage import Phases, peak_rss_mb

configure_runtime(intra_op_threads=int(os.environ.get("FAASDL_ACTION_THREADS", "1")))


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class ProfileArgs(_Args):
    mode: Literal["profile"]
    model: str
    input_shape: tuple[int, ...]
    classes: int = Field(ge=2)


class EvaluateArgs(_Args):
    mode: Literal["evaluate"]
    store_url: str
    model: str
    classes: int = Field(ge=2)
    weights: str = Field(description="Blob of the weights to evaluate.")
    data: str = Field(description="Blob of the examples (a shard: safetensors x, y).")


class TrainArgs(_Args):
    """One training attempt on one shard (a unit of a round)."""

    mode: Literal["train"] = "train"
    store_url: str = Field(description="State store holding the shard, weights and checkpoints.")
    model: str
    classes: int = Field(ge=2)
    shard: str = Field(description="Blob name of the shard (safetensors x, y).")
    weights_in: str | None = Field(None, description="Blob of the global model; none: initialise.")
    weights_out: str = Field(
        description="Blob the trained weights (group w) and optimizer state (opt) go to."
    )
    checkpoint: str | None = Field(None, description="Blob to resume from and checkpoint into.")
    checkpoint_every_steps: int = Field(0, ge=0, description="0: no intermediate checkpoints.")
    batch_size: int = Field(ge=1)
    epochs: int = Field(ge=1)
    seed: int = 0
    optimizer: Literal["adam", "sgd"] = "adam"
    learning_rate: float = Field(1e-3, gt=0)
    target_loss: float | None = Field(None, ge=0)


def main(args: dict[str, Any]) -> dict[str, Any]:
    return serve(args, _dispatch)


def _dispatch(args: dict[str, Any]) -> dict[str, Any]:
    if args.get("mode") == "profile":
        return profile(ProfileArgs.model_validate(args))
    if args.get("mode") == "baseline":
        return baseline()
    if args.get("mode") == "evaluate":
        return evaluate(EvaluateArgs.model_validate(args))
    return train(TrainArgs.model_validate(args))


def profile(args: ProfileArgs) -> dict[str, Any]:
    model = build_model(args.model, args.input_shape, args.classes, seed=0)
    return {**asdict(profile_model(model)), "peak_rss_mb": peak_rss_mb()}


def baseline() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, size=64).astype(np.int32)
    trainer = Trainer(
        build_model("mlp", (8, 8, 1), 10, seed=0), TrainConfig(batch_size=16, epochs=1)
    )
    trainer.train(x, y, trainer.initial_state())
    return {"peak_rss_mb": peak_rss_mb()}


def evaluate(args: EvaluateArgs) -> dict[str, Any]:
    store = action_store(args.store_url)
    data = Shard.from_bytes(store.get_blob(args.data), index=0)
    model = build_model(args.model, tuple(data.x.shape[1:]), args.classes, seed=0)
    trainer = Trainer(model, TrainConfig(batch_size=256, epochs=1))
    trainer.load(TrainState(weights=unpack(store.get_blob(args.weights))["w"]))
    return {**trainer.evaluate(data.x, data.y), "examples": data.count}


def train(args: TrainArgs) -> dict[str, Any]:
    phases = Phases()
    store = action_store(args.store_url)
    with phases("load"):
        shard = Shard.from_bytes(store.get_blob(args.shard), index=0)
        state: TrainState | None = None
        if args.checkpoint is not None and store.blob_manifest(args.checkpoint) is not None:
            state = TrainState.from_bytes(store.get_blob(args.checkpoint))
        resumed = state is not None
        if state is None and args.weights_in is not None:
            # The global model carries the averaged optimizer state too: restarting Adam's
            # moments every round costs local training most of its progress per round.
            groups = unpack(store.get_blob(args.weights_in))
            state = TrainState(weights=groups["w"], optimizer=groups.get("opt", []))
    with phases("build"):
        model = build_model(args.model, tuple(shard.x.shape[1:]), args.classes, seed=args.seed)
        config = TrainConfig(
            batch_size=args.batch_size,
            epochs=args.epochs,
            seed=args.seed,
            optimizer=args.optimizer,
            learning_rate=args.learning_rate,
            target_loss=args.target_loss,
        )
        trainer = Trainer(model, config)
        state = state or trainer.initial_state()
        started_at = (state.epoch, state.step)

    def checkpoint(progress: TrainState) -> None:
        if args.checkpoint and progress.step % args.checkpoint_every_steps == 0:
            with phases("checkpoint"):
                store.put_blob(args.checkpoint, trainer.snapshot(progress).to_bytes())

    with phases("train"):
        report = trainer.train(
            shard.x, shard.y, state, on_step=checkpoint if args.checkpoint_every_steps else None
        )
    # Checkpoints are timed inside training; report them apart.
    phases.seconds["train"] -= phases.seconds.get("checkpoint", 0.0)
    with phases("save"):
        store.put_blob(args.weights_out, pack(report.state.weights, opt=report.state.optimizer))
    epochs = report.state.epochs
    return {
        "examples": shard.count,
        "epochs": epochs,
        "loss": epochs[-1]["loss"] if epochs else None,
        "steps": report.steps,
        "resumed_from": list(started_at) if resumed else None,
        "stopped_early": report.stopped_early,
        "weights": args.weights_out,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "phases_s": {name: round(s, 4) for name, s in phases.seconds.items()},
        "finished_at": time.time(),
    }
