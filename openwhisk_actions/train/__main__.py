"""faasdl's training action: one unit of a round (see faasdl.training.action).

Importing faasdl.training.action imports and configures TensorFlow, so a cold start pays for it in
/init and a warm container does not.
"""

from faasdl.training.action import main

__all__ = ["main"]
