"""How `train` judges each rank (topologies/train_results.py) from what a host's torchrun left:
its exit code, its summary of the ranks that failed, and each rank's own stdout and stderr
files; and what `make run-topology`'s train prints of it. Fake log directories, no root."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from topologies import training_runs
from topologies.reports import report_train
from topologies.train_results import collect
from topologies.training import HostRun

WARNING = ("/home/u/train.py:12: UserWarning: TypedStorage is deprecated\n"
           "  warnings.warn(\"TypedStorage is deprecated\")\n"
           "[W1130 socket.cpp:207] [c10d] The hostname of the client socket cannot be found\n")
TRACEBACK = ("[rank3]: Traceback (most recent call last):\n[rank3]:   File \"x.py\"\n"
             "[rank3]: RuntimeError: Connection closed by peer\n[W1130 ProcessGroup.cpp] late\n")


def _summary(*failures: tuple[int, int, int]) -> str:
    """torchrun's ChildFailedError summary (as torch 2.13 prints it) of `failures`, each
    (global rank, local rank, exit code), the first one the root cause."""
    def one(i: int, rank: int, local: int, code: int) -> str:
        sig = " (SIGTERM)" if code == -15 else ""
        return (f"[{i}]:\n  time      : 2026-12-06_05:26:14\n  host      : h2\n"
                f"  rank      : {rank} (local_rank: {local})\n"
                f"  exitcode  : {code} (pid: {4000 + i}) {sig}\n  error_file: <N/A>\n"
                "  traceback : To enable traceback see: "
                "https://pytorch.org/docs/stable/elastic/errors.html")
    others = "\n".join(one(i, *f) for i, f in enumerate(failures[1:], 1))
    return ("E1206 05:26:14.694000 23511 torch/distributed/elastic/multiprocessing/api.py:1002]"
            " failed (exitcode: 1) local_rank: 1 (pid: 23790) of binary: python\n"
            "Traceback (most recent call last):\n  File \"run.py\", line 1028, in main\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            f"{'=' * 60}\ntrain.py FAILED\n{'-' * 60}\nFailures:\n"
            f"{others or '  <NO_OTHER_FAILURES>'}\n{'-' * 60}\n"
            f"Root Cause (first observed failure):\n{one(0, *failures[0])}\n{'=' * 60}\n")


def _run(tmp_path: Path, code: int, ranks: list[tuple[str, str]],
         torchrun_log: str | None = None, nproc: int | None = None) -> HostRun:
    """h2's torchrun (node 1, its local rank 0 global rank 2) that exited with `code`, its
    ranks' (stdout, stderr) in torchrun's per-rank log files, and torchrun's own log."""
    run = HostRun("h2", 1, nproc or len(ranks), 2, tmp_path, tag="t")
    attempt = tmp_path / "none_x1y2" / "attempt_0"
    for lr, (out, err) in enumerate(ranks):
        (attempt / str(lr)).mkdir(parents=True)
        (attempt / str(lr) / "stdout.log").write_text(out)
        (attempt / str(lr) / "stderr.log").write_text(err)
    if torchrun_log is not None:
        (tmp_path / "torchrun.log").write_text(torchrun_log)
    run.proc = subprocess.Popen(["sh", "-c", f"exit {code}"])
    run.proc.wait()
    return run


def test_a_script_that_exits_0_is_ok_whatever_its_stderr_says(tmp_path, capsys):
    """A script of the user's own: no JSON report, warnings on stderr, exit 0 on every rank:
    every rank ok, showing its last stdout line."""
    run = _run(tmp_path, 0, [("epoch 0: loss 0.9\nrank 2: done, loss 0.41\n\n", WARNING),
                             ("", WARNING)])
    res = collect(run)
    assert res["ok"] and res["error"] is None and res["exit_code"] == 0
    assert res["ranks"] == [
        {"ok": True, "exit_code": 0, "output": "rank 2: done, loss 0.41", "rank": 2,
         "host": "h2", "local_rank": 0},
        {"ok": True, "exit_code": 0, "output": "", "rank": 3, "host": "h2", "local_rank": 1}]
    assert report_train({"h2": res})
    assert capsys.readouterr().out.splitlines() == [
        "h2 rank 2 (local 0): ok, exit code 0; printed last: rank 2: done, loss 0.41",
        "h2 rank 3 (local 1): ok, exit code 0; printed last: (nothing)",
        "train: ok, 2 ranks on 1 hosts, exit code 0 on every rank"]


def test_a_rank_that_exits_1_fails_with_its_exit_code_and_its_last_exception(tmp_path,
                                                                             capsys):
    """torchrun names the ranks that failed and their exit codes: local rank 1 raised, rank 0
    was stopped by torchrun, rank 2 had finished (torchrun does not list it)."""
    run = _run(tmp_path, 1, [("step 9\n", WARNING), ("step 9\n", WARNING + TRACEBACK),
                             ("all done\n", WARNING)],
               torchrun_log=_summary((3, 1, 1), (2, 0, -15)))
    res = collect(run)
    r0, r1, r2 = res["ranks"]
    assert r1 == {"ok": False, "exit_code": 1, "output": "step 9", "rank": 3, "host": "h2",
                  "local_rank": 1,
                  "error": "exit code 1: RuntimeError: Connection closed by peer"}
    # Its stderr holds no exception of its own: no warning line stands in for one.
    assert not r0["ok"] and r0["error"] == "exit code -15 (SIGTERM after rank 3 failed)"
    assert r2["ok"] and r2["exit_code"] == 0 and r2["output"] == "all done"
    assert not res["ok"] and res["error"] == r1["error"]  # the root cause's
    assert not report_train({"h2": res})
    out = capsys.readouterr().out
    assert "h2 rank 3 (local 1): FAILED: exit code 1: RuntimeError: Connection closed by " \
           "peer\n" in out
    assert out.endswith(f"train: FAILED (2 of 3 ranks; logs in {tmp_path})\n")


def test_a_rank_that_exits_1_without_a_traceback_shows_its_last_stderr_line(tmp_path):
    run = _run(tmp_path, 1, [("", WARNING + "error: no data in /data/train\n")],
               torchrun_log=_summary((2, 0, 1)))
    assert collect(run)["ranks"][0]["error"] == "exit code 1: error: no data in /data/train"


def test_a_json_report_is_the_ranks_result(tmp_path, capsys):
    """examples/train_ddp.py --json: its last stdout line is its report, read as before."""
    report = ('{"ok": true, "rank": %d, "world_size": 2, "backend": "passing", "steps": 64, '
              '"final_loss": 0.5, "accuracy": 0.75, "iters_per_s": 12.5}\n')
    run = _run(tmp_path, 0, [("progress\n" + report % 2, WARNING), (report % 3, "")])
    res = collect(run)
    assert res["ok"]
    assert res["ranks"][0] == {"ok": True, "exit_code": 0, "rank": 2, "world_size": 2,
                               "backend": "passing", "steps": 64, "final_loss": 0.5,
                               "accuracy": 0.75, "iters_per_s": 12.5, "host": "h2",
                               "local_rank": 0}
    report_train({"h2": res})
    assert capsys.readouterr().out.splitlines() == [
        "h2 rank 2 (local 0) [passing]: final loss 0.5000, accuracy 0.750, 12.5 it/s, "
        "world size 2, ok",
        "h2 rank 3 (local 1) [passing]: final loss 0.5000, accuracy 0.750, 12.5 it/s, "
        "world size 2, ok",
        "train: ok, 2 ranks on 1 hosts, final loss 0.5000..0.5000"]


def test_a_report_that_says_it_failed_fails_the_rank_despite_exit_0(tmp_path):
    run = _run(tmp_path, 0, [('{"ok": false, "error": "diverged"}\n', "")])
    assert collect(run)["ranks"][0] == {"ok": False, "exit_code": 0, "error": "diverged",
                                        "rank": 2, "host": "h2", "local_rank": 0}


def test_without_torchruns_summary_only_a_report_says_a_rank_trained(tmp_path):
    """torchrun failed and told nothing of its ranks: a rank's report is its result; a rank
    without one reports the exception its stderr ends with (torch's `[rankN]:` prefix and
    c10d's log lines aside), one never started what torchrun's log says."""
    run = _run(tmp_path, 1, [('progress\n{"ok": true, "rank": 2, "final_loss": 0.5}\n\n',
                              "[W1130 socket.cpp:207] a warning\n"),
                             ("", TRACEBACK)], nproc=3)
    res = collect(run)
    assert not res["ok"] and res["exit_code"] == 1 and res["killed"] is None
    r0, r1, r2 = res["ranks"]
    assert r0 == {"ok": True, "rank": 2, "final_loss": 0.5, "host": "h2", "local_rank": 0,
                  "exit_code": None}
    assert r1 == {"ok": False, "exit_code": None, "output": "", "rank": 3, "host": "h2",
                  "local_rank": 1, "error": "RuntimeError: Connection closed by peer"}
    assert r2["rank"] == 4 and not r2["ok"] and r2["error"]  # torchrun never started it
    assert res["error"] == "RuntimeError: Connection closed by peer"
    run.killed = "killed: no result within 9s"
    assert collect(run)["ranks"][1]["error"] == \
        "killed: no result within 9s (RuntimeError: Connection closed by peer)"


def test_a_rank_that_aborts_after_its_report_is_named(tmp_path):
    """Every rank reported success, then torchrun failed without naming a rank: the host's
    error names the rank that aborted on its way out and its last words, not torchrun's
    ChildFailedError."""
    run = _run(tmp_path, 1, [('{"ok": true, "rank": 2}\n',
                              "[W1130 socket.cpp:207] a warning\n"
                              "terminate called without an active exception\n"),
                             ('{"ok": true, "rank": 3}\n', "[W1130 socket.cpp:207] a warning\n")],
               torchrun_log="torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    res = collect(run)
    assert not res["ok"] and all(r["ok"] for r in res["ranks"])
    assert res["error"] == ("rank 2 reported success, then torchrun exited with code 1; its "
                            "stderr ends: terminate called without an active exception")


def test_a_rank_that_aborts_after_its_report_fails_where_torchrun_says_so(tmp_path):
    run = _run(tmp_path, 1, [('{"ok": true, "rank": 2}\n',
                              "terminate called without an active exception\n")],
               torchrun_log=_summary((2, 0, -6)))
    rank = collect(run)["ranks"][0]
    assert not rank["ok"] and rank["exit_code"] == -6
    assert rank["error"] == \
        "exit code -6 (SIGABRT): terminate called without an active exception"


def test_train_without_a_script_says_to_pass_one(monkeypatch, tmp_path):
    monkeypatch.setattr(training_runs, "CHECKOUT", tmp_path)
    with pytest.raises(FileNotFoundError, match="pass one"):
        training_runs.default_script()
