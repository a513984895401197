"""The training action's logic, behind ``openwhisk_actions/train/__main__.py``.

Importing this module imports TensorFlow and configures it (determinism, one intra-op thread), so
that all of it happens in the container's ``/init``: a warm or prewarmed container then answers
``{"warmup": true}`` at once. Three calls:

* ``{"warmup": true}``: return immediately (used to prewarm replicas on a real OpenWhisk); with
  ``"prime"`` (:class:`PrimeArgs`), build and trace that trainer first, so that the first unit
  this container takes over starts training at once;
* ``{"mode": "profile", "model", "input_shape", "classes"}``: the model's sizes for the estimator;
* ``{"mode": "baseline"}``: this runtime's peak memory when it trains a tiny model in memory, the
  floor of every estimate (measured once per runtime: its ``runtime_id``, which every training
  result reports too);
* ``{"mode": "train", ...}`` (:class:`TrainArgs`): read the shard and the global weights from the
  store (or resume from the unit's latest checkpoint), train, write the new weights, commit the
  unit through Canary's fenced API, and report losses, peak memory, phase durations and
  checkpoint stalls;
* ``{"mode": "evaluate", ...}`` (:class:`EvaluateArgs`): the loss and accuracy of stored weights
  on a stored data set (the controller's per-round test accuracy), and on a second one (the job's
  validation set) where it names one, and the peak memory (the ledger's, as a trainer's).

Each but the baseline may give a job's own model's Keras config (``architecture``), which its
``model`` then names (``custom-`` and its digest): this process builds it by that name from then
on. Bad arguments come back as ``{"error": "<field>: <message>"}``, OpenWhisk's application
error.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any, Literal, NamedTuple, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from faasdl.actionkit import action_store, serve
from faasdl.canary.checkpoint import CanaryArgs, Checkpointer
from faasdl.store.base import StateStore
from faasdl.training.datasets import Shard
from faasdl.training.loop import TrainConfig, Trainer, configure_runtime, steps_per_epoch
from faasdl.training.models import (
    architecture,
    build_model,
    profile_model,
    remember_architecture,
)
from faasdl.training.tensors import TensorStream, TrainState
from faasdl.training.usage import Phases, peak_rss_mb, runtime_id

# TensorFlow loads here, in the cold start's /init, without what it imports for parts no action
# uses (`UNUSED_BY_ACTIONS`; scikit-learn, the first kept out: /init 2.9 s without it against 3.9
# s here, a trainer's peak 572 MB against 626 MB).
configure_runtime(intra_op_threads=int(os.environ.get("FAASDL_ACTION_THREADS", "1")))
runtime_id()  # cached: its ~10 ms in the cold start's /init, not in a first activation


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    architecture: dict[str, Any] | None = Field(
        None,
        description="A job's own model's Keras config, which ``model`` (its custom name) names.",
    )


class ProfileArgs(_Args):
    mode: Literal["profile"]
    model: str
    input_shape: tuple[int, ...]
    classes: int = Field(ge=2)


class PrimeArgs(_Args):
    """The trainer a warm-up call builds and traces (one step on zeros) for the units to come."""

    model: str
    input_shape: tuple[int, ...]
    classes: int = Field(ge=2)
    batch_size: int = Field(ge=1)
    optimizer: Literal["adam", "sgd"] = "adam"
    learning_rate: float = Field(1e-3, gt=0)


class EvaluateArgs(_Args):
    mode: Literal["evaluate"]
    store_url: str
    model: str
    classes: int = Field(ge=2)
    weights: str = Field(description="Blob of the weights to evaluate.")
    data: str = Field(description="Blob of the examples (a shard: safetensors x, y).")
    validation: str | None = Field(
        None,
        description="Blob of a second set of examples, scored after the first is let go "
        "(the job's validation set); none: the first only.",
    )
    batch_size: int = Field(
        256,
        ge=1,
        description="Examples a step: the job's training batch, whose activations the action's "
        "memory was sized for.",
    )


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
    canary: CanaryArgs | None = Field(
        None, description="The unit and fencing token: checkpoints, heartbeats, fenced commit."
    )
    batch_size: int = Field(ge=1)
    epochs: int = Field(ge=1)
    seed: int = 0
    optimizer: Literal["adam", "sgd"] = "adam"
    learning_rate: float = Field(1e-3, gt=0)
    target_loss: float | None = Field(None, ge=0)


def main(args: dict[str, Any]) -> dict[str, Any]:
    return serve(args, _dispatch, warm=warm_up)


def warm_up(args: dict[str, Any]) -> None:
    """Prepare the trainer a warm-up call names (``prime``), if it names one."""
    if args.get("prime") is None:
        return
    prime = PrimeArgs.model_validate(args["prime"])
    _remember(prime)
    config = TrainConfig(
        batch_size=prime.batch_size,
        epochs=1,
        optimizer=prime.optimizer,
        learning_rate=prime.learning_rate,
    )
    key = TrainerKey(prime.model, prime.input_shape, prime.classes, prime.optimizer)
    trainer = _trainer(key, config)
    x = np.zeros((prime.batch_size, *prime.input_shape), np.float32)
    y = np.zeros(prime.batch_size, np.int32)
    trainer.train(x, y, trainer.initial_state())  # traces the step; every unit loads its state


def _dispatch(args: dict[str, Any]) -> dict[str, Any]:
    if args.get("mode") == "profile":
        return profile(_remember(ProfileArgs.model_validate(args)))
    if args.get("mode") == "baseline":
        return baseline()
    if args.get("mode") == "evaluate":
        return evaluate(_remember(EvaluateArgs.model_validate(args)))
    return train(_remember(TrainArgs.model_validate(args)))


_A = TypeVar("_A", ProfileArgs, PrimeArgs, EvaluateArgs, TrainArgs)


def _remember(args: _A) -> _A:
    """``args`` whose job's own architecture, if they give one, this process builds by its name
    from now on."""
    if args.architecture is not None:
        remember_architecture(args.model, args.architecture)
    return args


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
    return {"peak_rss_mb": peak_rss_mb(), "runtime_id": runtime_id()}


def evaluate(args: EvaluateArgs) -> dict[str, Any]:
    store = action_store(args.store_url)
    data = Shard.from_bytes(store.get_blob(args.data), index=0)
    input_shape = tuple(data.x.shape[1:])
    # The container's trainer where it holds this model: one model in memory, not two (a
    # MobileNetV2 built beside its trainer, scoring 256 examples a step, peaked 1,364 MB in a
    # 1,088 MB action, and the next trainer there ran out of memory). Its next activation loads
    # its whole state, as every one does.
    trainer = next(
        (
            t
            for k, t in _trainers.items()
            if (k.model, k.input_shape, k.classes) == (args.model, input_shape, args.classes)
        ),
        None,
    )
    reused = trainer is not None
    if trainer is None:
        model = build_model(args.model, input_shape, args.classes, seed=0)
        trainer = Trainer(model, TrainConfig(batch_size=args.batch_size, epochs=1))
    weights = TensorStream(store.read_blob(args.weights)[1], what="weights")
    trainer.load_streamed(weights, weights_only=True)  # its optimizer may be another's
    scores = trainer.evaluate(data.x, data.y, batch_size=args.batch_size)
    examples = data.count
    del data  # let go before the validation set is read: one set in memory at a time
    if args.validation is not None:
        held = Shard.from_bytes(store.get_blob(args.validation), index=0)
        validated = trainer.evaluate(held.x, held.y, batch_size=args.batch_size)
        scores |= {f"validation_{name}": value for name, value in validated.items()}
    return {
        **scores,
        "examples": examples,
        "model_reused": reused,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


class TrainerKey(NamedTuple):
    """What makes two trainers interchangeable (the learning rate is set as a state is loaded:
    a job's rounds may train at different rates, on one trainer)."""

    model: str
    input_shape: tuple[int, ...]
    classes: int
    optimizer: str


#: The warm container's trainer: built and traced once (by a warm-up call, or by the first unit),
#: reused by the next activations that train the same model the same way.
_trainers: dict[TrainerKey, Trainer] = {}


def _trainer(key: TrainerKey, config: TrainConfig) -> Trainer:
    """The trainer of ``key`` (built once) set to ``config``. Every activation loads its whole
    state (weights and optimizer variables) into it, so reuse changes no result."""
    if key not in _trainers:
        _trainers.clear()  # one model at a time: a container serves one action variant
        model = build_model(key.model, key.input_shape, key.classes, seed=0)
        _trainers[key] = Trainer(model, config)
    trainer = _trainers[key]
    trainer.config = config
    return trainer


#: The latest initial weights drawn in this container, by trainer and seed (every unit of a job's
#: first round starts from the same ones).
_initial: dict[tuple[TrainerKey, int], list[np.ndarray]] = {}


def _initial_weights(key: TrainerKey, seed: int) -> list[np.ndarray]:
    if (key, seed) not in _initial:
        _initial.clear()
        built = build_model(key.model, key.input_shape, key.classes, seed=seed)
        _initial[(key, seed)] = [w.numpy() for w in built.weights]
    return _initial[(key, seed)]


def train(args: TrainArgs) -> dict[str, Any]:
    if args.canary is None:
        return _train(args, None)
    with Checkpointer(action_store(args.store_url), args.canary) as canary:
        return _train(args, canary)


def _start(
    trainer: Trainer,
    key: TrainerKey,
    args: TrainArgs,
    store: StateStore,
    canary: Checkpointer | None,
) -> tuple[TrainState, int | None]:
    """Load the attempt's starting state into ``trainer``: the unit's newest checkpoint, else the
    global model, else the job's initial weights drawn from its seed (with the optimizer as
    built). Returns the state's counters and the checkpoint position it resumed from, if any.
    A checkpoint or the global model is set as it is read, never held whole beside the
    variables (:meth:`Trainer.load_streamed`)."""
    restored = canary.restore_streamed(functools.partial(_resume, trainer)) if canary else None
    if restored is not None:
        return restored[0], restored[1].position
    if args.weights_in is not None:
        # The global model carries the averaged optimizer state too: restarting Adam's moments
        # every round costs local training most of its progress per round.
        _, pieces = store.read_blob(args.weights_in)
        trainer.load_streamed(TensorStream(pieces, what="weights_in"))
        return TrainState(weights=[]), None
    trainer.load(TrainState(weights=_initial_weights(key, args.seed)))
    return TrainState(weights=[]), None


def _resume(trainer: Trainer, pieces: Iterator[bytes]) -> TrainState:
    """Load the checkpoint read as ``pieces`` into ``trainer``; its counters."""
    stream = TensorStream(pieces, what="checkpoint")
    counters = TrainState.counters_of(stream.metadata)
    trainer.load_streamed(stream)
    return counters


def _train(args: TrainArgs, canary: Checkpointer | None) -> dict[str, Any]:
    phases = Phases()
    store = action_store(args.store_url)
    with phases("load"):
        shard = Shard.from_bytes(store.get_blob(args.shard), index=0)
    with phases("build"):
        input_shape = tuple(shard.x.shape[1:])
        key = TrainerKey(args.model, input_shape, args.classes, args.optimizer)
        config = TrainConfig(
            batch_size=args.batch_size,
            epochs=args.epochs,
            seed=args.seed,
            optimizer=args.optimizer,
            learning_rate=args.learning_rate,
            target_loss=args.target_loss,
        )
        reused = key in _trainers
        trainer = _trainer(key, config)
        if not reused:  # a container's one-off part, not its first epoch's
            trainer.trace()
    with phases("load"):
        start, resumed_from = _start(trainer, key, args, store, canary)
    per_epoch = steps_per_epoch(shard.count, args.batch_size)
    first_step_at: float | None = None

    def on_step(progress: TrainState) -> None:
        nonlocal first_step_at
        first_step_at = first_step_at or time.time()
        if canary is None:
            return
        canary.check()  # a zombie stops at its next step
        if canary.due():
            canary.checkpoint(
                lambda: trainer.snapshot(progress),
                TrainState.encode,
                position=progress.epoch * per_epoch + progress.step,
            )

    with phases("train"):
        report = trainer.train_on(shard.x, shard.y, start, on_step=on_step)
    with phases("save"):
        model = architecture(args.model, input_shape, args.classes)
        store.put_blob(args.weights_out, trainer.written(metadata=model))
    epochs = report.state.epochs
    loss = epochs[-1]["loss"] if epochs else None
    if canary is not None:
        with phases("commit"):
            canary.commit(args.weights_out, examples=shard.count, loss=loss)
    stalls = sorted(canary.stalls_s) if canary else []
    return {
        "examples": shard.count,
        "epochs": epochs,
        "loss": loss,
        "steps": report.steps,
        "resumed_from": resumed_from,
        "stopped_early": report.stopped_early,
        "weights": args.weights_out,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "runtime_id": runtime_id(),
        "phases_s": {name: round(s, 4) for name, s in phases.seconds.items()},
        "first_step_at": first_step_at,
        "first_step_extra_s": report.first_step_extra_s,
        "trainer_reused": reused,
        "learning_rate": float(trainer.optimizer.learning_rate),  # as the optimizer holds it
        "checkpoints": canary.persisted if canary else 0,
        "checkpoint_stall_ms_p50": round(1000 * stalls[len(stalls) // 2], 3) if stalls else None,
        "finished_at": time.time(),
    }
