"""The lab an experiment runs in: a fresh embedded platform, a state store and a runtime manager,
with the helpers every experiment shares (run a workload, check a run from the store)."""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from faasdl.canary.runtime import RuntimeManager
from faasdl.config import private_settings
from faasdl.experiments.runner import InvocationRunner, RunReport, RunSpec
from faasdl.platform.local import LocalPlatform
from faasdl.store import StateStore, absolute_url, action_environment, make_store
from faasdl.store.records import FunctionInfo, UnitState, fn_prefix

log = logging.getLogger(__name__)

#: How long a run waits for the replicas of the runs before it to finish warming up.
SETTLE_TIMEOUT_S = 120.0


@dataclass
class Lab:
    platform: LocalPlatform
    store: StateStore
    store_url: str
    #: The workload action's init parameters: the store's settings (see
    #: :func:`~faasdl.store.action_environment`).
    environment: dict[str, str]
    runtimes: RuntimeManager
    #: Where what a run's containers share lives (a web service's database): the lab's own.
    shared_dir: Path
    #: Where the runs' attempts leave their progress marks (see :mod:`.runner`).
    marks_dir: Path
    restart_store: Callable[[], None] | None = None

    def run(self, spec: RunSpec) -> RunReport:
        """Run ``spec`` once the replicas earlier runs asked for have warmed up (a warm-up takes
        a core for seconds: TensorFlow's import); a run of a strategy without replicas, with
        faults, first drops the spares earlier runs left."""
        if not self.runtimes.settle(timeout_s=SETTLE_TIMEOUT_S):
            log.warning(
                "replicas still warming up after %s s: %s starts anyway",
                SETTLE_TIMEOUT_S,
                spec.run_id,
            )
        runner = InvocationRunner(
            self.platform,
            self.store,
            self.store_url,
            self.runtimes,
            spec,
            restart_store=self.restart_store,
            marks_dir=self.marks_dir,
            environment=self.environment,
        )
        replicas = runner.strategy.replicas(active=spec.concurrency, failures=0, attempts=0)
        if spec.plan.faults and replicas == 0:
            # A strategy without replicas recovers in the pool it would have on its own: the
            # spares earlier runs warmed and released would recover it for free (a TensorFlow
            # container in 0.25 s instead of a 5 s cold start). A failure-free run keeps them:
            # it never looks for a spare, and the canary run after it would warm them again.
            dropped = self.platform.drop_spares()
            if dropped:
                log.debug("%s: %d spare container(s) of earlier runs dropped", spec.run_id, dropped)
        return runner.run()


@contextlib.contextmanager
def open_lab(*, pool_memory_mb: int = 8192, store_url: str | None = None) -> Iterator[Lab]:
    """A lab on a fresh embedded platform; the store is a SQLite file in a temporary directory
    unless ``store_url`` names one."""
    with tempfile.TemporaryDirectory(prefix="faasdl-experiment-") as tmp:
        url = store_url or f"sqlite:///{Path(tmp) / 'state.db'}"
        settings = private_settings(
            local={"pool_memory_mb": pool_memory_mb, "concurrent_invocations": 1000},
            store={"url": url, "spill_dir": tmp},
            users_store=store_url is not None,
        )
        runtimes: RuntimeManager
        with (
            LocalPlatform(settings=settings.local) as platform,
            make_store(settings.store) as store,
        ):
            runtimes = RuntimeManager(platform, tick_s=0.1)
            runtimes.start()
            try:
                marks = Path(tmp) / "marks"
                marks.mkdir()
                environment = action_environment(settings.store)
                yield Lab(
                    platform, store, absolute_url(url), environment, runtimes, Path(tmp), marks
                )
            finally:
                runtimes.close()


@dataclass(frozen=True)
class Ledger:
    """A run as its store records it: every unit's state, result and attempts."""

    units: int
    committed: int
    wrong: list[int]  # units committed with another result than expected
    missing: list[int]  # units not committed
    attempts: int

    @property
    def exactly_once(self) -> bool:
        return not self.wrong and not self.missing


def ledger(store: StateStore, run_id: str, expected: dict[int, str]) -> Ledger:
    """Read every unit of ``run_id`` from the store and check it was committed once, with the
    expected result (a result with a step applied twice or skipped differs: its digest chain and
    step count are in it). A unit record is committed by one compare-and-set only, so a unit
    committed with the right result was committed exactly once."""
    units: dict[int, FunctionInfo] = {}
    for _, found in store.scan(fn_prefix(run_id)):
        unit = FunctionInfo.model_validate(found.value)
        units[unit.shard] = unit
    committed = {i for i, u in units.items() if u.state is UnitState.COMMITTED}
    return Ledger(
        units=len(units),
        committed=len(committed),
        wrong=sorted(i for i in committed if units[i].committed_result != expected.get(i)),
        missing=sorted(set(expected) - committed),
        attempts=sum(u.attempts for u in units.values()),
    )
