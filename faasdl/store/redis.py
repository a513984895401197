"""``RedisStore``: records as hashes ``{v: version, d: data}`` changed only by Lua scripts (atomic,
one round trip), with their keys in a sorted set read by prefix (``ZRANGEBYLEX``: a scan costs
the records it finds, not the whole key space), blob chunks as plain strings written in
pipelines. Durability is the server's:
run it with ``appendonly yes`` and ``appendfsync always`` for acknowledged writes to survive a
crash (reference/fault-tolerance.md §5)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import redis
from redis.commands.core import Script
from tenacity import (
    before_sleep_log,
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from faasdl.errors import StoreFull, StoreUnavailable
from faasdl.store.base import StateStore

log = logging.getLogger(__name__)
T = TypeVar("T")

RECORD = "faasdl:r:"
CHUNK = "faasdl:c:"
#: Every record's key, all with score 0: a sorted set in key order, read by prefix.
INDEX = "faasdl:i"

_PUT = """
local v = redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('HSET', KEYS[1], 'd', ARGV[1])
redis.call('ZADD', KEYS[2], 0, KEYS[1])
return v
"""
_PUT_IF_ABSENT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'v', 1, 'd', ARGV[1])
redis.call('ZADD', KEYS[2], 0, KEYS[1])
return 1
"""
_DELETE = """
redis.call('ZREM', KEYS[2], KEYS[1])
return redis.call('DEL', KEYS[1])
"""
_CAS = """
local v = redis.call('HGET', KEYS[1], 'v')
if v ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', tonumber(v) + 1, 'd', ARGV[2])
return 1
"""
_DELETE_IF = """
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
redis.call('ZREM', KEYS[2], KEYS[1])
return redis.call('DEL', KEYS[1])
"""


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _lost_not_timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is a lost connection worth asking again: not one that timed out."""
    return isinstance(exc, StoreUnavailable) and not isinstance(exc.__cause__, redis.TimeoutError)


class RedisStore(StateStore):
    """A store on a Redis server at ``url`` (``redis://[:password@]host:port/db``, ``rediss://``
    for TLS)."""

    name = "redis"

    def __init__(
        self,
        *,
        url: str,
        username: str | None = None,
        password: str | None = None,
        tls_ca_file: str | None = None,
        tls_ca_data: str | None = None,
        timeout_s: float = 10.0,
        retry_attempts: int = 5,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.url = url
        self._username = username
        self._password = password
        self._tls_ca_file = tls_ca_file
        self._tls_ca_data = tls_ca_data
        self._timeout_s = timeout_s
        self._retry_attempts = retry_attempts
        self._client: redis.Redis | None = None
        self._scripts: dict[str, Script] = {}

    def new_client(self) -> redis.Redis:
        """A client of the store's server that logs in as the store does (its user, password and
        CA bundle, its timeouts), not yet connected: the store's own, or a plain one to measure
        beside it (``faasdl bench store``)."""
        options: dict[str, Any] = {
            "socket_timeout": self._timeout_s,
            "socket_connect_timeout": self._timeout_s,
        }
        if self._username is not None:  # an ACL user's (Redis 6); none: the default user
            options["username"] = self._username
        if self._password is not None:
            options["password"] = self._password
        if self._tls_ca_file is not None:
            options["ssl_ca_certs"] = self._tls_ca_file
        if self._tls_ca_data is not None:
            options["ssl_ca_data"] = self._tls_ca_data
        return redis.Redis.from_url(self.url, **options)

    def open(self) -> None:
        if self._client is not None:
            return
        client = self.new_client()
        try:
            client.ping()
        except redis.AuthenticationError as exc:
            client.close()
            given = self._password is not None or urlsplit(self.url).password is not None
            refused = (
                "the password (FAASDL_STORE__PASSWORD"
                if self._username is None
                else "the user and password (FAASDL_STORE__USERNAME and __PASSWORD"
            )
            raise StoreUnavailable(
                f"Redis at {self._safe_url()} refused {refused}, or the URL's): {exc}"
                if given
                else f"Redis at {self._safe_url()} needs a password: set FAASDL_STORE__PASSWORD "
                "(or __PASSWORD_FILE)"
            ) from exc
        except redis.RedisError as exc:
            client.close()
            raise StoreUnavailable(f"cannot reach Redis at {self._safe_url()}: {exc}") from exc
        self._client = client
        self._scripts = {
            name: client.register_script(source)
            for name, source in (
                ("put", _PUT),
                ("put_if_absent", _PUT_IF_ABSENT),
                ("cas", _CAS),
                ("delete", _DELETE),
                ("delete_if", _DELETE_IF),
            )
        }
        self._retried(self._index_existing)

    def _index_existing(self) -> None:
        """Index the records of a store written before the index existed (once: ZADD of a key
        already there changes nothing)."""
        client = self._redis()
        if client.exists(INDEX):
            return
        batch: list[bytes] = []
        for key in client.scan_iter(match=RECORD + "*", count=1000):
            batch.append(key)
            if len(batch) == 1000:
                client.zadd(INDEX, dict.fromkeys(batch, 0))
                batch = []
        if batch:
            client.zadd(INDEX, dict.fromkeys(batch, 0))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def durability_warning(self) -> str | None:
        """Redis' settings, read with ``CONFIG GET``, where they lose acknowledged writes: an
        eviction policy that deletes any key at ``maxmemory`` (``allkeys-*``: faasdl's keys have
        no expiry, so the ``volatile-*`` policies never take them); and persistence: none (in
        memory only), snapshots only, or an AOF not written through at each write. ``None`` where
        nothing is lost, or where ``CONFIG`` is refused (a managed Redis may rename it)."""
        client = self._redis()
        try:
            config = cast(dict[str, str], self._retried(lambda: client.config_get("*")))
        except redis.ResponseError:
            return None
        there = f"Redis at {self._safe_url()}"
        said = []
        policy = config.get("maxmemory-policy", "noeviction")
        if config.get("maxmemory", "0") != "0" and policy.startswith("allkeys-"):
            said.append(
                f"{there} deletes keys to make room at its maxmemory (maxmemory-policy "
                f"{policy}): any of faasdl's records may go, a unit's (a committed unit then runs "
                "again), a job's, a model, an API key; set maxmemory-policy noeviction (a full "
                "Redis then refuses writes, and faasdl says so)"
            )
        advice = "run it with appendonly yes and appendfsync always"
        if config.get("appendonly") != "yes":
            if not config.get("save"):
                said.append(
                    f"{there} keeps its data in memory only (appendonly no, no save points): "
                    f"its restart loses every job, model and API key; {advice}"
                )
            else:
                said.append(
                    f"{there} persists by snapshots only (appendonly no, save "
                    f"{config['save']!r}): its crash loses what was written since the last one, "
                    f"commits and API keys among it; {advice}"
                )
        elif config.get("appendfsync") != "always":
            said.append(
                f"{there} writes its AOF through to disk only {config.get('appendfsync')!r} "
                "(appendfsync): a crash of its machine can lose commits it acknowledged, and "
                f"their units run again; {advice}"
            )
        return "; ".join(said) or None

    def _safe_url(self) -> str:
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}"

    def _redis(self) -> redis.Redis:
        if self._client is None:
            raise StoreUnavailable("the Redis store is not open (call open() first)")
        return self._client

    def _once(self, op: Callable[[], T]) -> T:
        """Run ``op`` once; a lost connection becomes ``StoreUnavailable`` (never retried: a CAS
        whose reply was lost may or may not have happened), a write refused over ``maxmemory``
        ``StoreFull``."""
        try:
            return op()
        except redis.TimeoutError as exc:
            raise StoreUnavailable(
                f"Redis at {self._safe_url()} did not answer in {self._timeout_s:g} s "
                f"(FAASDL_STORE__TIMEOUT_S): {exc}"
            ) from exc
        except redis.ConnectionError as exc:
            raise StoreUnavailable(
                f"lost the connection to Redis at {self._safe_url()}: {exc}"
            ) from exc
        except redis.OutOfMemoryError as exc:
            raise StoreFull(
                f"the Redis store at {self._safe_url()} is full: it refused a write (its used "
                "memory is over its maxmemory); delete what it holds for nothing (ended jobs: "
                "FAASDL_CONTROLLER__JOB_RETENTION_DAYS) or give it more memory"
            ) from exc

    def _retried(self, op: Callable[[], T]) -> T:
        """Run an idempotent ``op``, retrying a lost connection with jittered backoff. Not one
        that timed out: a server that does not answer in ``timeout_s`` (stopped, or cut off
        without a reset) would hold the caller that long again at each attempt, an API request
        or a readiness probe among them."""
        attempt = retry(
            retry=retry_if_exception(_lost_not_timed_out),
            wait=wait_random_exponential(multiplier=0.05, max=2.0),
            stop=stop_after_attempt(self._retry_attempts),
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        )
        return attempt(lambda: self._once(op))()

    def _script(self, name: str, keys: list[str], args: list[Any]) -> int:
        script = self._scripts.get(name)
        if script is None:
            raise StoreUnavailable("the Redis store is not open (call open() first)")
        return int(self._once(lambda: script(keys=keys, args=args)))

    def _get(self, key: str) -> tuple[bytes, int] | None:
        client = self._redis()
        version, data = self._retried(lambda: client.hmget(RECORD + key, ["v", "d"]))
        return None if version is None else (cast(bytes, data), int(version))

    def _put(self, key: str, data: bytes) -> int:
        return self._script("put", [RECORD + key, INDEX], [data])

    def _put_if_absent(self, key: str, data: bytes) -> bool:
        return self._script("put_if_absent", [RECORD + key, INDEX], [data]) == 1

    def _compare_and_set(self, key: str, expected_version: int, data: bytes) -> bool:
        return self._script("cas", [RECORD + key], [str(expected_version), data]) == 1

    def _delete(self, key: str, expected_version: int | None) -> bool:
        if expected_version is None:
            return self._script("delete", [RECORD + key, INDEX], []) == 1
        return self._script("delete_if", [RECORD + key, INDEX], [str(expected_version)]) == 1

    def _scan(self, prefix: str, low: str) -> Iterable[tuple[str, bytes, int]]:
        return [
            (key, bytes(data), int(version))
            for key, (version, data) in self._fields(prefix, ["v", "d"], low)
            if version is not None  # deleted between the index's read and the fields'
        ]

    def _scan_versions(self, prefix: str) -> Iterable[tuple[str, int]]:
        return [
            (key, int(version))
            for key, (version,) in self._fields(prefix, ["v"], prefix)
            if version is not None
        ]

    def _fields(self, prefix: str, fields: list[str], low: str) -> Iterator[tuple[str, list[Any]]]:
        """``fields`` of each record under ``prefix`` from key ``low`` on, found in the index,
        500 at a time."""
        client = self._redis()
        # Keys from ``low`` up to the prefix followed by 0xFF, a byte no UTF-8 text holds (the
        # index sorts by bytes: UTF-8's order is the code points').
        first = b"[" + (RECORD + low).encode()
        past = b"(" + (RECORD + prefix).encode() + b"\xff"
        keys = cast(list[bytes], self._retried(lambda: client.zrangebylex(INDEX, first, past)))
        for start in range(0, len(keys), 500):
            batch = keys[start : start + 500]

            def fetch(batch: list[bytes] = batch) -> list[Any]:
                pipe = client.pipeline(transaction=False)
                for k in batch:
                    pipe.hmget(k, fields)
                return list(pipe.execute())

            for raw_key, values in zip(batch, self._retried(fetch), strict=True):
                yield raw_key.decode()[len(RECORD) :], values

    def _write_chunks(
        self, chunks: list[tuple[str, bytes | memoryview]], *, durable: bool = True
    ) -> None:
        client = self._redis()

        def write() -> None:
            pipe = client.pipeline(transaction=False)
            for key, data in chunks:
                pipe.set(CHUNK + key, data)
            pipe.execute()

        self._retried(write)  # idempotent: chunk keys are fresh and their content fixed

    def _read_chunk(self, key: str) -> bytes | None:
        client = self._redis()
        data = self._retried(lambda: client.get(CHUNK + key))
        return None if data is None else cast(bytes, data)

    def _delete_chunks(self, keys: Iterable[str]) -> None:
        client = self._redis()
        names = [CHUNK + k for k in keys]
        for start in range(0, len(names), 1000):
            batch = names[start : start + 1000]

            def delete(batch: list[str] = batch) -> None:
                client.delete(*batch)

            self._retried(delete)

    def _chunk_keys(self, prefix: str) -> Iterator[str]:
        client = self._redis()
        pattern = CHUNK + _glob_escape(prefix) + "*"
        keys = set(self._retried(lambda: list(client.scan_iter(match=pattern, count=1000))))
        for raw in sorted(keys):
            yield raw.decode()[len(CHUNK) :]
