"""One container of the embedded platform: OpenWhisk's action runtime protocol on a loopback port.

Started by the invoker as ``python -u runtime.py`` (by path, so that no faasdl package is imported
on the cold-start path). It speaks ``POST /init`` and ``POST /run`` as OpenWhisk's Python runtime
does (reference/openwhisk.md §4): source or a base64 zip with ``__main__.py``, an optional
``virtualenv/``, ``main`` selectable, ``__OW_*`` variables per activation, an uncaught exception
answered as ``{"error": ...}`` (an application error), anything that is not a dict or list as a
developer error, and the log sentinel on stdout and stderr after each activation.

Standard library only: this file is on every cold start's path.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# Running a file puts its directory first on sys.path, where sibling modules would shadow the
# standard library for the action's own imports.
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path.pop(0)

import base64
import importlib.util
import io
import json
import threading
import time
import traceback
import types
import zipfile
from http.server import BaseHTTPRequestHandler, HTTPServer

SENTINEL = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX"
NOT_A_DICT = "The action did not return a dictionary or array."
CANNOT_START = "Cannot start action. Check logs for details."
INIT_TWICE = "Cannot initialize the action more than once."
MISSING_MAIN = "Missing main/no code to execute."
ACTION_MODULE = "__faasdl_action__"


class Runtime:
    def __init__(self) -> None:
        self.main = None
        self.workdir = os.getcwd()

    def init(self, value):
        if self.main is not None:
            return 403, {"error": INIT_TWICE}
        code = value.get("code")
        if not code:
            return 502, {"error": MISSING_MAIN}
        for key, val in (value.get("env") or {}).items():
            os.environ[str(key)] = str(val)
        try:
            module = self._load(code, bool(value.get("binary")))
            main = getattr(module, value.get("main") or "main", None)
        except Exception:
            traceback.print_exc()
            return 502, {"error": CANNOT_START}
        if not callable(main):
            print(f"no function '{value.get('main') or 'main'}' in the action", file=sys.stderr)
            return 502, {"error": MISSING_MAIN}
        self.main = main
        return 200, {"ok": True}

    def _load(self, code, binary):
        module = types.ModuleType(ACTION_MODULE)
        if not binary:
            path = os.path.join(self.workdir, "__main__.py")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(code)
            module.__file__ = path
            sys.modules[ACTION_MODULE] = module
            exec(compile(code, path, "exec"), module.__dict__)
            return module
        root = os.path.join(self.workdir, "action")
        with zipfile.ZipFile(io.BytesIO(base64.b64decode(code))) as archive:
            archive.extractall(root)
        activate = os.path.join(root, "virtualenv", "bin", "activate_this.py")
        if os.path.exists(activate):
            with open(activate, encoding="utf-8") as fh:
                exec(compile(fh.read(), activate, "exec"), {"__file__": activate})
        sys.path.insert(0, root)
        spec = importlib.util.spec_from_file_location(
            ACTION_MODULE, os.path.join(root, "__main__.py")
        )
        if spec is None or spec.loader is None:
            raise ImportError("the zip has no __main__.py at its root")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[ACTION_MODULE] = loaded
        spec.loader.exec_module(loaded)
        return loaded

    def run(self, message):
        if self.main is None:
            return 502, {"error": MISSING_MAIN}
        for field in (
            "namespace",
            "action_name",
            "action_version",
            "activation_id",
            "transaction_id",
            "deadline",
            "api_key",
        ):
            if field in message:
                os.environ["__OW_" + field.upper()] = str(message[field])
        try:
            result = self.main(message.get("value") or {})
        except Exception as exc:
            traceback.print_exc()
            return 200, {"error": str(exc)}
        if not isinstance(result, (dict, list)):
            return 502, {"error": NOT_A_DICT}
        return 200, result


RUNTIME = Runtime()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            message = json.loads(body or b"{}")
        except ValueError:
            self._reply(400, {"error": "The request body is not valid JSON."})
            return
        if self.path == "/init":
            status, out = RUNTIME.init(message.get("value") or {})
            if status == 200:
                self._reply(status, out)
                return
        elif self.path == "/run":
            status, out = RUNTIME.run(message)
        else:
            self._reply(404, {"error": f"unknown path {self.path}"})
            return
        try:
            payload = json.dumps(out, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError):
            status, payload = 502, json.dumps({"error": NOT_A_DICT}).encode("utf-8")
        for stream in (sys.stdout, sys.stderr):
            stream.write(SENTINEL + "\n")
            stream.flush()
        self._send(status, payload)

    def _reply(self, status, out):
        self._send(status, json.dumps(out).encode("utf-8"))

    def _send(self, status, payload):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        """Request lines are not the action's logs."""


def _exit_with_parent(parent_pid: int) -> None:
    # A container must not outlive its invoker, even one killed with SIGKILL.
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(0.5)


def serve() -> None:
    server = HTTPServer(("127.0.0.1", 0), Handler)
    ready_fd = int(os.environ.pop("FAASDL_READY_FD"))
    parent_pid = int(os.environ.pop("FAASDL_PARENT_PID", str(os.getppid())))
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    os.write(ready_fd, f"{server.server_address[1]}\n".encode())
    os.close(ready_fd)
    server.serve_forever()


if __name__ == "__main__":
    serve()
