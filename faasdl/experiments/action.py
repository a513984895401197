"""The workload action's logic, behind ``openwhisk_actions/workload/__main__.py``: one invocation
of an experiment's workload (:mod:`.workloads`) as a Canary stateful function.

* ``{"warmup": true, "prime": {"workload", "params", "store_url"?}}``: prepare the workload's
  context (a warm replica of the training workload imports TensorFlow and builds its trainer),
  run one step and drop it (:meth:`~.workloads.Workload.prime`: a first step in a fresh process
  took 10-15 ms longer, for compression and the web service), start the checkpoint writer
  process for ``store_url`` if given and wait until it is ready, and answer;
* ``{"workload", "params", "store_url", "canary", "crash"?}`` (:class:`WorkloadArgs`): resume
  from the unit's newest checkpoint (or start), run the remaining steps with a checkpoint after
  each (when the attempt checkpoints; the container's writer process persists them, see
  :mod:`faasdl.canary.writer`), and commit the result through the fenced API; ``crash`` kills the
  container at a named crash point (failure injection); ``marks`` names a file the attempt
  appends its progress to, a line ``<steps done> <unix time>`` as its first step starts and as
  each step ends (the experiments read a killed attempt's to know how far it had got).

An attempt's answer says what CPU it took: ``cpu_s``, its process's (every thread's), and
``writer_cpu_s``, its checkpoint writer's beside it (``None`` without one, or where the kernel
does not say): the writer runs on another core, but on a machine whose cores slow each other
(this VM's two vCPUs) it slows the function as it runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from faasdl.actionkit import action_store, action_writer, serve
from faasdl.canary.checkpoint import HOST, CanaryArgs, Checkpointer
from faasdl.canary.writer import ProcessWriter
from faasdl.experiments.workloads import Params, State, Workload, workload

CrashPoint = Literal["before_checkpoint", "blob_written", "committed"]
#: Contexts a container keeps (a generated database, a built trainer, a graph's weights).
CONTEXTS_KEPT = 4
#: How long a replica's warm-up waits for its checkpoint writer to start (~0.5 s).
WRITER_START_TIMEOUT_S = 30.0


class CrashAt(BaseModel):
    """Kill the container the ``nth`` time the attempt passes ``point``."""

    model_config = ConfigDict(extra="forbid")

    point: CrashPoint
    nth: int = Field(1, ge=1)


class Prime(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload: str
    params: dict[str, Any] = Field(default_factory=dict)
    store_url: str | None = Field(None, description="Start a checkpoint writer for this store.")


class WorkloadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload: str
    params: dict[str, Any] = Field(default_factory=dict)
    store_url: str
    canary: CanaryArgs
    crash: CrashAt | None = None
    marks: str | None = Field(None, description="A file to append the attempt's progress to.")


_contexts: OrderedDict[str, Any] = OrderedDict()


def main(args: dict[str, Any]) -> dict[str, Any]:
    return serve(args, _handle, warm=_warm)


def _warm(args: dict[str, Any]) -> None:
    if args.get("prime") is not None:
        prime = Prime.model_validate(args["prime"])
        found = workload(prime.workload)
        params = found.params.model_validate(prime.params)
        found.prime(params, _context(found, params))
        if prime.store_url is not None:
            # A replica is warm once its writer is: one still starting would take a core from
            # the attempt that resumes on it, and leave that attempt to write its own checkpoints.
            action_writer(prime.store_url).wait_ready(WRITER_START_TIMEOUT_S)


def _context(found: Workload, params: Params) -> Any:
    """The workload's context for ``params``, prepared once per container."""
    key = f"{found.name}:{found.context_key(params)}"
    if key not in _contexts:
        _contexts[key] = found.context(params)
        while len(_contexts) > CONTEXTS_KEPT:
            _contexts.popitem(last=False)
    _contexts.move_to_end(key)
    return _contexts[key]


def _handle(raw: dict[str, Any]) -> dict[str, Any]:
    args = WorkloadArgs.model_validate(raw)
    found = workload(args.workload)
    params = found.params.model_validate(args.params)
    started = time.perf_counter()
    context = _context(found, params)
    context_ms = (time.perf_counter() - started) * 1000
    canary = args.canary
    writer = action_writer(args.store_url) if canary.checkpoints else None
    store = action_store(args.store_url)
    cpu_started, writer_started = time.process_time(), _writer_cpu_s(writer)
    with (
        Checkpointer(store, canary, probe=_crasher(args.crash), writer=writer) as ckpt,
        _marking(args.marks) as mark,
    ):
        started_at = time.time()  # the attempt's first heartbeat (faults are timed from it)
        restored = ckpt.restore(State.decode) if canary.checkpoints else None
        state = restored[0] if restored else found.initial(params, context)
        resumed_from = state.done if restored else None
        first_step_at = time.time()
        mark(state.done, first_step_at)
        step_ends: list[float] = []
        total = found.steps(params)
        while state.done < total:
            state = found.step(params, context, state)
            step_ends.append(time.time())
            mark(state.done, step_ends[-1])
            ckpt.check()
            if (
                state.done < total
                and canary.checkpoints
                and found.checkpoint_after(params, state.done)
            ):
                ckpt.checkpoint(_taken(found, params, context, state), State.pieces, state.done)
        ckpt.commit(state.result())
    writer_ended = _writer_cpu_s(writer)
    return {
        "result": state.result(),
        "resumed_from": resumed_from,
        "steps_run": total - (resumed_from or 0),
        "started_at": started_at,
        "first_step_at": first_step_at,
        "step_ends": [round(t, 4) for t in step_ends],
        "context_ms": round(context_ms, 2),
        "checkpoints": ckpt.persisted,
        "checkpoint_stall_ms_p50": (
            round(1000 * statistics.median(ckpt.stalls_s), 3) if ckpt.stalls_s else None
        ),
        "host": HOST,
        "cpu_s": round(time.process_time() - cpu_started, 4),
        "writer_cpu_s": (
            round(writer_ended - writer_started, 4)
            if writer_ended is not None and writer_started is not None
            else None
        ),
    }


def _writer_cpu_s(writer: ProcessWriter | None) -> float | None:
    """The CPU time the checkpoint writer process has run so far (its one thread's, in ns in
    ``/proc/PID/schedstat``: ``/proc/PID/stat``'s ticks are 10 ms, as long as a checkpoint's
    writes); ``None`` without a writer or where the kernel keeps no such file."""
    if writer is None:
        return None
    try:
        with open(f"/proc/{writer.pid}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _taken(found: Workload, params: Params, context: Any, state: State) -> Callable[[], State]:
    """The snapshot of the state a step just returned (its live part encoded: the next step
    changes that part in place)."""
    return lambda: found.snapshot(params, context, state)


@contextlib.contextmanager
def _marking(path: str | None) -> Iterator[Callable[[int, float], object]]:
    """Append ``<steps done> <time>`` lines to the file at ``path`` (nothing if ``None``): one
    unbuffered write each, so that a kill of the container loses none written before it."""
    if path is None:
        yield lambda done, at: None
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        yield lambda done, at: os.write(fd, f"{done} {at:.6f}\n".encode())
    finally:
        os.close(fd)


def _crasher(crash: CrashAt | None) -> Callable[[str], None] | None:
    if crash is None:
        return None
    seen = 0

    def probe(point: str) -> None:
        nonlocal seen
        if point == crash.point:
            seen += 1
            if seen == crash.nth:
                os.kill(os.getpid(), signal.SIGKILL)

    return probe
