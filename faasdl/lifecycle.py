"""What every seam with a connection has in common: ``open`` and ``close``, and use as a context
manager. Constructors do no I/O; ``open`` does."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class Resource(ABC):
    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @abstractmethod
    def open(self) -> None:
        """Connect or start. Idempotent."""

    @abstractmethod
    def close(self) -> None:
        """Release everything. Idempotent."""
