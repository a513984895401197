"""faasdl: deep-learning training on Apache OpenWhisk that survives failures.

Kept free of imports on purpose: the embedded platform's container processes import
``faasdl`` packages on their start path, and every millisecond there is cold-start time.
"""

__version__ = "0.1.0"
