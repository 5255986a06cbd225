"""The processes of PyTorch training across the hosts of a PassingNetwork: one torchrun per
host, started so that every rank's output lands in a file of its own
(topologies/train_results.py reads them), and every process of the run killed when it runs
out of time (topologies/training_runs.py uses these).

How processes are found: every process of a host's run (torchrun, its workers in their own
sessions, their children) inherits PASSING_TRAIN_TAG=<tag> in its environment; killing a
host's run kills every process whose environment has that tag, wherever it was reparented.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# torchrun's rendezvous (its TCP store on the first host) listens on TRAIN_PORT_BASE + job id
# % 9000: below the ring baselines' 29500 + job id % 1000 (passing_agent) and below the hosts'
# ephemeral range (32768 and up).
TRAIN_PORT_BASE = 20000
TAG_VAR = "PASSING_TRAIN_TAG"


def master_port(job_id: int) -> int:
    return TRAIN_PORT_BASE + job_id % 9000


@dataclass
class HostRun:
    """One host's torchrun in a training run."""

    host: str
    node_rank: int
    nproc: int
    rank_base: int  # global rank of its local rank 0
    log_dir: Path
    tag: str
    proc: subprocess.Popen | None = None
    killed: str | None = None  # why it was killed, when it was


def torchrun_argv(python: str, run: HostRun, nnodes: int, master_addr: str, port: int,
                  script: Path, script_args: list[str]) -> list[str]:
    return [python, "-m", "torch.distributed.run",
            "--nnodes", str(nnodes), "--nproc-per-node", str(run.nproc),
            "--node-rank", str(run.node_rank), "--master-addr", master_addr,
            "--master-port", str(port), "--max-restarts", "0",
            "--log-dir", str(run.log_dir), "--redirects", "3",
            str(script), *script_args]


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment holds PASSING_TRAIN_TAG=tag."""
    needle = f"{TAG_VAR}={tag}".encode() + b"\0"
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or a kernel thread
            continue
        if (b"\0" + env).find(b"\0" + needle) >= 0:
            pids.append(int(entry.name))
    return pids


def kill_tagged(tag: str, rounds: int = 20) -> int:
    """SIGKILL every process of that tag, until none is left; how many were killed."""
    killed = 0
    empty = 0
    for _ in range(rounds):
        pids = [p for p in tagged_pids(tag) if p != os.getpid()]
        if not pids:
            # A process in the middle of an exec shows no environment: only a second empty scan
            # says none is left.
            empty += 1
            if empty == 2:
                break
            time.sleep(0.05)
            continue
        empty = 0
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return killed
