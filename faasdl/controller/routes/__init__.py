"""One router per resource: ``jobs`` (submission, status, events, model, cancel) and ``ops``
(estimate, health, readiness, metrics)."""
