"""What every faasdl action shares: the warm-up answer, per-activation peak memory, errors as
OpenWhisk application errors, and a store connection (and a checkpoint writer process) kept
across warm activations."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from faasdl.canary.checkpoint import write_checkpoint
from faasdl.canary.writer import ProcessWriter
from faasdl.config import StoreSettings
from faasdl.errors import RETRYABLE, FaasdlError, ValidationError
from faasdl.store import StateStore, make_store
from faasdl.training.usage import reset_peak_rss

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
        return handle(args)
    except PydanticValidationError as exc:
        return {"error": str(ValidationError.from_pydantic(exc))}
    except FaasdlError as exc:
        return {"error": str(exc)} | ({RETRYABLE: True} if exc.retryable else {})


def action_store(url: str) -> StateStore:
    """The store at ``url``, opened once per container: a warm activation reuses it."""
    store = _stores.get(url)
    if store is None:
        store = make_store(StoreSettings(), url)
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
