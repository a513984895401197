"""faasdl's aggregation action: the weighted mean of models (see faasdl.aggregation.action)."""

from faasdl.aggregation.action import main

__all__ = ["main"]
