"""Who calls the controller's REST API, and how much each caller may do.

An API key is ``fdl_<id>.<secret>``. ``<id>`` names its record (``apikey/<id>`` in the state
store), which keeps the tenant, the scope and the SHA-256 of ``<secret>``: the secret is 256
random bits, so a fast hash is as safe as a slow one (there is no dictionary to try) and keeps
every request's check to one store read. The whole key is shown once, when it is made.

Limits are per key and per controller process: a token bucket of submissions and a count of open
event streams. Quotas per tenant (jobs queued, running, memory held) live in admission.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from faasdl.controller.validator import TENANT_PATTERN, JobSpec
from faasdl.errors import (
    AccessError,
    LimitExceeded,
    StoreUnavailable,
    Unauthenticated,
    ValidationError,
)
from faasdl.store import StateStore
from faasdl.store.records import ApiKeyInfo, apikey_key, create, load, update

KEY_PREFIX = "fdl_"
#: What a key looks like; anything else is refused before the store is asked.
KEY_PATTERN = re.compile(r"^fdl_([0-9a-f]{16})\.([A-Za-z0-9_-]{43})$")
#: Finds keys inside text, for redaction.
KEY_IN_TEXT = re.compile(r"fdl_[0-9a-f]{16}\.[A-Za-z0-9_-]+")
#: The shortest and longest life a key may be given (an expiry past ten years is none).
MIN_KEY_LIFE_S = 60.0
MAX_KEY_LIFE_S = 10 * 365 * 86_400
#: How often an open event stream asks whether its key is still valid: a revoked key's stream
#: ends within this long, not at ``FAASDL_API__STREAM_MAX_S`` (an hour).
KEY_RECHECK_S = 2.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Principal:
    """The caller of a request: a tenant, and whether it may see every tenant's jobs."""

    tenant: str
    admin: bool
    key_id: str | None  # None in the unauthenticated local mode
    expires_ms: int | None = None  # the key's expiry (none: never)

    def owns(self, tenant: str) -> bool:
        return self.admin or tenant == self.tenant


#: The caller when authentication is off (``FAASDL_API__AUTH=none``): an administrator.
LOCAL = Principal(tenant="default", admin=True, key_id=None)


def spec_for(spec: JobSpec, principal: Principal) -> JobSpec:
    """The spec under the caller's tenant: filled in where it names none, refused where it names
    another (an administrator may name any)."""
    if "tenant" not in spec.model_fields_set:
        return spec.model_copy(update={"tenant": principal.tenant})
    if not principal.owns(spec.tenant):
        raise AccessError(
            f"tenant: this key belongs to tenant {principal.tenant!r}; it cannot act for "
            f"{spec.tenant!r}"
        )
    return spec


def create_key(
    store: StateStore,
    *,
    tenant: str,
    admin: bool = False,
    name: str = "",
    expires_in_s: float | None = None,
) -> tuple[ApiKeyInfo, str]:
    """A new key for ``tenant``: its record (stored) and the key itself (kept nowhere); valid
    for ``expires_in_s`` from now (none: until it is revoked)."""
    if not re.match(TENANT_PATTERN, tenant):
        raise ValidationError(f"must match {TENANT_PATTERN}", field="tenant")
    if len(name) > 200 or not name.isprintable():
        raise ValidationError("must be at most 200 printable characters", field="name")
    if expires_in_s is not None and not MIN_KEY_LIFE_S <= expires_in_s <= MAX_KEY_LIFE_S:
        raise ValidationError(
            f"must be {MIN_KEY_LIFE_S:g} s to {MAX_KEY_LIFE_S // 86_400:,} days",
            field="expires_in",
        )
    secret = secrets.token_urlsafe(32)
    now = _now_ms()
    record = ApiKeyInfo(
        key_id=secrets.token_hex(8),
        tenant=tenant,
        admin=admin,
        name=name,
        secret_sha256=_digest(secret),
        created_ms=now,
        expires_ms=None if expires_in_s is None else now + round(expires_in_s * 1000),
    )
    if not create(store, record):  # 64 random bits collided: never in practice, never silently
        raise ValidationError("key id already taken; try again", field="key_id")
    return record, f"{KEY_PREFIX}{record.key_id}.{secret}"


def list_keys(store: StateStore) -> list[ApiKeyInfo]:
    """Every key, oldest first (revoked ones too)."""
    keys = [ApiKeyInfo.model_validate(v.value) for _, v in store.scan("apikey/")]
    return sorted(keys, key=lambda k: (k.created_ms, k.key_id))


def revoke_key(store: StateStore, key_id: str) -> ApiKeyInfo:
    """Revoke a key; from the next request on it is refused (and an event stream it holds open
    ends within ``KEY_RECHECK_S``). Revoking twice is no error."""

    def change(found: ApiKeyInfo | None) -> ApiKeyInfo:
        if found is None:
            raise ValidationError(f"no API key {key_id!r}", field="key_id")
        if found.revoked_ms is not None:
            return found
        return found.model_copy(update={"revoked_ms": _now_ms()})

    return update(store, apikey_key(key_id), ApiKeyInfo, change)


def still_valid(store: StateStore, principal: Principal) -> bool:
    """Whether the key ``principal`` authenticated with is still valid (not revoked, not gone):
    what a long answer (an event stream) asks as it goes. Always true without authentication."""
    if principal.key_id is None:
        return True
    found = load(store, apikey_key(principal.key_id), ApiKeyInfo)
    return found is not None and found[0].revoked_ms is None and not found[0].expired(_now_ms())


def authenticate(store: StateStore, token: str | None) -> Principal:
    """The caller a bearer token names. Raises ``Unauthenticated`` for a missing, malformed,
    unknown or revoked key, with the same message for the last three (no oracle), and for an
    expired one saying when it expired (to the caller who holds its secret)."""
    if not token:
        raise Unauthenticated("an API key is required: send 'Authorization: Bearer <key>'")
    match = KEY_PATTERN.match(token)
    found = load(store, apikey_key(match.group(1)), ApiKeyInfo) if match else None
    if (
        match is None
        or found is None
        or not secrets.compare_digest(found[0].secret_sha256, _digest(match.group(2)))
        or found[0].revoked_ms is not None
    ):
        raise Unauthenticated("the API key is not valid (unknown, malformed or revoked)")
    record = found[0]
    if record.expires_ms is not None and record.expired(_now_ms()):
        expired = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(record.expires_ms / 1000))
        raise Unauthenticated(
            f"the API key {record.key_id} expired at {expired}: make another (faasdl keys create)"
        )
    return Principal(record.tenant, record.admin, record.key_id, record.expires_ms)


class VouchedKeys:
    """Administrators' keys the store accepted lately, by their SHA-256: what lets ``/metrics``
    answer while the store cannot (an outage is when its metrics are wanted, and the keys are in
    the store). A key is vouched for ``grace_s`` after the store last accepted it (0: none is);
    one the store refuses (revoked, gone) is forgotten at once."""

    def __init__(self, *, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s = grace_s
        self._clock = clock
        self._accepted: dict[str, tuple[Principal, float]] = {}  # digest -> (principal, at)
        self._lock = threading.Lock()

    def accepted(self, token: str, principal: Principal) -> None:
        if principal.admin and self.grace_s > 0:
            with self._lock:
                self._accepted[_digest(token)] = (principal, self._clock())

    def refused(self, token: str) -> None:
        with self._lock:
            self._accepted.pop(_digest(token), None)

    def vouched(self, token: str) -> tuple[Principal, float] | None:
        """The key's caller and how many seconds ago the store accepted it, within the grace."""
        with self._lock:
            found = self._accepted.get(_digest(token))
        if found is None:
            return None
        principal, accepted_at = found
        if principal.expires_ms is not None and principal.expires_ms <= _now_ms():
            return None  # expired since the store accepted it
        age = self._clock() - accepted_at
        return (principal, age) if age <= self.grace_s else None


def authenticate_vouched(store: StateStore, token: str | None, vouched: VouchedKeys) -> Principal:
    """:func:`authenticate`, except that while the store is unavailable a key it accepted within
    ``vouched``'s grace is taken (said in the log); otherwise the store's error is raised."""
    if not token:
        return authenticate(store, token)  # refused, without asking the store
    try:
        principal = authenticate(store, token)
    except Unauthenticated:
        vouched.refused(token)
        raise
    except StoreUnavailable as exc:
        found = vouched.vouched(token)
        if found is None:
            raise
        log.warning(
            "the store is unavailable (%s): key %s taken as the store accepted it %.0f s ago",
            exc,
            found[0].key_id,
            found[1],
        )
        return found[0]
    vouched.accepted(token, principal)
    return principal


class RateLimiter:
    """A token bucket per caller: ``per_minute`` events a minute, bursts up to the same."""

    def __init__(self, *, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # caller -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, caller: str, what: str) -> None:
        """Spend one token of ``caller``'s. Raises ``LimitExceeded`` when none is left."""
        if self.per_minute <= 0:
            return
        rate = self.per_minute / 60.0
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(caller, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - at) * rate)
            if tokens < 1.0:
                self._buckets[caller] = (tokens, now)
                raise LimitExceeded(
                    f"{what}: at most {self.per_minute} a minute per API key",
                    retry_after_s=(1.0 - tokens) / rate,
                )
            self._buckets[caller] = (tokens - 1.0, now)


class StreamSlots:
    """How many event streams each caller holds open, capped."""

    def __init__(self, *, per_caller: int) -> None:
        self.per_caller = per_caller
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def reserve(self, caller: str) -> None:
        """Take a slot. Raises ``LimitExceeded`` when the caller holds them all."""
        with self._lock:
            if self._open.get(caller, 0) >= self.per_caller:
                raise LimitExceeded(
                    f"at most {self.per_caller} event streams open at once per API key",
                    retry_after_s=5.0,
                )
            self._open[caller] = self._open.get(caller, 0) + 1

    def release(self, caller: str) -> None:
        with self._lock:
            left = self._open.get(caller, 0) - 1
            if left > 0:
                self._open[caller] = left
            else:
                self._open.pop(caller, None)


def caller_id(principal: Principal) -> str:
    """The name limits count under: the key, or one shared name in the local mode."""
    return principal.key_id or "local"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _now_ms() -> int:
    return int(time.time() * 1000)
