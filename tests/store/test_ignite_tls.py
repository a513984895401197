"""An Ignite store over TLS verifies its nodes' certificates by the CA bundle it is given (a file
or its text), before a byte of the thin client's handshake (its password) goes.

No Ignite node runs here: the node is a TLS server that takes the handshake and closes, which is
all the TLS side needs. Run against an Ignite node with the contract suite
(``FAASDL_TEST_IGNITE_URL``)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from faasdl.config import StoreSettings
from faasdl.errors import StoreUnavailable
from faasdl.store import make_store
from tests.conftest import tls_files

#: pyignite's: its TLS 1.2 by a constant Python 3.10 deprecated, and the socket of a failed
#: handshake left to the garbage collector (its close is skipped when its shutdown raises).
pytestmark = [
    pytest.mark.filterwarnings("ignore:ssl.PROTOCOL_TLSv1_2 is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <ssl.SSLSocket:ResourceWarning"),
]

#: The thin client protocol's handshake operation's code (its request's fifth byte).
HANDSHAKE = 1


@contextlib.contextmanager
def tls_node(directory: Path) -> Iterator[tuple[str, list[bytes | str]]]:
    """A TLS server on loopback with a certificate of a fresh CA's (``directory/ca.pem``): it
    reads the first request sent over TLS and closes. Yields its ``ignite://`` URL and what it
    got: that request's bytes, or why the TLS handshake failed."""
    files = tls_files(directory)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert_file, files.key_file)
    got: list[bytes | str] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve() -> None:
            connection, _ = listener.accept()
            try:
                with context.wrap_socket(connection, server_side=True) as tls:
                    got.append(tls.recv(4096))
            except (ssl.SSLError, OSError) as exc:
                got.append(str(exc))

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        yield f"ignite://127.0.0.1:{listener.getsockname()[1]}", got
        server.join(timeout=30)


@pytest.mark.parametrize("given", ["file", "text"])
def test_an_ignite_store_sends_its_handshake_and_password_over_tls_it_verified(
    tmp_path: Path, given: str
) -> None:
    # Arrange: the bundle as the controller has it (a file) or as an action does (its text).
    left_before = sorted(Path(tempfile.gettempdir()).glob("faasdl-ignite-ca-*"))
    with tls_node(tmp_path / "tls") as (url, got):
        ca = tmp_path / "tls" / "ca.pem"
        bundle = {"tls_ca_file": str(ca)} if given == "file" else {"tls_ca_data": ca.read_text()}
        settings = StoreSettings(url=url, username="faasdl", password="s3cret", **bundle)

        # Execute: the node closes once it has the handshake, before answering it.
        with pytest.raises(StoreUnavailable, match="cannot reach Ignite at"):
            make_store(settings).open()

    # Assert: the handshake, its user and password, came through the verified TLS session;
    # the bundle's text was written for pyignite and removed.
    (request,) = got
    assert isinstance(request, bytes)
    length, operation = struct.unpack_from("<iB", request)
    assert (length, operation) == (len(request) - 4, HANDSHAKE)
    assert b"faasdl" in request
    assert b"s3cret" in request
    assert sorted(Path(tempfile.gettempdir()).glob("faasdl-ignite-ca-*")) == left_before


def test_an_ignite_node_whose_certificate_the_bundle_does_not_verify_gets_nothing(
    tmp_path: Path,
) -> None:
    # Arrange: another CA's bundle (pyignite verified no certificate: a password went to any
    # node that spoke TLS).
    other = tls_files(tmp_path / "other").ca_file
    with tls_node(tmp_path / "tls") as (url, got):
        settings = StoreSettings(
            url=url, username="faasdl", password="s3cret", tls_ca_file=str(other)
        )

        # Execute
        with pytest.raises(StoreUnavailable) as refused:
            make_store(settings).open()

    # Assert: refused by the client, saying why (pyignite's "Can not connect." alone did not);
    # the node got no request.
    assert "(the last handshake: SSLCertVerificationError(" in str(refused.value)
    assert "certificate verify failed" in str(refused.value)
    assert len(got) == 1
    assert isinstance(got[0], str)
