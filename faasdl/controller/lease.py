"""The store's controller lease: one controller at a time runs the jobs of a store.

Two controllers on one store would run the same jobs' rounds twice, each claim fencing the other's
attempts. A running controller holds the record :data:`LEASE_KEY`, renewed every third of
``FAASDL_CONTROLLER__LEASE_S``, and deletes it as it closes. A controller that starts and finds
the record watches it: renewed meanwhile, another controller runs, and it refuses to start,
naming it; unchanged for ``lease_s`` on its own clock (no two machines' clocks are compared), its
holder died, and it takes the lease over. A controller that finds its lease taken (it was stopped
or cut off from the store longer than ``lease_s``) stops running jobs.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from faasdl.errors import ConfigError, StoreError
from faasdl.store.base import StateStore

log = logging.getLogger(__name__)

LEASE_KEY = "controller/lease"


class AnotherController(ConfigError):
    """Another controller runs on the store (it renewed the lease while this one watched it)."""


class ControllerLease:
    """The lease of one controller on ``store``."""

    def __init__(self, store: StateStore, *, lease_s: float) -> None:
        self.store = store
        self.lease_s = lease_s
        self.holder = uuid.uuid4().hex
        self._since_ms: int | None = None
        self._version: int | None = None  # the record's version while this controller holds it
        #: Set once another controller took the lease (or it was deleted) while this one held
        #: it; ``loss`` says which.
        self.lost = threading.Event()
        self.loss = ""

    @property
    def held(self) -> bool:
        return self._version is not None

    def acquire(self, stop: threading.Event | None = None) -> None:
        """Hold the lease: at once if no controller holds it, after ``lease_s`` if its holder
        stopped renewing it. Raises ``AnotherController`` if it is renewed while this waits, and
        ``StoreError`` as the store does; ``stop`` set gives up waiting (``ConfigError``)."""
        stop = stop or threading.Event()
        seen: tuple[int, float] | None = None  # the holder's record version, and when first seen
        while not self.held:
            current = self.store.get(LEASE_KEY)
            if current is None:
                self._since_ms = _now_ms()
                if self.store.put_if_absent(LEASE_KEY, self._record()):
                    self._version = 1
                continue
            now = time.monotonic()
            if seen is None:
                seen = (current.version, now)
                log.warning(
                    "the store's controller lease is held by %s; waiting %g s "
                    "(FAASDL_CONTROLLER__LEASE_S) for it to lapse",
                    _holder(current.value),
                    self.lease_s,
                )
            elif current.version != seen[0]:
                raise AnotherController(_running(current.value, self.lease_s))
            elif now - seen[1] >= self.lease_s:
                self._since_ms = _now_ms()
                if self.store.compare_and_set(LEASE_KEY, current.version, self._record()):
                    self._version = current.version + 1
                    log.warning(
                        "took over the store's controller lease from %s, which stopped renewing it",
                        _holder(current.value),
                    )
                continue
            if stop.wait(min(0.5, self.lease_s / 10)):
                raise ConfigError("the controller closed while it waited for the store's lease")

    def renew(self) -> bool:
        """Renew the lease; ``False`` once another controller holds it. A store that does not
        answer is tried again at the next renewal (meanwhile the lease may lapse)."""
        if self._version is None:
            return False
        try:
            if self.store.compare_and_set(LEASE_KEY, self._version, self._record()):
                self._version += 1
                return True
            current = self.store.get(LEASE_KEY)
        except StoreError as exc:
            log.warning("the store's controller lease was not renewed: %s", exc)
            return True
        self._version = None
        self.loss = "it was deleted" if current is None else f"{_holder(current.value)} took it"
        self.lost.set()
        log.error("this controller lost the store's lease (%s): it stops running jobs", self.loss)
        return False

    def release(self) -> None:
        """Delete the lease, if this controller still holds it: the next starts at once."""
        if self._version is None:
            return
        try:
            self.store.delete(LEASE_KEY, expected_version=self._version)
        except StoreError as exc:  # the next controller waits the lease out
            log.warning("the store's controller lease was not released: %s", exc)
        self._version = None

    def _record(self) -> dict[str, Any]:
        return {
            "holder": self.holder,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since_ms": self._since_ms,
            "renewed_ms": _now_ms(),
        }


def _now_ms() -> int:
    return int(time.time() * 1000)


def _holder(record: dict[str, Any]) -> str:
    return f"the controller on {record.get('host')} (pid {record.get('pid')})"


def _running(record: dict[str, Any], lease_s: float) -> str:
    return (
        f"another controller runs on this store: {record.get('host')} (pid {record.get('pid')}) "
        f"renewed its lease within {lease_s:g} s; stop it first (two controllers would run the "
        "same jobs twice)"
    )
