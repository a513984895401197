"""Benchmarks behind ``faasdl bench …``: each returns a dict the CLI prints as JSON."""
