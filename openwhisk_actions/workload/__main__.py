"""faasdl's workload action: one invocation of an experiment's workload (see
faasdl.experiments.action). The training workload imports TensorFlow on its first request."""

from faasdl.experiments.action import main

__all__ = ["main"]
