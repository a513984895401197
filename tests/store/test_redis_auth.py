"""A Redis that requires a password: refused without one, or with the wrong one, saying which."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from faasdl.config import StoreSettings
from faasdl.errors import StoreUnavailable
from faasdl.store import make_store
from faasdl.store.redis_server import RedisServer


def test_a_redis_that_needs_a_password_says_so_and_one_that_refuses_it_says_that(
    tmp_path: Path,
) -> None:
    # Redis' own words were "HELLO must be called with the client already authenticated" for a
    # missing password, under "cannot reach Redis".
    server = RedisServer(directory=tmp_path / "redis")
    server.start()
    try:
        redis.Redis.from_url(server.url).config_set("requirepass", "right-pw")
        wrong = server.url.replace("redis://", "redis://:wrong-pw@")

        with pytest.raises(StoreUnavailable) as without:
            make_store(StoreSettings(), server.url).open()
        with pytest.raises(StoreUnavailable) as refused:
            make_store(StoreSettings(), wrong).open()
        with make_store(StoreSettings(password="right-pw"), server.url) as store:
            store.put("rec/a", {"ok": True})
    finally:
        server.stop()

    assert str(without.value) == (
        f"Redis at {server.url} needs a password: set FAASDL_STORE__PASSWORD (or __PASSWORD_FILE)"
    )
    assert str(refused.value).startswith(
        f"Redis at {server.url} refused the password (FAASDL_STORE__PASSWORD, or the URL's): "
    )
    assert "wrong-pw" not in str(refused.value)


def test_a_redis_acl_user_is_logged_in_as_that_user(tmp_path: Path) -> None:
    # FAASDL_STORE__USERNAME was Ignite's only: a Redis ACL user's name was dropped, and the
    # store logged in as the default user.
    server = RedisServer(directory=tmp_path / "redis")
    server.start()
    try:
        admin = redis.Redis.from_url(server.url)
        admin.acl_setuser(
            "faasdl", enabled=True, passwords=["+user-pw"], keys=["*"], commands=["+@all"]
        )
        admin.acl_setuser("default", enabled=False)  # only the user's login is left

        with make_store(StoreSettings(username="faasdl", password="user-pw"), server.url) as store:
            store.put("rec/a", {"ok": True})
            users = {client["user"] for client in admin.client_list()}
        with pytest.raises(StoreUnavailable) as refused:
            make_store(StoreSettings(username="faasdl", password="wrong-pw"), server.url).open()
    finally:
        server.stop()

    assert users == {"default", "faasdl"}  # the admin's connection, and the store's
    assert str(refused.value).startswith(
        f"Redis at {server.url} refused the user and password (FAASDL_STORE__USERNAME and "
        "__PASSWORD, or the URL's): "
    )
    assert "wrong-pw" not in str(refused.value)
