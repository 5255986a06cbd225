"""bench/ddp_overlap.py under torchrun (2 ranks, gloo, a small MLP): each rank prints one JSON
report with the numbers docs/benchmarks.md quotes, and the ranks end with one model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests import REPO
from tests.ports import free_port


def test_each_rank_reports_its_steps_and_the_ranks_agree():
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         str(REPO / "bench" / "ddp_overlap.py"), "--backend", "gloo", "--json", "--epochs",
         "1", "--width", "64", "--steps", "3", "--warmup", "1", "--bucket-mb", "0.01"],
        env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    reports = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for r in reports:
        assert r["backend"] == "gloo" and r["steps"] == 3 and r["buckets"] >= 2, r
        assert r["steps_per_s"] > 0 and r["compute_s"] > 0 and r["allreduce_s"] > 0, r
        assert 0.0 <= r["overlap_share"] <= 1.0, r
    assert reports[0]["param_checksum"] == reports[1]["param_checksum"]
