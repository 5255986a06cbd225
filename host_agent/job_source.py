"""Where a host agent gets its job parameters (passing.contract.JobParams) and its own name.

Either a file (`PASSING_PARAMS`, written by `passing-ctl job create --params-out`), or the
controller's HTTP service (`passing-ctl serve`) asked for job `PASSING_JOB` at
`PASSING_CONTROLLER`. Which host of the job this agent is comes from `PASSING_HOST`, or else
from the job's host addresses: the one that belongs to this machine. See docs/controller.md,
"Serving agent parameters". Standard library only: no torch, no controller imports.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping
from urllib.parse import urlsplit

from passing.contract import JobParams, ParamsError

MAX_JOB_ID = 0xFFFF  # job_id is 16 bits on the wire
_MAX_ANSWER = 1 << 20  # parameters are a few kB; more is not a PASSING controller answering
_HOW = ("set PASSING_PARAMS to a parameters file (`passing-ctl job create ... --params-out "
        "FILE`), or PASSING_JOB to the job id and PASSING_CONTROLLER to the HOST:PORT that "
        "`passing-ctl serve` prints")


class JobSourceError(RuntimeError):
    """The agent cannot get its parameters or its host name; the message says what to do."""


def controller_url(controller: str) -> str:
    """`host:port` or `http://host:port[/]` -> `http://host:port`."""
    text = controller.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None \
            or parts.path:
        raise JobSourceError(f"controller address {controller!r} is not HOST:PORT (or "
                             "http://HOST:PORT), as `passing-ctl serve` prints it")
    return f"{parts.scheme}://{parts.netloc}"


def fetch_params(controller: str, job_id: int, timeout: float = 10.0) -> JobParams:
    """Job `job_id`'s parameters from the `passing-ctl serve` at `controller`."""
    base = controller_url(controller)
    url = f"{base}/v1/jobs/{job_id}"
    # No proxy: the controller sits on the hosts' own network, and an http_proxy inherited
    # from a login shell (or by Mininet hosts) would send the request somewhere it cannot reach.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as answer:
            body = answer.read(_MAX_ANSWER)
    except urllib.error.HTTPError as e:
        raise JobSourceError(f"{_server_error(e)} (controller {base})") from None
    except urllib.error.URLError as e:
        raise _unreachable(base, e.reason) from None
    except (OSError, http.client.HTTPException) as e:  # timeouts and resets while reading
        raise _unreachable(base, e) from None
    try:
        params = JobParams.from_json(body.decode())
    except (UnicodeDecodeError, ParamsError) as e:
        raise JobSourceError(f"the controller at {base} answered job {job_id} with parameters "
                             f"that cannot be used: {e}") from None
    if params.job_id != job_id:
        raise JobSourceError(f"the controller at {base} answered job {job_id} with job "
                             f"{params.job_id}'s parameters")
    return params


def _unreachable(base: str, reason: object) -> JobSourceError:
    why = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
    return JobSourceError(f"cannot reach the PASSING controller at {base}: {why} "
                          "(is `passing-ctl serve` running there?)")


def _server_error(e: urllib.error.HTTPError) -> str:
    """The server's own message when it sent one ({"error": ...}), else the HTTP status."""
    try:
        doc = json.loads(e.read(_MAX_ANSWER).decode())
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            return doc["error"]
    except (OSError, ValueError):
        pass
    return f"HTTP {e.code} {e.reason} for {e.url}"


def params_from_env(env: Mapping[str, str] = os.environ) -> JobParams:
    """The parameters named by the environment: PASSING_PARAMS (a file), else PASSING_JOB at
    PASSING_CONTROLLER. With both, PASSING_JOB must agree with the file."""
    path = env.get("PASSING_PARAMS", "").strip()
    job_text = env.get("PASSING_JOB", "").strip()
    job_id = _job_id(job_text) if job_text else None
    if path:
        try:
            params = JobParams.load(path)
        except ParamsError as e:
            raise JobSourceError(f"PASSING_PARAMS={path!r}: {e}") from None
        if job_id is not None and job_id != params.job_id:
            raise JobSourceError(f"PASSING_PARAMS={path!r} holds job {params.job_id}, but "
                                 f"PASSING_JOB={job_text!r}; unset one of them")
        return params
    controller = env.get("PASSING_CONTROLLER", "").strip()
    missing = [name for name, value in (("PASSING_JOB", job_text),
                                        ("PASSING_CONTROLLER", controller)) if not value]
    if missing:
        raise JobSourceError(f"no job parameters: {' and '.join(missing)} not set; {_HOW}")
    assert job_id is not None
    try:
        return fetch_params(controller, job_id)
    except JobSourceError as e:
        raise JobSourceError(f"PASSING_CONTROLLER={controller!r}, PASSING_JOB={job_id}: {e}") \
            from None


def _job_id(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_JOB_ID:
        raise JobSourceError(f"PASSING_JOB={text!r} is not a job id (an integer "
                             f"1..{MAX_JOB_ID}, as given to `passing-ctl job create`)")
    return int(text)


def this_host(params: JobParams, env: Mapping[str, str] = os.environ) -> str:
    """The name of the job's host this agent runs on: PASSING_HOST, or else the one host whose
    host_ip is an address of this machine."""
    named = env.get("PASSING_HOST", "").strip()
    if named:
        if named not in params.host_names:
            raise JobSourceError(f"PASSING_HOST={named!r} is not a host of job {params.job_id} "
                                 f"(its hosts: {', '.join(params.host_names)})")
        return named
    tried = [(name, params.host(name).host_ip) for name in params.host_names]
    local = [(name, ip) for name, ip in tried if _is_local(ip)]
    if len(local) == 1:
        return local[0][0]
    listed = ", ".join(f"{name} {ip}" for name, ip in (local or tried))
    if not local:
        raise JobSourceError(f"none of job {params.job_id}'s host addresses is an address of "
                             f"this machine (tried {listed}); set PASSING_HOST to this host's "
                             "name in the job")
    raise JobSourceError(f"several hosts of job {params.job_id} have addresses of this machine "
                         f"({listed}); set PASSING_HOST to the one this agent runs as")


def _is_local(ip: str) -> bool:
    # The agent must receive results on host_ip (transport.UdpTransport binds it), so "can bind
    # it" is the test that matters. A machine with net.ipv4.ip_nonlocal_bind=1 binds anything:
    # there every address looks local and PASSING_HOST is needed.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((ip, 0))
        except OSError:
            return False
    return True


def pool_poll(env: Mapping[str, str] = os.environ) -> float:
    """PASSING_POOL_POLL: seconds between two reads of the job's parameters by a host's
    leader, to learn of a live resize (passing-ctl job resize; default 2, 0: never)."""
    text = env.get("PASSING_POOL_POLL")
    if text is None:
        return 2.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise JobSourceError(f"PASSING_POOL_POLL={text!r}: seconds between reads of the "
                             "job's parameters, 0 (never) or more")
    return seconds
