"""`bench.sweep` subsets: the plan a subset makes, the progress line, the command line's
refusals (no root needed), and one real subset run in Mininet (root): the rows it writes are
the runs asked for, on the links as shipped, with a progress line per run."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from bench.progress import Progress
from bench.sweep_plan import call_plan, fabric_groups, runs_in, scenarios, subset


def test_a_subset_is_every_bandwidth_and_gpu_count_with_the_sizes_and_strategies_given():
    plan = subset("leafspine", "auto", [None, 50.0], [0, 4], [4 << 20], ["passing", "ring"],
                  [], 0, 2)
    assert [(sc.bw_mbps, sc.gpus) for sc in plan] == [(None, 0), (50.0, 0), (None, 4),
                                                        (50.0, 4)]
    assert all(sc.target == "model" and sc.sizes == [4 << 20] for sc in plan)
    assert runs_in(plan) == 4 * 2
    # One network per GPU count, its links re-shaped for each bandwidth.
    assert [[(sc.bw_mbps, sc.gpus) for sc in g] for g in fabric_groups(plan)] == \
        [[(None, 0), (50.0, 0)], [(None, 4), (50.0, 4)]]


def test_the_whole_plan_starts_a_network_per_gpu_count_and_target_not_per_rate():
    plan = scenarios(False, "model")
    groups = fabric_groups(plan)
    assert [sc for g in groups for sc in g] == plan  # the same runs, in the same order
    assert [(g[0].target, g[0].gpus) for g in groups] == [("model", 2), ("model", 1),
                                                         ("model", 4)]
    assert [sc.bw_mbps for sc in groups[0]] == [20, None, 10, 50, 20]
    # Only consecutive scenarios share: a GPU count seen again gets a network of its own.
    again = fabric_groups(plan[:1] + plan[-1:] + plan[:1])
    assert [len(g) for g in again] == [1, 1, 1]


def test_runs_in_counts_job_sizes_and_training():
    plan = subset("leafspine", "model", [None], [0], [1, 2, 3], ["passing"], [2, 3], 50, 1)
    assert runs_in(plan) == 2 * (3 + 1)
    assert runs_in(scenarios(True, "model")) == 2 * 5 + 5  # quick: 2 sizes + training, 5 each


def test_calls_the_model_predicts_long_are_made_once_without_a_warm_up():
    assert call_plan(0.3, 2, 2.0) == (1, 2)  # one warm-up, then the timed calls
    assert call_plan(1.99, 3, 2.0) == (1, 3)
    assert call_plan(2.0, 3, 2.0) == (0, 1)  # from the threshold on: one call, timed
    assert call_plan(49.0, 2, 2.0) == (0, 1)
    assert call_plan(49.0, 2, 0.0) == (1, 2)  # 0: never


def test_progress_line_estimates_the_time_left():
    now = iter([0.0, 30.0, 90.0])
    p = Progress(4, clock=lambda: next(now))
    assert p.step() == "[run 1/4, 0m30s, ~1m30s left]"
    assert p.step() == "[run 2/4, 1m30s, ~1m30s left]"


@pytest.mark.parametrize("args, says", [
    (["--quick", "--sizes", "1M"], "--quick is a plan of its own"),
    (["--strategies", "passing,nccl"], "'nccl': one of passing"),
    (["--bw", "fast"], "Mbit/s (0: unshaped) or 'shipped'"),
    (["--topo", "torus"], "no shipped topology 'torus'"),
    (["--hosts", "5"], "leafspine has 4 hosts, not 5"),
    (["--sizes", "4X"], "size must be a number of float32 values"),
    (["--train-steps", "50", "--train-model", "digits-wide"], "go with a subset"),
    (["--strategies", "ring", "--train-model", "resnet"], "invalid choice: 'resnet'"),
    (["--strategies", "ring", "--train-steps", "9", "--target-accuracy", "90"],
     "--target-accuracy in (0, 1]"),
    (["--long-call", "-1"], "--long-call must be a number of seconds"),
    (["--long-call", "nan"], "--long-call must be a number of seconds"),
])
def test_bad_subsets_are_refused_before_anything_starts(args, says):
    res = subprocess.run([sys.executable, "-m", "bench.sweep", *args], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and says in res.stderr, res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="Mininet needs root")
def test_a_subset_runs_only_what_was_asked_on_the_shipped_links(tmp_path):
    out = tmp_path / "bench"
    res = subprocess.run([sys.executable, "-m", "bench.sweep", "--topo", "star", "--sizes",
                          "4K", "--strategies", "passing,ring", "--iters", "1", "--target",
                          "model", "--calibrate-seconds", "1", "--out", str(out),
                          "--long-call", "1e-9"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    with (out / "allreduce.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["strategy"], r["size_bytes"]) for r in rows] == [("passing", "16384"),
                                                                 ("ring", "16384")]
    # star ships 100 Mbit/s links and 2 GPUs per host: the rows say so. Every call is "long"
    # here (--long-call 1e-9): one timed call and no warm-up, so the counters are that one
    # call's, and each host link carried the tensor at least once.
    assert all(r["bw_mbps"] == "100.0" and r["gpus_per_host"] == "2" and r["correct"] == "True"
               and (r["warmup"], r["iters"]) == ("0", "1")
               and float(r["host_rx_bytes"]) >= 0.9 * 16384 for r in rows), rows
    assert "[run 1/2," in res.stdout and "[run 2/2," in res.stdout, res.stdout
