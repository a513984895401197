"""The training and aggregation actions as real activations on the embedded platform."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="needs TensorFlow (the 'train' extra)")

from faasdl.actions import AGGREGATE, TRAIN, deploy_variant
from faasdl.aggregation.average import weighted_average
from faasdl.aggregation.tree import aggregator_memory_mb
from faasdl.canary.checkpoint import CanaryArgs
from faasdl.config import Settings, StoreSettings
from faasdl.errors import ValidationError
from faasdl.estimator import history
from faasdl.estimator.planner import EstimateRequest
from faasdl.estimator.sizer import Sizer
from faasdl.platform.classify import classify
from faasdl.platform.local import LocalPlatform
from faasdl.store import StateStore, action_environment, make_store
from faasdl.store.records import CheckpointHead, FunctionInfo, UnitState, fn_key, load, update
from faasdl.training.datasets import DigitsSpec, load_dataset, split_shards
from faasdl.training.models import custom_name
from faasdl.training.tensors import decode, pack, unpack
from tests.conftest import eventually, keras_architecture
from tests.store.conftest import private_redis

pytestmark = pytest.mark.tensorflow
Store = tuple[StateStore, str]


@pytest.fixture(scope="module")
def train(tf_platform: LocalPlatform) -> str:
    return deploy_variant(tf_platform, TRAIN, memory_mb=1024, timeout_ms=120_000, environment={})


@pytest.fixture(scope="module")
def shard(tf_store: Store) -> str:
    store, _ = tf_store
    part = next(split_shards(load_dataset(DigitsSpec()), 2, seed=0))
    store.put_blob("test/shard", part.encode())
    return "test/shard"


def params(url: str, shard: str, **more: object) -> dict[str, object]:
    return {
        "store_url": url, "model": "small_cnn", "classes": 10, "shard": shard,
        "batch_size": 8, "epochs": 4, "seed": 3,
    } | more  # fmt: skip


def claim(store: StateStore, unit: str) -> int:
    """What the controller does before an attempt: owner_epoch e → e+1, the new attempt's token."""

    def change(u: FunctionInfo | None) -> FunctionInfo:
        u = u or FunctionInfo(job_id="test", round=0, shard=0)
        return u.model_copy(update={"owner_epoch": u.owner_epoch + 1, "state": UnitState.RUNNING})

    return update(store, unit, FunctionInfo, change).owner_epoch


def heads(store: StateStore, unit: str) -> list[CheckpointHead]:
    found = load(store, unit, FunctionInfo)
    return found[0].heads if found else []


def test_a_unit_killed_mid_epoch_resumes_from_its_checkpoint_bit_identical(
    tf_platform: LocalPlatform, tf_store: Store, train: str, shard: str
) -> None:
    store, url = tf_store
    whole = tf_platform.call(train, params(url, shard, weights_out="test/whole"))
    assert whole.success, whole.error
    unit = fn_key("test", 0, 0)

    def attempt() -> dict[str, object]:
        canary = CanaryArgs(unit=unit, token=claim(store, unit), blobs="test/ckpt", interval_s=0.2)
        return params(url, shard, weights_out="test/resumed", canary=canary.model_dump())

    # Execute: kill the attempt as soon as it has checkpointed, then run the unit again.
    killed = tf_platform.invoke(train, attempt())
    eventually(lambda: bool(heads(store, unit)), timeout_s=60)
    tf_platform.kill(killed)
    record = tf_platform.wait([killed], timeout_s=30)[killed]
    at_kill = load(store, unit, FunctionInfo)
    assert at_kill is not None
    head = at_kill[0].heads[-1]
    again = tf_platform.call(train, attempt())

    # Assert: the kill landed mid-run, the second attempt resumed there, committed the unit and
    # ended bit-identical; its checkpoints were deleted with the commit.
    assert not record.success
    assert 0 < head.position < whole.response.result["steps"]
    assert again.success, again.error
    assert again.response.result["resumed_from"] == head.position
    assert again.response.result["steps"] == whole.response.result["steps"] - head.position
    mine, theirs = (
        unpack(store.get_blob("test/resumed"))["w"],
        unpack(store.get_blob("test/whole"))["w"],
    )
    assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
    assert again.response.result["epochs"] == whole.response.result["epochs"]
    committed = load(store, unit, FunctionInfo)
    assert committed is not None
    assert committed[0].state is UnitState.COMMITTED
    assert committed[0].committed_result == "test/resumed"
    assert committed[0].heads == []
    assert store.blob_manifest(head.blob) is None


def test_the_action_reports_its_peak_memory_and_phases(
    tf_platform: LocalPlatform, tf_store: Store, train: str, shard: str
) -> None:
    _, url = tf_store

    record = tf_platform.call(train, params(url, shard, weights_out="test/w", epochs=1))

    result = record.response.result
    assert record.success, record.error
    assert 300 < result["peak_rss_mb"] < 1024
    assert set(result["phases_s"]) >= {"load", "build", "train", "save"}
    assert result["examples"] == 719


def test_an_evaluation_scores_with_the_containers_own_model_where_it_holds_one(
    tf_platform: LocalPlatform, tf_store: Store, train: str, shard: str
) -> None:
    # Arrange: weights to score, and a variant of its own (one container, cold).
    _, url = tf_store
    trained = tf_platform.call(train, params(url, shard, weights_out="test/scored", epochs=1))
    assert trained.success, trained.error
    fresh = deploy_variant(tf_platform, TRAIN, memory_mb=1152, timeout_ms=120_000, environment={})
    ask = {
        "mode": "evaluate", "store_url": url, "model": "small_cnn", "classes": 10,
        "weights": "test/scored", "data": shard, "batch_size": 8,
    }  # fmt: skip

    # Execute: score them in the cold container, train there, and score them again.
    cold = tf_platform.call(fresh, ask)
    between = tf_platform.call(fresh, params(url, shard, weights_out="test/between", epochs=1))
    warm = tf_platform.call(fresh, ask)

    # Assert: the second used the trainer the container held (a model built beside it had
    # doubled the model's memory), and scored the same.
    assert all(r.success for r in (cold, between, warm))
    assert cold.response.result["model_reused"] is False
    assert warm.response.result["model_reused"] is True
    assert warm.response.result["accuracy"] == cold.response.result["accuracy"]
    assert warm.response.result["loss"] == pytest.approx(cold.response.result["loss"], rel=1e-6)


def test_early_stopping_at_the_target_loss(
    tf_platform: LocalPlatform, tf_store: Store, train: str, shard: str
) -> None:
    _, url = tf_store

    record = tf_platform.call(
        train, params(url, shard, weights_out="test/w", epochs=50, target_loss=1.5)
    )

    result = record.response.result
    assert result["stopped_early"]
    assert len(result["epochs"]) < 50
    assert result["loss"] <= 1.5


def test_a_prewarmed_container_answers_a_warmup_at_once(
    tf_platform: LocalPlatform, train: str
) -> None:
    assert tf_platform.prewarm(train, 1) == 1

    record = tf_platform.call(train, {"warmup": True})

    assert record.success
    assert record.init_time is None
    assert record.duration is not None
    assert record.duration < 500


@pytest.mark.parametrize("own", [False, True], ids=["zoo", "own architecture"])
def test_a_replica_primed_by_its_warm_up_call_trains_at_once_and_the_same_weights(
    tf_platform: LocalPlatform, tf_store: Store, train: str, shard: str, own: bool
) -> None:
    # Arrange: a variant of its own, so that its one container is the primed replica; a model of
    # the zoo's, or a job's own architecture, which the warm-up call and each unit give.
    _, url = tf_store
    memory = 1088 + own  # a variant of each case's
    replica = deploy_variant(
        tf_platform, TRAIN, memory_mb=memory, timeout_ms=120_000, environment={}
    )
    model: dict[str, object] = {"model": "small_cnn"}
    if own:
        architecture = keras_architecture()
        model = {"model": custom_name(architecture), "architecture": architecture}
    prime = {**model, "input_shape": [8, 8, 1], "classes": 10, "batch_size": 8}
    primed_to, plain_to = f"test/primed-{own}", f"test/plain-{own}"

    # Execute
    ready = tf_platform.prewarm(replica, 1, {"warmup": True, "prime": prime})
    primed = tf_platform.call(replica, params(url, shard, weights_out=primed_to, **model))
    plain = tf_platform.call(train, params(url, shard, weights_out=plain_to, **model))

    # Assert: no cold start, no build, and the weights of any other container.
    assert ready == 1
    assert primed.success, primed.error
    assert primed.init_time is None
    assert primed.response.result["trainer_reused"] is True
    assert plain.success, plain.error
    store, _ = tf_store
    assert store.get_blob(primed_to) == store.get_blob(plain_to)


def test_a_warm_up_call_naming_a_bad_trainer_fails_the_replica(
    tf_platform: LocalPlatform, train: str
) -> None:
    bad = {"model": "gpt", "input_shape": [8, 8, 1], "classes": 10, "batch_size": 8}

    record = tf_platform.call(train, {"warmup": True, "prime": bad})

    assert not record.success
    assert "model" in (record.error or "")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"batch_size": None}, "batch_size"),
        ({"model": "gpt"}, "model"),
        ({"shard": "none"}, "none"),
    ],
)
def test_bad_arguments_are_an_application_error_naming_the_field(
    tf_platform: LocalPlatform, tf_store: Store, train: str, shard: str,
    change: dict[str, object], named: str,
) -> None:  # fmt: skip
    _, url = tf_store
    args = {k: v for k, v in (params(url, shard, weights_out="test/w") | change).items() if v}

    record = tf_platform.call(train, args)

    failure = classify(record)
    assert failure is not None
    assert failure.kind == "application_error"
    assert named in (record.error or "")


def test_the_aggregation_action_writes_the_weighted_mean(
    tf_platform: LocalPlatform, tf_store: Store
) -> None:
    store, url = tf_store
    rng = np.random.default_rng(0)
    models = [
        [rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=2).astype(np.float32)]
        for _ in range(3)
    ]
    for i, weights in enumerate(models):  # what they say of themselves, the last differing
        store.put_blob(f"test/in/{i}", pack(weights, metadata={"arch": "mlp", "n": str(i // 2)}))
    aggregate = deploy_variant(
        tf_platform, AGGREGATE, memory_mb=256, timeout_ms=30_000, environment={}
    )

    record = tf_platform.call(aggregate, {
        "store_url": url, "output": "test/mean",
        "inputs": [{"weights": f"test/in/{i}", "examples": n} for i, n in enumerate((1, 2, 5))],
    })  # fmt: skip

    assert record.success, record.error
    assert record.response.result["examples"] == 8
    groups, metadata = decode(store.get_blob("test/mean"))
    expected = weighted_average(list(zip(models, (1, 2, 5), strict=True)))
    assert all(np.allclose(a, b) for a, b in zip(groups["w"], expected, strict=True))
    assert metadata == {"arch": "mlp"}  # what they all say


def test_a_warm_aggregator_sized_for_its_model_merges_within_its_memory(
    tf_platform: LocalPlatform, tmp_path: Path
) -> None:
    # MobileNetV2's size (26 MB, weights and Adam's moments) in 300 arrays, through Redis: an
    # aggregator holds the float64 mean and an array of the input it reads, and is sized for 2.2
    # copies (154 MB). Holding each input whole, it was sized for three (174 MB); holding the
    # input read before until the next was read, converting arrays whole and making the output
    # beside the whole mean, it peaked at 192 MB. Warm, what each activation left in the heap
    # raised the next one's peak: 161, 171, 171, 187 MB.
    rng = np.random.default_rng(1)
    sizes = rng.multinomial(26 * 2**20 // 12, rng.dirichlet(np.full(300, 0.3)))
    with (
        private_redis(tmp_path / "redis") as server,
        make_store(StoreSettings(), server.url) as store,
    ):
        for i in range(4):
            weights = [rng.standard_normal(int(n), dtype=np.float32) for n in sizes]
            store.put_blob(f"test/big/{i}", pack(weights, opt=weights + weights))
        memory_mb = math.ceil(aggregator_memory_mb(26.0))
        aggregate = deploy_variant(
            tf_platform, AGGREGATE, memory_mb=memory_mb, timeout_ms=60_000, environment={}
        )
        inputs = [{"weights": f"test/big/{i}", "examples": i + 1} for i in range(4)]

        records = [
            tf_platform.call(
                aggregate, {"store_url": server.url, "output": "test/big/mean", "inputs": inputs}
            )
            for _ in range(4)
        ]

        for record in records:
            assert record.success, record.error
            assert record.response.result["peak_rss_mb"] <= memory_mb
        written, read = store.blob_manifest("test/big/mean"), store.blob_manifest("test/big/0")
        assert written is not None
        assert read is not None
        assert written.size == read.size


def test_the_sizer_measures_once_then_learns_from_a_real_run(
    tf_platform: LocalPlatform, tf_store: Store, shard: str
) -> None:
    store, url = tf_store
    sizer = Sizer(platform=tf_platform, store=store, settings=Settings())
    request = EstimateRequest(model="small_cnn", dataset=DigitsSpec(), batch_size=8, epochs=1)
    first = sizer.plan(request)
    probes = len(tf_platform.list_activations())

    again = sizer.plan(request)
    variant = deploy_variant(
        tf_platform,
        TRAIN,
        memory_mb=first.memory_mb,
        timeout_ms=first.timeout_ms,
        environment=action_environment(sizer.settings.store),  # as the sizer's probe's
    )
    record = tf_platform.call(variant, params(url, shard, weights_out="test/w", epochs=1))
    sizer.learn(first, record, classify(record))
    learned = sizer.plan(request)

    assert len(tf_platform.list_activations()) == probes + 1  # the plan probed nothing new
    assert again == first
    assert first.memory_source == "model"
    assert first.memory_mb >= record.response.result["peak_rss_mb"]
    assert (learned.memory_source, learned.timeout_source) == ("history", "history")
    assert learned.memory_mb >= record.response.result["peak_rss_mb"] * 1.1
    assert learned.timeout_ms < first.timeout_ms


def test_a_model_that_cannot_be_built_in_the_largest_memory_is_refused_naming_it(
    tf_platform: LocalPlatform, tf_store: Store
) -> None:
    # 2048×2048×3 inputs give the MLP's first layer 1.6 billion weights (6.4 GB): the probe
    # that measures the model runs out of memory before it has one.
    store, _ = tf_store
    sizer = Sizer(platform=tf_platform, store=store, settings=Settings())
    shape = (2048, 2048, 3)

    with pytest.raises(ValidationError, match="runs out of memory as it is built") as caught:
        sizer.profile(EstimateRequest(model="mlp"), shape, 10)

    assert caught.value.field == "model"
    assert f"({tf_platform.limits().memory_max_mb} MB)" in str(caught.value)
    assert history.read_profile(store, history.profile_name("mlp", shape, 10)) is None


@pytest.mark.parametrize("own", [False, True], ids=["zoo", "own architecture"])
def test_a_model_whose_weights_cannot_be_allocated_is_refused_by_its_probe_naming_it(
    tf_platform: LocalPlatform, tf_store: Store, own: bool
) -> None:
    # Arrange: a last layer of 16 or 64 × 2³¹ − 1 floats, which TensorFlow's allocator refuses
    # outright as the probe builds it (no memory is taken)
    store, _ = tf_store
    sizer = Sizer(platform=tf_platform, store=store, settings=Settings())
    classes = 2**31 - 1
    request = EstimateRequest(model="mlp")
    if own:
        architecture = keras_architecture(classes=classes)
        request = EstimateRequest(model="custom", architecture=architecture)

    # Execute
    with pytest.raises(ValidationError) as caught:
        sizer.profile(request, (8, 8, 1), classes)

    # Assert: refused naming the field, not as the estimator's "measuring profile failed"
    field = "architecture" if own else "model"
    assert caught.value.field == field
    assert f"{request.model_name} for 8×8×1 inputs and 2,147,483,647 classes cannot be" in (
        str(caught.value)
    )
    assert (
        history.read_profile(store, history.profile_name(request.model_name, (8, 8, 1), classes))
        is None
    )


def test_an_action_loads_tensorflow_without_modules_no_action_uses_which_stay_importable() -> None:
    # Keras imports scikit-learn and matplotlib as TensorFlow loads, TensorFlow's Keras 2 SciPy:
    # for wrappers, galleries and sparse inputs no action uses, 1.5 s of every cold start here.
    code = (
        "import sys, faasdl.training.action\n"
        "print(sorted(m for m in ('sklearn', 'matplotlib', 'scipy') if m in sys.modules))\n"
        "import sklearn.datasets\n"
        "print(sklearn.datasets.load_digits().data.shape)\n"
        "import matplotlib.pyplot, scipy.sparse\n"
        "print(scipy.sparse.csr_matrix([[0, 1]]).nnz, matplotlib.pyplot.figure().number)\n"
    )

    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )

    assert ran.stdout.splitlines() == ["[]", "(1797, 64)", "1 1"]
