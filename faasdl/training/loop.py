"""A deterministic, resumable training loop on one shard.

Deterministic: TensorFlow's op determinism is on, weights are drawn from the job's seed, and the
order of epoch ``e`` is ``default_rng([seed, e]).permutation(n)``, so two runs with one seed give
bit-identical weights. Resumable: the loop can stop after any step and a :class:`TrainState`
taken there lets another process carry on and end bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from faasdl.errors import TrainingDiverged
from faasdl.store.base import Streamed
from faasdl.training.tensors import Lazy, TensorStream, TrainState, pack_streamed

if TYPE_CHECKING:
    import keras

_configured = False

#: What TensorFlow and Keras import as they load, for parts no action uses (its data come from
#: the store; it plots nothing): scikit-learn for Keras's scikit-learn wrappers, matplotlib for
#: Keras's image galleries, SciPy's sparse matrices for TensorFlow's Keras 2 training loop. Each
#: goes without its module when the import fails (Keras's galleries then say matplotlib is
#: missing). The training action's import, its cold start's /init, took 3.4 s here and 506 MB
#: without the three, 4.0 s and 543 MB without scikit-learn alone (eight of each in turn).
UNUSED_BY_ACTIONS = ("sklearn", "matplotlib", "scipy")


@contextlib.contextmanager
def _importing_without(names: Iterable[str]) -> Iterator[None]:
    """Within the block, the modules ``names`` cannot be imported (Python's mark: None in
    ``sys.modules``), unless imported already; after it, they can. For a process's start, on its
    one thread: another thread importing one of them meanwhile would fail too."""
    hidden = [name for name in names if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden))  # type: ignore[arg-type]
    try:
        yield
    finally:
        for name in hidden:
            del sys.modules[name]


@dataclass(frozen=True)
class TrainConfig:
    """How one attempt trains: ``epochs`` counts from the start of the round, not of the attempt."""

    batch_size: int
    epochs: int
    seed: int = 0
    optimizer: Literal["adam", "sgd"] = "adam"
    learning_rate: float = 1e-3
    target_loss: float | None = None


@dataclass
class TrainReport:
    """What one attempt did: its final state (with per-epoch loss and accuracy) and its steps."""

    state: TrainState
    steps: int = 0
    stopped_early: bool = False
    first_steps_s: list[float] = field(default_factory=list)  # the attempt's first two steps'

    @property
    def first_step_extra_s(self) -> float | None:
        """How much longer the attempt's first step took than its second: on a new trainer, its
        step's graph's first run (:meth:`Trainer.trace` traces it, it does not run it); none
        with fewer than two steps."""
        if len(self.first_steps_s) < 2:
            return None
        return max(0.0, self.first_steps_s[0] - self.first_steps_s[1])


def configure_runtime(
    *,
    intra_op_threads: int = 1,
    inter_op_threads: int = 1,
    without: Iterable[str] = UNUSED_BY_ACTIONS,
) -> None:
    """Op determinism and thread counts; once per process, before TensorFlow runs anything.
    TensorFlow, if this imports it, loads without the modules ``without``."""
    global _configured
    # Hidden only while TensorFlow loads: a later call, in a process whose other threads may be
    # importing, hides nothing.
    with _importing_without(() if "tensorflow" in sys.modules else without):
        import tensorflow as tf

    if not _configured:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
        tf.config.experimental.enable_op_determinism()
        _configured = True


def steps_per_epoch(examples: int, batch_size: int) -> int:
    return math.ceil(examples / batch_size)


def epoch_order(seed: int, epoch: int, examples: int) -> np.ndarray:
    """The order of epoch ``epoch``: a pure function of (seed, epoch), never of the attempt."""
    return np.random.default_rng([seed, epoch]).permutation(examples)


#: What a model's variable is read in at most (a row of it at least) as it is written to the
#: store: a chunk of the store's, by default.
READ_BLOCK_BYTES = 4 * 1024 * 1024


class Trainer:
    """One model and its optimizer, ready to train on a shard from a given state."""

    def __init__(self, model: keras.Model, config: TrainConfig) -> None:
        import keras
        import tensorflow as tf

        self.model = model
        self.config = config
        self.optimizer: keras.optimizers.Optimizer = (
            keras.optimizers.Adam(config.learning_rate)
            if config.optimizer == "adam"
            else keras.optimizers.SGD(config.learning_rate, momentum=0.9)
        )
        self.optimizer.build(model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
        spec = (
            tf.TensorSpec((None, *model.input_shape[1:]), tf.float32),
            tf.TensorSpec((None,), tf.int32),
        )

        @tf.function(input_signature=spec)  # type: ignore[untyped-decorator]
        def train_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                total = loss_fn(y, logits)
                loss = total / tf.cast(tf.shape(y)[0], tf.float32)
            grads = tape.gradient(loss, model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            correct = tf.reduce_sum(
                tf.cast(tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32), y), tf.int32)
            )
            return total, correct

        self._train_step = train_step

        @tf.function  # type: ignore[untyped-decorator]
        def all_finite() -> tf.Tensor:
            return tf.reduce_all(
                [tf.reduce_all(tf.math.is_finite(v)) for v in model.trainable_variables]
            )

        self._all_finite = all_finite
        variables = [*model.weights, *self.optimizer.variables]

        @tf.function  # type: ignore[untyped-decorator]
        def read_variables() -> list[tf.Tensor]:
            return [tf.identity(v) for v in variables]

        # One call reads every variable: 0.4 ms for the digits MLP and its Adam state, against
        # 1.8 ms read one by one (the time a checkpoint holds training up).
        self._read_variables = read_variables
        # The optimizer's variables as built (step 0, the configured learning rate, zero
        # moments), the all-zero ones kept as their shape and dtype: as arrays the moments were
        # twice the model's size in every warm container (260 MB for VGG16).
        self._fresh: list[np.ndarray | tuple[tuple[int, ...], np.dtype[Any]]] = []
        for variable in self.optimizer.variables:
            value = np.asarray(variable.numpy())
            self._fresh.append((value.shape, value.dtype) if not value.any() else value)

    @property
    def fresh_optimizer(self) -> list[np.ndarray]:
        """The optimizer's variables as built: what a state without optimizer variables starts
        from (made on each call)."""
        return [v if isinstance(v, np.ndarray) else np.zeros(*v) for v in self._fresh]

    def trace(self) -> None:
        """Trace the training step, taking none: a new trainer's first unit does it as it
        builds the trainer, so that its epochs time training alone (the step's own first run is
        its first step's: :attr:`TrainReport.first_step_extra_s`). The weights' check and the
        snapshot's read are left to their first use: run here, as the trainer is built, they
        raised its peak by 25-35 MB for MobileNetV2 (their memory not yet free for training's
        reuse), to save a first unit 100-300 ms."""
        self._train_step.get_concrete_function()

    def initial_state(self) -> TrainState:
        return TrainState(weights=self.weights())

    def weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.model.weights]

    def load(self, state: TrainState) -> None:
        """Set weights and optimizer variables from ``state``; a state without optimizer
        variables starts from the optimizer as built (:attr:`fresh_optimizer`). Its learning
        rate is ``config``'s."""
        _fit(self.model.weights, [a.shape for a in state.weights], "weights")
        if state.optimizer:
            _fit(self.optimizer.variables, [a.shape for a in state.optimizer], "optimizer state")
        for variable, value in zip(self.model.weights, state.weights, strict=True):
            variable.assign(value)
        for variable, value in zip(self.optimizer.variables, state.optimizer, strict=False):
            variable.assign(value)
        self._loaded(optimizer=bool(state.optimizer))

    def load_streamed(self, stream: TensorStream, *, weights_only: bool = False) -> None:
        """:meth:`load` of a state :func:`~faasdl.training.tensors.pack` wrote (group ``w`` the
        weights, ``opt`` the optimizer variables, passed over where ``weights_only``), each array
        set as it is read: the file is never held whole beside the variables (loading VGG16's
        global model with Adam's moments raised the process's peak by 515 MB, now by 207).
        Nothing is set where the file's arrays do not fit the model (``ValidationError``);
        a file cut short leaves the trainer to be loaded again (every attempt loads its whole
        state)."""
        shapes = stream.shapes
        _fit(self.model.weights, shapes.get("w", []), "weights")
        optimizer = bool(shapes.get("opt")) and not weights_only
        if optimizer:
            _fit(self.optimizer.variables, shapes["opt"], "optimizer state")
        targets = {
            "w": self.model.weights,
            **({"opt": self.optimizer.variables} if optimizer else {}),
        }
        for group, position, array in stream:
            if group in targets:
                targets[group][position].assign(array)
            del array  # before the next is read: one array held at a time
        self._loaded(optimizer=optimizer)

    def _loaded(self, *, optimizer: bool) -> None:
        """After a load: the optimizer as built where the state had no variables of its own,
        and the configured learning rate."""
        import tensorflow as tf

        if not optimizer:
            for variable, fresh in zip(self.optimizer.variables, self._fresh, strict=True):
                variable.assign(fresh if isinstance(fresh, np.ndarray) else tf.zeros(*fresh))
        # The rate this run trains at: the state's (one of its variables) may be another
        # round's, or the one the trainer was built with.
        self.optimizer.learning_rate = self.config.learning_rate

    def snapshot(self, state: TrainState) -> TrainState:
        """``state``'s counters with the current weights and optimizer variables."""
        values = [t.numpy() for t in self._read_variables()]
        weights = len(self.model.weights)
        return TrainState(
            weights=values[:weights],
            optimizer=values[weights:],
            epoch=state.epoch,
            step=state.step,
            loss_sum=state.loss_sum,
            correct=state.correct,
            seen=state.seen,
            epochs=list(state.epochs),
        )

    def written(self, *, metadata: dict[str, str], block_bytes: int = READ_BLOCK_BYTES) -> Streamed:
        """:func:`~faasdl.training.tensors.pack` of the weights and the optimizer's variables
        (group ``opt``), read ``block_bytes`` at a time (a row at least) as the file is written:
        a block is held beside the variables, not a :meth:`snapshot` of them all, which at an
        attempt's end was its peak (VGG16 with Adam on 32×32 images, three rounds in one process
        without checkpoints: 1931-1960 MB, now 1555 in a first round and 1725 in later ones,
        whose peak is the global model's load). A
        variable's slices are read alone; a whole one is read as a copy of it (392 MB for
        VGG16's first dense layer on 224×224 images). The variables must not change until it is
        written: for the state training ends with, not a checkpoint taken while it goes on."""
        return pack_streamed(
            [_lazy(v, block_bytes) for v in self.model.weights],
            metadata=metadata,
            opt=[_lazy(v, block_bytes) for v in self.optimizer.variables],
        )

    def train(
        self,
        x: np.ndarray,
        y: np.ndarray,
        state: TrainState,
        *,
        on_step: Callable[[TrainState], None] | None = None,
    ) -> TrainReport:
        """Train from ``state`` to ``config.epochs``; ``on_step`` sees the state after each step.

        The state passed to ``on_step`` carries counters only (its weights are those it started
        with): call :meth:`snapshot` there to checkpoint.
        """
        self.load(state)
        report = self.train_on(x, y, state, on_step=on_step)
        report.state = self.snapshot(report.state)
        return report

    def train_on(
        self,
        x: np.ndarray,
        y: np.ndarray,
        state: TrainState,
        *,
        on_step: Callable[[TrainState], None] | None = None,
    ) -> TrainReport:
        """Train from ``state``'s counters to ``config.epochs`` with the weights and optimizer
        variables the model holds now (``state``'s: :meth:`load`-ed, or left by the call that
        reached ``state``). The report's state carries counters only (``state``'s weights, if
        any): :meth:`snapshot` takes the weights."""
        state = replace(state, epochs=list(state.epochs))  # the caller's state stays as it was
        report = TrainReport(state=state)
        steps = steps_per_epoch(len(y), self.config.batch_size)
        while state.epoch < self.config.epochs:
            order = epoch_order(self.config.seed, state.epoch, len(y))
            while state.step < steps:
                began = time.perf_counter()
                batch = order[state.step * self.config.batch_size :][: self.config.batch_size]
                total, correct = self._train_step(x[batch], y[batch])
                batch_loss = float(total)
                if not math.isfinite(batch_loss):
                    loss = batch_loss / len(batch)
                    where = f"the loss of epoch {state.epoch + 1}, step {state.step + 1} is {loss}"
                    raise self._diverged(where)
                state.loss_sum += batch_loss
                state.correct += int(correct)
                if report.steps < 2:
                    report.first_steps_s.append(time.perf_counter() - began)
                state.seen += len(batch)
                state.step += 1
                report.steps += 1
                if on_step is not None:
                    on_step(state)
            # A weight may be NaN while the steps' losses stay finite (an MLP's did).
            if not bool(self._all_finite()):
                raise self._diverged(f"a weight is not finite after epoch {state.epoch + 1}")
            state.epochs.append(
                {"loss": state.loss_sum / state.seen, "accuracy": state.correct / state.seen}
            )
            state.epoch, state.step, state.loss_sum, state.correct, state.seen = (
                state.epoch + 1,
                0,
                0.0,
                0,
                0,
            )
            target = self.config.target_loss
            if target is not None and state.epochs[-1]["loss"] <= target:
                report.stopped_early = state.epoch < self.config.epochs
                break
        return report

    def _diverged(self, where: str) -> TrainingDiverged:
        # Training on would average NaN into the global model, and a result's JSON cannot
        # hold one.
        config = self.config
        rate = f"{config.optimizer}, learning rate {config.learning_rate:g} in this action"
        return TrainingDiverged(where, trained_with=rate)

    def evaluate(self, x: np.ndarray, y: np.ndarray, *, batch_size: int = 256) -> dict[str, float]:
        """Loss and accuracy of the current weights on ``(x, y)``."""
        import keras

        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
        total, correct = 0.0, 0
        for start in range(0, len(y), batch_size):
            logits = self.model(x[start : start + batch_size], training=False)
            total += float(loss_fn(y[start : start + batch_size], logits))
            correct += int(np.sum(np.argmax(np.asarray(logits), axis=1) == y[start:][:batch_size]))
        if not math.isfinite(total):  # finite weights whose logits overflow
            raise TrainingDiverged(f"the model's loss on {len(y)} examples is {total / len(y)}")
        return {"loss": total / len(y), "accuracy": correct / len(y)}


def _lazy(variable: Any, block_bytes: int) -> Lazy:
    """A Keras variable as an array read ``block_bytes`` at a time (a row at least)."""
    shape = tuple(variable.shape)
    dtype = np.dtype(variable.dtype)

    def blocks() -> Iterator[np.ndarray]:
        row = math.prod(shape[1:]) * dtype.itemsize
        if not shape or not row or shape[0] * row <= block_bytes:
            yield np.asarray(variable.numpy())
            return
        rows = max(1, block_bytes // row)
        for start in range(0, shape[0], rows):
            yield variable.value[start : start + rows].numpy()

    return Lazy(shape=shape, dtype=dtype, read=blocks)


def _fit(variables: Any, shapes: list[tuple[int, ...]], what: str) -> None:
    """Raise ``ValidationError`` unless ``shapes`` are those of ``variables``, one for one."""
    from faasdl.errors import ValidationError

    targets = list(variables)
    if len(targets) != len(shapes) or any(
        tuple(v.shape) != tuple(shape) for v, shape in zip(targets, shapes, strict=False)
    ):
        raise ValidationError(
            f"the {what} do not fit the model ({len(shapes)} arrays for {len(targets)} variables)",
            field="weights",
        )
