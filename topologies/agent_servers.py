"""One passing-agent per Mininet host that stays up between all-reduces (bench.agent.serve).

`make bench` runs dozens of commands per host; starting G ranks that import torch took 15-20 s
of each run on a 2-core machine. Here each host's agent starts on its first command and answers
every later one with the ranks it already has. An agent that does not answer in time is killed
(by the PID started here; its ranks die with it) and the next command starts a fresh one.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _env_key() -> tuple:
    """What of the caller's environment an agent takes on at start (PASSING_POOL_POLL and
    the like): an agent started under another one is not reused."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PASSING_")))


class AgentServers:
    """Agents per host, each running one command at a time: a command takes an idle agent of
    its host started under the same PASSING_* environment, or starts one, and gives it back
    when it has answered. Two jobs on one host at once get one agent each.

    Usage::

        agents = AgentServers(net.get, run_dir)
        reports = agents.run({"h1": ["--params", p, "--host", "h1", "--size", "1M"], ...}, 300)
        agents.stop()
    """

    def __init__(self, node: Callable[[str], Any], log_dir: Path):
        self._node = node  # host name -> its Mininet node
        self._log_dir = Path(log_dir)
        self._lock = threading.Lock()
        self._idle: dict[str, list[tuple[tuple, subprocess.Popen]]] = {}
        self._busy: list[subprocess.Popen] = []
        self._hosts: dict[str, list[subprocess.Popen]] = {}  # every agent started, by host
        self.started = 0  # agents started so far (the tests count them)

    def processes(self, host: str) -> list[subprocess.Popen]:
        """The agents of `host` now (idle ones, then those running a command)."""
        with self._lock:
            return [p for _, p in self._idle.get(host, [])] + [
                p for p in self._busy if p in self._hosts.get(host, ())]

    def _take(self, host: str, key: tuple) -> subprocess.Popen:
        with self._lock:
            idle = self._idle.setdefault(host, [])
            for i, (k, proc) in enumerate(idle):
                if k == key and proc.poll() is None:
                    del idle[i]
                    self._busy.append(proc)
                    return proc
            # Agents of another environment would never be taken again.
            for _, proc in idle:
                _end(proc)
            idle.clear()
            self._log_dir.mkdir(parents=True, exist_ok=True)
            with open(self._log_dir / f"agent-{host}.log", "ab") as log:
                proc = self._node(host).popen([sys.executable, "-m", "bench.agent.serve"],
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=log)
            self.started += 1
            self._hosts[host] = [p for p in self._hosts.get(host, []) if p.poll() is None]
            self._hosts[host].append(proc)
            self._busy.append(proc)
            return proc

    def _give_back(self, host: str, key: tuple, proc: subprocess.Popen) -> None:
        with self._lock:
            if proc in self._busy:
                self._busy.remove(proc)
            if proc.poll() is None:
                self._idle.setdefault(host, []).append((key, proc))

    def run(self, commands: dict[str, list[str]], bound: float) -> dict[str, dict]:
        """Give every host its passing-agent arguments at once; each host's report. A host
        without one within `bound` seconds gets an error, and every agent of the command is
        killed: the others would wait for it at the next rendezvous."""
        key = _env_key()
        procs = {h: self._take(h, key) for h in commands}
        try:
            return self._exchange(procs, commands, bound)
        finally:
            for host, proc in procs.items():
                self._give_back(host, key, proc)

    def _exchange(self, procs: dict[str, subprocess.Popen], commands: dict[str, list[str]],
                  bound: float) -> dict[str, dict]:
        out: dict[str, dict] = {}
        pending: dict[int, str] = {}
        for host, argv in commands.items():
            try:
                procs[host].stdin.write(json.dumps(argv).encode() + b"\n")
                procs[host].stdin.flush()
                pending[procs[host].stdout.fileno()] = host
            except (OSError, ValueError) as e:
                out[host] = {"ok": False, "error": f"agent on {host} did not take the command: {e}"}
                _end(procs[host])
        chunks: dict[str, bytes] = {h: b"" for h in pending.values()}
        deadline = time.monotonic() + bound
        while pending:
            left = deadline - time.monotonic()
            ready = select.select(list(pending), [], [], left)[0] if left > 0 else []
            if not ready:
                for host in pending.values():
                    out[host] = {"ok": False, "error": "agent did not finish (killed)"}
                for proc in procs.values():
                    _end(proc)
                break
            for fd in ready:
                host = pending[fd]
                data = os.read(fd, 1 << 16)
                if not data:  # the agent exited
                    _end(procs[host])
                    code = procs[host].returncode
                    out[host] = {"ok": False, "error": f"agent on {host} exited (code {code}); "
                                 f"see {self._log_dir / f'agent-{host}.log'}"}
                    del pending[fd]
                    continue
                chunks[host] += data
                if b"\n" in chunks[host]:
                    line = chunks[host].split(b"\n", 1)[0]
                    try:
                        out[host] = json.loads(line)
                    except json.JSONDecodeError:
                        out[host] = {"ok": False, "error": f"agent on {host} answered "
                                     f"{line[:200]!r}"}
                        _end(procs[host])
                    del pending[fd]
        return out

    def stop(self) -> None:
        """Ask every agent to stop (its ranks with it); kill those that do not within 10 s."""
        with self._lock:
            procs = [p for idle in self._idle.values() for _, p in idle] + self._busy
            self._idle.clear()
            self._busy = []
        for proc in procs:
            try:
                proc.stdin.write(b"quit\n")
                proc.stdin.close()
            except (OSError, ValueError):  # gone already, or its pipe closed by _end
                pass
        deadline = time.monotonic() + 10.0
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _end(proc)


def _end(proc: subprocess.Popen) -> None:
    """Kill an agent started here (its ranks die with it: PR_SET_PDEATHSIG)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        try:
            pipe.close()
        except (OSError, ValueError):
            pass
