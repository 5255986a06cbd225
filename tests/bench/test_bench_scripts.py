"""The benchmark scripts run and measure what they claim (counts, not speed: speed is only ever
reported, never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from passing import protocol as P

# bench.switch_pps uses testbed/, the test harness, which is importable from the checkout only.
ROOT = Path(__file__).resolve().parents[2]


def run_module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_model_pipeline_benchmark_completes_every_slot():
    res = run_module("bench.model_pipeline", "--packets", "4096", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["packets"] == 4096 and out["slots_completed"] == 4096 // 4
    assert out["frames_out"] == out["packets"] and out["pps"] > 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (veth interfaces)")
def test_switch_pps_benchmark_on_the_model(tmp_path):
    out_file = tmp_path / "res.json"
    res = run_module("bench.switch_pps", "--target", "model", "--seconds", "0.5",
                     "--json-out", str(out_file))
    assert res.returncode == 0, res.stderr
    data = json.loads(out_file.read_text())
    assert data["forwarding"]["out"] > 0 and data["aggregation"]["out"] > 0
    # The switch's own rate (per CPU second of its process) is measured beside the rate the
    # Python sender reaches, and the calibration takes the larger: what the switch could carry.
    for kind in ("forwarding", "aggregation"):
        r = data[kind]
        assert r["switch_cpu_s"] > 0
        assert r["cpu_pps"] == pytest.approx(r["out"] / r["switch_cpu_s"], rel=0.01)
        assert r["capacity_pps"] == max(r["pps"], r["cpu_pps"])
    # Every aggregation packet the switch counted was admitted, none dropped.
    counters = data["switch_counters"]
    assert not any(v for k, v in counters.items() if k.startswith("drops_"))
    assert counters["job_contributions"] + counters["job_duplicates"] \
        + counters["job_result_retransmits"] >= data["aggregation"]["out"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (veth interfaces)")
def test_model_ports_benchmark_passes_every_frame_both_ways():
    res = run_module("bench.model_ports", "--frames", "2000", "--rounds", "1", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["passed"] == {"per_frame": [2000], "batched": [2000]}
    assert out["per_frame"][0] > 0 and out["batched"][0] > 0


def test_switch_pps_aggregation_frames_are_the_contributions_they_stand_for():
    """The calibration's frames are copies of one frame per (port, slot) with round, version
    and fragment set: each must be the frame testbed.entries builds for that contribution,
    sent without a UDP checksum (0)."""
    from bench import switch_pps
    from testbed.entries import contribution

    frames = switch_pps.aggregation_frames(rounds=3)
    assert len(frames) == 3 * switch_pps.POOL * 2
    udp_sum = slice(switch_pps._HDR - 2, switch_pps._HDR)
    vals = np.arange(P.K, dtype=np.int64)
    for i, (port, frame) in enumerate(frames):
        r, slot = divmod(i // 2, switch_pps.POOL)
        want = bytearray(contribution(switch_pps.DEV, port, vals, job_id=1, slot=slot, round=r,
                                      frag=r * switch_pps.POOL + slot))
        assert port == 1 + i % 2
        assert frame[udp_sum] == b"\0\0"
        want[udp_sum] = b"\0\0"
        assert frame == want, (i, port, r, slot)
