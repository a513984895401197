"""What every faasdl action shares: the warm-up answer, per-activation peak memory, errors as
OpenWhisk application errors, a stack dump before the time limit, and a store connection (and a
checkpoint writer process) kept across warm activations."""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from faasdl.canary.checkpoint import deadline_s, write_checkpoint
from faasdl.canary.writer import ProcessWriter
from faasdl.errors import RETRYABLE, FaasdlError, ValidationError
from faasdl.store import StateStore, action_store_settings, make_store
from faasdl.training.usage import reset_peak_rss

#: Share of the time left at the start of an activation after which its stacks are dumped
#: (:func:`stacks_dumped_before_deadline`), and the most time left between the dump and the limit.
STACK_DUMP_AT = 0.9
STACK_DUMP_BEFORE_DEADLINE_S = 1.0

_stores: dict[str, StateStore] = {}
_writers: dict[str, ProcessWriter] = {}


def serve(
    args: dict[str, Any],
    handle: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    warm: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Answer ``{"warmup": true}`` once ``warm`` (if any) has prepared what the call names;
    otherwise run ``handle`` with a fresh memory peak.

    Bad arguments and faasdl errors come back as ``{"error": "<field>: <message>"}``, which
    OpenWhisk records as an application error (no retry would help); an error that a later
    attempt may not meet (the store was unreachable) adds ``"retryable": true``.
    """
    reset_peak_rss()
    try:
        if args.get("warmup"):
            if warm is not None:
                warm(args)
            return {"warm": True, "pid": os.getpid()}
        with stacks_dumped_before_deadline():
            return handle(args)
    except PydanticValidationError as exc:
        return {"error": str(ValidationError.from_pydantic(exc))}
    except FaasdlError as exc:
        return {"error": str(exc)} | ({RETRYABLE: True} if exc.retryable else {})


@contextlib.contextmanager
def stacks_dumped_before_deadline() -> Iterator[None]:
    """Dump every thread's stack to stderr (the activation's logs) shortly before the activation's
    deadline (``__OW_DEADLINE``), if it is still running then: the platform's kill at the time
    limit leaves no trace of where an action was stuck. Nothing is armed without a deadline.

    The dump comes once :data:`STACK_DUMP_AT` of the time left has passed, and at most
    :data:`STACK_DUMP_BEFORE_DEADLINE_S` before the deadline. A thread of its own writes it while
    holding the GIL, so no other thread's frames change under it: faulthandler's watchdog, which
    reads them without the GIL, crashed a training action mid-dump (its activation a crash, not
    out of time). An action whose thread keeps the GIL until the deadline gets no dump."""
    deadline = deadline_s()
    left_s = deadline - time.time() if deadline is not None else 0.0
    timer: threading.Timer | None = None
    if left_s > 0 and _has_fd(sys.stderr):
        timer = threading.Timer(
            max(STACK_DUMP_AT * left_s, left_s - STACK_DUMP_BEFORE_DEADLINE_S), _dump_stacks
        )
        timer.name = "stack-dump"
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


def _has_fd(stream: Any) -> bool:
    """Whether ``stream`` has a file descriptor (a stderr captured in a test, or none, has not)."""
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True


def _dump_stacks() -> None:
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def action_store(url: str) -> StateStore:
    """The store at ``url``, opened once per container (a warm activation reuses it) with the
    settings its environment holds (:func:`~faasdl.store.action_store_settings`)."""
    store = _stores.get(url)
    if store is None:
        store = make_store(action_store_settings(), url)
        store.open()
        _stores[url] = store
    return store


def action_writer(url: str) -> ProcessWriter:
    """A checkpoint writer process for the store at ``url``, started by the container's first
    call for it and kept while the container is warm (see :mod:`faasdl.canary.writer`)."""
    writer = _writers.get(url)
    if writer is None:
        store = action_store(url)
        writer = _writers[url] = ProcessWriter(url, functools.partial(write_checkpoint, store))
    return writer
