"""Reading `make bench`'s measured tables, and the validation that compares the simulator with
them: a ratio outside 1.15x either way is flagged."""
# ruff: noqa: E501 (the fake report's lines are as long as bench/report.py writes them)

import math
import sys

import pytest

from sim import costs, measured, report, simgrid_missing, validate
from sim.fabric import ROOT
from tests.sim.simgrid_skip import needs_simgrid

FAKE = """# A fake report (long lines as bench/report.py writes them)
<!-- results:begin -->
## Results

- **date**: 2030-01-01 00:00 UTC
- **calibration**: bmv2: switch 4000 aggregation / 20000 forwarding packets/s, agent 200000 packets/s; model: switch 300000 aggregation / 175000 forwarding packets/s, agent 200000 packets/s

### All-reduce: leafspine/model, 4x2 GPUs, 20 Mbit/s (main)

| size | passing ms | passing Gbit/s | passing ratio | passing bound | ring ms | ring Gbit/s | ring ratio | ring bound |
|---|---|---|---|---|---|---|---|---|
| 64 KiB | 30.0 | 0.015 | 1.25 | link | 60.0 | 0.008 | 1.36 | link |
| 1 MiB | {passing} | 0.018 | 1.04 | link | {ring} | 0.010 | 1.15 | link |

Traffic per all-reduce at 1 MiB:

| strategy | tx per host link | rx per host link | tx / tensor size | switch packets | slots |
|---|---|---|---|---|---|
| passing | 1.06 MiB | 1.06 MiB | 1.06x | 7644 | 256 |
<!-- results:end -->
"""


def test_parse_a_report():
    rep = measured.parse(FAKE.format(passing=450.0, ring=880.0))
    assert rep.date == "2030-01-01 00:00 UTC"
    assert rep.calibration["model"].switch_agg_pps == 300000
    assert rep.calibration["bmv2"].agent_pps == 200000
    assert [(c.size_bytes, c.strategy, c.ms) for c in rep.cells] == [
        (64 << 10, "passing", 30.0), (64 << 10, "ring", 60.0),
        (1 << 20, "passing", 450.0), (1 << 20, "ring", 880.0)]
    assert rep.cells[0].scenario == "leafspine/model, 4x2 GPUs, 20 Mbit/s"
    assert [c.size_bytes for c in validate.cells_in(rep)] == [1 << 20, 1 << 20]
    with pytest.raises(measured.MeasuredError):
        measured.parse("no results here")


def test_a_switch_s_packets_cost_the_emulation_its_cpu_time():
    """Reports since 2026-12-08 also give each switch's rate per CPU second of its own: BMv2
    alone carries more a second (its threads use more than one core) than the cores it shares
    with everything in the emulation allow, so the emulation charges the CPU rate; the model
    switch, which the sender keeps under half busy, keeps its rate. Older lines parse as
    before."""
    line = FAKE.replace(
        "bmv2: switch 4000 aggregation / 20000 forwarding packets/s,",
        "bmv2: switch 4000 aggregation / 20000 forwarding packets/s (per CPU second 2500 / "
        "15000),").replace(
        "model: switch 300000 aggregation / 175000 forwarding packets/s,",
        "model: switch 300000 aggregation / 175000 forwarding packets/s (per CPU second "
        "300000 / 175000),")
    cal = measured.parse(line.format(passing=450.0, ring=880.0)).calibration
    assert (cal["bmv2"].switch_agg_cpu_pps, cal["bmv2"].switch_fwd_cpu_pps) == (2500, 15000)
    bmv2, model = costs.emulation(cal["bmv2"]), costs.emulation(cal["model"])
    assert (bmv2.switch_agg_pps, bmv2.switch_fwd_pps) == (2500, 15000)
    assert (model.switch_agg_pps, model.switch_fwd_pps) == (300000, 175000)
    old = measured.parse(FAKE.format(passing=450.0, ring=880.0)).calibration["bmv2"]
    assert old.switch_agg_cpu_pps is None and costs.emulation(old).switch_agg_pps == 4000


def test_parse_the_shipped_benchmarks():
    path = ROOT / "docs" / "benchmarks.md"
    if not path.exists():
        pytest.skip("no docs/benchmarks.md")
    rep = measured.load(path)
    assert {"model", "bmv2"} <= set(rep.calibration)
    cells = validate.cells_in(rep)
    assert len(cells) >= 50
    assert {c.strategy for c in cells} == {"passing", "ina", "ring", "hier-ring", "ps"}


@pytest.mark.parametrize("ratio,flagged", [(1.0, False), (1.15, False), (1 / 1.15, False),
                                           (1.16, True), (0.86, True), (2.0, True),
                                           (math.nan, True)])
def test_flag(ratio, flagged):
    assert validate.flag(ratio) is flagged


def test_simgrid_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "simgrid", None)  # import simgrid raises ImportError
    reason = simgrid_missing()
    assert reason is not None and "python3-simgrid" in reason


@needs_simgrid
def test_validation_flags_a_ratio_over_the_tolerance(tmp_path):
    # PASSING's 1 MiB at 20 Mbit/s takes ~0.48 s simulated: measured 100 ms is 4.8x off;
    # ring's ~0.88 s measured as 880 ms is within.
    rep = measured.parse(FAKE.format(passing=100.0, ring=880.0))
    rows = validate.validate(rep, validate.cells_in(rep), workers=1, max_chunks=32)
    by = {r.cell.strategy: r for r in rows}
    assert by["passing"].flagged and by["passing"].ratio > validate.TOLERANCE
    assert not by["ring"].flagged and not by["ring"].error
    cols = [c.strip() for c in validate.markdown_table(rows).splitlines()[2].split("|")]
    assert cols[3].endswith("!**") and "!" not in cols[4]  # passing's cell, ring's cell
    assert "1 of 2 cells within" in validate.summary(rows)
    doc = tmp_path / "simulation.md"
    doc.write_text("# Simulation\n\nhand-written text\n")
    report.write_validation(doc, rep, rows, tmp_path / "fake.md")
    text = doc.read_text()
    assert "hand-written text" in text and "<!-- sim:validation:begin -->" in text
    report.write_validation(doc, rep, rows, tmp_path / "fake.md")  # replaces, not appends
    assert doc.read_text().count("<!-- sim:validation:begin -->") == 1
