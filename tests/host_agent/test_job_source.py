"""host_agent.job_source: an agent gets its job's parameters from a live `passing-ctl serve` or a
file, as the environment says, and finds which host of the job it is; every failure says what
to set or start. The server is the real one, over a controller whose job was created on the
model's P4Runtime service in this process (no root)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from controller.core import Controller, Endpoint
from controller.job_plan import JobSpec
from controller.serve import ParamsServer
from controller.topology import load
from host_agent.job_source import (
    JobSourceError,
    controller_url,
    fetch_params,
    params_from_env,
    this_host,
)
from passing.contract import HostParams, JobParams
from tests import REPO
from tests.controller.conftest import ServedSwitches

JOB = 4


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[tuple[Controller, ParamsServer]]:
    """A star controller holding job 4 (h1, h2), served on 127.0.0.1, a free port."""
    switches = ServedSwitches(["s1"])
    state = tmp_path_factory.mktemp("controller") / "state.sqlite"
    ctl = Controller(load(REPO / "topologies" / "star.json"),
                     {"s1": Endpoint("s1", switches["s1"].grpc_address, 0)}, state)
    try:
        ctl.create_job(JobSpec(JOB, ("h1", "h2"), window=8))
        ctl.disconnect()
        with ParamsServer(ctl, "127.0.0.1", 0).start() as server:
            yield ctl, server
    finally:
        ctl.close()
        switches.close()


def _closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def answering() -> Iterator[Callable[[bytes], str]]:
    """answering(body) -> the URL of an HTTP server that answers every GET with 200 and `body`:
    something at the controller's address that is not a (matching) PASSING controller."""
    servers = []

    def start(body: bytes) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass
        httpd = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"127.0.0.1:{httpd.server_address[1]}"
    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


# -- fetch_params -------------------------------------------------------------------------------
def test_fetches_the_controllers_params(live):
    ctl, server = live
    want = ctl.agent_params(JOB)
    assert fetch_params(server.url, JOB) == want
    # host:port as `passing-ctl serve` is given, and a URL with a trailing slash, work too.
    assert fetch_params(f"127.0.0.1:{server.port}", JOB) == want
    assert fetch_params(server.url + "/", JOB) == want


def test_unknown_job_gives_the_servers_message(live):
    _, server = live
    with pytest.raises(JobSourceError) as e:
        fetch_params(server.url, 9)
    assert str(e.value) == (f"job 9 does not exist on this controller (jobs: {JOB}) "
                            f"(controller {server.url})")
    with pytest.raises(JobSourceError, match="job id 0 is outside 1..65535"):
        fetch_params(server.url, 0)


def test_unreachable_controller_fails_fast_and_says_to_start_serve():
    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(JobSourceError) as e:
        fetch_params(f"127.0.0.1:{port}", JOB)
    assert time.monotonic() - t0 < 2
    assert str(e.value) == (f"cannot reach the PASSING controller at http://127.0.0.1:{port}: "
                            "Connection refused (is `passing-ctl serve` running there?)")


def test_silent_controller_times_out():
    # Accepts connections (the kernel does, from the backlog) but never answers.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        t0 = time.monotonic()
        with pytest.raises(JobSourceError, match=r"cannot reach the PASSING controller at "
                                                 r"http://127\.0\.0\.1:\d+: .*timed out"):
            fetch_params(f"127.0.0.1:{s.getsockname()[1]}", JOB, timeout=0.3)
        assert time.monotonic() - t0 < 3


def test_an_answer_that_is_not_params_is_refused_with_the_reason(answering, live):
    ctl, _ = live
    url = answering(b"<html>hello</html>")
    with pytest.raises(JobSourceError, match=r"answered job 4 with parameters that cannot be "
                                             r"used: agent parameters: not JSON"):
        fetch_params(url, JOB)
    url = answering(b'{"job_id": 4, "udp_port": 48879}')  # the format before version 1
    with pytest.raises(JobSourceError, match="format before version 1"):
        fetch_params(url, JOB)
    # Valid parameters, but of another job: a misrouted request must not join the wrong job.
    url = answering(ctl.agent_params(JOB).to_json().encode())
    with pytest.raises(JobSourceError, match="answered job 5 with job 4's parameters"):
        fetch_params(url, 5)


@pytest.mark.parametrize("address", ["localhost", "ftp://h:1", "h:port", "http://h:1/v1", ""])
def test_bad_controller_address(address):
    with pytest.raises(JobSourceError, match="is not HOST:PORT"):
        controller_url(address)


# -- params_from_env ----------------------------------------------------------------------------
def test_env_controller_and_job(live):
    ctl, server = live
    env = {"PASSING_JOB": str(JOB), "PASSING_CONTROLLER": f"127.0.0.1:{server.port}"}
    assert params_from_env(env) == ctl.agent_params(JOB)


def test_env_params_file_wins_over_the_controller(live, tmp_path):
    ctl, _ = live
    path = tmp_path / "job4.json"
    path.write_text(ctl.agent_params(JOB).to_json())
    # The controller named is unreachable: the file alone must be used.
    env = {"PASSING_PARAMS": str(path), "PASSING_CONTROLLER": f"127.0.0.1:{_closed_port()}"}
    assert params_from_env(env) == ctl.agent_params(JOB)
    assert params_from_env({**env, "PASSING_JOB": str(JOB)}) == ctl.agent_params(JOB)
    with pytest.raises(JobSourceError, match=r"holds job 4, but PASSING_JOB='5'"):
        params_from_env({**env, "PASSING_JOB": "5"})


@pytest.mark.parametrize(("env", "message"), [
    ({}, "no job parameters: PASSING_JOB and PASSING_CONTROLLER not set; set PASSING_PARAMS"),
    ({"PASSING_JOB": "4"}, "no job parameters: PASSING_CONTROLLER not set"),
    ({"PASSING_CONTROLLER": "127.0.0.1:7700", "PASSING_PARAMS": ""},
     "no job parameters: PASSING_JOB not set"),
    ({"PASSING_JOB": "abc", "PASSING_CONTROLLER": "127.0.0.1:7700"},
     "PASSING_JOB='abc' is not a job id (an integer 1..65535"),
    ({"PASSING_JOB": "70000", "PASSING_CONTROLLER": "127.0.0.1:7700"},
     "PASSING_JOB='70000' is not a job id"),
    ({"PASSING_JOB": "4", "PASSING_CONTROLLER": "nohost"},
     "PASSING_CONTROLLER='nohost', PASSING_JOB=4: controller address 'nohost' is not HOST:PORT"),
    ({"PASSING_PARAMS": "/nonexistent/job.json"},
     "PASSING_PARAMS='/nonexistent/job.json': cannot read /nonexistent/job.json"),
])
def test_env_errors_name_the_variables(env, message):
    with pytest.raises(JobSourceError) as e:
        params_from_env(env)
    assert message in str(e.value)


def test_env_unknown_job_at_the_controller(live):
    _, server = live
    env = {"PASSING_JOB": "9", "PASSING_CONTROLLER": server.url}
    with pytest.raises(JobSourceError, match=rf"PASSING_CONTROLLER='{server.url}', "
                                             r"PASSING_JOB=9: job 9 does not exist"):
        params_from_env(env)


def test_env_params_file_that_is_not_params(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"version": 1, "job_id": 4}')
    with pytest.raises(JobSourceError, match=r"PASSING_PARAMS='.*p\.json': .*missing"):
        params_from_env({"PASSING_PARAMS": str(path)})


# -- this_host ----------------------------------------------------------------------------------
def job_with(**ips: str) -> JobParams:
    """A job whose hosts have these addresses, all behind one ToR."""
    hosts = tuple(HostParams(name, ip, "10.0.0.254", "08:00:00:00:00:fe", i, 1)
                  for i, (name, ip) in enumerate(sorted(ips.items())))
    return JobParams(7, "passing", "", 48879, 61000, 8, hosts)


def test_host_from_env():
    params = job_with(h1="203.0.113.5", h2="203.0.113.6")
    assert this_host(params, {"PASSING_HOST": "h2"}) == "h2"
    # Named explicitly, even where the addresses would be ambiguous.
    assert this_host(job_with(a="127.0.0.1", b="127.0.0.2"), {"PASSING_HOST": "b"}) == "b"


def test_host_from_env_not_in_the_job():
    with pytest.raises(JobSourceError) as e:
        this_host(job_with(h1="10.0.0.1", h2="10.0.0.2"), {"PASSING_HOST": "h9"})
    assert str(e.value) == "PASSING_HOST='h9' is not a host of job 7 (its hosts: h1, h2)"


def test_host_by_local_address():
    assert this_host(job_with(h1="203.0.113.5", h2="127.0.0.1"), {}) == "h2"


def test_no_local_address_lists_what_was_tried():
    with pytest.raises(JobSourceError) as e:
        this_host(job_with(h1="203.0.113.5", h2="203.0.113.6"), {})
    assert str(e.value) == ("none of job 7's host addresses is an address of this machine "
                            "(tried h1 203.0.113.5, h2 203.0.113.6); set PASSING_HOST to this "
                            "host's name in the job")


def test_several_local_addresses_ask_for_passing_host():
    with pytest.raises(JobSourceError) as e:
        this_host(job_with(h1="127.0.0.1", h2="127.0.0.2", h3="203.0.113.5"), {})
    assert str(e.value) == ("several hosts of job 7 have addresses of this machine (h1 "
                            "127.0.0.1, h2 127.0.0.2); set PASSING_HOST to the one this agent "
                            "runs as")
