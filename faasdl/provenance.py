"""Where a run's figures came from: the machine, the Python and faasdl it ran on, and the
``FAASDL_`` variables it ran with. An experiment's summary and every benchmark's JSON carry it,
so that a figure can be set beside another machine's or reproduced."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from typing import Any
from urllib.parse import urlsplit

import psutil

from faasdl import __version__
from faasdl.config import given_variables, secret_variables
from faasdl.redact import MASK


def environment() -> dict[str, Any]:
    """The machine and the settings: faasdl's and Python's versions, the OS, CPUs, memory, the
    date, and ``settings`` (:func:`settings_in_environment`)."""
    return {
        "faasdl": __version__,
        "python": sys.version.split()[0],
        "os": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "settings": settings_in_environment(),
    }


def settings_in_environment() -> dict[str, str]:
    """The ``FAASDL_`` variables this process was given (the test suite's ``FAASDL_TEST_`` ones
    left out), from which a benchmark's or an experiment's platform and store take every setting
    the run does not choose itself. Secrets are masked, and so is a URL's password."""
    secret = secret_variables()
    return {
        var: MASK if var in secret else _without_password(os.environ[var])
        for var in given_variables()
    }


def _without_password(value: str) -> str:
    # Not store.shown_url: that leaves the password out and makes a SQLite path absolute, where a
    # report quotes the variable as it was given, the password's place kept.
    try:
        password = urlsplit(value).password
    except ValueError:  # not a URL (an unclosed "[" reads as a bad IPv6 host)
        return value
    return value.replace(f":{password}@", f":{MASK}@", 1) if password else value
