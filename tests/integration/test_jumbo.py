"""Jumbo frames end to end (docs/protocol.md, "Choosing K"): with PASSING_K=2048 `make
run-topology`'s machinery sets every Mininet link to a 9000-byte MTU and one all-reduce on
every host of the star comes out exact. The run is its own process, as a user's is: K is fixed
per process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from tests import REPO


def test_k_2048_runs_over_jumbo_frames_and_every_host_sums_exactly(target, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PASSING_K": "2048"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "topologies.run", "--topo", "star", "--target", target,
         "--run-dir", str(tmp_path / "run"), "--no-cli"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # run.py stops its network on the way out
        out, _ = proc.communicate(timeout=120)
        raise AssertionError(f"no result in 420 s:\n{out[-3000:]}") from None
    assert proc.returncode == 0, out[-3000:]
    assert "*** K=2048: every link's MTU is 9000 (jumbo frames)" in out, out[-3000:]
    results = re.findall(r"^(?:passing> )?(h\d) \[passing\]: .* (correct vs numpy)", out, re.M)
    assert sorted(h for h, _ in results) == ["h1", "h2", "h3", "h4"], out[-3000:]
