"""The API's security: keys on every endpoint, tenants that cannot see each other, data sets
confined to their directories, bodies capped before they are read, secrets kept out of logs and
answers, and limits per key.

Controllers here are not started (jobs stay queued); sizing is real, on the embedded platform.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import http.server
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import requests
from typer.testing import CliRunner

from faasdl.cli import app as cli
from faasdl.config import ApiSettings, Settings
from faasdl.controller import auth
from faasdl.controller import client as client_module
from faasdl.controller import datasets as datasets_module
from faasdl.controller.app import create_app
from faasdl.controller.auth import (
    LOCAL,
    Principal,
    VouchedKeys,
    create_key,
    revoke_key,
    still_valid,
)
from faasdl.controller.client import ControllerClient
from faasdl.controller.datasets import sweep_partials
from faasdl.controller.jobs import Controller
from faasdl.errors import PlatformUnavailable, ValidationError
from faasdl.platform.local import LocalPlatform
from faasdl.serving import LINGER_BYTES, AppThread
from faasdl.store import StateStore, make_store
from faasdl.store.redis_server import RedisServer
from tests.conftest import Endless, QuietHandler, eventually, relay, serving_http, tls_files

pytestmark = pytest.mark.tensorflow

MLP: dict[str, Any] = {"model": "mlp", "dataset": {"name": "digits"}, "epochs": 1}
OPENWHISK_KEY = "2b6a5f0e-aaaa-bbbb-cccc-1234567890ab:s3cr3t-openwhisk-key-that-must-not-leak"
STORE_PASSWORD = "s3cr3t-store-password-that-must-not-leak"


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("data")
    found = {name: base / name for name in ("allowed", "uploads", "outside")}
    for path in found.values():
        path.mkdir()
    return found


@contextmanager
def serve(
    platform: LocalPlatform,
    store: tuple[StateStore, str],
    tls: tuple[Path, Path] | None = None,
    **api: Any,
) -> Iterator[tuple[str, Controller]]:
    """An API on loopback over a controller that is not started, with ``api`` settings (over
    HTTPS with ``tls``' certificate and key files)."""
    settings = Settings(
        openwhisk={"auth": OPENWHISK_KEY}, store={"password": STORE_PASSWORD}, api=api
    )
    controller = Controller(
        settings=settings, platform=platform, store=store[0], store_url=store[1]
    )
    app = create_app(controller, owns=False)
    server = AppThread(app, host="127.0.0.1", port=0, name="api", tls=tls)
    try:
        yield server.start(), controller
    finally:
        server.stop()


@pytest.fixture(scope="module")
def api(
    tf_platform: LocalPlatform, tf_store: tuple[StateStore, str], roots: dict[str, Path]
) -> Iterator[tuple[str, Controller]]:
    with serve(
        tf_platform,
        tf_store,
        dataset_roots=[str(roots["allowed"])],
        upload_dir=str(roots["uploads"]),
        max_upload_bytes=64 * 1024,
        max_streams_per_key=1,
        submissions_per_minute=1000,
    ) as served:
        yield served


@pytest.fixture(scope="module")
def keys(api: tuple[str, Controller]) -> dict[str, str]:
    store = api[1].store
    return {
        "a": create_key(store, tenant="alice")[1],
        "b": create_key(store, tenant="bob")[1],
        "admin": create_key(store, tenant="ops", admin=True)[1],
    }


def client(api: tuple[str, Controller], key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=api[0], headers=headers, timeout=120)


def operations(url: str) -> list[tuple[str, str]]:
    """Every operation of the schema that declares authentication, with its ids filled in."""
    schema = httpx.get(f"{url}/openapi.json").json()
    found = []
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            if operation.get("security"):
                concrete = path.replace("{job_id}", "0123456789abcdef").replace("{name}", "x")
                found.append((method.upper(), concrete))
    return found


def save_npz(path: Path, rows: int = 400) -> Path:
    rng = np.random.default_rng(0)
    x = rng.random((rows, 8), dtype=np.float32)
    y = (np.arange(rows) % 3).astype(np.int32)
    np.savez(path, x_train=x, y_train=y, x_test=x[:10], y_test=y[:10])
    return path


def forged_npz(path: Path, rows: int, compression: int) -> Path:
    """An .npz whose arrays' headers announce ``rows`` × 256 × 256 bytes of images, with as many
    bytes of zeros as ``compression`` will compress, or none (stored: only the headers)."""
    shapes = {"x_train": (rows, 256, 256), "y_train": (rows,), "x_test": (1, 8), "y_test": (1,)}
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for key, shape in shapes.items():
            with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
                dtype = np.dtype(np.uint8 if key.startswith("x") else np.int64)
                header = {"descr": dtype.descr[0][1], "fortran_order": False, "shape": shape}
                np.lib.format.write_array_header_1_0(member, header)
                left = math.prod(shape) * dtype.itemsize if compression else 0
                while left > 0:
                    member.write(bytes(min(left, 1 << 22)))
                    left -= 1 << 22
    return path


def test_every_endpoint_refuses_a_missing_invalid_or_revoked_key(
    api: tuple[str, Controller],
) -> None:
    store = api[1].store
    record, revoked = create_key(store, tenant="carol")
    revoke_key(store, record.key_id)
    operations_ = operations(api[0])
    well_formed_but_unknown = "fdl_0123456789abcdef." + "A" * 43

    for key in (None, "not-a-key", well_formed_but_unknown, revoked):
        with client(api, key) as http:
            for method, path in operations_:
                response = http.request(method, path)
                assert response.status_code == 401, (key, method, path, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
    assert len(operations_) >= 9
    with client(api, None) as http:
        assert http.get("/healthz").status_code == 200  # probes need no key
        assert http.get("/readyz").status_code == 200


def test_a_key_that_expired_is_refused_on_every_endpoint_saying_when(
    api: tuple[str, Controller], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrange: a key for 90 days (keys were valid until revoked), a stream's validity and a
    # vouched administrator's key; then the clock at its expiry.
    store = api[1].store
    record, key = create_key(store, tenant="ida", expires_in_s=90 * 86_400, admin=True)
    assert record.expires_ms is not None
    principal = Principal("ida", True, record.key_id, record.expires_ms)
    vouched = VouchedKeys(grace_s=60.0)
    vouched.accepted(key, principal)
    operations_ = operations(api[0])
    with client(api, key) as http:
        before = http.get("/v1/jobs").status_code
    valid_before = still_valid(store, principal)

    # Execute
    monkeypatch.setattr(auth, "_now_ms", lambda: record.expires_ms)
    with client(api, key) as http:
        answers = {(method, path): http.request(method, path) for method, path in operations_}

    # Assert: taken until then; then refused everywhere, saying when (to the key's holder).
    assert record.expires_ms - record.created_ms == 90 * 86_400_000
    assert before == 200
    assert valid_before
    assert not still_valid(store, principal)
    assert vouched.vouched(key) is None
    for (method, path), response in answers.items():
        assert response.status_code == 401, (method, path, response.text)
        detail = response.json()["detail"]
        assert detail.startswith(f"the API key {record.key_id} expired at "), (method, path)


@pytest.mark.parametrize("life_s", [59.0, 11 * 365 * 86_400.0])
def test_a_keys_life_is_a_minute_to_ten_years(api: tuple[str, Controller], life_s: float) -> None:
    with pytest.raises(ValidationError, match="expires_in: must be 60 s to 3,650 days"):
        create_key(api[1].store, tenant="ida", expires_in_s=life_s)


def test_an_https_controller_is_reached_with_its_ca_bundle_and_refused_without_it(
    tf_platform: LocalPlatform,
    tf_store: tuple[StateStore, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Arrange: the API over HTTPS with a certificate of a fresh CA's (keys went in the clear
    # beyond loopback, or through a proxy of the operator's making).
    tls = tls_files(tmp_path)
    monkeypatch.setenv("FAASDL_CONTROLLER__TLS_CERT_FILE", str(tls.cert_file))
    monkeypatch.setenv("FAASDL_CONTROLLER__TLS_KEY_FILE", str(tls.key_file))
    monkeypatch.setenv("FAASDL_CLIENT__CA_FILE", str(tls.ca_file))
    with serve(tf_platform, tf_store, (tls.cert_file, tls.key_file)) as (url, controller):
        key = create_key(controller.store, tenant="jo")[1]
        monkeypatch.setenv("FAASDL_CLIENT__API_KEY", key)
        monkeypatch.setenv("FAASDL_CONTROLLER__PORT", url.rpartition(":")[2])

        # Execute: as the CLI makes its client (the URL from the controller's settings), and
        # one with the system's CAs.
        with ControllerClient.from_settings() as by_settings:
            listed = by_settings.jobs()
            reached = by_settings.url
        with (
            ControllerClient(url=url, api_key=key) as system,
            pytest.raises(PlatformUnavailable) as refused,
        ):
            system.jobs()

    # Assert
    assert url.startswith("https://127.0.0.1:")
    assert reached == url
    assert listed == ([], None)
    assert "certificate verify failed" in str(refused.value)


def test_a_tenant_cannot_see_or_touch_another_tenants_job(
    api: tuple[str, Controller], keys: dict[str, str]
) -> None:
    with client(api, keys["b"]) as bob, client(api, keys["a"]) as alice:
        job_id = bob.post("/v1/jobs", json=MLP).json()["job"]["job_id"]
        never = "fedcba9876543210"

        answers = {
            (method, path.format(job_id)): alice.request(method, path.format(job_id))
            for method, path in [
                ("GET", "/v1/jobs/{}"),
                ("GET", "/v1/jobs/{}/events"),
                ("GET", "/v1/jobs/{}/model"),
                ("DELETE", "/v1/jobs/{}"),
                ("DELETE", "/v1/jobs/{}?purge=true"),
            ]
        }
        unknown = alice.get(f"/v1/jobs/{never}")
        listed = alice.get("/v1/jobs").json()
        filtered = alice.get("/v1/jobs", params={"tenant": "bob"}).json()
        as_bob = alice.post("/v1/jobs", json={**MLP, "tenant": "bob"})
        bobs_view = bob.get(f"/v1/jobs/{job_id}")

    for (_, path), response in answers.items():
        assert response.status_code == 404, path
        assert response.json()["detail"] == f"job_id: no job {job_id!r}"
    assert unknown.json()["detail"] == f"job_id: no job {never!r}"  # same answer: no oracle
    assert job_id not in {j["job_id"] for j in listed}
    assert filtered == []
    assert as_bob.status_code == 403
    assert "tenant" in as_bob.json()["detail"]
    assert bobs_view.json()["job"]["state"] == "queued"  # alice's DELETEs did nothing
    assert bobs_view.json()["job"]["tenant"] == "bob"
    with client(api, keys["admin"]) as admin:
        assert job_id in {j["job_id"] for j in admin.get("/v1/jobs").json()}
        assert admin.get(f"/v1/jobs/{job_id}").status_code == 200
        assert admin.get("/metrics").status_code == 200
    with client(api, keys["a"]) as alice:
        assert alice.get("/metrics").status_code == 403


@pytest.mark.parametrize(
    "path",
    [
        "../bob/x.npz",
        "../../outside/data.npz",
        "{outside}/data.npz",
        "{allowed}/../outside/data.npz",
        "{allowed}/escape.npz",  # a symbolic link out of the allowed root
        "{uploads}/alice/link.npz",  # a symbolic link out of alice's uploads
        "/etc/passwd",
    ],
)
def test_a_data_set_path_outside_the_allowed_directories_is_refused(
    api: tuple[str, Controller], keys: dict[str, str], roots: dict[str, Path], path: str
) -> None:
    save_npz(roots["outside"] / "data.npz")
    for link, parent in (
        ("escape.npz", roots["allowed"]),
        ("link.npz", roots["uploads"] / "alice"),
    ):
        parent.mkdir(exist_ok=True)
        if not (parent / link).is_symlink():
            (parent / link).symlink_to(roots["outside"] / "data.npz")
    spec = {**MLP, "dataset": {"name": "npz", "path": path.format(**roots)}}

    with client(api, keys["a"]) as alice:
        estimate = alice.post("/v1/estimate", json=spec)
        submit = alice.post("/v1/jobs", json=spec)

    for response in (estimate, submit):
        assert response.status_code == 422, response.text
        assert response.json()["field"] == "dataset.path"
        assert "outside" in response.json()["detail"]


def test_a_data_set_in_an_allowed_root_is_used_by_its_resolved_path(
    api: tuple[str, Controller], keys: dict[str, str], roots: dict[str, Path]
) -> None:
    save_npz(roots["allowed"] / "ok.npz")
    spec = {**MLP, "dataset": {"name": "npz", "path": f"{roots['allowed']}/./ok.npz"}}

    with client(api, keys["a"]) as alice:
        response = alice.post("/v1/jobs", json=spec)
        assert response.status_code == 201, response.text
        job = response.json()["job"]

    assert job["spec"]["dataset"]["path"] == str((roots["allowed"] / "ok.npz").resolve())


def test_an_upload_is_checked_kept_whole_and_private_to_its_tenant(
    api: tuple[str, Controller], keys: dict[str, str], roots: dict[str, Path], tmp_path: Path
) -> None:
    data = save_npz(tmp_path / "d.npz").read_bytes()
    alice_dir = roots["uploads"] / "alice"

    with client(api, keys["a"]) as alice, client(api, keys["b"]) as bob:
        created = alice.put("/v1/datasets/mine", content=data)
        not_npz = alice.put("/v1/datasets/junk", content=b"PK\x03\x04 not really a zip")
        too_big = alice.put("/v1/datasets/big", content=os.urandom(65 * 1024))
        # Under the 64 KiB upload limit, and each gigabytes once read: the arrays' headers are
        # read first, and bzip2 (which zipfile decompresses whole blocks of) is refused.
        vast = forged_npz(tmp_path / "vast.npz", 2**20, zipfile.ZIP_STORED).read_bytes()
        bomb = forged_npz(tmp_path / "bomb.npz", 4200, zipfile.ZIP_BZIP2).read_bytes()
        refused_vast = alice.put("/v1/datasets/vast", content=vast)
        refused_bomb = alice.put("/v1/datasets/bomb", content=bomb)
        listed = alice.get("/v1/datasets").json()
        estimate = alice.post(
            "/v1/estimate", json={**MLP, "dataset": {"name": "npz", "path": "mine.npz"}}
        )
        submitted = alice.post(
            "/v1/jobs", json={**MLP, "dataset": {"name": "npz", "path": "mine.npz"}}
        )
        job_id = submitted.json()["job"]["job_id"]
        viewed = alice.get(f"/v1/jobs/{job_id}")
        unsuffixed, missing = (
            alice.post("/v1/estimate", json={**MLP, "dataset": {"name": "npz", "path": path}})
            for path in ("mine", "nothing.npz")
        )
        bobs_try = bob.post(
            "/v1/estimate", json={**MLP, "dataset": {"name": "npz", "path": "../alice/mine.npz"}}
        )
        bobs_list = bob.get("/v1/datasets").json()
        with (alice_dir / "mine.npz").open("ab") as rewritten:  # changed other than by an upload
            rewritten.write(b"\0")
        changed = alice.get("/v1/datasets").json()
        kept = alice.delete("/v1/datasets/mine")  # the queued job trains on it
        alice.delete(f"/v1/jobs/{job_id}")
        deleted = alice.delete("/v1/datasets/mine")
        gone = alice.delete("/v1/datasets/mine")

    assert created.status_code == 201, created.text
    assert created.json()["bytes"] == len(data)
    assert created.json()["contents"] == {
        "examples": 400,
        "test_examples": 10,
        "input_shape": [8],
        "classes": 3,
        "notes": [],
    }
    assert not_npz.status_code == 422
    assert not_npz.json()["field"] == "body"
    assert too_big.status_code == 413
    assert len(vast) < 1024
    assert len(bomb) < 2048
    assert refused_vast.status_code == refused_bomb.status_code == 422
    assert "hold 68,719,476,744 values, more than the 268,435,456" in refused_vast.text
    assert "x_train is compressed with bzip2" in refused_bomb.text
    assert listed == [created.json()]
    assert created.json()["sha256"] == hashlib.sha256(data).hexdigest()
    assert changed == [{**created.json(), "bytes": len(data) + 1, "sha256": None, "contents": None}]
    assert estimate.status_code == 200, estimate.text
    # The job reads the file by its resolved path, and shows it by the name it was given.
    assert submitted.status_code == 201, submitted.text
    assert api[1].job(job_id).spec["dataset"]["path"] == str(alice_dir.resolve() / "mine.npz")
    for answer in (submitted, viewed):
        assert answer.json()["job"]["spec"]["dataset"]["path"] == "mine.npz"
        assert str(roots["uploads"]) not in answer.text
    assert unsuffixed.status_code == missing.status_code == 422
    assert unsuffixed.json()["detail"] == (
        "dataset.path: no upload of yours is named 'mine' (did you mean 'mine.npz'?): upload one "
        "with faasdl datasets upload FILE, or PUT /v1/datasets/NAME"
    )
    assert "no upload of yours is named 'nothing.npz': upload one" in missing.text
    assert str(roots["uploads"]) not in missing.text  # the server's directories are its own
    assert bobs_try.status_code == 422
    assert bobs_list == []
    assert kept.status_code == 409
    assert kept.json()["detail"] == (
        f"data set 'mine' is needed by job {job_id}, which has not staged it yet: delete it once "
        "the job has started training, or cancel the job"
    )
    assert deleted.status_code == 204
    assert gone.status_code == 404
    left = sorted(p.name for p in alice_dir.iterdir() if not p.is_symlink())
    assert left == []  # no partial file of the refused uploads; the deleted one and its digest gone


def test_the_cli_uploads_lists_and_deletes_a_tenants_data_sets(
    api: tuple[str, Controller], keys: dict[str, str], tmp_path: Path
) -> None:
    # Arrange: alice's and bob's keys for the CLI, a data set, and files it must refuse.
    runner = CliRunner()
    url = ["--url", api[0]]
    alice = {"FAASDL_CLIENT__API_KEY": keys["a"]}
    bob = {"FAASDL_CLIENT__API_KEY": keys["b"]}
    data = save_npz(tmp_path / "cli-set.npz")
    spaced = save_npz(tmp_path / "my set.npz")
    counted_from_1 = tmp_path / "from-1.npz"
    x = np.zeros((6, 4, 4), np.uint8)  # grey images: a channel added
    np.savez(counted_from_1, x_train=x, y_train=[1, 2, 3] * 2, x_test=x[:2], y_test=[1, 3])
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    big = tmp_path / "big.npz"
    big.write_bytes(os.urandom(65 * 1024))

    def datasets(*args: str, env: dict[str, str] = alice) -> Any:
        return runner.invoke(cli, ["datasets", *args, *url], env=env)

    # Execute
    uploaded = datasets("upload", str(data))
    noted = datasets("upload", str(counted_from_1))
    bad_name = datasets("upload", str(data), "--name", "../up")
    unnamed = datasets("upload", str(spaced))
    refused = datasets("upload", str(junk))
    too_big = datasets("upload", str(big), "--name", "big")
    listed = datasets("list")
    bobs = datasets("list", env=bob)
    bobs_delete = datasets("delete", "cli-set", env=bob)
    deleted = datasets("delete", "cli-set")
    again = datasets("delete", "cli-set")

    # Assert: the upload is kept under its file's name, with its digest; bad names are refused
    # before anything is sent, a bad or oversized file by the controller; the data set is
    # alice's alone, and deleted once.
    assert uploaded.exit_code == 0, uploaded.output
    record = json.loads(uploaded.stdout.splitlines()[-1])
    assert record == {
        "name": "cli-set",
        "path": "cli-set.npz",
        "bytes": data.stat().st_size,
        "sha256": hashlib.sha256(data.read_bytes()).hexdigest(),
        "contents": {
            "examples": 400,
            "test_examples": 10,
            "input_shape": [8],
            "classes": 3,
            "notes": [],
        },
    }
    assert "400 training and 10 test examples of shape 8, 3 classes" in uploaded.output
    assert "jobs name it as dataset: {name: npz, path: cli-set.npz}" in uploaded.output
    assert noted.exit_code == 0, noted.output
    assert "6 training and 2 test examples of shape 4×4×1, 4 classes" in noted.output
    assert "note: class 0 has no example in y_train (labels are class indices from 0)" in (
        " ".join(noted.output.split())
    )
    assert bad_name.exit_code == 2
    assert "'../up' is not a data set's name" in bad_name.output
    assert unnamed.exit_code == 2
    assert "my set.npz: 'my set' is not a data set's name" in unnamed.output
    assert "give it one with --name" in unnamed.output
    assert refused.exit_code == 2
    assert "error: junk.npz: the upload is not a valid .npz" in refused.output
    assert too_big.exit_code == 2
    assert "HTTP 413: Content Too Large: over the controller's FAASDL_API__MAX_UPLOAD_BYTES" in (
        too_big.output
    )
    assert [d["name"] for d in json.loads(listed.stdout.splitlines()[-1])] == ["cli-set", "from-1"]
    assert json.loads(listed.stdout.splitlines()[-1])[0] == record
    assert record["sha256"][:12] in listed.output
    assert "400 + 10 test" in listed.output
    assert json.loads(bobs.stdout.splitlines()[-1]) == []
    assert bobs.stderr.splitlines() == [
        "no data sets: upload one with faasdl datasets upload FILE.npz"  # not an empty table
    ]
    assert bobs_delete.exit_code == 2
    assert "no uploaded data set 'cli-set'" in bobs_delete.output
    assert deleted.exit_code == 0, deleted.output
    assert again.exit_code == 2
    assert "no uploaded data set 'cli-set'" in again.output


def test_the_python_client_uploads_a_file_by_its_path_and_arrays(
    api: tuple[str, Controller], tmp_path: Path
) -> None:
    key = create_key(api[1].store, tenant="carol")[1]
    path = save_npz(tmp_path / "file.npz", rows=50)
    pixels = np.full((6, 4, 4), 255.0)  # floats: taken as given, noted

    with ControllerClient(url=api[0], api_key=key) as carol:
        from_path = carol.upload_dataset("from-path", str(path))
        from_arrays = carol.upload_arrays(
            "from-arrays",
            x_train=pixels,
            y_train=np.arange(6) % 2,
            x_test=pixels[:2],
            y_test=np.array([0, 1]),
        )
        listed = [d["name"] for d in carol.datasets()]
        for name in listed:
            carol.delete_dataset(name)

    assert from_path["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert from_path["contents"]["examples"] == 50
    contents = from_arrays["contents"]
    assert (contents["examples"], contents["input_shape"], contents["classes"]) == (6, [4, 4, 1], 2)
    [note] = contents["notes"]
    assert note.startswith("x_train's values reach ±255: inputs are taken as given")
    assert listed == ["from-arrays", "from-path"]


def raw_request(url: str, head: str, body: bytes) -> bytes:
    """Send ``head`` and ``body`` on a socket, then read the answer without sending more."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head.encode() + body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_an_oversized_body_is_refused_before_it_is_read_whole(
    api: tuple[str, Controller], keys: dict[str, str]
) -> None:
    declared = (
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {keys['a']}\r\nContent-Length: {100 * 2**20}\r\n\r\n"
    )
    chunked = (
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {keys['a']}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b" " * 65536
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20))

    # 100 MiB announced, 1 KiB sent: the answer comes without the rest.
    announced = raw_request(api[0], declared, b"{" + b" " * 1023)
    streamed = raw_request(api[0], chunked, body)  # 1.25 MiB with no length, over the 1 MiB cap

    assert announced.startswith(b"HTTP/1.1 413"), announced[:200]
    assert streamed.startswith(b"HTTP/1.1 413"), streamed[:200]


def test_a_body_refused_before_its_end_is_not_read_on(
    api: tuple[str, Controller], keys: dict[str, str]
) -> None:
    # requests sends a body whole before it reads the answer: kept alive, the connection had
    # the server read the rest after its refusal (`faasdl datasets upload /dev/zero`: for ever).
    url, alice = api[0], {"Authorization": f"Bearer {keys['a']}"}
    over, stranger, job = Endless(), Endless(), Endless()

    too_big = requests.put(f"{url}/v1/datasets/zeros", data=over, headers=alice, timeout=60)
    unknown = requests.put(
        f"{url}/v1/datasets/zeros",
        data=stranger,
        headers={"Authorization": f"Bearer {keys['a']}x"},
        timeout=60,
    )
    too_long = requests.post(
        f"{url}/v1/jobs",
        data=job,
        headers={**alice, "Content-Type": "application/json"},
        timeout=60,
    )
    read_whole = requests.post(f"{url}/v1/jobs", json={**MLP, "epochs": 0}, headers=alice)

    assert (too_big.status_code, unknown.status_code, too_long.status_code) == (413, 401, 413)
    for body in (over, stranger, job):
        assert body.sent < LINGER_BYTES + 16 * 2**20, body.sent  # read on after the answer
    assert too_big.headers["connection"] == "close"
    # An answer to a body read to its end keeps the connection.
    assert read_whole.status_code == 422
    assert "connection" not in read_whole.headers


def test_secrets_appear_in_no_log_and_no_answer(
    api: tuple[str, Controller], keys: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    secrets = [OPENWHISK_KEY, OPENWHISK_KEY.split(":")[1], STORE_PASSWORD, keys["a"]]
    caplog.set_level(logging.DEBUG)
    answers: list[str] = []

    with client(api, keys["a"]) as alice, client(api, keys["admin"]) as admin:
        for http in (alice, admin):
            for method, path in operations(api[0]):
                answers.append(http.request(method, path).text)
        answers.append(alice.post("/v1/jobs", json={**MLP, "tenant": "x y"}).text)
        answers.append(admin.get("/openapi.json").text)
        answers.append(admin.get("/readyz").text)
    with client(api, keys["a"].replace("fdl_", "fdl_x")) as wrong:
        answers.append(wrong.get("/v1/jobs").text)
    # A faasdl module that logs a secret by mistake, and a library that does.
    logging.getLogger("faasdl.controller.jobs").warning("connecting with %s", STORE_PASSWORD)
    logging.getLogger("urllib3").error("auth %s failed for %s", OPENWHISK_KEY, keys["a"])

    logged = caplog.text
    assert "connecting with ***" in logged
    for secret in secrets:
        assert secret not in logged
        assert not any(secret in answer for answer in answers)


def test_submissions_are_rate_limited_per_key_and_queues_per_tenant(
    tf_platform: LocalPlatform, tf_store: tuple[StateStore, str]
) -> None:
    with serve(tf_platform, tf_store, submissions_per_minute=2, tenant_max_queued_jobs=3) as (
        url,
        controller,
    ):
        store = controller.store
        first, second = create_key(store, tenant="dave")[1], create_key(store, tenant="dave")[1]
        with client((url, controller), first) as one, client((url, controller), second) as two:
            answers = [one.post("/v1/jobs", json=MLP) for _ in range(3)]
            other_key = two.post("/v1/jobs", json=MLP)
            queue_full = two.post("/v1/jobs", json=MLP)

    assert [a.status_code for a in answers] == [201, 201, 429]
    assert 1 <= int(answers[2].headers["retry-after"]) <= 30
    assert "2 a minute" in answers[2].json()["detail"]
    assert other_key.status_code == 201  # a limit per key
    assert queue_full.status_code == 429  # 3 jobs of tenant dave queued: the tenant's quota
    assert "queued" in queue_full.json()["detail"]


def test_estimates_and_uploads_are_rate_limited_per_key(
    tf_platform: LocalPlatform, tf_store: tuple[StateStore, str], tmp_path: Path
) -> None:
    data = save_npz(tmp_path / "d.npz").read_bytes()
    uploads = tmp_path / "uploads"
    with serve(
        tf_platform,
        tf_store,
        estimates_per_minute=1,
        uploads_per_minute=1,
        upload_dir=str(uploads),
    ) as (url, controller):
        key = create_key(controller.store, tenant="hana")[1]
        with client((url, controller), key) as hana:
            estimates = [hana.post("/v1/estimate", json=MLP) for _ in range(2)]
            sent = [
                hana.put("/v1/datasets/set0", **part_of(data, 0, 999)),
                hana.put("/v1/datasets/set0", **part_of(data, 1000)),  # the same upload's rest
                hana.put("/v1/datasets/set1", content=data),
            ]

    assert [a.status_code for a in estimates] == [200, 429]
    assert "estimates: at most 1 a minute per API key" in estimates[1].json()["detail"]
    assert 1 <= int(estimates[1].headers["retry-after"]) <= 60
    assert [a.status_code for a in sent] == [202, 201, 429]
    assert "data set uploads: at most 1 a minute" in sent[2].json()["detail"]
    assert sorted(p.name for p in (uploads / "hana").iterdir()) == [".set0.npz.sha256", "set0.npz"]


def test_a_tenants_uploads_are_held_to_its_quota(
    tf_platform: LocalPlatform, tf_store: tuple[StateStore, str], tmp_path: Path
) -> None:
    data = save_npz(tmp_path / "d.npz").read_bytes()
    uploads = tmp_path / "uploads"
    quota = len(data) * 3 // 2
    with serve(tf_platform, tf_store, tenant_max_upload_bytes=quota, upload_dir=str(uploads)) as (
        url,
        controller,
    ):
        key = create_key(controller.store, tenant="ivan")[1]
        with client((url, controller), key) as ivan:
            first = ivan.put("/v1/datasets/one", content=data)
            second = ivan.put("/v1/datasets/two", content=data)
            part = ivan.put("/v1/datasets/two", **part_of(data, 0, 99))  # the whole file counts
            replaced = ivan.put("/v1/datasets/one", content=data)  # the same name: no more held
            ivan.delete("/v1/datasets/one")
            begun = ivan.put("/v1/datasets/two", **part_of(data, 0, len(data) * 3 // 4))
            crowded = ivan.put("/v1/datasets/one", content=data)  # beside the part held

    assert first.status_code == 201
    too_much = f"would hold {2 * len(data):,} bytes with this one, more than the {quota:,}"
    assert second.status_code == part.status_code == 403
    assert too_much in second.json()["detail"]
    assert too_much in part.json()["detail"]
    assert replaced.status_code == 201
    assert begun.status_code == 202
    assert crowded.status_code == 403
    held = len(data) + len(data) * 3 // 4 + 1
    assert crowded.json()["detail"].endswith(
        f"would hold {held:,} bytes with this one, more than the {quota:,} they may: delete one "
        f"first (DELETE /v1/datasets/NAME); they count the parts kept of unfinished uploads as "
        f"two ({len(data) * 3 // 4 + 1:,} bytes)"
    )
    assert "unfinished" not in second.json()["detail"]  # none then
    sha256 = hashlib.sha256(data).hexdigest()
    assert [p.name for p in (uploads / "ivan").iterdir()] == [f".two.npz.sha256-{sha256}.partial"]


def test_housekeeping_keeps_an_unfinished_upload_a_day_and_an_uploads_temporary_file_an_hour(
    tmp_path: Path,
) -> None:
    # Arrange: temporary files of uploads arriving (or whose controller was killed), and parts
    # kept of uploads cut short, each last written 5 minutes, 2 hours or 2 days ago.
    folder = tmp_path / "ola"
    folder.mkdir()
    ages_s = {"new": 300, "older": 7200, "old": 2 * 86_400}
    files = {
        f"{kind} {age}": folder / name.format(age=age)
        for kind, name in (
            ("temporary", ".{age}.npz.k3j2x9.partial"),
            ("unfinished", ".{age}.npz.sha256-" + "0" * 64 + ".partial"),
        )
        for age in ages_s
    }
    for what, path in files.items():
        path.write_bytes(b"part")
        written = time.time() - ages_s[what.split()[1]]
        os.utime(path, (written, written))

    # Execute
    swept = sweep_partials(ApiSettings(upload_dir=str(tmp_path)), grace_s=3600)

    # Assert
    assert swept == 3
    assert sorted(what for what, path in files.items() if path.exists()) == [
        "temporary new",
        "unfinished new",
        "unfinished older",
    ]


def test_an_upload_folder_the_controller_cannot_write_is_a_503_that_says_so(
    tf_platform: LocalPlatform, tf_store: tuple[StateStore, str], tmp_path: Path
) -> None:
    # An operator's FAASDL_API__UPLOAD_DIR where no folder can be: a 500 with no word of why.
    data = save_npz(tmp_path / "d.npz").read_bytes()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with serve(tf_platform, tf_store, upload_dir=str(blocked / "uploads")) as (url, controller):
        key = create_key(controller.store, tenant="jo")[1]
        with client((url, controller), key) as jo:
            sent = jo.put("/v1/datasets/set0", content=data)
            listed = jo.get("/v1/datasets")

    assert sent.status_code == 503, sent.text
    detail = sent.json()["detail"]
    assert "the controller cannot keep uploads (Not a directory)" in detail
    assert "FAASDL_API__UPLOAD_DIR" in detail
    assert str(tmp_path) not in detail  # the server's folders are its operator's to know
    assert listed.status_code == 200
    assert listed.json() == []


def test_an_upload_whose_client_goes_away_is_one_log_line_and_leaves_nothing(
    tf_platform: LocalPlatform,
    tf_store: tuple[StateStore, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # A user's Ctrl-C mid-upload: nothing was kept, but uvicorn logged an ERROR "Exception in
    # ASGI application" with ClientDisconnect's eighty-line traceback.
    caplog.set_level(logging.INFO)
    data = save_npz(tmp_path / "d.npz").read_bytes()
    uploads = tmp_path / "uploads"
    with serve(tf_platform, tf_store, upload_dir=str(uploads)) as (url, controller):
        key = create_key(controller.store, tenant="kim")[1]
        parts = urlsplit(url)
        with socket.create_connection((parts.hostname, parts.port)) as cut:
            cut.sendall(
                f"PUT /v1/datasets/cut HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Length: {len(data)}\r\n\r\n".encode()
                + data[: len(data) // 2]
            )
            eventually(lambda: any(uploads.rglob("*")), what="the upload under way")
        eventually(
            lambda: "upload 'cut' of tenant kim stopped: its client went away" in caplog.text,
            what="the upload's end logged",
        )
        with client((url, controller), key) as kim:
            listed = kim.get("/v1/datasets").json()

    assert listed == []
    assert [p for p in uploads.rglob("*") if p.is_file()] == []  # no partial file
    assert "Exception in ASGI application" not in capfd.readouterr().err  # uvicorn's own log


def digest_of(data: bytes) -> str:
    """``data``'s ``Repr-Digest``."""
    return f"sha-256=:{base64.b64encode(hashlib.sha256(data).digest()).decode()}:"


def part_of(data: bytes, first: int, last: int | None = None) -> dict[str, Any]:
    """A PUT's arguments for bytes ``first`` to ``last`` (the last byte's where none) of
    ``data``, with its digest."""
    end = len(data) - 1 if last is None else last
    headers = {"Repr-Digest": digest_of(data), "Content-Range": f"bytes {first}-{end}/{len(data)}"}
    return {"content": data[first : end + 1], "headers": headers}


def two_files(tmp_path: Path) -> tuple[bytes, bytes]:
    """Two data sets' files: one of 400 training examples, and another of 50."""
    return (
        save_npz(tmp_path / "d.npz").read_bytes(),
        save_npz(tmp_path / "other.npz", rows=50).read_bytes(),
    )


def held_of(api: tuple[str, Controller], key: str, name: str) -> list[int]:
    """The bytes the controller holds of each unfinished upload as ``name`` (its GET waits 2 s
    for a request still writing one)."""
    with client(api, key) as caller:
        return [p["received"] for p in caller.get(f"/v1/datasets/{name}/upload").json()]


@contextmanager
def sending_half(api: tuple[str, Controller], key: str, name: str, data: bytes) -> Iterator[None]:
    """An upload of ``data`` as ``name`` with its digest, its first half sent and written, its
    link open until the block ends (then lost)."""
    parts = urlsplit(api[0])
    with socket.create_connection((parts.hostname, parts.port)) as link:
        link.sendall(
            f"PUT /v1/datasets/{name} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Repr-Digest: {digest_of(data)}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data[: len(data) // 2]
        )
        # uvicorn drops what it has read and not yet handed on when a link is lost: the half
        # is written before the link goes.
        written = [len(data) // 2]
        eventually(lambda: held_of(api, key, name) == written, what="the half written")
        yield


def test_an_upload_sent_with_its_digest_and_cut_short_goes_on_from_what_the_controller_holds(
    api: tuple[str, Controller], roots: dict[str, Path], tmp_path: Path
) -> None:
    # Arrange: a link lost half-way through an upload sent with the file's SHA-256.
    key = create_key(api[1].store, tenant="lena")[1]
    data = save_npz(tmp_path / "d.npz").read_bytes()
    half = len(data) // 2
    with sending_half(api, key, "resumed", data):
        pass  # the link lost once the half is written

    # Execute: what the controller holds, a part past it, then the rest from before it.
    with client(api, key) as lena:
        held = lena.get("/v1/datasets/resumed/upload").json()
        gap = lena.put("/v1/datasets/resumed", **part_of(data, half + 10))
        rest = lena.put("/v1/datasets/resumed", **part_of(data, half - 100))
        after = lena.get("/v1/datasets/resumed/upload").json()

    # Assert: the half that came, kept a day; the part past it refused, saying where to go on
    # from; the rest, its first 100 bytes held already, made the file whole, checked and kept.
    [part] = held
    assert (part["name"], part["received"]) == ("resumed", half)
    assert part["sha256"] == hashlib.sha256(data).hexdigest()
    assert part["kept_until_ms"] - part["updated_ms"] == 86_400_000
    assert gap.status_code == 409
    assert gap.json()["detail"] == (
        f"the controller holds {half:,} bytes of this file, not {half + 10:,}: send it from byte "
        f"{half} (GET /v1/datasets/resumed/upload says so)"
    )
    assert rest.status_code == 201, rest.text
    assert rest.json()["sha256"] == part["sha256"]
    assert (rest.json()["bytes"], rest.json()["contents"]["examples"]) == (len(data), 400)
    assert after == []
    kept = roots["uploads"] / "lena"
    assert (kept / "resumed.npz").read_bytes() == data
    assert sorted(p.name for p in kept.iterdir()) == [".resumed.npz.sha256", "resumed.npz"]


def test_a_part_sent_while_a_request_writes_the_same_file_waits_for_it_to_end(
    api: tuple[str, Controller], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrange: an upload arriving (its half written, its link open), and a wait of 0.5 s.
    key = create_key(api[1].store, tenant="pia")[1]
    data = save_npz(tmp_path / "d.npz").read_bytes()
    half = len(data) // 2
    monkeypatch.setattr(datasets_module, "LOCK_WAIT_S", 0.5)
    # Execute: the rest sent as the first request goes on, then once it has ended (the wait
    # the default's again: its link's loss may take the controller a moment to see).
    with sending_half(api, key, "busy", data), client(api, key) as pia:
        busy = pia.put("/v1/datasets/busy", **part_of(data, half))
    monkeypatch.undo()
    with client(api, key) as pia:
        rest = pia.put("/v1/datasets/busy", **part_of(data, half))

    # Assert
    assert busy.status_code == 409
    assert busy.json()["detail"] == (
        "another request is sending this file as 'busy': send the rest once it has ended"
    )
    assert rest.status_code == 201, rest.text
    assert rest.json()["sha256"] == hashlib.sha256(data).hexdigest()


@pytest.fixture
def without_hard_links(tmp_path: Path) -> Iterator[Path]:
    """A folder on a file system without hard links (as FAT's, or an SMB share's): a 32 MiB
    exFAT image on a loop device, mounted through FUSE (Debian's exfatprogs and exfat-fuse, which
    `make test` installs where it can)."""
    image, folder = tmp_path / "exfat.img", tmp_path / "exfat"
    folder.mkdir()
    with image.open("wb") as fh:
        fh.truncate(32 * 2**20)

    def run(*command: str) -> str:
        try:
            done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
        except FileNotFoundError:
            pytest.skip(f"no {command[0]} here (Debian's exfatprogs, exfat-fuse and mount)")
        except subprocess.TimeoutExpired:
            pytest.skip(f"cannot mount an exFAT file system here: {command[0]} took over 60 s")
        if done.returncode != 0:
            pytest.skip(
                f"cannot mount an exFAT file system here ({' '.join(command[:2])}, as "
                f"root with /dev/fuse and loop devices): {done.stderr.strip()}"
            )
        return done.stdout.strip()

    run("mkfs.exfat", str(image))
    device = run("losetup", "--find", "--show", str(image))
    try:
        run("mount.exfat-fuse", device, str(folder))
        try:
            yield folder
        finally:
            subprocess.run(["umount", str(folder)], check=True)
    finally:
        subprocess.run(["losetup", "--detach", device], check=True)


def test_an_upload_cut_short_goes_on_in_a_folder_on_a_file_system_without_hard_links(
    tf_platform: LocalPlatform,
    tf_store: tuple[StateStore, str],
    without_hard_links: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An unfinished upload's file is made locked under another name and linked into place: on a
    # file system without hard links every upload sent with its digest was a 503 that told the
    # operator to make the upload folder one the controller can write.
    data = save_npz(tmp_path / "d.npz").read_bytes()
    half = len(data) // 2
    uploads = without_hard_links / "uploads"
    with serve(tf_platform, tf_store, upload_dir=str(uploads)) as (url, controller):
        api = (url, controller)
        key = create_key(controller.store, tenant="fay")[1]
        probe = uploads / "probe"
        probe.parent.mkdir()
        probe.touch()
        with pytest.raises(PermissionError):  # the premise: no hard links there
            probe.with_name("linked").hardlink_to(probe)
        probe.unlink()

        # Execute: the first half sent, then the rest as it is written (waited for 0.5 s), then
        # once its link is lost.
        monkeypatch.setattr(datasets_module, "LOCK_WAIT_S", 0.5)
        with sending_half(api, key, "fat", data), client(api, key) as fay:
            busy = fay.put("/v1/datasets/fat", **part_of(data, half))
        monkeypatch.undo()
        held = held_of(api, key, "fat")
        with client(api, key) as fay:
            rest = fay.put("/v1/datasets/fat", **part_of(data, half))

    # Assert: the half held, and locked while its request wrote it; the rest made it whole.
    assert busy.status_code == 409, busy.text
    assert held == [half]
    assert rest.status_code == 201, rest.text
    assert rest.json()["sha256"] == hashlib.sha256(data).hexdigest()
    assert (uploads / "fay" / "fat.npz").read_bytes() == data
    assert sorted(p.name for p in (uploads / "fay").iterdir()) == [".fat.npz.sha256", "fat.npz"]


def test_names_that_differ_by_case_alone_are_kept_apart_or_refused_where_the_files_are_one(
    tf_platform: LocalPlatform,
    tf_store: tuple[StateStore, str],
    without_hard_links: Path,
    tmp_path: Path,
) -> None:
    # exFAT (as an SMB share, or macOS's file system by default) does not tell names apart by
    # case: tenant ada's folder of uploads was tenant Ada's, her uploads listed and trained on by
    # ada; and Ada's data set "set" replaced her "Set", and a job naming "set.npz" trained on it.
    data = save_npz(tmp_path / "d.npz").read_bytes()
    uploads = without_hard_links / "uploads"
    with serve(tf_platform, tf_store, upload_dir=str(uploads)) as (url, controller):
        keys = {t: create_key(controller.store, tenant=t)[1] for t in ("Ada", "ada", "bo")}
        with (
            client((url, controller), keys["Ada"]) as upper,
            client((url, controller), keys["ada"]) as lower,
            client((url, controller), keys["bo"]) as bo,
        ):
            # Execute
            kept = upper.put("/v1/datasets/Set", content=data)
            theirs = {
                "list": lower.get("/v1/datasets"),
                "upload": lower.put("/v1/datasets/Set", content=data),
                "job": lower.post(
                    "/v1/jobs", json={**MLP, "dataset": {"name": "npz", "path": "Set.npz"}}
                ),
            }
            other_case = {
                "upload": upper.put("/v1/datasets/set", content=data),
                "delete": upper.delete("/v1/datasets/set"),
                "job": upper.post(
                    "/v1/jobs", json={**MLP, "dataset": {"name": "npz", "path": "set.npz"}}
                ),
            }
            own = upper.get("/v1/datasets").json()
            elsewhere = bo.put("/v1/datasets/set", content=data)

    # Assert: ada is refused all her uploads; Ada's name in another case is not her data set;
    # a tenant of a name of its own uploads as it would anywhere.
    assert kept.status_code == 201, kept.text
    said = {what: (r.status_code, r.json()["detail"]) for what, r in theirs.items()}
    refusal = (
        403,
        "the controller keeps uploads on a file system that does not tell names apart by case, "
        "and another tenant's name is yours in another case: your uploads cannot be kept apart "
        "from theirs there; ask its operator to keep FAASDL_API__UPLOAD_DIR on one that does",
    )
    assert said == {"list": refusal, "upload": refusal, "job": refusal}
    conflict = (
        409,
        "your data set 'Set' is the same file as 'set' on the controller's file system, which "
        "does not tell names apart by case: name it so, or delete that one first",
    )
    said = {what: (r.status_code, r.json()["detail"]) for what, r in other_case.items()}
    assert said == {
        "upload": conflict,
        "delete": conflict,
        "job": (
            422,
            "dataset.path: no upload of yours is named 'set.npz' (did you mean 'Set.npz'?): "
            "upload one with faasdl datasets upload FILE, or PUT /v1/datasets/NAME",
        ),
    }
    assert [d["name"] for d in own] == ["Set"]
    assert (uploads / "Ada" / "Set.npz").read_bytes() == data
    assert elsewhere.status_code == 201, elsewhere.text
    assert sorted(os.listdir(uploads)) == ["Ada", "bo"]


def test_a_part_refused_leaves_what_was_held_and_a_wrong_file_nothing(
    api: tuple[str, Controller], roots: dict[str, Path], tmp_path: Path
) -> None:
    # Arrange
    key = create_key(api[1].store, tenant="mo")[1]
    data, other = two_files(tmp_path)
    whole = f"bytes 1000-{len(data) - 1}/{len(data)}"

    # Execute: a first part, then parts refused; another file sent with the first's digest.
    with client(api, key) as mo:
        first = mo.put("/v1/datasets/parts", **part_of(data, 0, 999))
        refused = {
            "no digest": mo.put(
                "/v1/datasets/parts", content=data[1000:], headers={"Content-Range": whole}
            ),
            "another digest": mo.put(
                "/v1/datasets/parts", content=data, headers={"Repr-Digest": "md5=:AAAA:"}
            ),
            "a short digest": mo.put(
                "/v1/datasets/parts", content=data, headers={"Repr-Digest": "sha-256=:AAAA:"}
            ),
            "no range": mo.put(
                "/v1/datasets/parts",
                content=data[1000:],
                headers={"Repr-Digest": digest_of(data), "Content-Range": "bytes 1000-/9"},
            ),
            "a short body": mo.put(
                "/v1/datasets/parts",
                content=data[1000:2000],
                headers={**part_of(data, 1000, 2999)["headers"]},
            ),
            "too large": mo.put(
                "/v1/datasets/parts",
                content=data[:10],
                headers={"Repr-Digest": digest_of(data), "Content-Range": "bytes 0-9/70000"},
            ),
        }
        held = mo.get("/v1/datasets/parts/upload").json()
        wrong = mo.put(
            "/v1/datasets/wrong", content=other, headers={"Repr-Digest": digest_of(data)}
        )
        deleted = mo.delete("/v1/datasets/parts")
        after = mo.get("/v1/datasets/parts/upload").json()
        again = mo.delete("/v1/datasets/parts")

    # Assert: each refusal names its header; the first part is all that is held through them,
    # until the name is deleted; the wrong file is refused and nothing of it kept.
    assert first.status_code == 202, first.text
    assert first.json()["received"] == 1000
    said = {what: (r.status_code, r.json()["detail"]) for what, r in refused.items()}
    assert said == {
        "no digest": (
            422,
            "Content-Range: needs Repr-Digest: the whole file's SHA-256 names the upload a part "
            "goes on",
        ),
        "another digest": (
            422,
            "Repr-Digest: has no sha-256: an upload is named by the SHA-256 of the whole file "
            "(sha-256=:BASE64:), the one digest the controller checks",
        ),
        "a short digest": (
            422,
            "Repr-Digest: sha-256=:AAAA:: not the base64 of a SHA-256 between colons "
            "(sha-256=:BASE64:)",
        ),
        "no range": (
            422,
            "Content-Range: 'bytes 1000-/9' is not `bytes FIRST-LAST/TOTAL` (the part's first "
            "and last bytes, counted from 0, and the whole file's size)",
        ),
        "a short body": (422, "Content-Range: gave 2,000 bytes, and 1,000 came"),
        "too large": (
            413,
            "the file's 70,000 bytes are over the controller's FAASDL_API__MAX_UPLOAD_BYTES, "
            "65,536",
        ),
    }
    assert [p["received"] for p in held] == [1000]
    assert wrong.status_code == 422
    assert wrong.json()["detail"] == (
        f"body: is not the file its Repr-Digest names (SHA-256 {hashlib.sha256(data).hexdigest()})"
        ": it changed as it was sent, or the digest is another file's; send it again"
    )
    assert deleted.status_code == 204
    assert after == []
    assert again.status_code == 404
    assert list((roots["uploads"] / "mo").iterdir()) == []


def test_every_unfinished_upload_is_listed_and_deleted_without_its_data_set(
    api: tuple[str, Controller], roots: dict[str, Path], tmp_path: Path
) -> None:
    # Arrange: ivo's data set, the first 1,000 bytes of another file as its name and 500 of one
    # as another name; una's part as the data set's name.
    ivo = create_key(api[1].store, tenant="ivo")[1]
    una = create_key(api[1].store, tenant="una")[1]
    data, other = two_files(tmp_path)
    with client(api, ivo) as caller:
        assert caller.put("/v1/datasets/kept", content=other).status_code == 201
        assert caller.put("/v1/datasets/kept", **part_of(data, 0, 999)).status_code == 202
        assert caller.put("/v1/datasets/more", **part_of(data, 0, 499)).status_code == 202
    with client(api, una) as caller:
        assert caller.put("/v1/datasets/kept", **part_of(data, 0, 99)).status_code == 202

    # Execute
    with client(api, ivo) as caller:
        listed = caller.get("/v1/uploads").json()
        deleted = caller.delete("/v1/datasets/kept/upload")
        after = caller.get("/v1/uploads").json()
        datasets = caller.get("/v1/datasets").json()
        again = caller.delete("/v1/datasets/kept/upload")

    # Assert: ivo's parts, by name, una's not; those of the name deleted, its data set kept.
    assert [(p["name"], p["received"]) for p in listed] == [("kept", 1000), ("more", 500)]
    assert {p["sha256"] for p in listed} == {hashlib.sha256(data).hexdigest()}
    assert deleted.status_code == 204
    assert [(p["name"], p["received"]) for p in after] == [("more", 500)]
    assert [(d["name"], d["bytes"]) for d in datasets] == [("kept", len(other))]
    assert (roots["uploads"] / "ivo" / "kept.npz").read_bytes() == other
    assert again.status_code == 404
    assert again.json()["detail"] == "name: no unfinished upload as 'kept'"
    assert held_of(api, una, "kept") == [100]


def test_a_name_being_sent_is_not_deleted_until_its_request_has_ended(
    api: tuple[str, Controller], roots: dict[str, Path], tmp_path: Path
) -> None:
    # Arrange: a data set, and a file arriving as its name (half written, its link open).
    key = create_key(api[1].store, tenant="vic")[1]
    data, other = two_files(tmp_path)
    with client(api, key) as vic:
        assert vic.put("/v1/datasets/busy", content=other).status_code == 201
    kept = roots["uploads"] / "vic"
    before = sorted(p.name for p in kept.iterdir())

    # Execute: both deletions as it arrives, then the parts' once its request has ended (the
    # link's loss may take the controller a moment to see).
    with sending_half(api, key, "busy", data), client(api, key) as vic:
        unfinished = vic.delete("/v1/datasets/busy/upload")
        whole = vic.delete("/v1/datasets/busy")
        left = sorted(p.name for p in kept.iterdir())
    with client(api, key) as vic:
        eventually(
            lambda: vic.delete("/v1/datasets/busy/upload").status_code == 204,
            what="the parts deleted once the request has ended",
        )

    # Assert: each refused, naming why, and nothing removed; then the parts alone.
    for refused in (unfinished, whole):
        assert refused.status_code == 409
        assert refused.json()["detail"] == (
            "a request is sending a file as 'busy': delete it once that request has ended"
        )
    assert len(left) == len(before) + 1  # the arriving file's part
    assert sorted(p.name for p in kept.iterdir()) == before == [".busy.npz.sha256", "busy.npz"]


@contextmanager
def cutting_uploads(upstream: str, cuts: list[int | None], asked: list[str]) -> Iterator[str]:
    """A proxy to ``upstream`` (its URL) that passes on ``cuts``' numbers of bytes of the bodies
    of its first PUTs, one each, then closes both connections unanswered (a link lost; ``None``:
    the whole body passed on, its answer lost), and passes every other request on whole; it
    adds each request's method, path and ``Content-Range`` to ``asked``."""
    parts = urlsplit(upstream)

    def held(path: str, key: str) -> list[int]:
        asking = {"Authorization": key}
        found = httpx.get(f"{upstream}{path}/upload", headers=asking, timeout=60).json()
        return [p["received"] for p in found]

    class Proxy(QuietHandler):
        def do_GET(self) -> None:
            asked.append(
                f"{self.command} {self.path} {self.headers['Content-Range'] or ''}".strip()
            )
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            headers = {
                k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
            }
            self.close_connection = True
            if self.command == "PUT" and cuts and cuts[0] is None:
                cuts.pop(0)
                httpx.put(upstream + self.path, headers=headers, content=body, timeout=60)
                return
            if self.command == "PUT" and cuts:
                cut = http.client.HTTPConnection(parts.hostname or "", parts.port)
                cut.putrequest("PUT", self.path, skip_accept_encoding=True)
                for name, value in headers.items():
                    cut.putheader(name, value)
                sent = cuts.pop(0) or 0
                first = (self.headers["Content-Range"] or "bytes 0-").split()[1].split("-")[0]
                cut.endheaders(body[:sent])
                # What came is written before the link goes (uvicorn drops what it has read
                # and not handed on, and the client is to be told a number known here).
                eventually(
                    lambda: held(self.path, self.headers["Authorization"]) == [int(first) + sent],
                    what=f"{sent} bytes written after {first}",
                )
                cut.close()
                return
            answer = httpx.request(
                self.command, upstream + self.path, headers=headers, content=body, timeout=60
            )
            relay(self, answer)

        do_PUT = do_GET

    with serving_http(Proxy) as url:
        yield url


def test_the_python_client_goes_on_with_an_upload_cut_short_in_its_run_and_in_the_next(
    api: tuple[str, Controller],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Arrange: links lost twice in a run's upload; in another, once in a run that does not go
    # on by itself (a laptop closed), then a next run; in a third, the answer to the whole file;
    # then the first file's upload again.
    key = create_key(api[1].store, tenant="nia")[1]
    path = save_npz(tmp_path / "d.npz")
    size = len(path.read_bytes())
    asked: list[list[str]] = [[], [], [], [], []]

    def upload(name: str, cuts: list[int | None], asked: list[str]) -> dict[str, Any]:
        with (
            cutting_uploads(api[0], cuts, asked) as url,
            ControllerClient(url=url, api_key=key) as nia,
        ):
            return nia.upload_dataset(name, path)

    # Execute
    with caplog.at_level(logging.WARNING, "faasdl.controller.client"):
        uploaded = upload("resumed", [4000, 3000], asked[0])
        monkeypatch.setattr(client_module, "UPLOAD_RESUMES", 0)
        with pytest.raises(PlatformUnavailable, match="is unreachable"):
            upload("later", [5000], asked[1])
        later = upload("later", [], asked[2])
        answered = upload("answered", [None], asked[3])
        again = upload("resumed", [], asked[4])

    # Assert: each run asked first whether the controller kept the file as the name, then went
    # on from what it held (after asking whether the whole file had come); the file was sent
    # once in all, and not at all again.
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    assert (uploaded["sha256"], uploaded["bytes"]) == (sha256, size)
    assert (later["sha256"], later["bytes"]) == (sha256, size)
    assert answered == {**later, "name": "answered", "path": "answered.npz"}
    asking = ["GET /v1/datasets/resumed/upload", "GET /v1/datasets"]
    assert asked[0] == [
        "GET /v1/datasets",
        "GET /v1/datasets/resumed/upload",
        "PUT /v1/datasets/resumed",
        *asking,
        f"PUT /v1/datasets/resumed bytes 4000-{size - 1}/{size}",
        *asking,
        f"PUT /v1/datasets/resumed bytes 7000-{size - 1}/{size}",
    ]
    assert asked[1] == [
        "GET /v1/datasets",
        "GET /v1/datasets/later/upload",
        "PUT /v1/datasets/later",
        "GET /v1/datasets/later/upload",
        "GET /v1/datasets",
    ]
    assert asked[2] == [
        "GET /v1/datasets",
        "GET /v1/datasets/later/upload",
        f"PUT /v1/datasets/later bytes 5000-{size - 1}/{size}",
    ]
    # The answer lost, the file whole: its record found, nothing sent again.
    assert asked[3] == [
        "GET /v1/datasets",
        "GET /v1/datasets/answered/upload",
        "PUT /v1/datasets/answered",
        "GET /v1/datasets/answered/upload",
        "GET /v1/datasets",
    ]
    assert (again, asked[4]) == (uploaded, ["GET /v1/datasets"])
    assert [r.getMessage().partition(" (")[0] for r in caplog.records] == [
        "the upload of resumed stopped after 4,000 bytes",
        "the upload of resumed stopped after 7,000 bytes",
    ]


def test_the_cli_lists_uploads_cut_short_and_deletes_them_alone(
    api: tuple[str, Controller], tmp_path: Path
) -> None:
    # Arrange: a data set, and the first 1,000 bytes of another file sent as its name.
    key = create_key(api[1].store, tenant="wren")[1]
    data, other = two_files(tmp_path)
    with client(api, key) as wren:
        assert wren.put("/v1/datasets/cut", content=other).status_code == 201
        assert wren.put("/v1/datasets/cut", **part_of(data, 0, 999)).status_code == 202

    def datasets(*args: str) -> Any:
        env = {"FAASDL_CLIENT__API_KEY": key}
        return CliRunner().invoke(cli, ["datasets", *args, "--url", api[0]], env=env)

    # Execute
    listed = datasets("list")
    deleted = datasets("delete", "cut", "--unfinished")
    after = datasets("list")
    again = datasets("delete", "cut", "--unfinished")

    # Assert: the part shown beneath the data sets, which alone are the JSON; deleted alone.
    assert listed.exit_code == 0, listed.output
    assert [d["name"] for d in json.loads(listed.stdout.splitlines()[-1])] == ["cut"]
    assert "uploads cut short" in listed.stderr
    assert hashlib.sha256(data).hexdigest()[:12] in listed.stderr
    assert "1,000" in listed.stderr
    assert "faasdl datasets delete NAME --unfinished deletes those of NAME" in " ".join(
        listed.stderr.split()
    )
    assert deleted.exit_code == 0, deleted.output
    assert json.loads(deleted.stdout) == {"name": "cut", "deleted": True, "unfinished": True}
    assert after.exit_code == 0, after.output
    assert "uploads cut short" not in after.stderr
    assert [d["bytes"] for d in json.loads(after.stdout.splitlines()[-1])] == [len(other)]
    assert again.exit_code == 2
    assert "no unfinished upload as 'cut'" in again.output


def test_the_cli_sends_an_uploads_digest_and_goes_on_from_where_its_link_was_lost(
    api: tuple[str, Controller], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Arrange
    key = create_key(api[1].store, tenant="quinn")[1]
    path = save_npz(tmp_path / "set.npz")
    size = len(path.read_bytes())
    asked: list[str] = []

    def upload(url: str) -> Any:
        return CliRunner().invoke(
            cli,
            ["datasets", "upload", str(path), "--url", url],
            env={"FAASDL_CLIENT__API_KEY": key},
        )

    # Execute: the upload, then the same file's again.
    with (
        cutting_uploads(api[0], [6000], asked) as url,
        caplog.at_level(logging.WARNING, "faasdl.controller.client"),
    ):
        result = upload(url)
    again = upload(api[0])

    # Assert: the rest sent after the lost link, the whole file's record last; the second run
    # sent nothing, saying so, and printed the same record.
    assert result.exit_code == 0, result.output
    assert asked == [
        "GET /v1/datasets",
        "GET /v1/datasets/set/upload",
        "PUT /v1/datasets/set",
        "GET /v1/datasets/set/upload",
        "GET /v1/datasets",
        f"PUT /v1/datasets/set bytes 6000-{size - 1}/{size}",
    ]
    assert "the upload of set stopped after 6,000 bytes" in caplog.text
    uploaded = json.loads(result.output.splitlines()[-1])
    assert uploaded["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "nothing sent" not in result.output
    assert again.exit_code == 0, again.output
    assert "set is this file already (its SHA-256): nothing sent" in again.stderr
    assert "400 training and 10 test examples" in again.stderr
    assert json.loads(again.stdout.splitlines()[-1]) == uploaded


def test_a_job_larger_than_its_tenants_memory_quota_is_refused(
    tf_platform: LocalPlatform, tf_store: tuple[StateStore, str]
) -> None:
    with serve(tf_platform, tf_store, tenant_max_memory_mb=200) as (url, controller):
        key = create_key(controller.store, tenant="erin")[1]
        with client((url, controller), key) as erin:
            response = erin.post("/v1/jobs", json={**MLP, "workers": 2})

    assert response.status_code == 403
    assert response.json()["detail"].startswith("workers: ")
    assert "(200 MB)" in response.json()["detail"]


def test_event_streams_are_limited_per_key_and_end_after_their_longest_time(
    tf_platform: LocalPlatform, tf_store: tuple[StateStore, str]
) -> None:
    with serve(
        tf_platform, tf_store, max_streams_per_key=1, stream_max_s=1.0, stream_keepalive_s=0.2
    ) as (url, controller):
        key = create_key(controller.store, tenant="frank")[1]
        with client((url, controller), key) as frank:
            job_id = frank.post("/v1/jobs", json=MLP).json()["job"]["job_id"]
            with frank.stream("GET", f"/v1/jobs/{job_id}/events") as stream:
                second = frank.get(f"/v1/jobs/{job_id}/events")
                lines = list(stream.iter_lines())  # ends by itself: the job stays queued
            again = frank.get(f"/v1/jobs/{job_id}/events")  # the slot is free again

    assert second.status_code == 429
    assert any(line.startswith("event: submitted") for line in lines)
    assert ": keep-alive" in lines
    assert not any(line.startswith("event: end") for line in lines)
    assert again.status_code == 200


def test_an_event_stream_ends_once_its_key_is_revoked(
    tf_platform: LocalPlatform, tf_store: tuple[StateStore, str]
) -> None:
    # Streams of 30 s, kept open by keep-alives: one that ends for its time says nothing of keys.
    with serve(tf_platform, tf_store, stream_max_s=30.0, stream_keepalive_s=0.2) as (
        url,
        controller,
    ):
        record, key = create_key(controller.store, tenant="hugo")
        with client((url, controller), key) as hugo:
            job_id = hugo.post("/v1/jobs", json=MLP).json()["job"]["job_id"]
            with hugo.stream("GET", f"/v1/jobs/{job_id}/events") as stream:
                lines = stream.iter_lines()
                before = [next(lines) for _ in range(3)]  # the job's first line: it is open
                revoke_key(controller.store, record.key_id)
                after = list(lines)  # ends by itself: the job stays queued
            again = hugo.get(f"/v1/jobs/{job_id}/events")

    assert before[1] == "event: submitted"
    assert ": keep-alive" in after
    assert after[-2:] == [": the API key is no longer valid", ""]
    assert not any(line.startswith("event: ") for line in after)
    assert again.status_code == 401


def test_metrics_take_a_key_the_store_accepted_lately_while_it_is_down_and_nothing_else(
    tf_platform: LocalPlatform, tmp_path: Path
) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it with apt-get)")
    with RedisServer(directory=tmp_path) as redis, make_store(Settings().store, redis.url) as store:
        scraper = create_key(store, tenant="ops", admin=True)[1]
        unused = create_key(store, tenant="ops", admin=True)[1]  # never shown to the controller
        record, revoked = create_key(store, tenant="ops", admin=True)
        tenant = create_key(store, tenant="alice")[1]
        with serve(tf_platform, (store, redis.url)) as api:

            def scrape(key: str) -> httpx.Response:
                with client(api, key) as http:
                    return http.get("/metrics")

            before = {
                name: scrape(key).status_code
                for name, key in [("scraper", scraper), ("revoked", revoked), ("tenant", tenant)]
            }
            revoke_key(store, record.key_id)
            refused = scrape(revoked).status_code
            redis.stop()
            during = scrape(scraper)
            with client(api, scraper) as http:
                jobs = http.get("/v1/jobs")
            others = {
                name: scrape(key)
                for name, key in [("unused", unused), ("revoked", revoked), ("tenant", tenant)]
            }

    assert before == {"scraper": 200, "revoked": 200, "tenant": 403}
    assert refused == 401
    assert during.status_code == 200
    assert "faasdl_admission_last_pass_timestamp_seconds" in during.text
    assert jobs.status_code == 503  # the key lets in the metrics only
    for name, answer in others.items():
        assert answer.status_code == 503, name
        assert "Redis" in answer.json()["detail"], name


def test_a_key_is_vouched_for_its_grace_after_the_store_last_accepted_it() -> None:
    now = [100.0]
    vouched = VouchedKeys(grace_s=60.0, clock=lambda: now[0])
    admin = Principal(tenant="ops", admin=True, key_id="0123456789abcdef")
    tenant = Principal(tenant="alice", admin=False, key_id="fedcba9876543210")
    vouched.accepted("fdl_admin", admin)
    vouched.accepted("fdl_tenant", tenant)

    now[0] = 160.0
    at_the_grace = vouched.vouched("fdl_admin")
    now[0] = 160.5
    past_it = vouched.vouched("fdl_admin")
    vouched.accepted("fdl_admin", admin)  # accepted again: vouched anew
    renewed = vouched.vouched("fdl_admin")
    vouched.refused("fdl_admin")
    none = VouchedKeys(grace_s=0.0)
    none.accepted("fdl_admin", LOCAL)

    assert at_the_grace == (admin, 60.0)
    assert past_it is None
    assert renewed == (admin, 0.0)
    assert vouched.vouched("fdl_admin") is None
    assert vouched.vouched("fdl_tenant") is None  # only administrators' keys are kept
    assert none.vouched("fdl_admin") is None


def test_keys_are_made_listed_and_revoked_from_the_command_line(tmp_path: Path) -> None:
    env = {"FAASDL_STORE__URL": f"sqlite:///{tmp_path / 'state.db'}"}
    runner = CliRunner()

    made = runner.invoke(cli, ["keys", "create", "--tenant", "gina", "--admin"], env=env)
    bad = runner.invoke(cli, ["keys", "create", "--tenant", "no spaces"], env=env)
    key = json.loads(made.stdout.splitlines()[-1])
    for_a_day = runner.invoke(
        cli, ["keys", "create", "--tenant", "gina", "--expires-in", "24h"], env=env
    )
    lives = [
        runner.invoke(cli, ["keys", "create", "--tenant", "gina", "--expires-in", life], env=env)
        for life in ("2w", "0m", "3651d")
    ]
    listed = runner.invoke(cli, ["keys", "list"], env=env)
    revoked = runner.invoke(cli, ["keys", "revoke", key["key_id"]], env=env)
    unknown = runner.invoke(cli, ["keys", "revoke", "0000000000000000"], env=env)
    after = runner.invoke(cli, ["keys", "list"], env=env)

    assert made.exit_code == 0, made.output
    assert key["key"].startswith(f"fdl_{key['key_id']}.")
    assert bad.exit_code == 2
    assert "tenant" in bad.output
    assert key["key"] not in listed.stdout
    assert "secret_sha256" not in listed.stdout
    assert revoked.exit_code == 0
    assert unknown.exit_code == 2
    assert "no API key" in unknown.output
    assert json.loads(after.stdout.splitlines()[-1])[0]["revoked_ms"] is not None
    assert key["expires_ms"] is None  # valid until revoked
    day = json.loads(for_a_day.stdout.splitlines()[-1])
    (listed_day,) = [
        k for k in json.loads(after.stdout.splitlines()[-1]) if k["key_id"] == day["key_id"]
    ]
    assert day["expires_ms"] - listed_day["created_ms"] == 86_400_000
    assert "it expires at " in for_a_day.output
    assert "expires at" not in made.output
    assert "expires" in after.stdout
    saids = ["'2w' is not a duration", "'0m': a key's life is", "'3651d': a key's life is"]
    for refused, said in zip(lives, saids, strict=True):
        assert refused.exit_code == 2
        assert said in " ".join(refused.output.split())
