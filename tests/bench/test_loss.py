"""`bench.loss`: the loss conditions it takes, how a run's reports become a row (the slowest
host, every call checked, the multiple of the strategy's own no-loss time, the goal), its
command line's refusals (no root needed), and one real run in Mininet (root)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from bench.loss import NO_LOSS, Condition, _condition, summarize, table


def report(mean, correct=True, resent=0, packets=100):
    return {"ok": True, "mean_s": mean, "times": [mean], "correct": correct,
            "retransmissions": resent, "packets": packets}


def test_conditions_parse_every_link_or_the_first_host_link():
    assert _condition("5") == Condition(5.0)
    assert _condition("20@host") == Condition(20.0, True)
    assert Condition(20.0, True).label == "20% on one host link"
    for bad in ("0", "100", "x", "5@spine", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            _condition(bad)


def test_a_row_is_the_slowest_host_against_the_same_strategy_without_loss():
    row = summarize(Condition(5.0), "passing", [{"h1": report(0.5, resent=7, packets=200),
                                                 "h2": report(0.8, resent=3, packets=210)}],
                    base=0.4)
    assert row.mean_s == 0.8 and row.vs_no_loss == pytest.approx(2.0)
    assert row.goal == 2.5 and row.correct
    assert (row.resends, row.packets) == (10, 410)
    assert "<= 2.5x met" in table([row]) and "10 of 410 (2.4%)" in table([row])
    slow = summarize(Condition(1.0), "passing", [{"h1": report(0.6)}], base=0.4)
    assert "<= 1.3x not met" in table([slow])
    # The goals are PASSING's: a baseline's row has none.
    assert summarize(Condition(5.0), "ring", [{"h1": report(0.5)}], base=0.4).goal is None
    assert summarize(NO_LOSS, "ring", [{"h1": report(0.5)}], base=None).vs_no_loss == 1.0


def test_a_condition_is_the_median_of_its_rounds_with_every_round_counted():
    runs = [{"h1": report(0.5, resent=1), "h2": report(0.6, resent=2)},
            {"h1": report(2.0, resent=4), "h2": report(0.7)},
            {"h1": report(0.65), "h2": report(0.55)}]
    row = summarize(Condition(1.0), "passing", runs, base=0.5)
    assert row.rounds_s == [0.6, 2.0, 0.65]
    assert row.mean_s == 0.65 and row.vs_no_loss == pytest.approx(1.3)
    assert row.resends == 7 and row.packets == 600
    # One wrong call in any round makes the condition wrong.
    runs[0]["h2"] = report(0.6, correct=False)
    assert not summarize(Condition(1.0), "passing", runs, base=0.5).correct


def test_a_wrong_result_or_a_failed_host_is_not_a_correct_run():
    wrong = summarize(Condition(5.0), "passing", [{"h1": report(0.5), "h2": report(
        0.5, correct=False)}], base=0.4)
    assert not wrong.correct and "| NO |" in table([wrong])
    failed = summarize(Condition(5.0), "passing", [{
        "h1": report(0.5), "h2": {"ok": False, "error": "SwitchTimeout: no result"}}], base=0.4)
    assert not failed.correct and failed.errors == {"h2": "SwitchTimeout: no result"}
    assert failed.mean_s != failed.mean_s  # nan: no time for a run that did not finish


@pytest.mark.parametrize("args, says", [
    (["--loss", "150"], "a loss percentage in (0, 100)"),
    (["--loss", "5@tor"], "P@host for the first host's link"),
    (["--strategies", "nccl"], "'nccl': one of passing"),
    (["--topo", "torus"], "no shipped topology 'torus'"),
    (["--iters", "0"], "a whole number, at least 1"),
    (["--rounds", "x"], "a whole number, at least 1"),
])
def test_bad_arguments_are_refused_before_anything_starts(args, says):
    res = subprocess.run([sys.executable, "-m", "bench.loss", *args], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and says in res.stderr, res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="Mininet needs root")
def test_a_run_under_heavy_loss_is_correct_and_resends(tmp_path):
    """star as shipped, 64K values (205 fragments of K=320 per call and host): with 20% loss
    on every link some frames are lost in every call, and every result is still right."""
    out = tmp_path / "loss.json"
    res = subprocess.run([sys.executable, "-m", "bench.loss", "--topo", "star", "--size", "64K",
                          "--strategies", "passing", "--loss", "20", "--iters", "1",
                          "--rounds", "1", "--json-out", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["condition"], r["strategy"]) for r in rows] == [
        ("no loss", "passing"), ("20% on every link", "passing")]
    assert all(r["correct"] for r in rows), rows
    assert rows[0]["resends"] < rows[1]["resends"]
    assert rows[1]["vs_no_loss"] == pytest.approx(rows[1]["mean_s"] / rows[0]["mean_s"])
    assert "[run 2/2," in res.stdout and "| 20% on every link | passing |" in res.stdout
