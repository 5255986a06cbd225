"""`passing-ctl serve`: the host agents' job parameters over HTTP, read-only.

    GET /v1/jobs        {"jobs": [1, 7]}
    GET /v1/jobs/<id>   the job's JobParams.to_dict() (passing.contract)

The SQLite state file stays the only source of truth: every request reads it afresh, so a job
that another `passing-ctl` process creates or deletes is served (or gone) at once, and nothing
here can disagree with `passing-ctl job show`. The server never connects to a switch: the
parameters are derived from the state file and the topology alone (Controller.agent_params).
Errors are JSON too, {"error": "..."}, with a message meant for the user of the agent.
"""

from __future__ import annotations

import errno
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

from controller.core import Controller, ControllerError
from controller.job_plan import JobError
from controller.store import MAX_JOB_ID, StoreError
from passing.contract import ParamsError

# This machine only, unless asked: the parameters carry each job's session key, and anyone who
# can reach the service reads them. Serve the hosts on their management network's address.
DEFAULT_LISTEN = "127.0.0.1:7700"
JOBS_PATH = "/v1/jobs"


class ServeError(ControllerError):
    """The server cannot start (its address is in use, or not one of this machine's)."""


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:PORT` for IPv6) -> (host, port); ValueError says what is wrong."""
    example = "expected HOST:PORT, e.g. 10.0.0.100:7700, or 127.0.0.1:0 (any free port)"
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:([0-9]{1,5})|([^\s:\[\]]+):([0-9]{1,5})", text)
    if not m:
        raise ValueError(f"{text!r}: {example}")
    host, port = (m[1], m[2]) if m[1] else (m[3], m[4])
    if not 0 <= int(port) <= 0xFFFF:
        raise ValueError(f"{text!r}: port {int(port)} outside 0..65535")
    return host, int(port)


def route(ctl: Controller, path: str) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON document) answering GET `path`; reads the state file each time."""
    path = urlsplit(path).path
    if path.rstrip("/") == JOBS_PATH:
        return 200, {"jobs": _job_ids(ctl)}
    head, sep, raw = path.rpartition("/")
    if head != JOBS_PATH or not sep:
        return 404, {"error": f"no such path {path}; this controller serves GET {JOBS_PATH} "
                              f"and GET {JOBS_PATH}/<job id>"}
    text = unquote(raw)
    # Only ASCII digits: int() would also take " 7", "+7", "1_0" and non-ASCII digits.
    if not re.fullmatch(r"[0-9]+", text):
        return 400, {"error": f"{text!r} is not a job id (an integer 1..{MAX_JOB_ID})"}
    # Length first: int() refuses strings of thousands of digits with a ValueError.
    if len(text.lstrip("0")) > len(str(MAX_JOB_ID)) or not 1 <= int(text) <= MAX_JOB_ID:
        return 400, {"error": f"job id {text} is outside 1..{MAX_JOB_ID}"}
    job_id = int(text)
    try:
        return 200, ctl.agent_params(job_id).to_dict()
    except ControllerError:
        # Checked after the fact rather than before, so that a job deleted in between is a
        # 404 like any other missing job.
        if ctl.store.get_job(job_id) is not None:
            raise
        ids = _job_ids(ctl)
        known = ", ".join(map(str, ids)) or "none"
        return 404, {"error": f"job {job_id} does not exist on this controller (jobs: {known})"}


def _job_ids(ctl: Controller) -> list[int]:
    return [rec.job_id for rec in ctl.store.jobs()]


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client must not keep the process alive on shutdown

    def __init__(self, address: tuple[str, int], ctl: Controller, log: TextIO | None):
        self.ctl, self.log = ctl, log
        super().__init__(address, _Handler)


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = "passing-ctl-serve"
    timeout = 10  # seconds a connection may stay silent before its thread gives up on it

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def __getattr__(self, name: str) -> Any:
        # http.server looks up do_<METHOD> and answers 501 when missing; every method but GET
        # and HEAD is refused with 405 instead, since the resource exists but is read-only.
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self) -> None:
        self.close_connection = True  # any request body stays unread
        self._send(405, {"error": f"{self.command} is not allowed: this controller's job "
                                   "parameters are read-only (GET or HEAD)"},
                   with_body=True, extra={"Allow": "GET, HEAD"})

    def _answer(self, with_body: bool) -> None:
        try:
            status, doc = route(self.server.ctl, self.path)
        except (ControllerError, JobError, StoreError, ParamsError) as e:
            # e.g. a state file that became unreadable, or a topology that lost a job's host
            status, doc = 500, {"error": f"cannot read the job parameters: {e}"}
        self._send(status, doc, with_body)

    def _send(self, status: int, doc: dict[str, Any], with_body: bool,
              extra: dict[str, str] | None = None) -> None:
        body = (json.dumps(doc, indent=2) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        # The parameters change when a job is re-created and hold the job's session key.
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log = self.server.log
        if log is not None:
            log.write(f"passing-ctl serve: {self.address_string()} {format % args}\n")
            log.flush()


class ParamsServer:
    """The HTTP service over `ctl`'s state file (module docstring), bound at construction.

    `ctl` may be shared with other threads (the Mininet runner's controller): the server only
    reads its job store, which serialises access itself. The caller keeps ownership of `ctl`.
    log: where to write one line per request (None: nothing).
    """

    def __init__(self, ctl: Controller, host: str = "127.0.0.1", port: int = 0,
                 log: TextIO | None = None):
        cls = _HTTPServer6 if ":" in host else _HTTPServer
        try:
            self._httpd = cls((host, port), ctl, log)
        except OSError as e:
            hint = ("another program, or another `passing-ctl serve`, listens there; pass "
                    "--listen HOST:PORT with a free port" if e.errno == errno.EADDRINUSE else
                    "is HOST an address of this machine?")
            raise ServeError(f"cannot listen on {_join(host, port)}: "
                             f"{e.strerror or e} ({hint})") from None
        self.host = host
        self.port: int = self._httpd.server_address[1]
        self._lock = threading.Lock()
        self._started = self._closed = False

    @property
    def url(self) -> str:
        return f"http://{_join(self.host, self.port)}"

    def serve_forever(self) -> None:
        """Answer requests until shutdown() (from another thread or a signal handler's)."""
        with self._lock:
            if self._closed:
                return
            self._started = True
        self._httpd.serve_forever(poll_interval=0.2)

    def start(self) -> ParamsServer:
        """serve_forever() in a daemon thread; returns self (`with ParamsServer(...).start()`)."""
        threading.Thread(target=self.serve_forever, name="passing-params-server",
                         daemon=True).start()
        return self

    def shutdown(self) -> None:
        """Stop serving and close the socket; safe to call twice, or before serving started."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._started:
                # Blocks until serve_forever returns, so never call it from that thread.
                self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self) -> ParamsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
