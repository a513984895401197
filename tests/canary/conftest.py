"""The stores of the store tests (SQLite, a private redis-server, Ignite where reachable)."""

from tests.store.conftest import make_store_for, redis_server, store, store_url

__all__ = ["make_store_for", "redis_server", "store", "store_url"]
