"""passing-agent kept running (passing_agent.serve): two hosts of two local ranks, each one agent
process answering command after command through the switch pipeline over real UDP. Every
answer is checked (the first ones too), the ranks start once, a refused command changes
nothing, and a failed command leaves no trace in the next one."""

from __future__ import annotations

import glob
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from testbed.loopback import UdpLoopbackSwitch
from tests import REPO
from tests.agent_ranks import descendants, rank_processes
from topologies import agent_servers
from topologies.agent_servers import AgentServers


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agent:
    def __init__(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PASSING_")}
        self.proc = subprocess.Popen([sys.executable, "-m", "passing_agent.serve"], cwd=REPO,
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"the agent exited (code {self.proc.poll()})"
        return json.loads(line)

    def close(self, timeout: float = 60) -> int:
        self.proc.stdin.close()
        return self.proc.wait(timeout)


@pytest.fixture
def job(tmp_path):
    sw = UdpLoopbackSwitch(2, agent_udp_port=_free_udp_port(), slots=32)
    path = tmp_path / "job.json"
    path.write_text(sw.agent_params(local_gpus=2).to_json())
    agents = {h: Agent() for h in ("h1", "h2")}
    yield path, agents
    for a in agents.values():
        if a.proc.poll() is None:
            # Asked to stop first, so that it removes what its ranks leave.
            try:
                a.close(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                a.proc.kill()
                a.proc.wait()
    sw.close()


def _store_dirs(agent: Agent) -> list[str]:
    """The directories where the agent's local ranks meet (passing_agent.pool): one while its
    ranks are up, none after."""
    return glob.glob(os.path.join(tempfile.gettempdir(), f"passing-agent-{agent.proc.pid}-*"))


def _all(agents: dict[str, Agent], argv: list[str], hosts=("h1", "h2")) -> dict[str, dict]:
    for h in hosts:
        agents[h].send(json.dumps([*argv, "--host", h]))
    return {h: agents[h].answer() for h in hosts}


def test_commands_one_after_another_reuse_the_ranks_and_are_all_correct(job):
    path, agents = job
    # The directory an agent killed earlier left (its pid is gone) is removed when ranks start.
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = os.path.join(tempfile.gettempdir(), f"passing-agent-{gone.pid}-test")
    os.makedirs(orphan, exist_ok=True)
    # Strategies alternate (each builds and tears down its own process groups and sockets),
    # and sizes change: a command must not see what the one before it left. Without a
    # warm-up the first call is timed (and checked, as every call is).
    plan = [("passing", "3K", 1), ("ring", "2K", 0), ("passing", "5K", 0), ("ps", "1K", 2),
            ("hier-ring", "3K", 1), ("passing", "1K", 1)]
    for strategy, size, warmup in plan:
        res = _all(agents, ["--params", str(path), "--size", size, "--iters", "2",
                            "--warmup", str(warmup), "--strategy", strategy])
        for host, r in res.items():
            assert r["ok"] and r["correct"] and r["strategy"] == strategy, (host, r)
            assert r["size"] == int(size[:-1]) * 1024 and r["contributors"] == 4, r
            assert len(r["times"]) == 2 and r["warmup"] == warmup, r
            assert len(r["call_errors"]) == 2 + warmup  # the warm-up calls were checked too
            assert r["rank_starts"] == 1, "the ranks were started again"
    assert all(len(_store_dirs(a)) == 1 for a in agents.values())
    assert not os.path.exists(orphan), "a dead agent's directory was left"
    assert all(a.close() == 0 for a in agents.values())
    assert not any(_store_dirs(a) for a in agents.values()), "the ranks' directory outlived them"


def test_a_refused_command_is_answered_and_the_next_one_runs(job):
    path, agents = job
    a = agents["h1"]
    for bad in ("not json", '"--size"', json.dumps(["--params", str(path), "--size", "x"]),
                json.dumps(["--params", str(path), "--host", "h9"]),
                json.dumps(["--params", str(path), "--warmup", "-1"]),
                json.dumps(["--params", str(path), "--help"])):
        a.send(bad)
        r = a.answer()
        assert r["ok"] is False and r["usage"] is True and r["error"], (bad, r)
    res = _all(agents, ["--params", str(path), "--size", "2K", "--iters", "1"])
    assert all(r["ok"] and r["correct"] for r in res.values()), res


def test_a_failed_command_restarts_the_ranks_and_the_next_one_is_correct(job):
    path, agents = job
    # h1 alone: its leader waits for h2 at the rendezvous and gives up.
    agents["h1"].send(json.dumps(["--params", str(path), "--host", "h1", "--size", "1K",
                                  "--rendezvous-timeout", "2"]))
    failed = agents["h1"].answer()
    assert not failed["ok"] and failed["error"], failed
    res = _all(agents, ["--params", str(path), "--size", "2K", "--iters", "1"])
    assert all(r["ok"] and r["correct"] for r in res.values()), res
    assert res["h1"]["rank_starts"] == 2 and res["h2"]["rank_starts"] == 1, res
    assert len(_store_dirs(agents["h1"])) == 1, "the failed ranks' directory was left behind"


def _all_gone(pids: list[int], why: str, grace: float = 10) -> None:
    # The ranks see their agent end through a pidfd, the fork server and the resource
    # tracker once their pipes close after that: a few seconds' grace, not a leak.
    deadline = time.monotonic() + grace
    for pid in pids:
        while os.path.exists(f"/proc/{pid}") and _state(pid) != "Z":
            assert time.monotonic() < deadline, \
                f"process {pid} ({_cmdline(pid)}) outlived its agent ({why})"
            time.sleep(0.1)


def _processes_after_a_command(job) -> list[int]:
    """One correct command on both hosts, then every process below h1's agent, its 2 ranks
    among them (they stay up between commands)."""
    path, agents = job
    res = _all(agents, ["--params", str(path), "--size", "1K", "--iters", "1"])
    assert all(r["ok"] and r["correct"] for r in res.values()), res
    ranks = rank_processes(agents["h1"].proc.pid)
    assert len(ranks) == 2, f"the 2 ranks should be up between commands: {ranks}"
    return descendants(agents["h1"].proc.pid)


def test_end_of_input_stops_the_agent_and_its_ranks(job):
    below = _processes_after_a_command(job)
    agent = job[1]["h1"]
    agent.send("quit")
    assert agent.proc.wait(60) == 0
    assert not _store_dirs(agent)
    _all_gone(below, "quit")


def test_a_killed_agent_takes_its_ranks_with_it(job):
    """An agent killed outright (how a driver ends a stuck one) cleans nothing up itself: its
    ranks and their fork server must still end, or an orphaned leader would stream on."""
    below = _processes_after_a_command(job)
    agent = job[1]["h1"]
    agent.proc.kill()
    agent.proc.wait(10)
    _all_gone(below, "SIGKILL")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return ""


def _state(pid: int) -> str:
    """The process's state letter ("" if it is gone meanwhile)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


class _LocalNode:
    """A Mininet host stand-in: the agent runs here, in this namespace."""

    def popen(self, argv, **kw):
        return subprocess.Popen(argv, cwd=REPO, **kw)


def test_the_driver_never_reads_an_old_answer_as_a_new_one(tmp_path, monkeypatch):
    """topologies.agent_servers: an agent whose answer went unread (the caller interrupted,
    or out of time) is not reused; the next command gets its own answer, from a new agent.
    Refused commands (answered at once, no switch needed) tell the answers apart."""
    agents = AgentServers(lambda host: _LocalNode(), tmp_path)
    try:
        assert "'x1'" in agents.run({"h1": ["--size", "x1"]}, 60)["h1"]["error"]
        assert "'x2'" in agents.run({"h1": ["--size", "x2"]}, 60)["h1"]["error"]
        assert agents.started == 1  # the same agent answered both

        class Interrupted(selectors.DefaultSelector):
            def select(self, timeout=None):
                raise KeyboardInterrupt

        with monkeypatch.context() as m:
            m.setattr(agent_servers.selectors, "DefaultSelector", Interrupted)
            with pytest.raises(KeyboardInterrupt):
                agents.run({"h1": ["--size", "x3"]}, 60)
        assert "'x4'" in agents.run({"h1": ["--size", "x4"]}, 60)["h1"]["error"]
        assert agents.started == 2
        late = agents.run({"h1": ["--size", "x5"]}, 0)["h1"]  # no time to answer
        assert late == {"ok": False, "error": "agent did not finish (killed)"}
        assert "'x6'" in agents.run({"h1": ["--size", "x6"]}, 60)["h1"]["error"]
        assert agents.started == 3
        # Started under another PASSING_* environment: not reused.
        monkeypatch.setenv("PASSING_POOL_POLL", "0.5")
        assert "'x7'" in agents.run({"h1": ["--size", "x7"]}, 60)["h1"]["error"]
        assert agents.started == 4
        assert len(agents.processes("h1")) == 1  # the other environment's agent ended
        last = agents.processes("h1")
    finally:
        agents.stop()
    assert all(p.poll() is not None for p in last)


def test_the_bytes_of_the_timed_calls_are_read_from_the_named_interface():
    """What an agent reports as its host link's bytes per timed call: the interface's own
    counters, read before and after (here loopback, with 20 KB sent between the reads), per
    call; nothing where the interface cannot be read, rather than a made-up zero."""
    from passing_agent import rank_report as worker

    start = worker.link_bytes("lo")
    assert start is not None and min(start) >= 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        for _ in range(20):
            s.sendto(bytes(1000), s.getsockname())
    per_call = worker.timed_link_bytes(start, "lo", 2)
    assert per_call["timed_tx_bytes"] >= 10_000 and per_call["timed_rx_bytes"] >= 10_000
    assert worker.link_bytes("no-such-if0") is None and worker.link_bytes(None) is None
    assert worker.timed_link_bytes(None, "lo", 2) == {}
    assert worker.timed_link_bytes(start, "no-such-if0", 2) == {}
