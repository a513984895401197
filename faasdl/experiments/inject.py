"""Failure plans: which invocations of an experiment fail, how and when, drawn from a seed and
written next to every result so that a run can be repeated exactly (the tests use the same format).

A plan is a list of :class:`Fault`, each tied to the first attempt of one invocation (to one copy
of it where a strategy runs several: request replication) and fired when that attempt has run for
``at`` × its expected duration (from its first heartbeat), or, with ``after_checkpoint``, once its
newest checkpoint holds that many steps (a trigger tied to progress, not to the clock, for tests
that must know what a resumed attempt finds):

* ``kill``: SIGKILL the attempt's container (a crash, an OOM kill by the kernel, a lost pod);
* ``zombie``: SIGSTOP it, and SIGCONT it once a newer attempt owns the unit (or it has ended):
  its late writes must be fenced;
* ``node_loss``: SIGKILL every container running at that moment (the embedded platform is one
  node: every attempt in flight is on it);
* ``store_restart``: restart the state store under the running attempts;
* ``crash_point``: the attempt kills its own container the first time it passes ``point``
  (:data:`~faasdl.experiments.action.CrashPoint`): before a checkpoint, between a checkpoint's
  data and its head, after its commit before its reply. ``at`` is unused.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from faasdl.experiments.action import CrashPoint

#: How far into an attempt's expected execution a random fault may come.
REACH = 0.9

FaultKind = Literal["kill", "zombie", "node_loss", "store_restart", "crash_point"]


class Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    invocation: int = Field(ge=0, description="The invocation whose first attempt it hits.")
    copy_index: int = Field(
        0, ge=0, description="Which copy of that attempt (request replication runs several)."
    )
    kind: FaultKind = "kill"
    at: float = Field(0.5, ge=0, le=1, description="Fraction of the expected duration.")
    point: CrashPoint | None = Field(None, description="For crash_point: where.")
    after_checkpoint: int | None = Field(
        None, ge=1, description="Fire once the attempt has checkpointed this many steps."
    )

    @model_validator(mode="after")
    def _point(self) -> Fault:
        if (self.kind == "crash_point") != (self.point is not None):
            raise ValueError("point: set exactly when kind is crash_point")
        if self.kind == "crash_point" and self.after_checkpoint is not None:
            raise ValueError("after_checkpoint: a crash point fires where it is, not after one")
        return self


class FailurePlan(BaseModel):
    """The faults of one run, with the seed and rate they were drawn from (if drawn)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int | None = None
    rate: float | None = Field(None, ge=0, le=1)
    faults: list[Fault] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_per_invocation(self) -> FailurePlan:
        hit = [(f.invocation, f.copy_index) for f in self.faults]
        if len(hit) != len(set(hit)):
            raise ValueError("faults: at most one fault per invocation (and copy)")
        return self

    @classmethod
    def random(
        cls,
        *,
        seed: int,
        invocations: int,
        rate: float,
        kind: FaultKind = "kill",
        copies: int = 1,
    ) -> FailurePlan:
        """``round(rate × invocations)`` distinct invocations, each hit at a uniformly random
        point of the first :data:`REACH` of its expected execution (an attempt a little faster
        than its failure-free reference would otherwise end before a late blow).

        With ``copies`` > 1, each further copy of the first attempts is hit the same way, drawn
        independently: every container fails at the same rate, so all copies of an invocation
        fail together at ``rate ** copies``. The first copy's faults are those of the plan with
        one copy from the same seed: strategies compared on one seed meet the same failures."""
        rng = random.Random(seed)
        faults: list[Fault] = []
        for copy in range(copies):
            hit = sorted(rng.sample(range(invocations), round(rate * invocations)))
            faults += [
                Fault(invocation=i, copy_index=copy, kind=kind, at=round(REACH * rng.random(), 4))
                for i in hit
            ]
        return cls(seed=seed, rate=rate, faults=faults)

    def by_attempt(self) -> dict[tuple[int, int], Fault]:
        """The faults by invocation and copy."""
        return {(f.invocation, f.copy_index): f for f in self.faults}

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.model_dump(mode="json"), indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> FailurePlan:
        return cls.model_validate_json(path.read_text())
