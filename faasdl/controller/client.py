"""A client of the controller's REST API (the CLI's, and yours from Python), with the API's
errors as faasdl errors.

    with ControllerClient.from_settings() as client:  # FAASDL_CLIENT__URL, __API_KEY
        job_id = client.submit({"model": "mlp", "dataset": {"name": "digits"}})["job"]["job_id"]
        view = client.wait(job_id)  # its state done, failed or cancelled
        client.save_model(job_id, "model.safetensors")
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlsplit

import requests
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from faasdl.errors import (
    AccessError,
    DatasetNotFound,
    FaasdlError,
    JobError,
    JobNotFound,
    LimitExceeded,
    PlatformUnavailable,
    Unauthenticated,
    UploadConflict,
    ValidationError,
    body_said,
    check_unicode,
    reason,
)
from faasdl.files import Download, Resumable

if TYPE_CHECKING:
    import numpy as np

    from faasdl.config import Settings

log = logging.getLogger(__name__)

#: What a download tells as it goes: the bytes written, and the whole's (``None``: not known).
Progress = Callable[[int, int | None], None]
#: How much of a model a download writes at a time.
DOWNLOAD_CHUNK_BYTES = 1 << 20
#: How many times a model's download cut short goes on from where it stopped.
DOWNLOAD_RESUMES = 3
#: How many times a data set's upload cut short goes on from what the controller holds of it.
UPLOAD_RESUMES = 3
#: A job's states once it has ended.
ENDED = ("done", "failed", "cancelled")


class ControllerClient:
    def __init__(
        self,
        *,
        url: str,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        reconnect_s: float = 120.0,
        ca_file: str | os.PathLike[str] | None = None,
    ) -> None:
        """``ca_file``: the CA bundle an https:// controller's certificate is verified by (none:
        the system's, or ``REQUESTS_CA_BUNDLE``'s)."""
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.reconnect_s = reconnect_s
        # Given with each request: a session's own is overridden by REQUESTS_CA_BUNDLE.
        self._verify: bool | str = os.fspath(ca_file) if ca_file is not None else True
        self._session = requests.Session()
        if api_key:
            self._session.headers["Authorization"] = f"Bearer {api_key}"

    @classmethod
    def from_settings(
        cls, settings: Settings | None = None, *, url: str | None = None
    ) -> ControllerClient:
        """A client of the controller ``url`` names, else ``FAASDL_CLIENT__URL``, else
        ``FAASDL_CONTROLLER__HOST`` and ``__PORT``, with the key ``FAASDL_CLIENT__API_KEY`` (or
        ``__API_KEY_FILE``) holds."""
        if settings is None:
            from faasdl.config import Settings

            settings = Settings()
        client = settings.client
        url = url or client.url or settings.controller.url
        key = client.api_key.get_secret_value() if client.api_key else None
        return cls(url=url, api_key=key, reconnect_s=client.reconnect_s, ca_file=client.ca_file)

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._session.close()

    def submit(self, spec: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {}
        if idempotency_key is not None:
            from faasdl.controller.validator import check_idempotency_key

            check_idempotency_key(idempotency_key)
            headers["Idempotency-Key"] = idempotency_key
        found: dict[str, Any] = self._answer("POST", "/v1/jobs", json=spec, headers=headers)
        return found

    def estimate(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The plan the controller would run the job with; nothing runs."""
        found: dict[str, Any] = self._answer("POST", "/v1/estimate", json=spec)
        return found

    def jobs(self, **filters: str | int | None) -> tuple[list[dict[str, Any]], str | None]:
        """A page of jobs (``limit``, ``before`` and the filters as the API takes them), and the
        last job's id when there are more: the next page's ``before``."""
        params = {k: v for k, v in filters.items() if v is not None}
        response = self._call("GET", "/v1/jobs", params=params)
        found: list[dict[str, Any]] = _parsed(response, self.url)
        more = "next" in response.links and bool(found)
        return found, found[-1]["job_id"] if more else None

    def job(
        self, job_id: str, *, timeout_s: float | None = None, round_from: int = 0
    ) -> dict[str, Any]:
        """The job's view, with its rounds from round ``round_from`` on; ``timeout_s`` (default:
        the client's) bounds each wait for the controller (a watch's reads take less than a
        model's download may)."""
        found: dict[str, Any] = self._answer(
            "GET", f"/v1/jobs/{job_id}", timeout=timeout_s, params={"round_from": round_from}
        )
        return found

    def wait(
        self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0
    ) -> dict[str, Any]:
        """The job's view once it has ended (done, failed or cancelled: its ``job.state``), read
        every ``poll_s``; a controller that stops answering (a restart) is asked again for the
        client's ``reconnect_s``. ``TimeoutError`` if it runs on past ``timeout_s`` (the job
        goes on)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        seen = 0  # rounds read: a long job's are not read again at each look
        while True:
            view = self._read_through_outages(job_id, seen)
            state = view["job"]["state"]
            if state in ENDED:
                return view if seen == 0 else self._read_through_outages(job_id, 0)
            seen = view["job"]["round"]
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {state} after {timeout_s:g} s")
            left = math.inf if deadline is None else deadline - time.monotonic()
            time.sleep(max(0.0, min(poll_s, left)))

    def _read_through_outages(self, job_id: str, round_from: int) -> dict[str, Any]:
        retrying = Retrying(
            retry=retry_if_exception_type(PlatformUnavailable),
            stop=stop_after_delay(self.reconnect_s),
            wait=wait_exponential(multiplier=0.5, max=5),
            reraise=True,
        )
        return retrying(self.job, job_id, round_from=round_from)

    def cancel(self, job_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self._answer("DELETE", f"/v1/jobs/{job_id}")
        return found

    def delete(self, job_id: str) -> None:
        """Delete the ended job whole: its record, log, ledger and model (``JobError`` for one
        that has not ended)."""
        self._call("DELETE", f"/v1/jobs/{job_id}", params={"purge": "true"})

    def finish(self, job_id: str) -> dict[str, Any]:
        """End the running job now, done, with its last finished round's model; its view."""
        found: dict[str, Any] = self._answer("POST", f"/v1/jobs/{job_id}/finish")
        return found

    def ledger(self, job_id: str, round_from: int = 0) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._answer(
            "GET", f"/v1/jobs/{job_id}/ledger", params={"round_from": round_from}
        )
        return found

    def model(self, job_id: str) -> bytes:
        buffer = io.BytesIO()
        self.download_model(job_id, buffer)
        return buffer.getvalue()

    def download_model(
        self, job_id: str, out: BinaryIO, *, progress: Progress | None = None
    ) -> int:
        """Write the job's model to ``out`` as it arrives, not held whole; returns its size. A
        download cut short (the connection lost) after some progress goes on from where it
        stopped, up to :data:`DOWNLOAD_RESUMES` times, asking for the rest of the same model
        (``Range`` and ``If-Range`` its ETag): a large model is not downloaded again from its
        start. (One cut short where the controller found a damaged chunk is not resumed into
        it: the rest is refused, saying so, or it stops where it stopped.) ``progress`` is
        called as each piece is written, with the bytes written and the model's size."""
        return self._download(job_id, Download(out), progress)

    def save_model(
        self, job_id: str, path: str | os.PathLike[str], *, progress: Progress | None = None
    ) -> int:
        """Download the job's model to ``path``, written as it arrives beside it and renamed when
        whole (a device or a pipe is written to as it is); returns its size. A download that
        fails after some of it came keeps that part (:class:`~faasdl.files.Resumable`: the file
        ``NAME.partial`` and its ETag beside it), and the next save to ``path`` goes on from
        there if the model is the same (the rest of it asked for, as a download cut short within
        a run goes on), or writes the other whole. ``progress`` as :meth:`download_model`'s
        (the bytes kept counted as written)."""
        into = Resumable(Path(path))
        try:
            with into.writing():
                return self._download(job_id, into, progress)
        finally:
            if into.kept:
                log.warning(
                    "the %s bytes of the model written are kept in %s: a download to %s goes "
                    "on from there",
                    f"{into.written:,}",
                    into.partial,
                    path,
                )

    def _download(self, job_id: str, into: Download, progress: Progress | None) -> int:
        """Write the job's model into ``into`` (which may hold the first bytes of the model whose
        ETag is its tag: the rest is asked for); see :meth:`download_model`."""
        path, resumes, kept = f"/v1/jobs/{job_id}/model", 0, into.written
        while True:
            started = into.written
            rest = {"Range": f"bytes={started}-", "If-Range": into.tag} if into.tag else {}
            try:
                response = self._call("GET", path, stream=True, headers=rest)
            except FaasdlError as exc:
                if exc.status_code != 416 or resumes:
                    raise
                # The model's ETag is the one kept with its bytes, which reach its end: it was
                # whole (a run stopped before renaming it), unless the file grew after.
                if started == int(self._call("HEAD", path).headers["Content-Length"]):
                    return started
                into.start_over(None)
                continue
            with response:
                if not rest:
                    into.tagged(response.headers.get("ETag"))
                elif response.status_code != 206 and resumes:  # another model (the If-Range)
                    raise PlatformUnavailable(
                        f"the controller at {self.url} stopped sending the model after "
                        f"{started:,} bytes, and then sent another one: download it again"
                    )
                elif response.status_code != 206:  # kept from a run before, of another model
                    log.warning(
                        "the %s bytes kept of a download before are of another model: "
                        "downloading it whole",
                        f"{kept:,}",
                    )
                    into.start_over(response.headers.get("ETag"))
                elif not resumes and kept:
                    log.warning("going on from the %s bytes kept of a download before", f"{kept:,}")
                size = _model_size(response)
                try:
                    for chunk in response.iter_content(chunk_size=DOWNLOAD_CHUNK_BYTES):
                        into.write(chunk)
                        if progress is not None:
                            progress(into.written, size)
                    return into.written
                except requests.RequestException as exc:
                    if into.tag is None or into.written == started or resumes == DOWNLOAD_RESUMES:
                        raise PlatformUnavailable(
                            f"the controller at {self.url} stopped sending the model after "
                            f"{into.written:,} bytes: {reason(exc)}"
                        ) from exc
                    resumes += 1
                    log.warning(
                        "the model's download stopped after %s bytes (%s): going on from there",
                        f"{into.written:,}",
                        reason(exc),
                    )

    def upload_dataset(
        self, name: str, data: BinaryIO | str | os.PathLike[str], *, sha256: str | None = None
    ) -> dict[str, Any]:
        """Send an ``.npz`` file (open, or its path) as the data set ``name`` (replacing one of
        that name), read as it is sent; the controller's record of it, with what it holds.

        A file that can be read again from a place (a path, an open file) goes with its SHA-256
        (``sha256``, or hashed here first; ``Repr-Digest``): where the controller keeps that file
        as ``name`` already, nothing is sent (nor read, given ``sha256``), and its record is
        returned; where its link is lost, the upload goes on from what the controller holds of it
        (``UPLOAD_RESUMES`` times), and the next upload of the same file as ``name`` does too
        (the controller keeps the part a day, ``FAASDL_API__UPLOAD_KEEP_S``). A pipe is sent
        once, as it comes."""
        if isinstance(data, (str, os.PathLike)):
            with Path(data).open("rb") as opened:
                return self.upload_dataset(name, opened, sha256=sha256)
        headers = {"Content-Type": "application/octet-stream"}
        path = f"/v1/datasets/{name}"
        if not data.seekable():
            found: dict[str, Any] = self._answer("PUT", path, data=data, headers=headers)
            return found
        start = data.tell()
        if sha256 is None:
            sha256 = sha256_of(data)
        if kept := self._uploaded(name, sha256):  # an upload of it again would change nothing
            return kept
        total = data.seek(0, os.SEEK_END) - start
        headers["Repr-Digest"] = f"sha-256=:{base64.b64encode(bytes.fromhex(sha256)).decode()}:"
        held = self._held(name, sha256, total)
        resumes = 0
        while True:
            data.seek(start + held)  # requests sends from here: what is left, its length
            if held:
                headers["Content-Range"] = f"bytes {held}-{total - 1}/{total}"
            else:
                headers.pop("Content-Range", None)
            try:
                sent: dict[str, Any] = self._answer("PUT", path, data=data, headers=headers)
                return sent
            except (PlatformUnavailable, UploadConflict) as exc:
                stopped = exc
            # Cut short, or its answer lost after the whole file came: ask what the controller
            # holds once the request is over there, and go on where some of it got there.
            before, held = held, self._held(name, sha256, total)
            if done := self._uploaded(name, sha256):
                return done
            if resumes == UPLOAD_RESUMES or (
                held <= before and not isinstance(stopped, UploadConflict)
            ):
                raise stopped
            resumes += 1
            log.warning(
                "the upload of %s stopped after %s bytes (%s): going on from there",
                name,
                f"{held:,}",
                stopped,
            )

    def _held(self, name: str, sha256: str, total: int) -> int:
        """Where to go on with the upload of the file ``sha256`` (``total`` bytes) as ``name``:
        what the controller holds of it, but its last byte at least, so that the request ends
        the upload (where the whole file is held, unchecked: its check cut short)."""
        parts = self.unfinished_uploads(name)
        held: int = next((p["received"] for p in parts if p["sha256"] == sha256), 0)
        return max(0, min(held, total - 1))

    def _uploaded(self, name: str, sha256: str) -> dict[str, Any] | None:
        """The data set ``name``'s record, where it is the file ``sha256``."""
        kept = (d for d in self.datasets() if d["name"] == name and d["sha256"] == sha256)
        return next(kept, None)

    def upload_arrays(
        self,
        name: str,
        *,
        x_train: np.ndarray,
        y_train: np.ndarray,
        x_test: np.ndarray,
        y_test: np.ndarray,
    ) -> dict[str, Any]:
        """Upload arrays as the data set ``name``: saved as an ``.npz`` in a temporary file (a
        data set may be a GiB), then sent as :meth:`upload_dataset` sends one."""
        import numpy as np

        with tempfile.TemporaryFile() as npz:
            np.savez(npz, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
            npz.seek(0)
            return self.upload_dataset(name, npz)

    def datasets(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._answer("GET", "/v1/datasets")
        return found

    def unfinished_uploads(self, name: str | None = None) -> list[dict[str, Any]]:
        """What the controller holds of the caller's unfinished uploads as ``name`` (of every
        name where none): an upload cut short, by name and SHA-256, with the bytes it holds."""
        path = "/v1/uploads" if name is None else f"/v1/datasets/{name}/upload"
        found: list[dict[str, Any]] = self._answer("GET", path)
        return found

    def delete_dataset(self, name: str, *, unfinished: bool = False) -> None:
        """Delete the data set ``name`` and what is held of its unfinished uploads; with
        ``unfinished``, only those (the data set stays)."""
        self._call(
            "DELETE", f"/v1/datasets/{name}/upload" if unfinished else f"/v1/datasets/{name}"
        )

    def _answer(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON of the controller's answer to the request (see :func:`_parsed`)."""
        return _parsed(self._call(method, path, **kwargs), self.url)

    def _call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs["timeout"] = kwargs.get("timeout") or self.timeout_s
        # A query's text with a byte the terminal could not decode (an argument's) has no UTF-8
        # for the URL: requests would raise UnicodeEncodeError as it built the request.
        check_unicode(kwargs.get("params") or {})
        try:
            response = self._session.request(method, self.url + path, verify=self._verify, **kwargs)
        except requests.Timeout as exc:
            raise PlatformUnavailable(
                f"the controller at {self.url} did not answer in {kwargs['timeout']:g} s"
            ) from exc
        except requests.RequestException as exc:
            raise PlatformUnavailable(
                f"the controller at {self.url} is unreachable: {reason(exc)}"
            ) from exc
        if response.ok:
            return response
        raise _error(response, path, self.url)


def sha256_of(data: BinaryIO, advance: Callable[[int], object] | None = None) -> str:
    """The SHA-256 of what is left to read of ``data``, in hex; ``advance`` told each block's
    length as it is read (a progress bar's)."""
    digest = hashlib.sha256()
    while block := data.read(1 << 20):
        digest.update(block)
        if advance is not None:
            advance(len(block))
    return digest.hexdigest()


def _model_size(response: requests.Response) -> int | None:
    """The whole model's size, from an answer of all of it or of a part (``Content-Range``'s
    ``bytes FIRST-LAST/SIZE``); ``None`` where it does not say (a proxy's chunked answer)."""
    if response.status_code == 206:
        size = response.headers.get("Content-Range", "").rpartition("/")[2]
    else:
        size = response.headers.get("Content-Length", "")
    return int(size) if size.isdigit() else None


def _parsed(response: requests.Response, url: str) -> Any:
    """The JSON of a successful answer; ``FaasdlError`` where it is not JSON (a web server or a
    proxy's page at ``url``: ``requests`` raised its ``JSONDecodeError``, a traceback)."""
    try:
        return response.json()
    except ValueError:
        raise FaasdlError(
            f"{url} answered {response.request.method} {urlsplit(response.url).path} with "
            f"{body_said(response)}, not the controller's JSON: is it the controller's URL?"
        ) from None


def _line(response: requests.Response) -> str | None:
    """The body, where it is one short line of text: what the controller's server says itself,
    not its API ("Content Too Large" past a body limit, uvicorn's "Invalid HTTP request
    received.")."""
    text = response.text.strip()
    return text if 0 < len(text) <= 200 and "\n" not in text and text[0] != "<" else None


def _error(response: requests.Response, path: str, url: str) -> FaasdlError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "detail" in body:  # every error of the controller's API has
        detail = body["detail"]
    elif (line := _line(response)) is not None:
        detail = line
    else:
        said = (
            f"HTTP {response.status_code} from {url}, not the controller's answer "
            f"({body_said(response)}): is it the controller's URL, or a proxy before it failing?"
        )
        unavailable = response.status_code in (502, 503, 504)  # down for now: a proxy before it
        found = PlatformUnavailable(said) if unavailable else FaasdlError(said)
        found.status_code = response.status_code
        return found
    if isinstance(detail, list):  # FastAPI's schema errors: one per field
        detail = "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail
        )
    message = str(detail or response.reason)
    if response.status_code == 404 and detail == "Not Found":  # no route: not a job's 404
        return FaasdlError(
            f"HTTP 404: {url} has no {path.partition('?')[0]}: is it the controller's URL? (a "
            "path after its host is kept: the API's /v1 is added to it)"
        )
    if response.status_code == 404 and path.startswith("/v1/jobs/"):
        return JobNotFound(path.split("/")[3])
    if response.status_code == 404 and path.startswith("/v1/datasets/"):
        name, _, below = path.removeprefix("/v1/datasets/").partition("/")
        return DatasetNotFound(name, unfinished=below == "upload")
    if response.status_code == 422:
        return ValidationError(message)
    if response.status_code == 401:
        return Unauthenticated(message)
    if response.status_code == 403:
        return AccessError(message)
    if response.status_code == 429:
        retry = response.headers.get("Retry-After", "")
        return LimitExceeded(message, retry_after_s=float(retry) if retry.isdigit() else 1.0)
    if response.status_code == 409 and response.request.method == "PUT":  # only uploads
        return UploadConflict(message)
    if response.status_code == 409:
        return JobError(message)
    if response.status_code == 413:  # Starlette's answer names no limit
        limit = "MAX_UPLOAD_BYTES" if path.startswith("/v1/datasets/") else "MAX_BODY_BYTES"
        message = f"{message}: over the controller's FAASDL_API__{limit}"
    if response.status_code in (502, 503, 504):  # down for now: its store, a proxy before it
        error: FaasdlError = PlatformUnavailable(f"HTTP {response.status_code}: {message}")
    else:
        error = FaasdlError(f"HTTP {response.status_code}: {message}")
    error.status_code = response.status_code
    return error
