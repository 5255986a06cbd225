"""passing-ctl: every subcommand explains itself, works with --json, and every user error prints
one clear line and a documented exit code, never a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from scapy.layers.inet import IP, UDP, IPOption_NOP
from scapy.layers.l2 import Ether

from controller.cli import build_parser, main
from controller.topology import load
from passing import protocol as P
from passing.contract import JobParams
from tests import REPO

SUBCOMMANDS = [["switches"], ["prepare"], ["job"], ["job", "create"], ["job", "set"],
               ["job", "resize"], ["job", "delete"],
               ["job", "list"], ["job", "show"], ["slots"], ["stats"], ["reconcile"]]


@pytest.mark.parametrize("cmd", SUBCOMMANDS, ids=" ".join)
def test_every_subcommand_has_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([*cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: passing-ctl" in out
    if cmd != ["job"]:
        assert "example:" in out and "passing-ctl" in out.split("example:")[1]


def write_config(tmp_path, fabric, topo="star") -> str:
    names = {"star": ["s1"], "leafspine": ["tor1", "tor2", "spine"]}[topo]
    cfg = {"topology": str(REPO / "topologies" / f"{topo}.json"), "state": "state.sqlite",
           "switches": {n: {"address": fabric[n].grpc_address, "device_id": fabric[n].device_id}
                        for n in names}}
    path = tmp_path / "controller.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def ctl(capsys, config, *args) -> tuple[int, str, str]:
    code = main(["--config", config, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_operator_session(switches_of, tmp_path, capsys):
    fabric = switches_of("star")
    cfg = write_config(tmp_path, fabric)
    code, out, _ = ctl(capsys, cfg, "switches")
    assert code == 0 and "s1" in out and "pipeline loaded" in out
    code, out, _ = ctl(capsys, cfg, "job", "create", "7", "--hosts", "h1,h2", "--window",
                       "32", "--json", "--params-out", str(tmp_path / "job7.json"))
    assert code == 0
    res = json.loads(out)
    assert res["pools"][0]["size"] == 32 and res["agent_params"]["hosts"]["h2"][
        "contributor_id"] == 1
    # What --params-out writes and what --json prints are the same contract, readable by agents.
    written = JobParams.load(tmp_path / "job7.json")
    assert written == JobParams.from_dict(res["agent_params"]) and written.job_id == 7
    code, out, _ = ctl(capsys, cfg, "job", "list")
    assert code == 0 and "h1,h2" in out
    code, out, _ = ctl(capsys, cfg, "slots", "--json")
    assert json.loads(out)["s1"]["used"] == 32
    code, out, _ = ctl(capsys, cfg, "slots")
    assert "32/4096 slots used" in out
    code, out, _ = ctl(capsys, cfg, "stats", "7", "--json")
    assert json.loads(out)["7"]["s1"]["job_contributions"] == 0
    code, out, _ = ctl(capsys, cfg, "job", "show", "7")
    assert code == 0 and "agent parameters" in out
    code, out, _ = ctl(capsys, cfg, "reconcile")
    assert code == 0 and "STRAY" not in out
    code, out, _ = ctl(capsys, cfg, "job", "set", "7", "--quorum", "1")
    assert code == 0 and "quorum 1" in out and "s1" in out
    code, out, _ = ctl(capsys, cfg, "stats", "7")
    assert code == 0 and "1/2" in out  # the switch's quorum of its fan-in
    code, out, _ = ctl(capsys, cfg, "reconcile", "--dry-run")
    assert code == 0 and "repaired" not in out  # the switch holds the new quorum
    code, out, _ = ctl(capsys, cfg, "job", "set", "7", "--quorum", "all", "--json")
    assert json.loads(out)["quorum"] == {"s1": {"fan_in": 2, "quorum": 2}}
    # The agents' side: in the parameters agents fetch, the quorum left as it was.
    code, out, _ = ctl(capsys, cfg, "job", "set", "7", "--patience", "0.02..0.1",
                       "--staleness", "3")
    assert code == 0 and "patience 0.02..0.1 s (adaptive), staleness 3" in out
    assert "rounds wait for everyone" in out and "policy 1: running agents of the" in out
    code, out, _ = ctl(capsys, cfg, "job", "show", "7", "--json")
    params = JobParams.from_dict(json.loads(out)["agent_params"])
    assert params.patience == (0.02, 0.1) and params.staleness == 3
    assert params.policy == 1
    code, out, _ = ctl(capsys, cfg, "job", "set", "7", "--patience", "none", "--json",
                       "--params-out", str(tmp_path / "job7.json"))
    assert json.loads(out)["agents"] == {"patience": [], "staleness": 3, "policy": 2}
    written = JobParams.load(tmp_path / "job7.json")  # what agents given a file re-read
    assert (written.policy, written.patience, written.staleness) == (2, (), 3)
    # The same policy again, or a quorum alone, is no new policy for the agents to vote on.
    for again in (["--staleness", "3"], ["--quorum", "1"]):
        code, out, _ = ctl(capsys, cfg, "job", "set", "7", *again, "--json")
        assert json.loads(out)["agents"]["policy"] == 2

    # User errors: one line on stderr, exit 3.
    for args, message in [
        (["job", "create", "7", "--hosts", "h3", "--window", "4"], "job 7 already exists"),
        (["job", "create", "8", "--hosts", "h1,h9", "--window", "4"], "not in topology"),
        (["job", "create", "8", "--hosts", "h1", "--window", "5000"], "share"),
        (["job", "create", "0", "--hosts", "h1", "--window", "4"], "job id 0 outside"),
        (["job", "create", "8", "--hosts", "h3", "--window", "4", "--agent-port", "61000"],
         "job 8: agent ports 61000 overlap job 7's agent ports 61000"),
        (["job", "delete", "9"], "no job 9"),
        (["job", "show", "9"], "no job 9"),
        (["stats", "9"], "no job 9"),
        (["job", "set", "9", "--quorum", "1"], "no job 9"),
    ]:
        code, out, err = ctl(capsys, cfg, *args)
        assert code == 3, args
        assert message in err and "Traceback" not in err, (args, err)
        assert err.count("\n") == 1
    code, out, _ = ctl(capsys, cfg, "job", "delete", "7")
    assert code == 0 and "slots freed: s1 0-31" in out
    code, out, _ = ctl(capsys, cfg, "job", "list", "--json")
    assert json.loads(out) == []


def test_unreachable_switch_exit_code(tmp_path, capsys):
    cfg = {"topology": str(REPO / "topologies" / "star.json"), "state": "s.sqlite",
           "switches": {"s1": {"address": "127.0.0.1:1", "device_id": 0}}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    code, _, err = ctl(capsys, str(path), "--timeout", "0.2", "--retries", "1", "job", "list")
    assert code == 0  # listing needs no switch
    code = main(["--config", str(path), "--timeout", "0.2", "--retries", "1",
                 "job", "create", "1", "--all-hosts", "--window", "4"])
    err = capsys.readouterr().err
    assert code == 4 and "no P4Runtime server at 127.0.0.1:1" in err


@pytest.mark.parametrize("content,message", [
    (None, "no such configuration file"),
    ("{", "not valid JSON"),
    ('{"topology": "x.json"}', 'missing "state"'),
    ('{"topology": "nope.json", "state": "s", "switches": {}}', "no such topology file"),
    (json.dumps({"topology": str(REPO / "topologies" / "star.json"), "state": "s",
                 "switches": {}, "max_jobs": 129}), "max_jobs must be an integer from 1 to 128"),
    (json.dumps({"topology": str(REPO / "topologies" / "star.json"), "state": "s",
                 "switches": {}, "max_jobs": "16"}), "max_jobs must be an integer from 1 to 128"),
    (json.dumps({"topology": str(REPO / "topologies" / "star.json"), "state": "s",
                 "switches": {}, "max_jobs": 4, "shares": 8}),
     "shares must be an integer from 1 to 4"),
])
def test_bad_configuration(tmp_path, capsys, content, message):
    path = tmp_path / "c.json"
    if content is not None:
        path.write_text(content)
    code = main(["--config", str(path), "job", "list"])
    assert code == 3 and message in capsys.readouterr().err


def test_usage_errors_exit_2(capsys):
    for argv in (["job", "create", "1", "--window", "4"], ["frobnicate"], ["stats", "x"],
                 ["job", "set", "1"], ["job", "set", "1", "--quorum", "0"],
                 ["job", "set", "1", "--patience", "0"], ["job", "set", "1", "--patience",
                                                          "0.2..0.1"],
                 ["job", "set", "1", "--patience", "soon"],
                 ["job", "set", "1", "--staleness", "-1"],
                 ["job", "create", "8", "--hosts", "h3", "--window", "4", "--patience", "inf"],
                 ["job", "set", "1", "--quorum", "two"],
                 ["job", "create", "8", "--hosts", "h3", "--window", "4", "--quorum", "1,1,1,1"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    assert build_parser().prog == "passing-ctl"


def test_no_traceback_from_the_real_command(tmp_path):
    res = subprocess.run([sys.executable, "-m", "controller.cli", "--config",
                          str(tmp_path / "missing.json"), "job", "list"],
                         capture_output=True, text=True)
    assert res.returncode == 3
    assert res.stderr.startswith("passing-ctl: ") and "Traceback" not in res.stderr


def test_stats_accounts_for_every_dropped_forged_packet(fabric_of, tmp_path, capsys):
    fabric = fabric_of("star")
    cfg = write_config(tmp_path, fabric)
    assert ctl(capsys, cfg, "prepare")[0] == 0  # L2 forwarding: without the guard h1 gets them
    assert ctl(capsys, cfg, "job", "create", "7", "--hosts", "h1,h2", "--window", "8")[0] == 0
    code, out, _ = ctl(capsys, cfg, "job", "show", "7", "--json")
    agent_port = json.loads(out)["agent_params"]["agent_udp_port"]
    topo = load(REPO / "topologies" / "star.json")
    h1, h3 = topo.hosts["h1"], topo.hosts["h3"]
    ports = fabric["s1"].test_ports

    def frame(dport, sport=12345, ip_options=()):
        return bytes(Ether(src=h3.mac, dst=h1.mac)
                     / IP(src=h3.ip, dst=h1.ip, options=list(ip_options))
                     / UDP(sport=sport, dport=dport) / (b"\x00" * 16))

    ports[3].send(frame(agent_port))  # to an agent of job 7: counted in the job's row
    ports[3].send(frame(5555, sport=P.PASSING_UDP_PORT))  # from the aggregation port
    ports[3].send(frame(5555, ip_options=[IPOption_NOP()] * 4))  # ports hidden by options
    ports[3].send(frame(5555))  # ordinary traffic
    assert [Ether(f)[UDP].dport for f in ports[1].recv(4, 1)] == [5555]
    code, out, _ = ctl(capsys, cfg, "stats", "7", "--json")
    s1 = json.loads(out)["7"]["s1"]
    assert s1["drops_forged_result"] == 1
    assert s1["switch_drops"] == {"unknown_job": 0, "malformed": 0, "forged": 1,
                                  "unchecked_udp": 1, "tagged": 0, "no_peer": 0}
    code, out, _ = ctl(capsys, cfg, "stats")
    assert code == 0
    jobs, drops, switch = out.split("\n\n")
    head, row = (line.split() for line in drops.splitlines()[1:])
    assert dict(zip(head, row, strict=True))["FORGED_RESULT"] == "1"
    assert switch.splitlines()[0] == "switch-wide drops (no job's row):"
    head, row = (line.split() for line in switch.splitlines()[1:])
    assert dict(zip(head, row, strict=True)) == {
        "SWITCH": "s1", "UNKNOWN_JOB": "0", "MALFORMED": "0", "FORGED": "1",
        "UNCHECKED_UDP": "1", "TAGGED": "0", "NO_PEER": "0"}


def test_stats_with_a_switch_down_gives_the_others_and_says_which(make_control, tmp_path,
                                                                   capsys):
    """tor2 stops answering (its address leads nowhere): `stats` still prints tor1's and the
    spine's counters, marks tor2's row and says why, and exits 4 so that a script notices."""
    from controller.core import Controller, Endpoint
    from controller.job_plan import JobSpec
    from tests.controller.test_resize import cli

    ctl, fabric = make_control("leafspine")
    ctl.create_job(JobSpec(4, ("h1", "h3"), window=4))
    ctl.create_job(JobSpec(5, ("h2", "h4"), window=4))
    ctl.disconnect()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    endpoints = {n: Endpoint(n, dead if n == "tor2" else fabric[n].grpc_address,
                             fabric[n].device_id) for n in ("tor1", "tor2", "spine")}
    down = Controller(ctl.topo, endpoints, tmp_path / "state.sqlite", retries=1,
                      connect_timeout=1.0)
    try:
        code, out, err = cli(down, capsys, "stats", "4", "--json")
        assert code == 4 and err == "passing-ctl: stats incomplete: no counters from tor2\n"
        stats = json.loads(out)["4"]
        assert set(stats) == {"tor1", "tor2", "spine"}
        for sw in ("tor1", "spine"):
            assert stats[sw]["job_contributions"] == 0 and "error" not in stats[sw], sw
            assert stats[sw]["switch_drops"]["forged"] == 0
        assert set(stats["tor2"]) == {"error", "fan_in", "quorum"}
        assert "tor2" in stats["tor2"]["error"] and stats["tor2"]["fan_in"] == 1
        # Every job: the down switch is asked once, not once per job (each costs the retries).
        asked = []
        real = down.connections.conn
        down.connections.conn = lambda name: (asked.append(name), real(name))[1]
        code, out, err = cli(down, capsys, "stats")
        assert code == 4 and "tor2" in err
        assert asked.count("tor2") == 1, asked
        jobs, drops, switch, unread = out.strip().split("\n\n")
        head, *rows = (line.split() for line in jobs.splitlines())
        by_row = {(r[0], r[1]): dict(zip(head, r, strict=True)) for r in rows}
        assert set(by_row) == {(j, s) for j in ("4", "5") for s in ("tor1", "tor2", "spine")}
        for job in ("4", "5"):
            assert by_row[job, "tor1"]["JOB_CONTRIBUTIONS"] == "0"
            assert by_row[job, "tor2"]["JOB_CONTRIBUTIONS"] == "-"
            assert by_row[job, "tor2"]["QUORUM"] == "1/1"
        assert "tor2" not in drops and "tor2" not in switch and "tor1" in switch
        assert unread.startswith("not read:\n  tor2: ") and "tor1" not in unread
    finally:
        down.close()


def test_the_mininet_cli_job_command_sets_the_straggler_policy(make_control, capsys):
    """`job set ...` at the passing> prompt is passing-ctl job set on the network's
    controller: the quorum goes to the switch, patience and staleness into the parameters the
    hosts' agents fetch; a bad command line prints its usage and leaves the prompt alive."""
    from controller.job_plan import JobSpec
    from topologies.run import PassingCLI

    controller, _ = make_control("star")
    controller.create_job(JobSpec(3, ("h1", "h2", "h3"), window=4))
    cli = PassingCLI.__new__(PassingCLI)  # the commands, without Mininet's interactive loop
    cli.pnet = type("Net", (), {"ctl": controller})()
    cli.do_job("set 3 --quorum 2 --patience 0.005..0.05 --staleness 4")
    assert "quorum 2; agents: patience 0.005..0.05 s (adaptive), staleness 4" in \
        capsys.readouterr().out
    assert controller.quorums(3) == {"s1": {"fan_in": 3, "quorum": 2}}
    params = controller.agent_params(3)
    assert params.patience == (0.005, 0.05) and params.staleness == 4
    cli.do_job("set 3 --quorum two")
    assert "usage" in capsys.readouterr().err
    assert controller.quorums(3) == {"s1": {"fan_in": 3, "quorum": 2}}


def test_the_mininet_cli_job_command_resizes_a_job(make_control, capsys):
    """`job resize ...` at the passing> prompt is passing-ctl job resize on the network's
    controller; a bad command line prints its usage, a refusal its one line, and the prompt
    stays alive."""
    from controller.job_plan import JobSpec
    from topologies.run import PassingCLI

    controller, _ = make_control("star")
    controller.create_job(JobSpec(3, ("h1", "h2"), window=4))
    cli = PassingCLI.__new__(PassingCLI)  # the commands, without Mininet's interactive loop
    cli.pnet = type("Net", (), {"ctl": controller})()
    cli.do_job("resize 3 --window 8")
    assert "job 3 resized to a window of 8 (pool epoch 1) on s1" in capsys.readouterr().out
    params = controller.agent_params(3)
    assert (params.window, params.pool) == (8, 1)
    cli.do_job("resize 3")
    assert "usage: passing-ctl job resize" in capsys.readouterr().err
    cli.do_job("resize 3 --window 16")  # no host has used the new pool yet
    assert "hosts h1, h2 have not contributed" in capsys.readouterr().err
    cli.do_job("show 3")
    assert "not yet: h1, h2" in capsys.readouterr().out
    assert controller.agent_params(3) == params
