"""Sizing training actions: memory from the model and the data, timeouts from history or cost,
corrections after a failure; pure functions, with the history's I/O in :mod:`.history`."""
