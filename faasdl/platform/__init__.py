"""FaaS platforms behind one seam (:class:`~faasdl.platform.base.Platform`), chosen by name."""

from __future__ import annotations

from collections.abc import Callable

from faasdl.config import Settings
from faasdl.platform.base import Platform
from faasdl.platform.local import LocalPlatform
from faasdl.platform.openwhisk import OpenWhiskPlatform

#: Every implementation, by the name ``Settings.platform`` selects, built from its own section of
#: the settings.
PLATFORMS: dict[str, Callable[[Settings], Platform]] = {
    "local": lambda s: LocalPlatform(settings=s.local),
    "openwhisk": lambda s: OpenWhiskPlatform(settings=s.openwhisk),
}


def make_platform(settings: Settings) -> Platform:
    """The platform ``settings.platform`` names, constructed but not opened (no I/O)."""
    return PLATFORMS[settings.platform](settings)


__all__ = ["PLATFORMS", "Platform", "make_platform"]
