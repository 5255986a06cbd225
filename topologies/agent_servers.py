"""One passing-agent per Mininet host that stays up between all-reduces (passing_agent.serve).

`make bench` runs dozens of commands per host; starting G ranks that import torch took 15-20 s
of each run on a 2-core machine. Here each host's agent starts on its first command and answers
every later one with the ranks it already has. An agent that does not answer in time is killed
(by the PID started here; its ranks die with it) and the next command starts a fresh one.
"""

from __future__ import annotations

import json
import os
import selectors
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
    once it has read the agent's answer. Two jobs on one host at once get one agent each.

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
        self._busy: dict[subprocess.Popen, str] = {}  # agent running a command -> its host
        self._stopping = False
        self.started = 0  # agents started so far (the tests count them)

    def processes(self, host: str) -> list[subprocess.Popen]:
        """The agents of `host` now (idle ones, then those running a command)."""
        with self._lock:
            return [p for _, p in self._idle.get(host, [])] + [
                p for p, h in self._busy.items() if h == host]

    def _take(self, host: str, key: tuple) -> subprocess.Popen:
        with self._lock:
            if self._stopping:
                raise RuntimeError("the network's agents are being stopped")
            idle = self._idle.setdefault(host, [])
            for i, (k, proc) in enumerate(idle):
                if k == key and proc.poll() is None:
                    del idle[i]
                    self._busy[proc] = host
                    return proc
            self._log_dir.mkdir(parents=True, exist_ok=True)
            with open(self._log_dir / f"agent-{host}.log", "ab") as log:
                proc = self._node(host).popen([sys.executable, "-m", "passing_agent.serve"],
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=log)
            self.started += 1
            self._busy[proc] = host
            return proc

    def _give_back(self, host: str, key: tuple, proc: subprocess.Popen) -> None:
        with self._lock:
            self._busy.pop(proc, None)
            if proc.poll() is not None:
                return
            if self._stopping:
                _end(proc)
                return
            idle = self._idle.setdefault(host, [])
            # An agent of another environment than the newest one is not kept for later.
            for _, old in [(k, p) for k, p in idle if k != key]:
                _end(old)
            idle[:] = [(k, p) for k, p in idle if k == key] + [(key, proc)]

    def run(self, commands: dict[str, list[str]], bound: float) -> dict[str, dict]:
        """Give every host its passing-agent arguments at once; each host's report. A host
        without one within `bound` seconds gets an error, and every agent of the command is
        killed: the others would wait for it at the next rendezvous. An agent is reused only
        once its answer to this command was read: one left with an answer unread (the caller
        interrupted, say) is killed, or the next command would read that answer as its own."""
        key = _env_key()
        procs: dict[str, subprocess.Popen] = {}
        answered: set[str] = set()
        try:
            for h in commands:
                procs[h] = self._take(h, key)
            out = self._exchange(procs, commands, bound)
            answered = set(out)
            return out
        finally:
            for host, proc in procs.items():
                if host not in answered:
                    _end(proc)
                self._give_back(host, key, proc)

    def _exchange(self, procs: dict[str, subprocess.Popen], commands: dict[str, list[str]],
                  bound: float) -> dict[str, dict]:
        out: dict[str, dict] = {}
        sel = selectors.DefaultSelector()
        chunks: dict[str, bytes] = {}
        try:
            for host, argv in commands.items():
                try:
                    procs[host].stdin.write(json.dumps(argv).encode() + b"\n")
                    procs[host].stdin.flush()
                except (OSError, ValueError) as e:
                    out[host] = {"ok": False,
                                 "error": f"agent on {host} did not take the command: {e}"}
                    _end(procs[host])
                    continue
                sel.register(procs[host].stdout, selectors.EVENT_READ, host)
                chunks[host] = b""
            deadline = time.monotonic() + bound
            while chunks.keys() - out.keys():
                left = deadline - time.monotonic()
                ready = sel.select(left) if left > 0 else []
                if not ready:
                    for host in chunks.keys() - out.keys():
                        out[host] = {"ok": False, "error": "agent did not finish (killed)"}
                    for proc in procs.values():
                        _end(proc)
                    break
                for k, _ in ready:
                    host = k.data
                    data = os.read(k.fd, 1 << 16)
                    if not data:  # the agent exited
                        sel.unregister(k.fileobj)
                        _end(procs[host])
                        out[host] = {"ok": False, "error": (
                            f"agent on {host} exited (code {procs[host].returncode}); "
                            f"see {self._log_dir / f'agent-{host}.log'}")}
                        continue
                    chunks[host] += data
                    if b"\n" not in chunks[host]:
                        continue
                    sel.unregister(k.fileobj)
                    line = chunks[host].split(b"\n", 1)[0]
                    try:
                        out[host] = json.loads(line)
                    except json.JSONDecodeError:
                        out[host] = {"ok": False,
                                     "error": f"agent on {host} answered {line[:200]!r}"}
                        _end(procs[host])
        finally:
            sel.close()
        return out

    def stop(self) -> None:
        """Ask every idle agent to stop (its ranks with it), killing those that do not within
        10 s; agents running a command are killed (their command then fails)."""
        with self._lock:
            self._stopping = True
            idle = [p for agents in self._idle.values() for _, p in agents]
            busy = list(self._busy)  # the agents (dict keys)
            self._idle.clear()
        for proc in busy:
            if proc.poll() is None:
                proc.kill()  # its pipes are the running command's to close
        for proc in idle:
            try:
                proc.stdin.write(b"quit\n")
                proc.stdin.close()
            except (OSError, ValueError):  # gone already
                pass
        deadline = time.monotonic() + 10.0
        for proc in idle:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _end(proc)
        with self._lock:
            self._stopping = False  # a network started again gets agents again


def _end(proc: subprocess.Popen) -> None:
    """Kill an agent started here (its ranks die with it: each watches it, passing_agent.worker)
    and close our ends of its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        try:
            pipe.close()
        except (OSError, ValueError):
            pass
