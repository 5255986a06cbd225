"""`passing-ctl serve` and controller.serve: the agents' parameters over HTTP, read from the state
file on every request (jobs other processes create or delete are seen at once), never from a
switch, and every refusal a JSON error a user can act on. No frames are sent: the jobs are
created on the model's P4Runtime service in this process (`make_control`, no root)."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest

from controller.cli import main
from controller.job_plan import JobSpec
from controller.serve import ParamsServer, ServeError, parse_listen
from passing.contract import JobParams
from tests import REPO

# The server reads the state file only; running it once per switch target would test nothing
# more, so only the model (in-process, no root) backs the job creation here.
model_only = pytest.mark.parametrize("switches_of", ["model"], indirect=True)

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, method: str = "GET") -> tuple[int, dict, http.client.HTTPMessage]:
    """(status, JSON body, headers) of one request; HTTP errors are answers, not exceptions."""
    req = urllib.request.Request(url, method=method)
    try:
        with NO_PROXY.open(req, timeout=5) as r:
            return r.status, json.loads(r.read() or b"null"), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


@pytest.fixture
def served(make_control, tmp_path):
    """(controller, server, state file, switches): a star controller with job 1 (h1, h2) and
    job 2 (h3), its parameters served on 127.0.0.1, a free port."""
    state = tmp_path / "state.sqlite"
    ctl, fabric = make_control("star", state=state)
    ctl.create_job(JobSpec(1, ("h1", "h2"), window=16))
    ctl.create_job(JobSpec(2, ("h3",), window=8, mode="ina"))
    ctl.disconnect()  # as `passing-ctl job create` does when it exits: the switches are free
    with ParamsServer(ctl, "127.0.0.1", 0).start() as server:
        yield ctl, server, state, fabric


@model_only
def test_url_names_the_bound_port(served):
    _, server, _, _ = served
    assert server.port != 0 and server.url == f"http://127.0.0.1:{server.port}"


@model_only
def test_lists_jobs_and_serves_each_jobs_params(served):
    ctl, server, _, _ = served
    status, doc, headers = get(server.url + "/v1/jobs")
    assert (status, doc) == (200, {"jobs": [1, 2]})
    assert headers["Content-Type"] == "application/json"
    for job_id in (1, 2):
        status, doc, headers = get(f"{server.url}/v1/jobs/{job_id}")
        assert status == 200
        # What agents read over HTTP is what `job show --json` and --params-out give.
        assert JobParams.from_dict(doc) == ctl.agent_params(job_id)
        assert headers["Cache-Control"] == "no-store"  # it holds the job's session key
    # HEAD: the same status and headers, no body.
    status, doc, headers = get(server.url + "/v1/jobs/1", method="HEAD")
    assert status == 200 and doc is None and int(headers["Content-Length"]) > 0


@model_only
def test_unknown_job_is_404_naming_the_jobs(served):
    _, server, _, _ = served
    status, doc, _ = get(server.url + "/v1/jobs/7")
    assert status == 404
    assert doc == {"error": "job 7 does not exist on this controller (jobs: 1, 2)"}


@model_only
def test_bad_job_id_is_400(served):
    _, server, _, _ = served
    for raw, message in [
        ("abc", "'abc' is not a job id (an integer 1..65535)"),
        ("-1", "'-1' is not a job id"),
        ("1.5", "'1.5' is not a job id"),
        ("%2B1", "'+1' is not a job id"),  # int() would take "+1"
        ("0", "job id 0 is outside 1..65535"),
        ("65536", "job id 65536 is outside 1..65535"),
        ("9" * 5000, "is outside 1..65535"),  # beyond what int() converts
    ]:
        status, doc, _ = get(f"{server.url}/v1/jobs/{raw}")
        assert (status, message in doc["error"]) == (400, True), (raw, doc)


@model_only
def test_other_paths_are_404(served):
    _, server, _, _ = served
    for path in ["/", "/v1", "/v1/job/1", "/v2/jobs", "/v1/jobs/1/extra", "/v1/jobs1"]:
        status, doc, _ = get(server.url + path)
        assert (status, "GET /v1/jobs" in doc["error"]) == (404, True), (path, doc)
    # A trailing slash or a query string changes nothing.
    assert get(server.url + "/v1/jobs/")[:2] == (200, {"jobs": [1, 2]})
    assert get(server.url + "/v1/jobs/1?x=1")[0] == 200


@model_only
def test_writes_are_405(served):
    ctl, server, _, _ = served
    for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "FROB"]:
        status, doc, headers = get(server.url + "/v1/jobs/1", method=method)
        assert (status, headers["Allow"]) == (405, "GET, HEAD"), method
        assert doc["error"].startswith(f"{method} is not allowed") and "read-only" in doc["error"]
    assert ctl.store.get_job(1) is not None  # DELETE deleted nothing


@model_only
def test_jobs_of_another_controller_process_are_seen_at_once(served, make_control):
    _, server, state, fabric = served
    # Another controller (its own SQLite connection) on the same state file, as a second
    # `passing-ctl` process would be.
    other, _ = make_control("star", state=state, fabric=fabric)
    other.create_job(JobSpec(3, ("h4",), window=4))
    assert get(server.url + "/v1/jobs")[1] == {"jobs": [1, 2, 3]}
    status, doc, _ = get(server.url + "/v1/jobs/3")
    assert status == 200 and JobParams.from_dict(doc).host_names == ["h4"]
    other.delete_job(1)
    assert get(server.url + "/v1/jobs")[1] == {"jobs": [2, 3]}
    status, doc, _ = get(server.url + "/v1/jobs/1")
    assert status == 404 and doc["error"].endswith("(jobs: 2, 3)")


@model_only
def test_never_connects_to_a_switch(served):
    ctl, server, _, fabric = served
    fabric["s1"].server.stop(grace=None)  # any switch call would now fail
    assert [get(server.url + path)[0] for path in ("/v1/jobs", "/v1/jobs/1", "/v1/jobs/9")] \
        == [200, 200, 404]
    assert ctl.connections.connected == []  # not even tried


@model_only
def test_unreadable_state_is_500_with_the_reason(served):
    ctl, server, _, _ = served
    ctl.store.close()  # as if the state file went away under the server
    status, doc, _ = get(server.url + "/v1/jobs/1")
    assert status == 500 and doc["error"].startswith("cannot read the job parameters: ")
    assert get(server.url + "/v1/jobs")[0] == 500


@model_only
def test_port_in_use_is_a_clear_error(served):
    _, server, _, _ = served
    with pytest.raises(ServeError, match=rf"cannot listen on 127\.0\.0\.1:{server.port}: "
                                         r".*in use.*--listen"):
        ParamsServer(served[0], "127.0.0.1", server.port)


@model_only
def test_shutdown_stops_serving_and_is_idempotent(make_control, tmp_path):
    ctl, _ = make_control("star")
    server = ParamsServer(ctl, "127.0.0.1", 0)
    server.shutdown()  # before serving: must not hang
    server.serve_forever()  # returns at once: it was shut down
    server = ParamsServer(ctl, "127.0.0.1", 0).start()
    assert get(server.url + "/v1/jobs")[1] == {"jobs": []}
    server.shutdown()
    server.shutdown()
    with pytest.raises(urllib.error.URLError):
        NO_PROXY.open(server.url + "/v1/jobs", timeout=2)


@pytest.mark.parametrize(("text", "expected"), [
    ("0.0.0.0:7700", ("0.0.0.0", 7700)), ("localhost:0", ("localhost", 0)),
    ("[::1]:80", ("::1", 80)),
])
def test_parse_listen(text, expected):
    assert parse_listen(text) == expected


# -- passing-ctl serve --------------------------------------------------------------------------
def write_config(tmp_path, state) -> str:
    # Switches at an address where nothing listens: serving must not need them.
    cfg = {"topology": str(REPO / "topologies" / "star.json"), "state": str(state),
           "switches": {"s1": {"address": "127.0.0.1:1", "device_id": 0}}}
    path = tmp_path / "controller.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@model_only
@pytest.mark.parametrize(("stop", "json_out"), [(signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["SIGTERM", "SIGINT-json"])
def test_cli_serves_until_stopped(served, tmp_path, stop, json_out):
    ctl, _, state, _ = served
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "--config", write_config(tmp_path, state),
         "serve", "--listen", "127.0.0.1:0", *(["--json"] if json_out else [])],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(30, proc.kill)  # a hung server must not hang the suite
    watchdog.start()
    try:
        line = proc.stdout.readline()
        url = json.loads(line)["url"] if json_out else line.strip()
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0"), line
        status, doc, _ = get(url + "/v1/jobs/1")
        assert status == 200 and JobParams.from_dict(doc) == ctl.agent_params(1)
        ctl.create_job(JobSpec(5, ("h4",), window=4))  # by this process, after it started
        assert get(url + "/v1/jobs")[1] == {"jobs": [1, 2, 5]}
        proc.send_signal(stop)
        assert proc.wait(10) == 0
        err = proc.stderr.read()
        assert "Traceback" not in err and "GET /v1/jobs/1" in err  # one line per request
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@model_only
def test_cli_port_in_use_exits_3(served, tmp_path, capsys):
    _, server, state, _ = served
    code = main(["--config", write_config(tmp_path, state), "serve", "--listen",
                 f"127.0.0.1:{server.port}"])
    err = capsys.readouterr().err
    assert code == 3 and "cannot listen on" in err and "in use" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(("listen", "message"), [
    ("nope", "expected HOST:PORT"), ("127.0.0.1", "expected HOST:PORT"),
    ("127.0.0.1:x", "expected HOST:PORT"), (":7700", "expected HOST:PORT"),
    ("1.2.3.4:5:6", "expected HOST:PORT"), ("127.0.0.1:123456", "expected HOST:PORT"),
    ("127.0.0.1:70000", "port 70000 outside 0..65535"),
])
def test_cli_bad_listen_exits_2(listen, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--listen", listen])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"argument --listen: {listen!r}: {message}" in err


def test_cli_serve_has_help_with_example(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "example:" in out and "default 127.0.0.1:7700" in out

