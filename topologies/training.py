"""PyTorch training across the hosts of a PassingNetwork: one torchrun per host, its ranks'
reports collected from torchrun's per-rank log files, every process of the run killed when it
runs out of time (PassingNetwork.train uses these).

How a rank's report is found: torchrun runs with `--log-dir DIR --redirects 3`, so local rank
r's stdout and stderr are DIR/<run id>_<random>/attempt_0/<r>/stdout.log and stderr.log, never
interleaved with other ranks' or torchrun's own output (which goes to DIR/torchrun.log). The
training script's last stdout line is its JSON report (examples/train_ddp.py --json); a rank
without one failed, and its error is the last exception line of its stderr.

How processes are found: every process of a host's run (torchrun, its workers in their own
sessions, their children) inherits PASSING_TRAIN_TAG=<tag> in its environment; killing a
host's run kills every process whose environment has that tag, wherever it was reparented.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

# torchrun's rendezvous (its TCP store on the first host) listens on TRAIN_PORT_BASE + job id
# % 9000: below the ring baselines' 29500 + job id % 1000 (bench/agent) and below the hosts'
# ephemeral range (32768 and up).
TRAIN_PORT_BASE = 20000
TAG_VAR = "PASSING_TRAIN_TAG"
_EXC = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure|Refused)\b.*")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")  # torch's prefix of a rank's stderr lines


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
    ranks: list[dict] = field(default_factory=list)


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


def error_line(text: str, fallback: bool = True) -> str | None:
    """The last exception line of a traceback in `text` (with fallback, else its last line
    that is no c10d log line like `[W1130 ...]`), shortened."""
    lines = [_RANK_PREFIX.sub("", ln.strip()) for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    line = next((ln for ln in reversed(lines) if _EXC.match(ln)), None)
    if line is None and fallback:
        line = next((ln for ln in reversed(lines) if not ln.startswith("[")),
                    lines[-1] if lines else None)
    if line is None:
        return None
    return line if len(line) <= 500 else line[:497] + "..."


def _tail(path: Path, limit: int = 64_000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            return None
        return obj if isinstance(obj, dict) else None
    return None


def rank_logs(log_dir: Path, local_rank: int) -> tuple[Path | None, Path | None]:
    """(stdout.log, stderr.log) of that local rank in torchrun's log directory (last
    attempt), or (None, None) when torchrun never started it."""
    found = sorted(log_dir.glob(f"*/attempt_*/{local_rank}/stdout.log"))
    if not found:
        return None, None
    return found[-1], found[-1].with_name("stderr.log")


def _crash_after_report(run: HostRun, code: int | None) -> str | None:
    """Every rank reported success, yet torchrun failed: a rank died on its way out (a
    C++ abort at interpreter exit, say). Names the rank and its own last words, which
    torchrun's summary ("ChildFailedError") does not."""
    for lr in range(run.nproc):
        _, err = rank_logs(run.log_dir, lr)
        line = error_line(_tail(err), fallback=False) if err else None
        if line is None and err:
            line = next((ln.strip() for ln in reversed(_tail(err).splitlines())
                         if ln.strip() and not ln.startswith("[")), None)
        if line:
            return (f"rank {run.rank_base + lr} reported success, then torchrun exited with "
                    f"code {code}; its stderr ends: {line}")
    return None


def collect(run: HostRun) -> dict:
    """The host's result: its ranks' reports (a failed rank: ok False and its error)."""
    code = run.proc.returncode if run.proc is not None else None
    torchrun_log = _tail(run.log_dir / "torchrun.log")
    ranks = []
    for lr in range(run.nproc):
        out, err = rank_logs(run.log_dir, lr)
        rep = _last_json(_tail(out)) if out else None
        if rep is None or not rep.get("ok"):
            why = (rep or {}).get("error")
            if run.killed:  # its own error, if it had one before being killed
                why = why or (error_line(_tail(err), fallback=False) if err else None)
                why = f"{run.killed}" + (f" ({why})" if why else "")
            else:
                why = why or (error_line(_tail(err)) if err else None)
            if not run.killed and out is None:
                why = why or error_line(torchrun_log) or "torchrun started no worker"
            rep = {**(rep or {}), "ok": False,
                   "error": why or f"no report (torchrun exit code {code})"}
        rep.setdefault("rank", run.rank_base + lr)
        rep.setdefault("host", run.host)
        rep.setdefault("local_rank", lr)
        ranks.append(rep)
    ok = code == 0 and not run.killed and all(r.get("ok") for r in ranks)
    error = None
    if not ok:
        error = next((r["error"] for r in ranks if not r.get("ok") and r.get("error")), None)
        error = error or run.killed or _crash_after_report(run, code) \
            or error_line(torchrun_log) or f"torchrun exit code {code}"
    return {"ok": ok, "host": run.host, "node_rank": run.node_rank, "nproc": run.nproc,
            "exit_code": code, "killed": run.killed, "error": error, "ranks": ranks,
            "log_dir": str(run.log_dir)}
