"""The training loop, in process: it learns, it is deterministic, and it resumes exactly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="needs TensorFlow (the 'train' extra)")

from faasdl.errors import TrainingDiverged, ValidationError
from faasdl.training.datasets import DigitsSpec, Shard, load_dataset, split_shards
from faasdl.training.loop import READ_BLOCK_BYTES, TrainConfig, Trainer, configure_runtime
from faasdl.training.models import build_model
from faasdl.training.tensors import TensorStream, TrainState, pack

pytestmark = pytest.mark.tensorflow
DIGITS = load_dataset(DigitsSpec())
SHARD: Shard = next(split_shards(DIGITS, 2, seed=1))


class Stop(Exception):
    pass


def trainer(model: str, *, seed: int = 5, epochs: int = 3, learning_rate: float = 1e-3) -> Trainer:
    configure_runtime()
    net = build_model(model, DIGITS.input_shape, DIGITS.classes, seed=seed)
    config = TrainConfig(batch_size=32, epochs=epochs, seed=seed, learning_rate=learning_rate)
    return Trainer(net, config)


@pytest.mark.parametrize("model", ["mlp", "small_cnn"])
def test_training_on_a_shard_raises_test_accuracy(model: str) -> None:
    t = trainer(model, epochs=5)
    before = t.evaluate(DIGITS.x_test, DIGITS.y_test)

    report = t.train(SHARD.x, SHARD.y, t.initial_state())

    after = t.evaluate(DIGITS.x_test, DIGITS.y_test)
    assert after["accuracy"] > before["accuracy"] + 0.3
    assert after["accuracy"] > 0.75
    losses = [e["loss"] for e in report.state.epochs]
    assert len(losses) == 5
    assert losses[-1] < losses[0]
    assert report.steps == 5 * -(-SHARD.count // 32)


@pytest.mark.parametrize("model", ["mlp", "small_cnn"])
def test_two_runs_with_one_seed_give_bit_identical_weights(model: str) -> None:
    first = trainer(model).train(SHARD.x, SHARD.y, trainer(model).initial_state())
    t = trainer(model)
    second = t.train(SHARD.x, SHARD.y, t.initial_state())
    t = trainer(model, seed=6)
    other = t.train(SHARD.x, SHARD.y, t.initial_state())

    pairs = zip(first.state.weights, second.state.weights, strict=True)
    assert all(np.array_equal(a, b) for a, b in pairs)
    assert not np.array_equal(first.state.weights[0], other.state.weights[0])


def test_a_traced_trainer_takes_no_step_and_trains_as_one_that_was_not() -> None:
    # Arrange: two trainers of one model and seed, one traced first.
    traced, plain = trainer("small_cnn"), trainer("small_cnn")
    before = traced.weights()

    # Execute
    traced.trace()
    after = traced.weights()
    ours = traced.train(SHARD.x, SHARD.y, traced.initial_state())
    theirs = plain.train(SHARD.x, SHARD.y, plain.initial_state())

    traced.snapshot(ours.state)

    # Assert: the step was traced once, before training and not again by it; tracing changed
    # no weight, and the trained weights are those of the trainer that was not traced.
    assert traced._train_step.experimental_get_tracing_count() == 1
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    pairs = zip(ours.state.weights, theirs.state.weights, strict=True)
    assert all(np.array_equal(a, b) for a, b in pairs)
    # Each attempt times its first two steps (what its first step's graph's first run cost).
    assert len(ours.first_steps_s) == len(theirs.first_steps_s) == 2
    assert ours.first_step_extra_s is not None
    assert ours.first_step_extra_s == max(0.0, ours.first_steps_s[0] - ours.first_steps_s[1])


def test_an_attempt_of_one_step_says_nothing_of_its_first_steps_extra() -> None:
    one = trainer("mlp")
    one.config = dataclasses.replace(one.config, epochs=1, batch_size=len(SHARD.y))

    report = one.train(SHARD.x, SHARD.y, one.initial_state())

    assert report.steps == 1
    assert len(report.first_steps_s) == 1
    assert report.first_step_extra_s is None


def test_a_state_without_optimizer_variables_starts_from_the_optimizer_as_built() -> None:
    # A warm container's trainer holds the last activation's step and moments: a round's first
    # state (weights only) must train as in a new trainer, not go on from them.
    used = trainer("mlp")
    start = used.initial_state()
    used.train(SHARD.x, SHARD.y, start)
    assert any(np.any(v.numpy()) for v in used.optimizer.variables[2:])
    new = trainer("mlp")
    as_built = [np.asarray(v.numpy()) for v in new.optimizer.variables]

    again = used.train(SHARD.x, SHARD.y, start)
    first = new.train(SHARD.x, SHARD.y, new.initial_state())

    assert all(np.array_equal(a, b) for a, b in zip(used.fresh_optimizer, as_built, strict=True))
    for kept, made in (
        (again.state.weights, first.state.weights),
        (again.state.optimizer, first.state.optimizer),
    ):
        assert all(np.array_equal(a, b) for a, b in zip(kept, made, strict=True))


def test_a_trainer_trains_at_its_configs_learning_rate_not_its_built_or_saved_one() -> None:
    # A warm container's trainer serves every round of a job, and a schedule changes the rate
    # round by round: the rate is the config's, not the one the trainer was built with, nor the
    # one a state (a global model's optimizer variables) was saved at.
    start = trainer("mlp", epochs=1).initial_state()
    used = trainer("mlp", epochs=1)
    saved = used.train(SHARD.x, SHARD.y, start).state  # at the rate it was built with, 0.001
    built_at = trainer("mlp", epochs=1, learning_rate=0.01)
    used.config = built_at.config

    again = used.train(SHARD.x, SHARD.y, start)
    fresh = built_at.train(SHARD.x, SHARD.y, start)
    on_saved = used.train(SHARD.x, SHARD.y, saved)
    on_saved_fresh = built_at.train(SHARD.x, SHARD.y, saved)

    assert float(used.optimizer.learning_rate) == pytest.approx(0.01)
    for a, b in ((again, fresh), (on_saved, on_saved_fresh)):
        pairs = zip(
            a.state.weights + a.state.optimizer, b.state.weights + b.state.optimizer, strict=True
        )
        assert all(np.array_equal(x, y) for x, y in pairs)
    assert not np.array_equal(again.state.weights[0], saved.weights[0])


def test_a_run_stopped_mid_epoch_resumes_in_a_new_trainer_bit_identical() -> None:
    t = trainer("small_cnn")
    uninterrupted = t.train(SHARD.x, SHARD.y, t.initial_state())
    t = trainer("small_cnn")
    saved: list[bytes] = []

    def stop_mid_epoch(progress: TrainState) -> None:
        if (progress.epoch, progress.step) == (1, 7):
            saved.append(t.snapshot(progress).to_bytes())
            raise Stop

    with pytest.raises(Stop):
        t.train(SHARD.x, SHARD.y, t.initial_state(), on_step=stop_mid_epoch)
    resumed_from = TrainState.from_bytes(saved[0])
    fresh = trainer("small_cnn", seed=5)
    fresh.model.set_weights([np.zeros_like(w) for w in fresh.model.get_weights()])

    resumed = fresh.train(SHARD.x, SHARD.y, resumed_from)

    assert (resumed_from.epoch, resumed_from.step) == (1, 7)
    assert resumed.steps == 3 * -(-SHARD.count // 32) - (-(-SHARD.count // 32) + 7)
    pairs = zip(uninterrupted.state.weights, resumed.state.weights, strict=True)
    assert all(np.array_equal(a, b) for a, b in pairs)
    assert resumed.state.epochs == uninterrupted.state.epochs


def test_weights_that_are_no_longer_finite_stop_training_naming_the_learning_rate() -> None:
    # An input near float32's largest makes the first layer's sums overflow: the weights turn
    # NaN at its step (whose loss may stay finite), and every later step would train on them.
    net = build_model("mlp", DIGITS.input_shape, DIGITS.classes, seed=5)
    t = Trainer(net, TrainConfig(batch_size=32, epochs=2, seed=5, optimizer="sgd"))
    x = SHARD.x.copy()
    x[40] = 3e38

    with pytest.raises(TrainingDiverged, match=r"training diverged: .* epoch 1\b") as caught:
        t.train(x, SHARD.y, t.initial_state())
    assert "(sgd, learning rate 0.001 in this action): a lower learning_rate" in str(caught.value)


def test_a_model_whose_test_loss_overflows_is_reported_as_diverged() -> None:
    t = trainer("mlp")
    t.load(TrainState(weights=[w * np.float32(1e30) for w in t.weights()]))  # finite, huge

    with pytest.raises(TrainingDiverged, match=r"the model's loss on 359 examples is (nan|inf)"):
        t.evaluate(DIGITS.x_test, DIGITS.y_test)


def streamed(state: TrainState, piece: int = 1000) -> TensorStream:
    data = b"".join(state.encode())
    return TensorStream(data[i : i + piece] for i in range(0, len(data), piece))


def test_a_state_loaded_as_it_is_read_trains_as_one_loaded_whole() -> None:
    # Arrange: a state with optimizer variables, and one of weights only (a round's first).
    source = trainer("small_cnn")
    full = source.train(SHARD.x, SHARD.y, source.initial_state()).state
    bare = TrainState(weights=full.weights)
    results = {}
    for name, state in {"full": full, "bare": bare}.items():
        whole, streaming = trainer("small_cnn", seed=9), trainer("small_cnn", seed=9)
        whole.load(state)

        # Execute
        streaming.load_streamed(streamed(state))

        ours = streaming.train_on(SHARD.x, SHARD.y, TrainState(weights=[]))  # as loaded
        theirs = whole.train_on(SHARD.x, SHARD.y, TrainState(weights=[]))
        results[name] = (streaming.snapshot(ours.state), whole.snapshot(theirs.state))

    # Assert: bit for bit, optimizer state included (the bare state's from the optimizer as
    # built), at the configured learning rate.
    for by_stream, by_whole in results.values():
        pairs = [*zip(by_stream.weights, by_whole.weights, strict=True)]
        pairs += zip(by_stream.optimizer, by_whole.optimizer, strict=True)
        assert all(np.array_equal(a, b) for a, b in pairs)
    assert not np.array_equal(results["full"][0].weights[0], results["bare"][0].weights[0])


def test_a_streamed_state_that_does_not_fit_the_model_sets_nothing() -> None:
    # Arrange: an MLP's state for a small CNN, and an MLP's weights with a CNN's optimizer
    # variables.
    cnn, mlp = trainer("small_cnn"), trainer("mlp")
    before = cnn.weights()
    wrong = TrainState(weights=mlp.weights())
    mixed = TrainState(weights=cnn.weights(), optimizer=mlp.fresh_optimizer)

    # Execute
    with pytest.raises(ValidationError) as weights:
        cnn.load_streamed(streamed(wrong))
    with pytest.raises(ValidationError) as optimizer:
        cnn.load_streamed(streamed(mixed))

    # Assert
    assert "the weights do not fit the model" in str(weights.value)
    assert "the optimizer state do not fit the model" in str(optimizer.value)
    assert all(np.array_equal(a, b) for a, b in zip(before, cnn.weights(), strict=True))


def test_weights_alone_are_loaded_from_a_state_whose_optimizer_is_another_models() -> None:
    # An evaluation scores a global model whose optimizer state may be of another optimizer.
    loaded, other = trainer("mlp"), trainer("mlp", seed=7)
    state = TrainState(weights=other.weights(), optimizer=[np.ones(3, np.float32)])

    loaded.load_streamed(streamed(state), weights_only=True)

    assert all(np.array_equal(a, b) for a, b in zip(loaded.weights(), state.weights, strict=True))
    fresh = zip(loaded.optimizer.variables, loaded.fresh_optimizer, strict=True)
    assert all(np.array_equal(v.numpy(), f) for v, f in fresh)


@pytest.mark.parametrize("block_bytes", [READ_BLOCK_BYTES, 1000, 1])
def test_a_trained_state_written_a_block_at_a_time_is_its_snapshots_file(block_bytes: int) -> None:
    # 1000 bytes: the kernels read a few rows at a time (the MLP's first, 64 × 128 float32, a
    # row of 512 bytes); 1: a row at a time.
    t = trainer("mlp", epochs=1)
    report = t.train(SHARD.x, SHARD.y, t.initial_state())  # Adam's moments are not zero
    snapshot = t.snapshot(report.state)
    metadata = {"faasdl.architecture": "mlp"}

    streamed = t.written(metadata=metadata, block_bytes=block_bytes)
    data = b"".join(streamed.pieces)

    assert len(data) == streamed.size
    assert data == b"".join(pack(snapshot.weights, metadata=metadata, opt=snapshot.optimizer))
    assert any(a.any() for a in snapshot.optimizer[2:])
