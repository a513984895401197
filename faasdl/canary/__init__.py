"""Canary: checkpoints, warm runtime replicas, failure detection and exactly-once recovery
(DESIGN.md §3–4). ``checkpoint`` is the action side; ``core``, ``runtime`` and ``strategies`` are
the controller side."""
