"""`make bench` in CI size (bench.sweep --quick): every strategy, in Mininet on the software
model, returns the correct sum; training reaches ring's accuracy with every strategy; the CSVs,
plots and report come out. Times are recorded, never asserted."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from passing import protocol as P
from passing_agent import STRATEGIES

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="Mininet needs root")


def test_quick_sweep_checks_every_strategy_and_writes_the_report(tmp_path):
    out = tmp_path / "bench"
    report = tmp_path / "benchmarks.md"
    res = subprocess.run([sys.executable, "-m", "bench.sweep", "--quick", "--out", str(out),
                          "--report", str(report)], capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    with (out / "allreduce.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["strategy"] for r in rows} == set(STRATEGIES)
    assert len(rows) == 2 * len(STRATEGIES) and all(r["correct"] == "True" for r in rows)
    # Calls this small are made after a warm-up (bench.sweep_plan.call_plan); counters per call.
    assert all((r["warmup"], r["iters"]) == ("1", "1") for r in rows), rows
    by = {(r["strategy"], int(r["size_bytes"])): r for r in rows}
    for size in (16 << 10, 64 << 10):
        # Every host link carried at least the tensor once each way, and the switch-based
        # strategies were counted by the P4 pipeline.
        for s in STRATEGIES:
            assert float(by[s, size]["host_rx_bytes"]) >= size * 0.9, (s, size)
            assert float(by[s, size]["predicted_s"]) > 0
        # The P4 counters saw every stream's value packets: one per host with PASSING, one
        # per GPU (2 per host, 4 hosts) with ina. (Resends only add to these.)
        blocks = size // P.VALUES_BYTES
        assert int(by["passing", size]["agg_packets"]) >= 4 * blocks
        assert int(by["ina", size]["agg_packets"]) >= 8 * blocks
    with (out / "training.csv").open() as fh:
        train = {r["strategy"]: r for r in csv.DictReader(fh)}
    assert set(train) == set(STRATEGIES)
    ring = float(train["ring"]["accuracy"])
    assert all(abs(float(t["accuracy"]) - ring) <= 0.01 for t in train.values()), train
    text = report.read_text()
    assert "all 10 runs correct" in text and "(benchmarks/allreduce_time.png)" in text
    assert (tmp_path / "benchmarks" / "allreduce_time.png").stat().st_size > 10_000
