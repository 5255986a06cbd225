"""bench/stragglers.py's checks and summary: a failed rank or replicas that differ at the end
fail the run, and the row reports the job's slowest rank and node 0's time to accuracy."""

from __future__ import annotations

import pytest

from bench.straggler_train import parse_args as train_args
from bench.stragglers import (
    SETTINGS,
    check,
    main,
    parse_args,
    straggler_quorum,
    summarize,
    table,
    time_to,
)
from controller.topology import load
from passing.pipeline_files import topology_file


def rank(r: int, node: int, seconds: float, checksum: float = 1.5, skipped: int = 0) -> dict:
    return {"ok": True, "rank": r, "node": node, "steps": 100, "seconds": seconds,
            "accuracy": 0.9, "param_checksum": checksum, "skipped": skipped, "short_calls": 7,
            "curve": [(0.0, 0, 0.1), (4.0, 50, 0.85), (9.0, 100, 0.9)]}


def reports(*ranks: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in ranks:
        out.setdefault(f"h{r['node'] + 1}", {"ok": True, "error": None, "ranks": []})[
            "ranks"].append(r)
    return out


def test_every_rank_is_returned_when_all_finished_with_the_same_weights():
    ranks = check(reports(rank(0, 0, 9.0), rank(1, 1, 10.0)))
    assert [r["rank"] for r in ranks] == [0, 1]


def test_replicas_that_differ_fail_the_run():
    with pytest.raises(RuntimeError, match="replicas differ"):
        check(reports(rank(0, 0, 9.0), rank(1, 1, 10.0, checksum=1.25)))


def test_a_failed_host_fails_the_run_with_its_error():
    bad = reports(rank(0, 0, 9.0), rank(1, 1, 10.0))
    bad["h2"].update(ok=False, error="AllreduceError: the switch did not answer")
    with pytest.raises(RuntimeError, match="h2: AllreduceError"):
        check(bad)


def test_the_row_takes_the_slowest_rank_and_node_0s_curve():
    row = summarize(SETTINGS[3], [rank(1, 3, 12.0, skipped=40), rank(0, 0, 9.0)], 0.85)
    assert row["seconds"] == 12.0 and row["ms_per_iter"] == 120.0
    assert row["time_to_target_s"] == 4.0 and row["skipped_by_straggler"] == 40
    assert row["straggler"] and row["short_calls"] == 7
    assert time_to([(0.0, 0, 0.1), (3.0, 10, 0.5)], 0.9) is None


def test_a_varying_straggler_is_named_in_the_table_and_bad_periods_refused(tmp_path):
    args = parse_args(["--out", str(tmp_path), "--slow-period", "25"])
    row = summarize(SETTINGS[1], [rank(0, 0, 9.0)], 0.85) | {
        "quorum": "all", "slow_factor": 2.0, "slow_period": 25}
    assert "| 2x, every other 25 steps |" in table([row], args)
    with pytest.raises(SystemExit):
        parse_args(["--out", str(tmp_path), "--slow-period", "-1"])
    with pytest.raises(SystemExit):
        train_args(["--slow-period", "-3"])


def test_the_quorum_is_judged_at_the_stragglers_switch(tmp_path, capsys):
    """On leafspine the straggler's ToR has 2 of the 4 hosts: 'all but one' is 1 there (the
    spine waits for both racks). A quorum of 3 would mean everyone at that ToR, a
    bulk-synchronous run under the quorum's name: refused before Mininet starts."""
    star, leafspine = load(topology_file("star")), load(topology_file("leafspine"))
    assert straggler_quorum(star, list(star.hosts), 0) == (3, "3/4")
    assert straggler_quorum(leafspine, list(leafspine.hosts), 0) == (1, "1/2 per ToR")
    assert straggler_quorum(leafspine, list(leafspine.hosts), 2) == (2, "2/2 per ToR")
    assert main(["--topo", "leafspine", "--quorum", "3", "--out", str(tmp_path / "o")]) == 2
    assert "switch tor2 has 2 hosts, so 1..2" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
