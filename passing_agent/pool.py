"""The local ranks of one `passing-agent` host, kept alive from one command to the next.

Starting G ranks costs seconds each (a process, then torch); `make bench` runs dozens of
commands per host, so the ranks start once and each command only builds its process groups
(passing_agent.worker). A command that fails, or whose ranks do not all come back idle, costs
the ranks: they end and the next command starts fresh ones, so nothing a failed command
left behind (a rank stuck in a collective, a socket still bound) reaches the next: they are
asked to stop, and killed if they have not within 5 s.
"""

from __future__ import annotations

import dataclasses
import glob
import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import time

import numpy as np

from passing.contract import JobParams
from passing_agent import worker
from passing_agent.options import IDLE_GRACE_S, RunOptions, command_budget_s

# Only modules that read no PASSING_* setting at import: the server outlives the settings a
# caller may change between starts (each rank applies the agent's environment as it starts).
_PRELOAD = ["numpy", "torch", "torch.distributed"]


def _remove_orphans() -> None:
    """The ranks' directories of agents that are gone (killed by their driver, which is how a
    stuck agent ends): nothing else removes them. (Agents sharing the temporary directory must
    share this PID namespace, as Mininet's hosts do.)"""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "passing-agent-*-*")):
        pid = os.path.basename(path).split("-")[2]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(path, ignore_errors=True)


class RankPool:
    """G local ranks (processes) that run commands one at a time.

    Usage::

        with RankPool() as pool:
            report = pool.run(params, "h1", RunOptions(size=1 << 20, iters=3))
            again = pool.run(params, "h1", RunOptions(strategy="ring"))
    """

    def __init__(self) -> None:
        # Ranks are forked from a server process that imported torch once (a fresh process,
        # no threads of the agent's), not each spawned to import it anew: torch's import is
        # ~1.4 s of CPU per rank, paid G times per host on every fabric start otherwise.
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(_PRELOAD)
        self._procs: list = []
        self._commands: list = []
        self._out = None
        # The local ranks meet in a file of this directory per command (a FileStore): a
        # TCPStore cost each command ~0.4 s of connecting, more than a small command's calls.
        # A directory of the ranks' own (mode 0700), removed with them: nobody else's file
        # can stand in for a command's.
        self._dir: str | None = None
        self._runs = 0
        self.starts = 0  # how many times ranks were started (for the report and the tests)

    def _start(self, gpus: int) -> None:
        self.stop()
        _remove_orphans()
        self._dir = tempfile.mkdtemp(prefix=f"passing-agent-{os.getpid()}-")
        self._out = self._ctx.Queue()
        self._commands = [self._ctx.Queue() for _ in range(gpus)]
        self._procs = [self._ctx.Process(target=worker.serve,
                                         args=(r, self._commands[r], self._out, os.getpid(),
                                               dict(os.environ)))
                       for r in range(gpus)]
        for p in self._procs:
            p.start()
        self.starts += 1

    def stop(self) -> None:
        """End the ranks: asked to, then killed if they do not."""
        for q in self._commands:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5.0
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5.0)
        self._procs, self._commands, self._out = [], [], None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def run(self, params: JobParams, host: str, opts: RunOptions) -> dict:
        """One command on every local rank of `host`: the leader's report (or, without one,
        another rank's error)."""
        gpus = params.host(host).local_gpus
        if len(self._procs) != gpus or not all(p.is_alive() for p in self._procs):
            self._start(gpus)
        self._runs += 1
        job = {**dataclasses.asdict(opts), "params": params, "host": host, "world": gpus,
               "store": os.path.join(self._dir, f"run-{self._runs}"), "run": self._runs,
               "rendezvous_port": opts.rendezvous_port or 29500 + params.job_id % 1000}
        for q in self._commands:
            q.put(job)
        budget = command_budget_s(opts)
        reports, idle = self._collect(self._runs, budget)
        # The leader's report says most (its error names the switch); others only if it has none.
        res = next((r for r in reports if r.get("rank") == 0), reports[0])
        if res["ok"] and len(idle) < gpus:
            idle |= self._collect(self._runs, IDLE_GRACE_S, idle)[1]
        if not res["ok"] or len(idle) < gpus:
            self.stop()
        res.pop("run", None)
        if not res["ok"] or opts.train_steps:
            return res
        mean = float(np.mean(res["times"]))
        nbytes = opts.size * 4
        res.update({"host": host, "local_ranks": gpus, "size": opts.size, "bytes": nbytes,
                    "iters": opts.iters, "warmup": opts.warmup, "mean_s": mean,
                    "goodput_gbps": nbytes * 8 / mean / 1e9,
                    "correct": res["wrong_values"] == 0})
        return res

    def _collect(self, run: int, budget: float,
                 idle: set[int] | None = None) -> tuple[list[dict], set[int]]:
        """The reports of command `run` until the leader's is in (or every rank is idle), and
        which ranks are idle. A rank that dies ends the wait at once with an error rather than
        after the whole budget, and so does the budget running out."""
        reports: list[dict] = []
        idle = set(idle or ())
        deadline = time.monotonic() + budget
        n = len(self._procs)
        while (not any(r.get("rank") == 0 for r in reports) and len(reports) < n
               and len(idle) < n):
            try:
                msg = self._out.get(timeout=1.0)
                if msg.get("run") != run:
                    continue  # a report of a command given up on
                if "idle" in msg:
                    idle.add(msg["idle"])
                else:
                    reports.append(msg)
                continue
            except queue.Empty:
                pass
            dead = [(i, p.exitcode) for i, p in enumerate(self._procs) if not p.is_alive()]
            if dead:
                what = ", ".join(f"local rank {i} exit code {code}" for i, code in dead)
                return [{"ok": False, "rank": -1, "error": f"a local rank died: {what}"}], idle
            if time.monotonic() > deadline:
                return [{"ok": False, "rank": -1,
                         "error": f"no report from the local ranks within {budget:.0f}s"}], idle
        if not reports:
            reports = [{"ok": False, "rank": -1, "error": "the local ranks ended without a report"}]
        return reports, idle
