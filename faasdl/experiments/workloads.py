"""The experiments' workloads: stateful functions that run as OpenWhisk actions and survive
failures through Canary's action-side API (:mod:`faasdl.canary.checkpoint`).

Each workload is a sequence of deterministic steps over a small state: a step is a pure function of
the invocation's parameters, its index and the state before it, so an attempt that resumes from a
checkpoint ends with exactly the result a failure-free run has; the result's digest (with the count
of steps folded into it) is what the unit commits, which lets an experiment check from the store
that no step was lost or applied twice.

* ``training`` (deep learning): a small CNN (or an MLP) on scikit-learn's digits trained with
  faasdl's trainer, one epoch per step, a checkpoint (weights and optimizer state) after each;
* ``compression``: zlib over generated files, a checkpoint after each file;
* ``graph``: breadth-first search over a generated binary tree, a checkpoint every ``every``
  vertices (the frontier is the state);
* ``webservice``: a sequence of requests, each a few queries, against a SQLite database (generated
  on first use; an experiment's containers share one, as the thesis's front-ends share one
  PostgreSQL server), a checkpoint after each request.

Their default sizes follow the thesis's granularity (its BFS checkpoints every million of 50
million vertices, its compression after each of 50 ~1 GB files, its web service after each of 50
requests of five queries): an invocation is a few seconds of a few dozen steps (a checkpoint's
worth of work), each tens of milliseconds or more.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import tempfile
import zlib
from abc import ABC, abstractmethod
from array import array
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from faasdl.store.base import Pieces


class Params(BaseModel):
    """A workload's parameters (every workload adds its own; ``seed`` varies per invocation)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, ge=0, description="Varies the invocation's input.")


@dataclass
class State:
    """Where a run of a workload is: the steps done, a digest chain over their outputs, and the
    workload's own part: ``data`` (JSON-able) and ``blob`` (bytes), or ``live``, the form the
    steps keep it in between them (a BFS's queue; the weights its model holds), which only the
    attempt's next step may use and :meth:`Workload.snapshot` encodes into ``blob`` for a
    checkpoint. Between steps without a checkpoint nothing is encoded, as a function written
    without Canary would not: the failure-free run does no work for checkpoints."""

    done: int = 0
    digest: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    #: Bytes, or a byte view of a buffer the steps after never change (a snapshot's).
    blob: bytes | memoryview = b""
    live: Any = field(default=None, repr=False, compare=False)

    def pieces(self) -> Pieces:
        """The state encoded, in two pieces not joined: a header (its length, then the JSON of
        the rest) and the blob (a checkpoint writer copies a view of a large one once)."""
        if self.live is not None:
            raise ValueError("a state with a live part is encoded from its snapshot")
        head = json.dumps({"done": self.done, "digest": self.digest, "data": self.data}).encode()
        return len(head).to_bytes(4, "big") + head, self.blob

    def encode(self) -> bytes:
        return b"".join(self.pieces())

    @classmethod
    def decode(cls, data: bytes | bytearray) -> State:
        size = int.from_bytes(data[:4], "big")
        head = json.loads(data[4 : 4 + size])
        return cls(head["done"], head["digest"], head["data"], bytes(memoryview(data)[4 + size :]))

    def result(self) -> str:
        """What the unit commits: the digest chain with the number of steps in it."""
        return f"{self.done}:{self.digest}"


def chain(digest: str, output: bytes) -> str:
    return hashlib.sha256(digest.encode() + output).hexdigest()


class Workload(ABC):
    """One kind of stateful function: its parameters, its steps and its per-container context (a
    generated database, a built model) that warm containers keep."""

    name: ClassVar[str]
    params: ClassVar[type[Params]]
    #: What the workload does, for reports.
    description: ClassVar[str]
    #: The memory limit of its action (MB).
    memory_mb: ClassVar[int] = 256

    def context(self, params: Params) -> Any:
        """What a container prepares once for these parameters (kept while it is warm)."""
        return None

    def context_key(self, params: Params) -> str:
        """The parameters :meth:`context` depends on (by default all but the seed)."""
        return params.model_dump_json(exclude={"seed"})

    @abstractmethod
    def steps(self, params: Params) -> int:
        """How many steps one invocation takes."""

    def initial(self, params: Params, context: Any) -> State:
        return State()

    @abstractmethod
    def step(self, params: Params, context: Any, state: State) -> State:
        """Step ``state.done``: a new state. ``state``'s live part, if it has one, is spent (the
        new state may carry it on, changed); the rest of ``state`` is left as it was."""

    def snapshot(self, params: Params, context: Any, state: State) -> State:
        """``state``, the one the attempt's last step returned, with its live part encoded into
        ``blob``: a copy the steps after leave as it is, or a view of what they never change
        (what a checkpoint persists). By default a workload's states have no live part."""
        return state

    def prime(self, params: Params, context: Any) -> None:
        """Run a step once and drop it: a warm replica's first step after a takeover is then as
        fast as any (its code, allocator and caches have been through one)."""
        self.step(params, context, self.initial(params, context))

    def checkpoint_after(self, params: Params, done: int) -> bool:
        """Whether to checkpoint after ``done`` steps (default: after every step)."""
        return True

    def shared(self, params: Params, directory: Path) -> dict[str, Any]:
        """Parameters that keep what every container of a run uses, but none of them owns (a
        database server's data), under ``directory``; by default there is none."""
        return {}


# ---- compression ----------------------------------------------------------------------------


class CompressionParams(Params):
    files: int = Field(16, ge=1, le=10_000, description="Files compressed per invocation.")
    file_kb: int = Field(1024, ge=1, le=65_536, description="Size of each generated file (KiB).")
    level: int = Field(6, ge=0, le=9, description="zlib's compression level.")


class Compression(Workload):
    name = "compression"
    params = CompressionParams
    description = "zlib over generated files, a checkpoint after each file"

    def steps(self, params: Params) -> int:
        assert isinstance(params, CompressionParams)
        return params.files

    def step(self, params: Params, context: Any, state: State) -> State:
        assert isinstance(params, CompressionParams)
        rng = np.random.default_rng([params.seed, state.done])
        # Text-like data: words of a small vocabulary, so that zlib has work to do.
        words = rng.integers(0, 4096, size=params.file_kb * 1024 // 6)
        text = b" ".join(b"w%04x" % w for w in words.tolist())
        packed = zlib.compress(text, params.level)
        data = dict(state.data)
        data["bytes_in"] = data.get("bytes_in", 0) + len(text)
        data["bytes_out"] = data.get("bytes_out", 0) + len(packed)
        return State(state.done + 1, chain(state.digest, packed), data)


# ---- graph search ---------------------------------------------------------------------------


#: The checkpointed frontier's vertex ids, 4 bytes each (a depth of at most 22 keeps them under
#: 2**23): half the bytes of 8-byte ids, and a third less of the writer's time per checkpoint.
FRONTIER_TYPECODE = "I"


class GraphParams(Params):
    depth: int = Field(20, ge=1, le=22, description="Depth of the generated binary tree.")
    every: int = Field(65_536, ge=1, description="Vertices visited between two checkpoints.")


class GraphSearch(Workload):
    """BFS from the root of a complete binary tree whose vertices carry seeded weights; the search
    sums the weights of each level and hashes the visiting order."""

    name = "graph"
    params = GraphParams
    description = "breadth-first search over a generated binary tree, a checkpoint every N vertices"

    def _vertices(self, params: GraphParams) -> int:
        return int(2 ** (params.depth + 1) - 1)

    def context_key(self, params: Params) -> str:
        return params.model_dump_json()

    def context(self, params: Params) -> Any:
        assert isinstance(params, GraphParams)
        rng = np.random.default_rng(params.seed)
        return rng.integers(0, 1_000_000, size=self._vertices(params), dtype=np.int64)

    def steps(self, params: Params) -> int:
        assert isinstance(params, GraphParams)
        return -(-self._vertices(params) // params.every)

    def initial(self, params: Params, context: Any) -> State:
        return State(data={"sum": 0}, blob=array(FRONTIER_TYPECODE, [0]).tobytes())

    def step(self, params: Params, context: Any, state: State) -> State:
        assert isinstance(params, GraphParams)
        n, weights = self._vertices(params), context
        queue: _Queue = state.live if state.live is not None else _Queue.of(state.blob, n)
        items, head, tail = queue.items, queue.head, queue.tail
        total, order = state.data["sum"], hashlib.sha256()
        for _ in range(params.every):
            if head == tail:
                break
            v = items[head]
            head += 1
            total += int(weights[v])
            order.update(v.to_bytes(8, "big"))
            for c in (2 * v + 1, 2 * v + 2):
                if c < n:
                    items[tail] = c
                    tail += 1
        queue.head, queue.tail = head, tail
        return State(
            state.done + 1,
            chain(state.digest, order.digest() + total.to_bytes(16, "big")),
            {"sum": total},
            live=queue,
        )

    def snapshot(self, params: Params, context: Any, state: State) -> State:
        if state.live is None:
            return state
        queue: _Queue = state.live
        # A view, not a copy: the steps after write only past the tail (each vertex once) and
        # the queue never grows, so what lies between head and tail stays as it is.
        blob = memoryview(queue.items)[queue.head : queue.tail].cast("B")
        return State(state.done, state.digest, state.data, blob)


@dataclass
class _Queue:
    """A BFS's queue as its live state: an array with room for every vertex (each enters once),
    read from ``head``, written at ``tail``. It is never resized during a search: an array
    extended at its tail and cut at its head made the steps take 5-8% more CPU with checkpoints
    persisted beside them than without (this one: under 1%). A snapshot of the frontier is one
    copy of its bytes (from a deque of ints, 6 ms a MiB)."""

    items: array[int]
    head: int
    tail: int

    @classmethod
    def of(cls, frontier: bytes | memoryview, vertices: int) -> _Queue:
        loaded = array(FRONTIER_TYPECODE)
        loaded.frombytes(frontier)
        items = array(FRONTIER_TYPECODE, [0]) * vertices
        items[: len(loaded)] = loaded
        return cls(items, 0, len(loaded))


# ---- web service ----------------------------------------------------------------------------


class WebServiceParams(Params):
    requests: int = Field(50, ge=1, le=100_000, description="Requests per invocation.")
    queries: int = Field(5, ge=1, le=100, description="Queries per request.")
    rows: int = Field(50_000, ge=1, le=5_000_000, description="Rows of the generated table.")
    database: str | None = Field(
        None,
        description=(
            "The SQLite file the requests query, generated there if missing; containers that "
            "name the same file share it as the thesis's front-ends share one PostgreSQL "
            "server. Default: one in the container's temporary directory."
        ),
    )


class WebService(Workload):
    """Requests against a SQLite database the container generates on its first request (an
    ``orders`` table with an index); each request is ``queries`` queries of a few seeded shapes
    (the thesis's requests are five queries each)."""

    name = "webservice"
    params = WebServiceParams
    description = (
        "requests of a few queries against a local SQLite database, a checkpoint after each"
    )

    def shared(self, params: Params, directory: Path) -> dict[str, Any]:
        assert isinstance(params, WebServiceParams)
        return {"database": str(directory / f"webservice-{params.rows}.db")}

    def context(self, params: Params) -> Any:
        assert isinstance(params, WebServiceParams)
        path = (
            Path(params.database)
            if params.database
            else Path(tempfile.gettempdir()) / f"faasdl-webservice-{params.rows}.db"
        )
        if not path.exists():
            # A partial file of this process's own: containers that share the database may
            # generate it at once, and each renames a whole one into place.
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
            os.close(fd)
            partial = Path(name)
            try:
                rng = np.random.default_rng(params.rows)
                with sqlite3.connect(partial) as db:
                    db.execute(
                        "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER,"
                        " category INTEGER, price REAL, quantity INTEGER)"
                    )
                    db.executemany(
                        "INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                        zip(
                            range(params.rows),
                            rng.integers(0, 5000, params.rows).tolist(),
                            rng.integers(0, 40, params.rows).tolist(),
                            np.round(rng.uniform(1, 500, params.rows), 2).tolist(),
                            rng.integers(1, 10, params.rows).tolist(),
                            strict=True,
                        ),
                    )
                    db.execute("CREATE INDEX orders_customer ON orders (customer)")
                db.close()
                partial.replace(path)  # whole or not at all
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)

    def steps(self, params: Params) -> int:
        assert isinstance(params, WebServiceParams)
        return params.requests

    def step(self, params: Params, context: Any, state: State) -> State:
        assert isinstance(params, WebServiceParams)
        rng = np.random.default_rng([params.seed, state.done])
        answers = [_query(context, rng) for _ in range(params.queries)]
        return State(state.done + 1, chain(state.digest, json.dumps(answers).encode()), {})


def _query(db: sqlite3.Connection, rng: np.random.Generator) -> list[Any]:
    """One query of a seeded shape."""
    shape = int(rng.integers(0, 3))
    if shape == 0:  # a customer's orders (the index)
        rows = db.execute(
            "SELECT id, price * quantity FROM orders WHERE customer = ? ORDER BY id",
            (int(rng.integers(0, 5000)),),
        ).fetchall()
    elif shape == 1:  # revenue per category in a price band (a scan)
        low = float(rng.uniform(1, 400))
        rows = db.execute(
            "SELECT category, COUNT(*), ROUND(SUM(price * quantity), 2) FROM orders"
            " WHERE price BETWEEN ? AND ? GROUP BY category ORDER BY category",
            (low, low + 100),
        ).fetchall()
    else:  # the top customers of a category (a scan and a sort)
        rows = db.execute(
            "SELECT customer, ROUND(SUM(price * quantity), 2) AS spent FROM orders"
            " WHERE category = ? GROUP BY customer ORDER BY spent DESC, customer LIMIT 10",
            (int(rng.integers(0, 40)),),
        ).fetchall()
    return rows


# ---- deep learning --------------------------------------------------------------------------


class TrainingParams(Params):
    model: Literal["small_cnn", "mlp"] = Field(
        "small_cnn", description="The model trained (faasdl's models of those names)."
    )
    epochs: int = Field(8, ge=1, le=1000, description="Epochs per invocation (one per step).")
    examples: int = Field(1437, ge=32, le=1437, description="Training digits used.")
    batch_size: int = Field(32, ge=1, le=1024, description="Examples per batch.")


@dataclass
class _Trainer:
    trainer: Any
    x: np.ndarray
    y: np.ndarray
    classes: int


class Training(Workload):
    """faasdl's trainer on scikit-learn's digits, one epoch per step; TensorFlow is imported by
    the container's first request (a warm replica has).

    Its model is by default the small CNN, as the thesis's is a CNN (ResNet50 on MNIST, 50
    epochs a function): a convolution does more work per weight than a dense layer, so an
    epoch's work weighs more against its checkpoint's size. The MLP's epoch of batches of 32
    takes ~60 ms against a checkpoint of 200 KiB, the CNN's ~200 ms against 420 KiB."""

    name = "training"
    params = TrainingParams
    memory_mb = 1024  # TensorFlow
    description = "a CNN trained on digits with faasdl's trainer, a checkpoint after each epoch"

    def context(self, params: Params) -> Any:
        assert isinstance(params, TrainingParams)
        from faasdl.training.datasets import DigitsSpec, load_dataset
        from faasdl.training.loop import TrainConfig, Trainer, configure_runtime
        from faasdl.training.models import build_model

        configure_runtime()
        data = load_dataset(DigitsSpec())
        model = build_model(params.model, data.input_shape, data.classes, seed=0)
        trainer = Trainer(model, TrainConfig(batch_size=params.batch_size, epochs=1))
        x, y = data.x_train[: params.examples], data.y_train[: params.examples]
        # One step now traces the train step (~0.4 s): a warm replica's first step is then as
        # fast as any. An attempt's first step loads its weights and optimizer state, so this
        # one leaves nothing behind.
        trainer.train(x[: params.batch_size], y[: params.batch_size], trainer.initial_state())
        return _Trainer(trainer, x, y, data.classes)

    def steps(self, params: Params) -> int:
        assert isinstance(params, TrainingParams)
        return params.epochs

    def initial(self, params: Params, context: Any) -> State:
        from faasdl.training.tensors import TrainState

        job: _Trainer = context
        # The same initial weights in every container, drawn from the seed as Keras's Dense
        # layers draw theirs (Glorot-uniform kernels, zero biases), into the container's model's
        # shapes: building a fresh Keras model here took 50-100 ms, and slowed the step after it
        # by as much again.
        rng = np.random.default_rng([params.seed, 1])
        weights = [_glorot_uniform(rng, v.shape) for v in job.trainer.weights()]
        # A fresh optimizer too (step 0, the learning rate, zero moments): the container's
        # trainer holds the last invocation's.
        optimizer = job.trainer.fresh_optimizer
        return State(blob=TrainState(weights=weights, optimizer=optimizer).to_bytes())

    def step(self, params: Params, context: Any, state: State) -> State:
        """An epoch. The live part is the state's counters: its weights and optimizer variables
        are the model's (an attempt's first step loads them from ``blob``). The digest chains
        each epoch's loss and accuracy, and after the last the model's bytes."""
        from faasdl.training.loop import TrainConfig
        from faasdl.training.tensors import TrainState

        assert isinstance(params, TrainingParams)
        job: _Trainer = context
        counters = state.live
        if counters is None:
            loaded = TrainState.from_bytes(bytes(state.blob))  # bytes() copies no bytes object
            job.trainer.load(loaded)
            counters = replace(loaded, weights=[], optimizer=[])
        job.trainer.config = TrainConfig(
            batch_size=params.batch_size,
            epochs=state.done + 1,
            seed=params.seed,
        )
        counters = job.trainer.train_on(job.x, job.y, counters).state
        output = json.dumps(counters.epochs[-1]).encode()  # floats as repr: exact
        if state.done + 1 == self.steps(params):
            output += job.trainer.snapshot(counters).to_bytes()
        return State(state.done + 1, chain(state.digest, output), live=counters)

    def snapshot(self, params: Params, context: Any, state: State) -> State:
        if state.live is None:
            return state
        job: _Trainer = context
        return State(state.done, state.digest, blob=job.trainer.snapshot(state.live).to_bytes())


def _glorot_uniform(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A kernel drawn from U(±√(6 / (fan_in + fan_out))), or zeros for a bias (1-D); a
    convolution's fans count its receptive field, as Keras's do."""
    if len(shape) < 2:
        return np.zeros(shape, dtype=np.float32)
    receptive = int(np.prod(shape[:-2]))
    limit = np.sqrt(6 / (receptive * (shape[-2] + shape[-1])))
    return rng.uniform(-limit, limit, size=shape).astype(np.float32)


WORKLOADS: dict[str, Workload] = {
    w.name: w for w in (Training(), Compression(), GraphSearch(), WebService())
}


def workload(name: str) -> Workload:
    from faasdl.errors import ValidationError

    try:
        return WORKLOADS[name]
    except KeyError:
        known = ", ".join(WORKLOADS)
        raise ValidationError(f"workload: unknown workload {name!r} (known: {known})") from None


def run_steps(
    workload: Workload, params: Params, context: Any, state: State | None = None
) -> State:
    """Every step of an invocation in this process, without checkpoints (the expected result)."""
    state = state or workload.initial(params, context)
    while state.done < workload.steps(params):
        state = workload.step(params, context, state)
    return state
