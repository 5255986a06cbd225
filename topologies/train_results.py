"""How each rank of a training run did, judged from what its host's torchrun left behind
(topologies/training.py starts it).

A rank's verdict is its exit status, because any training script, not only
examples/train_ddp.py, says with it whether it trained: what it prints, to stdout or stderr
(warnings, progress), is its own business. torchrun exits 0 only when every rank did; when one
did not, its ChildFailedError summary lists every rank that exited non-zero, with its exit code
(those it stopped itself once a rank failed included), so a rank that it does not list exited 0.

Where a rank's output is: torchrun runs with `--log-dir DIR --redirects 3`, so local rank r's
stdout and stderr are DIR/<run id>_<random>/attempt_0/<r>/stdout.log and stderr.log, never
interleaved with other ranks' or torchrun's own output (which goes to DIR/torchrun.log).

What a rank shows: its JSON report when its last stdout line is one (examples/train_ddp.py
--json), else that line (`output`); a failed rank, its exit code and the last exception line of
its stderr. Where torchrun left no exit statuses (it was killed, or failed before its ranks
started), a rank succeeded only if its JSON report said so.
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from topologies.training import HostRun

_EXC = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure|Refused)\b.*")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")  # torch's prefix of a rank's stderr lines
# One failure in torchrun's ChildFailedError summary (torch.distributed.elastic's
# _FAILURE_FORMAT_TEMPLATE): its rank line, then its exit code line.
_FAILURE = re.compile(r"^\s*rank\s*:\s*(-?\d+) \(local_rank: (\d+)\)[ \t]*\n"
                      r"\s*exitcode\s*:\s*(-?\d+)", re.M)
_SUMMARY = "ChildFailedError"
_ROOT_CAUSE = "Root Cause (first observed failure):"
_LINE_CHARS = 500


@dataclass(frozen=True)
class Exits:
    """Every local rank's exit code as torchrun reported it, and the local rank it named the
    root cause (its first failure; None when none failed)."""

    codes: dict[int, int]
    root: int | None = None


def torchrun_exits(code: int | None, nproc: int, log: str) -> Exits | None:
    """The exit codes of a torchrun's `nproc` ranks from its exit code and its log; None where
    it told none (killed, or failed without a summary of its ranks)."""
    if code == 0:
        return Exits(dict.fromkeys(range(nproc), 0))
    summary = log[log.rfind(_SUMMARY):] if _SUMMARY in log else ""
    failed = {int(lr): int(c) for _, lr, c in _FAILURE.findall(summary)}
    if not failed:
        return None
    root = _FAILURE.search(summary, summary.find(_ROOT_CAUSE)) \
        if _ROOT_CAUSE in summary else None
    return Exits({lr: failed.get(lr, 0) for lr in range(nproc)},
                 int(root.group(2)) if root else None)


def error_line(text: str, fallback: bool = True) -> str | None:
    """The last exception line of a traceback in `text` (with fallback, else its last line
    that is no c10d log line like `[W1130 ...]`), shortened."""
    lines = [_RANK_PREFIX.sub("", ln.strip()) for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    line = next((ln for ln in reversed(lines) if _EXC.match(ln)), None)
    if line is None and fallback:
        line = next((ln for ln in reversed(lines) if not ln.startswith("[")),
                    lines[-1] if lines else None)
    return None if line is None else _shorten(line)


def _shorten(line: str) -> str:
    return line if len(line) <= _LINE_CHARS else line[:_LINE_CHARS - 3] + "..."


def _tail(path: Path | None, limit: int = 64_000) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _last_line(text: str) -> str:
    return next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")


def _last_json(text: str) -> dict | None:
    try:
        obj = json.loads(_last_line(text) or "null")
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def rank_logs(log_dir: Path, local_rank: int) -> tuple[Path | None, Path | None]:
    """(stdout.log, stderr.log) of that local rank in torchrun's log directory (last
    attempt), or (None, None) when torchrun never started it."""
    found = sorted(log_dir.glob(f"*/attempt_*/{local_rank}/stdout.log"))
    if not found:
        return None, None
    return found[-1], found[-1].with_name("stderr.log")


def _status(code: int, stopped_after: int | None) -> str:
    """`exit code N`, with the signal that ended the rank, and the rank whose failure made
    torchrun stop it."""
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    after = f" after rank {stopped_after} failed" if stopped_after is not None else ""
    return f"exit code {code} ({name}{after})"


def _rank(run: HostRun, lr: int, exits: Exits | None, torchrun_log: str) -> dict:
    """Local rank `lr`'s result: its report (or last output line), ok, and why it failed."""
    out, err = rank_logs(run.log_dir, lr)
    stdout = _tail(out)
    report = _last_json(stdout)
    code = exits.codes[lr] if exits else None
    if code is None:  # torchrun told nothing of it: only its report can say it trained
        ok = report is not None and bool(report.get("ok"))
    else:
        ok = code == 0 and (report is None or bool(report.get("ok", True)))
    rank = dict(report) if report is not None else {"output": _shorten(_last_line(stdout))}
    rank.update({"ok": ok, "exit_code": code})
    if not ok:
        rank["error"] = _failure(run, lr, exits, (report or {}).get("error"), _tail(err),
                                 out is not None, torchrun_log)
    rank.setdefault("rank", run.rank_base + lr)
    rank.setdefault("host", run.host)
    rank.setdefault("local_rank", lr)
    return rank


def _failure(run: HostRun, lr: int, exits: Exits | None, own: str | None, stderr: str,
             started: bool, torchrun_log: str) -> str:
    """Why local rank `lr` failed, given its report's own error (if any) and its stderr."""
    code = exits.codes[lr] if exits else None
    if run.killed:  # its own error too, if it had one before being killed
        own = own or error_line(stderr, fallback=False)
        return run.killed + (f" ({own})" if own else "")
    if code is None:
        own = own or error_line(stderr)
        if not started:
            own = own or error_line(torchrun_log) or "torchrun started no worker"
        return own or f"no report (torchrun exit code {_exit_code(run)})"
    if code == 0:
        return own or "exited 0, but its report says it failed"
    # A rank that torchrun stopped because another failed has no error of its own: its
    # stderr's last line (a warning, say) is not one.
    stopped_after = run.rank_base + exits.root \
        if code < 0 and exits.root not in (None, lr) else None
    own = own or error_line(stderr, fallback=stopped_after is None)
    return _status(code, stopped_after) + (f": {own}" if own else "")


def _exit_code(run: HostRun) -> int | None:
    return run.proc.returncode if run.proc is not None else None


def _crash_after_report(run: HostRun, code: int | None) -> str | None:
    """Every rank reported success, yet torchrun failed without saying which rank did: a rank
    died on its way out (a C++ abort at interpreter exit, say). Names the rank and its own
    last words, which torchrun's summary ("ChildFailedError") does not."""
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
    """The host's result: its ranks' results (a failed rank: ok False and its error), and
    the host's own verdict and error (its root cause's, where torchrun named one)."""
    code = _exit_code(run)
    torchrun_log = _tail(run.log_dir / "torchrun.log")
    exits = torchrun_exits(code, run.nproc, torchrun_log)
    ranks = [_rank(run, lr, exits, torchrun_log) for lr in range(run.nproc)]
    ok = code == 0 and not run.killed and all(r["ok"] for r in ranks)
    error = None
    if not ok:
        failed = [r for r in ranks if not r["ok"]]
        if exits is not None and exits.root is not None:
            failed.insert(0, ranks[exits.root])
        error = next((r["error"] for r in failed if r.get("error")), None)
        error = error or run.killed or _crash_after_report(run, code) \
            or error_line(torchrun_log) or f"torchrun exit code {code}"
    return {"ok": ok, "host": run.host, "node_rank": run.node_rank, "nproc": run.nproc,
            "exit_code": code, "killed": run.killed, "error": error, "ranks": ranks,
            "log_dir": str(run.log_dir)}
