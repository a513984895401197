"""State stores behind one seam (:class:`~faasdl.store.base.StateStore`), chosen by URL scheme.

A backend's module is imported when a URL names it: an action's container (and its checkpoint
writer) opens one store, and the Redis and Ignite clients' imports took a third of a second of
every container's start.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from faasdl.config import ENV_PREFIX, StoreSettings
from faasdl.errors import ValidationError
from faasdl.store.base import StateStore, Versioned


def _sqlite(url: str, s: StoreSettings) -> StateStore:
    from faasdl.store.sqlite import SqliteStore

    path = url.removeprefix("sqlite:///")
    if not path or path == url:  # sqlite://x.db had made a store at ./sqlite:/x.db
        raise ValidationError(
            "sqlite URLs need a path after three slashes: sqlite:///relative.db or "
            f"sqlite:////abs.db, not {url}",
            field="store url",
        )
    return SqliteStore(
        path=Path(path),
        synchronous=s.sqlite_synchronous,
        chunk_bytes=s.chunk_bytes,
        spill_bytes=s.spill_bytes or None,
        spill_dir=s.spill_dir,
    )


def _redis(url: str, s: StoreSettings) -> StateStore:
    from redis import ConnectionPool

    from faasdl.store.redis import RedisStore

    try:
        ConnectionPool.from_url(url)  # parses, connects to nothing: open() raised ValueError
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValidationError(str(exc), field="store url") from None
    if port == 0:  # redis-py would take 6379
        raise ValidationError("port 0 is not a Redis port", field="store url")
    database = parts.path.strip("/")
    if database and not database.isdigit():  # redis-py would take database 0
        raise ValidationError(
            f"the database after the host must be a number (/0, /1, …), not /{database}",
            field="store url",
        )
    return RedisStore(
        url=url,
        username=s.username,
        password=s.password.get_secret_value() if s.password else None,
        tls_ca_file=s.tls_ca_file,
        tls_ca_data=s.tls_ca_data,
        timeout_s=s.timeout_s,
        chunk_bytes=s.chunk_bytes,
        spill_bytes=s.spill_bytes or None,
        spill_dir=s.spill_dir,
    )


def _ignite(url: str, s: StoreSettings) -> StateStore:
    from faasdl.store.ignite import IgniteStore, parse_nodes

    hosts, _, query = url.removeprefix("ignite://").partition("?")
    options = dict(parse_qsl(query))
    return IgniteStore(
        nodes=parse_nodes(hosts.rstrip("/")),
        cache_prefix=options.get("prefix", "faasdl"),
        replicated=s.ignite_replicated,
        backups=s.ignite_backups,
        username=s.username,
        password=s.password.get_secret_value() if s.password else None,
        tls_ca_file=s.tls_ca_file,
        tls_ca_data=s.tls_ca_data,
        timeout_s=s.timeout_s,
        chunk_bytes=min(s.chunk_bytes, 1024 * 1024),
        spill_bytes=s.spill_bytes or None,
        spill_dir=s.spill_dir,
    )


#: Every backend, by URL scheme.
STORES: dict[str, Callable[[str, StoreSettings], StateStore]] = {
    "sqlite": _sqlite,
    "redis": _redis,
    "rediss": _redis,
    "ignite": _ignite,
}


def make_store(settings: StoreSettings, url: str | None = None) -> StateStore:
    """The store ``url`` (default ``settings.url``) names, constructed but not opened (no I/O)."""
    url = url or settings.url
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValidationError(f"'{url}' is not a URL (scheme://...)", field="store url")
    builder = STORES.get(scheme)
    if builder is None:
        raise ValidationError(
            f"unknown scheme '{scheme}'; use one of {', '.join(sorted(STORES))}", field="store url"
        )
    return builder(url, settings)


def absolute_url(url: str) -> str:
    """``url`` as a process with another working directory reaches it: an action's container
    runs elsewhere, so a relative SQLite path is made absolute (other schemes are unchanged)."""
    path = url.removeprefix("sqlite:///")
    if path == url or path.startswith("/"):
        return url
    return f"sqlite:///{Path(path).resolve()}"


def shown_url(url: str) -> str:
    """``url`` as it leaves the process that holds it: told to a person (which store a command
    opened) or passed to an action in its calls' arguments (:func:`action_environment` gives the
    actions the password). A SQLite path absolute (a relative one is the working directory's), a
    password in it left out."""
    url = absolute_url(url)
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=user + parts.netloc.rpartition("@")[2]))


class _StoreFromEnvironment(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore", allow_inf_nan=False
    )

    store: StoreSettings = Field(default_factory=StoreSettings)


def action_store_settings() -> StoreSettings:
    """The store's settings in one of faasdl's actions: its container's ``FAASDL_STORE__…``
    variables, which the controller sets through the action's init parameters
    (:func:`action_environment`). The store an action opens is still the URL its call names."""
    return _StoreFromEnvironment().store


def action_environment(store: StoreSettings) -> dict[str, str]:
    """``store``'s settings as the environment of the actions that open it (their init
    parameters), so that an action reaches the store as the controller does (its user, password
    and CA bundle) and writes blobs as it does: its chunks, and a blob over ``spill_bytes`` to
    its spill directory (made absolute: an action runs in a directory of its own), none where it
    spills none. A CA bundle goes as its text (``tls_ca_data``) and a password file's password
    as read: an action's container (an OpenWhisk pod) lacks the controller's files. A password
    in the URL goes here too, and the URL without it (:func:`shown_url`): it wins over the
    setting, as the URL's does in the controller, and stays out of the calls' arguments, which
    travel through the platform's queues and a checkpoint writer's command line."""
    values = store.model_dump(
        exclude={"password", "password_file", "tls_ca_file"}, exclude_none=True
    )
    values["url"] = shown_url(store.url)
    values["spill_dir"] = str(Path(store.spill_dir).resolve())
    if store.tls_ca_file is not None:
        try:
            values["tls_ca_data"] = Path(store.tls_ca_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValidationError(
                f"cannot read the CA bundle {store.tls_ca_file}: {exc}", field="tls_ca_file"
            ) from None
    in_url = urlsplit(store.url).password
    if in_url:  # redis-py reads it unquoted, and an empty one as none
        values["password"] = unquote(in_url)
    elif store.password is not None:
        values["password"] = store.password.get_secret_value()
    return {
        f"{ENV_PREFIX}STORE__{name.upper()}": value if isinstance(value, str) else json.dumps(value)
        for name, value in values.items()
    }


def sqlite_path(url: str) -> Path | None:
    """The file a ``sqlite:///`` URL names, absolute; None for another scheme."""
    url = absolute_url(url)
    path = url.removeprefix("sqlite:///")
    return None if path == url else Path(path)


__all__ = [
    "STORES",
    "StateStore",
    "Versioned",
    "absolute_url",
    "action_environment",
    "action_store_settings",
    "make_store",
    "shown_url",
    "sqlite_path",
]
