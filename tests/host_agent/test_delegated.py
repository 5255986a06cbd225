"""Collectives a `passing` group hands to gloo, run back to back many times from Python: they
must all finish with gloo's results. torch's trampoline for a Python process group runs an
inherited collective with the GIL held, which deadlocks against gloo's worker about one call
in a few thousand (host_agent/backend.py); the group's own overrides must avoid it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import REPO

WORKER = Path(__file__).with_name("delegated_worker.py")
ROUNDS = 1500  # the deadlock came within a few hundred rounds in every run before the fix
DEADLINE_S = 120


def test_delegated_collectives_never_hang_and_give_gloos_results(tmp_path):
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(rank), str(tmp_path / "store"),
                               str(ROUNDS)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    hung = []
    for p in procs:  # a few seconds' work; a deadlocked rank never ends by itself
        try:
            p.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            hung.append(p.args[2])
            p.kill()
            p.wait()
    outs = [p.stdout.read() for p in procs]
    assert not hung, f"ranks {hung} hung:\n" + "\n".join(o[-2000:] for o in outs)
    for rank, (p, out) in enumerate(zip(procs, outs, strict=False)):
        assert p.returncode == 0 and f"rank {rank}: {ROUNDS} rounds" in out, out[-3000:]
