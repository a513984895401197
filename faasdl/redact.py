"""Secrets out of logs and answers: a safety net under the rule that faasdl never formats one in.

:class:`Redactor` replaces every configured secret value (``Settings.secrets()``) and anything
shaped like a faasdl API key with ``***``. :func:`redact_logs` makes every log record of the
process pass through it, whichever library logs it and whichever handler writes it (a log record
factory, since filters on a logger do not see what its children propagate).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from faasdl.controller.auth import KEY_IN_TEXT

MASK = "***"
#: Shorter values are not secrets worth matching (and would mask ordinary words).
MIN_SECRET_CHARS = 6


class Redactor:
    def __init__(self, secrets: Iterable[str]) -> None:
        values = sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)
        parts = [re.escape(v) for v in values] + [KEY_IN_TEXT.pattern]
        self._pattern = re.compile("|".join(parts))

    def __call__(self, text: str) -> str:
        return self._pattern.sub(MASK, text)


_installed: Redactor | None = None


def redact_logs(redactor: Redactor) -> None:
    """Redact every log record made from now on in this process (the last call's secrets)."""
    global _installed
    first = _installed is None
    _installed = redactor
    if not first:
        return
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        active = _installed
        if active is None:
            return record
        message = record.getMessage()
        clean = active(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info:
            # Formatted now, redacted, and kept where every Formatter looks first.
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = active(text)
        return record

    logging.setLogRecordFactory(factory)
