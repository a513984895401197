"""The embedded OpenWhisk-like platform: container processes, pool, invoker, REST server."""

from faasdl.platform.local.embedded import LocalPlatform

__all__ = ["LocalPlatform"]
