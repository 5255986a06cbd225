"""passing-agent on two hosts at once, each with two local ranks, through the switch pipeline
over real UDP: both report a correct sum; bad arguments and a missing peer end clearly."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from passing import protocol as P
from testbed.loopback import UdpLoopbackSwitch
from tests.agent_ranks import rank_processes


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def loopback(tmp_path):
    """(the switch, its job's parameters file): 2 hosts of 2 local ranks."""
    sw = UdpLoopbackSwitch(2, agent_udp_port=free_udp_port(), slots=32)
    path = tmp_path / "job.json"
    path.write_text(sw.agent_params(local_gpus=2).to_json())
    yield sw, path
    sw.close()


@pytest.fixture
def params_file(loopback):
    return loopback[1]


def agent(*args: str, python: tuple[str, ...] = ("-m", "passing_agent.cli"),
          env: dict[str, str] | None = None) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PASSING_")}
    return subprocess.Popen([sys.executable, *python, *args], env={**clean, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# The default sends 8 datagrams per message; 1 one each, 64 a whole window at once.
@pytest.mark.parametrize("gather", [[], ["--gather-max", "0"], ["--udp-segments", "1"],
                                    ["--udp-segments", "64"]])
def test_two_hosts_get_the_correct_sum(params_file, gather):
    procs = [agent("--params", str(params_file), "--host", h, "--size", "3K", "--iters", "2",
                   "--json", *gather) for h in ("h1", "h2")]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        res = json.loads(out)
        assert res["correct"] and res["contributors"] == 4 and res["local_ranks"] == 2
        assert res["size"] == 3072 and res["goodput_gbps"] > 0
        assert res["passes"] > 0  # the leader's loop, reported
        if "--gather-max" in gather:
            assert res["gathers"] == 0 and res["gathered_s"] == 0


def test_the_job_and_host_from_the_environment(params_file):
    procs = [agent("--size", "1K", "--iters", "1", "--json",
                   env={"PASSING_PARAMS": str(params_file), "PASSING_HOST": h})
             for h in ("h1", "h2")]
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0 and json.loads(out)["correct"], err


def test_no_job_anywhere_says_where_to_give_it():
    p = agent("--size", "1K")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "PASSING_PARAMS" in err and "PASSING_JOB" in err, err


def test_bad_arguments_exit_2(params_file):
    for args, message in [(["--host", "h9"], "h9 is not in job"),
                          (["--host", "h1", "--size", "4X"], "size must be"),
                          (["--host", "h1", "--iters", "0"], "--iters must be"),
                          (["--host", "h1", "--gather-max", "-1"], "--gather-max must be"),
                          (["--host", "h1", "--gather-max", "nan"], "--gather-max must be"),
                          (["--host", "h1", "--udp-segments", "65"], "--udp-segments must be"),
                          (["--host", "h1", "--udp-segments", "-1"], "--udp-segments must be")]:
        p = agent("--params", str(params_file), *args)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 2 and message in err, err
    p = agent("--params", str(params_file), "--host", "h1", env={"PASSING_POOL_POLL": "-1"})
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "PASSING_POOL_POLL='-1': seconds between reads" in err, err
    p = agent("--params", str(params_file), "--host", "h1", env={"PASSING_UDP_SEGMENTS": "0"})
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "PASSING_UDP_SEGMENTS='0': datagrams per message" in err, err


def test_parameters_of_the_old_format_are_refused_with_how_to_regenerate(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"job_id": 7, "udp_port": 48879, "agent_port": 61000,
                               "slots": 32, "hosts_total": 1, "streams": 1,
                               "hosts": {"h1": {"host_ip": "127.0.0.11",
                                                "switch_ip": "127.0.0.1", "contributor": 0}}}))
    p = agent("--params", str(old), "--host", "h1")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "format before version 1" in err, err
    assert "passing-ctl job show 7 --json | jq .agent_params" in err, err


def test_parameters_with_a_bad_field_name_it(params_file, tmp_path):
    doc = json.loads(params_file.read_text())
    doc["window"] = -1  # 0 is a job waiting for switch slots
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    p = agent("--params", str(bad), "--host", "h1")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "window: -1 outside 0..4096" in err, err


def test_training_without_scikit_learn_says_what_to_install(params_file):
    # sys.modules[name] = None makes the import machinery report the package as absent.
    hide_sklearn = ("-c", "import sys; sys.modules['sklearn'] = None; "
                          "from passing_agent.cli import main; sys.exit(main())")
    p = agent("--params", str(params_file), "--host", "h1", "--train", "5", python=hide_sklearn)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "--train needs scikit-learn" in err, err


def test_a_host_alone_fails_clearly_at_the_rendezvous(params_file):
    p = agent("--params", str(params_file), "--host", "h1", "--size", "100", "--iters", "1",
              "--rendezvous-port", str(free_tcp_port()), "--rendezvous-timeout", "3")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "the other hosts did not join within 3s" in err, err


def test_a_silent_switch_fails_every_host_clearly(params_file, tmp_path):
    params = json.loads(params_file.read_text())
    params["switch_udp_port"] = free_udp_port()  # nobody answers there
    silent = tmp_path / "silent.json"
    silent.write_text(json.dumps(params))
    port = str(free_tcp_port())
    procs = [agent("--params", str(silent), "--host", h, "--size", "100", "--iters", "1",
                   "--timeout", "1", "--rto", "0.05", "--rendezvous-port", port)
             for h in ("h1", "h2")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 1 and "no result from the switch for 1.0s" in err, err


def test_one_host_restarting_alone_gets_no_session_and_the_other_fails(loopback):
    """h2's agent is killed mid-run and started again while h1 still runs: the new h2 cannot
    join h1's session (it fails at the rendezvous), h1 fails within its deadline; neither
    returns a wrong value."""
    switch, params_file = loopback
    port = str(free_tcp_port())
    common = ["--params", str(params_file), "--size", "64K", "--rendezvous-port", port,
              "--json"]
    # h1 serves the rendezvous store until it gives up on the switch: its deadline must outlast
    # the restarted h2's start (torch takes seconds to import on a busy machine), or h2 finds no
    # store at all instead of being refused by it.
    h1 = agent(*common, "--host", "h1", "--iters", "100000", "--timeout", "30")
    h2 = agent(*common, "--host", "h2", "--iters", "100000", "--timeout", "3")
    try:
        # Both streaming: the switch sent a result, which takes both hosts (a fixed sleep was
        # not always enough on a loaded machine, and an h2 killed before the rendezvous
        # rightly joins h1's session when it starts again).
        deadline = time.monotonic() + 120
        while switch.delivered < 2:
            assert h1.poll() is None and h2.poll() is None, "an agent ended before streaming"
            assert time.monotonic() < deadline, "the agents never streamed"
            time.sleep(0.2)
        h2.kill()
        h2.communicate(timeout=30)
        again = agent(*common, "--host", "h2", "--iters", "1", "--timeout", "3",
                      "--rendezvous-timeout", "5")
        out2, err2 = again.communicate(timeout=120)
        assert again.returncode == 1, (out2, err2)
        assert "already took part in a round of this run" in out2 + err2
        out1, err1 = h1.communicate(timeout=90)
        assert h1.returncode == 1
        # Killed mid-call, h2 leaves h1 without a result; killed between calls, it leaves h1
        # waiting alone at the next call's start line. Either way h1 says why, within its
        # deadline.
        said = out1 + err1
        assert ("no result from the switch" in said
                or re.search(r"of 4 ranks \(h2 rank \d(, h2 rank \d)?\) did not come to call",
                             said)), (out1, err1)
    finally:
        for p in (h1, h2):
            if p.poll() is None:
                p.kill()
                p.communicate()


@pytest.mark.parametrize("strategy", ["ring", "hier-ring", "ps"])
def test_baseline_strategies_get_the_same_correct_sum(params_file, strategy):
    # 150K + 1 values: the parameter server's pipeline has 16 chunks of 9,600 and a 17th of one
    # value (passing_agent/strategies.ps_chunk_bytes); pushes, pulls and the server's sums must
    # split the tensor alike down to that last value.
    port = str(free_tcp_port())
    procs = [agent("--params", str(params_file), "--host", h, "--size", "153601", "--iters", "1",
                   "--strategy", strategy, "--ifname", "lo", "--rendezvous-port", port,
                   "--json") for h in ("h1", "h2")]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        res = json.loads(out)
        assert res["correct"] and res["strategy"] == strategy and res["contributors"] == 4


def test_ina_every_rank_streams_its_own_tensor_and_gets_the_sum(tmp_path):
    """Switch-only INA: 2 hosts x 2 ranks are 4 contributors at the switch."""
    sw = UdpLoopbackSwitch(2, agent_udp_port=free_udp_port(), slots=32, ranks=2)
    try:
        path = tmp_path / "ina.json"
        path.write_text(sw.agent_params().to_json())
        port = str(free_tcp_port())
        procs = [agent("--params", str(path), "--host", h, "--size", "3K", "--iters", "1",
                       "--strategy", "ina", "--ifname", "lo", "--rendezvous-port", port,
                       "--json") for h in ("h1", "h2")]
        outs = [p.communicate(timeout=240) for p in procs]
        for p, (out, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err[-2000:]
            res = json.loads(out)
            assert res["correct"] and res["strategy"] == "ina" and res["contributors"] == 4
            # A rank's own stream: 3K values in packets of K, plus the exponent packets.
            assert res["packets"] >= 3 * 1024 // P.K
    finally:
        sw.close()


def test_strategy_must_match_the_jobs_mode(params_file):
    p = agent("--params", str(params_file), "--host", "h1", "--strategy", "ina")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "created in mode passing" in err, err


def test_training_through_the_switch_matches_gloo_ring(params_file):
    """Same seed and steps: PASSING's fixed-point aggregation trains to ring's accuracy."""
    def train(strategy: str) -> dict:
        port = str(free_tcp_port())
        procs = [agent("--params", str(params_file), "--host", h, "--train", "40",
                       "--strategy", strategy, "--ifname", "lo", "--rendezvous-port", port,
                       "--json") for h in ("h1", "h2")]
        outs = [p.communicate(timeout=240) for p in procs]
        for p, (_, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err[-2000:]
        return json.loads(outs[0][0])
    passing, ring = train("passing"), train("ring")
    assert passing["world"] == ring["world"] == 4 and passing["steps"] == 40
    assert passing["packets"] > 0
    assert abs(passing["accuracy"] - ring["accuracy"]) <= 0.01
    assert abs(passing["param_checksum"] - ring["param_checksum"]) <= 1e-3 * ring["param_checksum"]
    assert ring["accuracy"] > 0.5


def test_a_killed_leader_fails_its_host_at_once(params_file):
    """The leader rank dies without a report (killed, or crashed in native code): the agent
    ends with an error naming it, instead of waiting as long as every call's deadline
    together for a report that never comes."""
    port = str(free_tcp_port())
    common = ["--params", str(params_file), "--size", "64K", "--rendezvous-port", port,
              "--iters", "100000", "--timeout", "30", "--json"]
    h1, h2 = agent(*common, "--host", "h1"), agent(*common, "--host", "h2")
    try:
        deadline = time.monotonic() + 120
        while len(rank_processes(h2.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        ranks = rank_processes(h2.pid)
        assert len(ranks) == 2 and h2.poll() is None
        time.sleep(10)  # streaming by now (torch starts in a few seconds)
        os.kill(min(ranks), signal.SIGKILL)  # local rank 0: started first
        killed = time.monotonic()
        out, err = h2.communicate(timeout=120)
        assert h2.returncode == 1, err
        assert json.loads(out)["error"] == "a local rank died: local rank 0 exit code -9"
        # The wait ends at the death, not after the budget (30 s x 100,002 calls).
        assert time.monotonic() - killed < 60
    finally:
        for p in (h1, h2):
            if p.poll() is None:
                p.kill()
            p.communicate()
