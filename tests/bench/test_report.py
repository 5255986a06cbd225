"""bench/plots.py and bench/report.py on small synthetic sweep CSVs whose speedups are known
by construction: plots are valid PNGs, the report's numbers are exact, wrong runs and accuracy
regressions are flagged, and the human-written text around the markers survives."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from bench import report
from bench.plots import make_plots, time_plot_groups
from bench.report import BEGIN, END, summary, write_report
from bench.results import ALLREDUCE_COLUMNS, TRAINING_COLUMNS, group_runs, load_allreduce

KIB, MIB = 1024, 1024 * 1024
SIZES = (KIB, 64 * KIB, MIB)
# Time of each strategy as a multiple of PASSING's, so PASSING's speedup over it is the factor.
FACTORS_A = {"passing": 1.0, "ina": 1.25, "ring": 2.0, "hier-ring": 3.0, "ps": 4.0}
FACTORS_B = {"passing": 1.0, "ina": 1.5, "ring": 2.5, "hier-ring": 5.0, "ps": 8.0}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def passing_time(size: int) -> float:
    return 1e-3 * (1 + size / (64 * KIB))


def allreduce_row(strategy: str, size: int, factor: float, *, hosts: int = 4, bw: float = 1000,
                  correct: bool = True) -> dict:
    mean = passing_time(size) * factor
    predicted = mean / 1.1  # every measurement 10% above the model
    return {
        "topology": "star", "target": "model", "strategy": strategy, "hosts": hosts,
        "gpus_per_host": 2, "size_bytes": size, "bw_mbps": bw, "iters": 10, "mean_s": mean,
        "std_s": mean / 20, "algbw_gbps": size * 8 / mean / 1e9,
        "host_tx_bytes": size * (2.0 if "ring" in strategy else 1.0),
        "host_rx_bytes": size * (2.0 if "ring" in strategy else 1.0),
        "switch_packets": size // 256 if strategy in ("passing", "ina") else 0,
        "slots": 64, "predicted_s": predicted, "ratio": mean / predicted,
        "bound": "link" if size >= 64 * KIB else "host", "correct": str(correct),
    }


def write_csv(path: Path, columns: tuple[str, ...], rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture
def allreduce_csv(tmp_path: Path) -> Path:
    rows = []
    # Group A (main, first): 1000 Mbit/s, 4 hosts, three sizes.
    rows += [allreduce_row(s, size, f) for size in SIZES for s, f in FACTORS_A.items()]
    # Group B: 100 Mbit/s; ps at 64 KiB gave a wrong result.
    rows += [allreduce_row(s, size, f, bw=100, correct=not (s == "ps" and size == 64 * KIB))
             for size in SIZES for s, f in FACTORS_B.items()]
    # Group C: 8 hosts at a single size (a scaling point): no time-vs-size panel of its own.
    rows += [allreduce_row(s, MIB, f, hosts=8) for s, f in FACTORS_A.items()]
    return write_csv(tmp_path / "allreduce.csv", ALLREDUCE_COLUMNS, rows)


@pytest.fixture
def training_csv(tmp_path: Path) -> Path:
    # ina 5 points below ring: must be flagged; the others within 0.01.
    acc = {"passing": 0.905, "ina": 0.85, "ring": 0.90, "hier-ring": 0.895, "ps": 0.90}
    rows = [{"topology": "star", "target": "model", "strategy": s, "hosts": 4,
             "gpus_per_host": 2, "bw_mbps": 1000, "steps": 200, "seconds": 200 / ips,
             "iters_per_s": ips, "accuracy": acc[s], "final_loss": 0.3}
            for s, ips in zip(acc, (20.0, 18.0, 10.0, 12.0, 6.0), strict=True)]
    return write_csv(tmp_path / "training.csv", TRAINING_COLUMNS, rows)


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 10_000, f"{path} suspiciously small ({len(data)} bytes)"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 300, img.shape


def table_cell(md: str, heading: str, row_start: str, column: str) -> str:
    """The cell of the first Markdown table after `heading` in the row whose first cell is
    `row_start`, in the column headed `column`."""
    lines = md[md.index(heading):].splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    rows = []
    for ln in lines[first:]:
        if not ln.startswith("|"):
            break  # end of this table
        rows.append([c.strip() for c in ln.strip("|").split("|")])
    header = rows[0]
    for cells in rows[2:]:
        if cells[0] == row_start:
            return cells[header.index(column)]
    raise AssertionError(f"no row {row_start!r} under {heading!r}")


# ---------------------------------------------------------------------------- plots

def test_make_plots_writes_every_supported_plot(allreduce_csv, training_csv, tmp_path):
    out = tmp_path / "plots"
    written = make_plots(allreduce_csv, training_csv, out)
    names = {p.name for p in written}
    # Bandwidth varies (1000 vs 100 Mbit/s at 4 hosts), hosts vary (4 vs 8 at 1 MiB).
    assert names == {"allreduce_time.png", "speedup.png", "ratio.png", "scaling.png",
                     "bandwidth.png", "training.png"}
    for p in written:
        assert p.parent == out and p.exists()
        assert_png(p)


def test_single_size_group_gets_no_time_panel(allreduce_csv):
    groups = group_runs(load_allreduce(allreduce_csv))
    chosen = time_plot_groups(groups)
    assert len(chosen) == 2 and all(key[3] == 4 for key in chosen)  # not the 8-host group


def test_only_single_size_data_skips_time_plot(tmp_path):
    rows = [allreduce_row(s, MIB, f) for s, f in FACTORS_A.items()]
    csv_path = write_csv(tmp_path / "one.csv", ALLREDUCE_COLUMNS, rows)
    written = make_plots(csv_path, None, tmp_path / "plots")
    names = {p.name for p in written}
    assert "allreduce_time.png" not in names
    assert not (tmp_path / "plots" / "allreduce_time.png").exists()
    assert {"speedup.png", "ratio.png"} <= names
    assert not names & {"scaling.png", "bandwidth.png", "training.png"}
    for p in written:
        assert_png(p)


def test_empty_csv_writes_nothing(tmp_path):
    csv_path = write_csv(tmp_path / "empty.csv", ALLREDUCE_COLUMNS, [])
    assert make_plots(csv_path, None, tmp_path / "plots") == []


def test_missing_column_is_named(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("topology,target\nstar,model\n")
    with pytest.raises(ValueError, match="strategy"):
        load_allreduce(path)


# ---------------------------------------------------------------------------- report

@pytest.fixture
def written_report(allreduce_csv, training_csv, tmp_path) -> tuple[Path, str]:
    out = tmp_path / "docs" / "benchmarks.md"
    plots = make_plots(allreduce_csv, training_csv, out.parent / "benchmarks")
    meta = {"date": "2024-01-01", "machine": "test box", "command": "make bench",
            "target": "model"}
    write_report(allreduce_csv, training_csv, plots, out, meta)
    return out, out.read_text()


def test_speedup_table_has_the_known_speedups(written_report):
    _, md = written_report
    head_a = "### All-reduce: star/model, 4x2 GPUs, 1000 Mbit/s"
    head_b = "### All-reduce: star/model, 4x2 GPUs, 100 Mbit/s"
    for size in ("1 KiB", "64 KiB", "1 MiB"):
        for s, f in FACTORS_A.items():
            if s != "passing":
                assert table_cell(md, head_a, size, f"passing speedup vs {s}") == f"{f:.2f}x"
        assert table_cell(md, head_b, size, "passing speedup vs ps") == "8.00x"
    assert table_cell(md, head_a, "1 MiB", "passing speedup vs ps") == "4.00x"
    assert table_cell(md, head_a, "1 MiB", "passing ratio") == "1.10"
    assert table_cell(md, head_a, "1 MiB", "passing bound") == "link"
    assert ("PASSING speedup over ps/ring/hier-ring/ina at the largest size: "
            "ps 4.00x, ring 2.00x, hier-ring 3.00x, ina 1.25x") in md
    # Traffic at the largest size: ring sends twice the tensor per host link.
    assert table_cell(md, "Traffic per all-reduce at 1 MiB", "ring", "tx / tensor size") \
        == "2.00x"


def test_meta_and_plot_links(written_report):
    _, md = written_report
    assert "- **machine**: test box" in md and "- **command**: make bench" in md
    for name in ("allreduce_time", "speedup", "ratio", "scaling", "bandwidth", "training"):
        assert f"](benchmarks/{name}.png)" in md


def test_wrong_run_is_flagged(written_report):
    _, md = written_report
    assert "**WARNING: 1 of 35 runs produced a WRONG result:**" in md
    assert "- **WRONG**: ps, 64 KiB, star/model, 4x2 GPUs, 100 Mbit/s" in md
    assert "all 35 runs correct" not in md
    assert "**WRONG**" in table_cell(md, "### All-reduce: star/model, 4x2 GPUs, 100 Mbit/s",
                                     "64 KiB", "ps ms")


def test_all_correct_is_stated(tmp_path):
    rows = [allreduce_row(s, size, f) for size in SIZES for s, f in FACTORS_A.items()]
    csv_path = write_csv(tmp_path / "ok.csv", ALLREDUCE_COLUMNS, rows)
    out = tmp_path / "r.md"
    write_report(csv_path, None, [], out, {"date": "x"})
    md = out.read_text()
    assert "all 15 runs correct" in md and "WRONG" not in md and "### Training" not in md


def test_training_accuracy_check_flags_five_points_below_ring(written_report):
    _, md = written_report
    head = "### Training"
    col = "accuracy equal to ring"
    assert table_cell(md, head, "ina", col).startswith("**NO**")
    assert table_cell(md, head, "passing", col).startswith("yes")
    assert table_cell(md, head, "hier-ring", col).startswith("yes")
    assert table_cell(md, head, "ring", col) == "reference"
    assert table_cell(md, head, "passing", "iters/s") == "20.000"
    assert "accuracy differs from ring by more than 0.01 for: ina" in md


def test_markers_keep_the_text_around_them(allreduce_csv, tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text(f"# Benchmarks\n\nHuman intro.\n\n{BEGIN}\nold numbers\n{END}\n\n"
                   "## Discussion\n\nHuman conclusions.\n")
    for _ in range(2):  # the second write must find the markers the first one kept
        write_report(allreduce_csv, None, [], out, {"date": "2024-01-01"})
        md = out.read_text()
        assert md.startswith("# Benchmarks\n\nHuman intro.\n\n" + BEGIN)
        assert md.endswith(END + "\n\n## Discussion\n\nHuman conclusions.\n")
        assert md.count(BEGIN) == 1 and md.count(END) == 1
        assert "old numbers" not in md and "ps 4.00x" in md


def test_fresh_file_then_rewrite_is_stable(allreduce_csv, tmp_path):
    out = tmp_path / "new" / "benchmarks.md"
    write_report(allreduce_csv, None, [], out, {"date": "d"})
    first = out.read_text()
    assert first.startswith("# ") and BEGIN in first and END in first
    out.write_text(first + "\nAdded by hand.\n")
    write_report(allreduce_csv, None, [], out, {"date": "d"})
    assert out.read_text() == first + "\nAdded by hand.\n"


def test_file_without_markers_is_kept_and_section_appended(allreduce_csv, tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text("# Mine\n\nNo markers yet.\n")
    write_report(allreduce_csv, None, [], out, {"date": "d"})
    md = out.read_text()
    assert md.startswith("# Mine\n\nNo markers yet.\n\n" + BEGIN) and md.endswith(END + "\n")


def test_summary_gives_speedups_and_ratio_per_group(allreduce_csv):
    s = summary(allreduce_csv)
    a = s["star/model, 4x2 GPUs, 1000 Mbit/s"]
    assert a["size_bytes"] == MIB
    assert a["speedup"] == pytest.approx({k: v for k, v in FACTORS_A.items() if k != "passing"})
    assert a["passing_ratio"] == pytest.approx(1.1)
    assert s["star/model, 4x2 GPUs, 100 Mbit/s"]["speedup"]["ps"] == pytest.approx(8.0)
    assert s["star/model, 8x2 GPUs, 1000 Mbit/s"]["speedup"]["ring"] == pytest.approx(2.0)


def test_cli_draws_plots_and_writes_report(allreduce_csv, training_csv, tmp_path):
    out = tmp_path / "docs" / "benchmarks.md"
    rc = report.main(["--allreduce", str(allreduce_csv), "--training", str(training_csv),
                      "--plots-dir", str(tmp_path / "docs" / "benchmarks"), "--out", str(out),
                      "--meta", "machine=ci"])
    assert rc == 0
    md = out.read_text()
    assert "- **machine**: ci" in md and "- **target**: model" in md
    assert "](benchmarks/training.png)" in md
    assert_png(tmp_path / "docs" / "benchmarks" / "allreduce_time.png")


def test_unknown_strategy_and_missing_prediction_do_not_break_anything(training_csv, tmp_path):
    rows = [allreduce_row(s, size, f) for size in SIZES for s, f in FACTORS_A.items()]
    rows.append(dict(allreduce_row("switchml", MIB, 1.1), predicted_s="", ratio=""))
    csv_path = write_csv(tmp_path / "x.csv", ALLREDUCE_COLUMNS, rows)
    with open(training_csv) as f:
        train = list(csv.DictReader(f))
    train += [dict(r, hosts=8) for r in train]  # a second training configuration
    train_path = write_csv(tmp_path / "t.csv", TRAINING_COLUMNS, train)
    written = make_plots(csv_path, train_path, tmp_path / "plots")
    assert {"allreduce_time.png", "ratio.png", "training.png"} <= {p.name for p in written}
    for p in written:
        assert_png(p)
    out = tmp_path / "r.md"
    write_report(csv_path, train_path, written, out, {})
    md = out.read_text()
    assert table_cell(md, "### All-reduce", "1 MiB", "passing speedup vs switchml") == "1.10x"
    assert table_cell(md, "### All-reduce", "1 MiB", "switchml ratio") == "n/a"
    assert md.count("**NO**") == 2  # ina in both training configurations


def test_two_workloads_get_their_own_tables_times_to_accuracy_and_curves(
        allreduce_csv, training_csv, tmp_path):
    """A sweep's training.csv with the model and the time to the target accuracy, beside
    its curves: each workload is a table of its own, and the curves are drawn."""
    from bench.results import CURVES_FILE, load_training

    with open(training_csv) as f:
        small = list(csv.DictReader(f))
    tta = {"passing": "21.5", "ring": "inf", "hier-ring": "40.25"}
    wide = [dict(r, model="digits-wide", time_to_target_s=tta.get(r["strategy"], ""))
            for r in small]
    cols = (*TRAINING_COLUMNS, "model", "time_to_target_s")
    path = write_csv(tmp_path / "training.csv", cols,
                     [dict(r, model="digits-mlp", time_to_target_s="") for r in small] + wide)
    rows = load_training(path)
    assert {r.model for r in rows} == {"digits-mlp", "digits-wide"}
    curves = [{"label": "digits-wide, star/model, 4x2 GPUs, 1 Gbit/s", "strategy": s,
               "curve": [[0.0, 0, 0.1], [10.0, 50, 0.8], [20.0 + i, 100, 0.92]],
               "target_accuracy": 0.9} for i, s in enumerate(("passing", "ring"))]
    (tmp_path / CURVES_FILE).write_text(json.dumps(curves))
    out = tmp_path / "docs" / "benchmarks.md"
    plots = make_plots(allreduce_csv, path, out.parent / "benchmarks")
    assert {p.name for p in plots} >= {"training.png", "training_curves.png"}
    assert_png(out.parent / "benchmarks" / "training_curves.png")
    write_report(allreduce_csv, path, plots, out, {"date": "2024-01-01"})
    md = out.read_text()
    mlp = md.index("digits-mlp, star/model")
    wide_at = md.index("digits-wide, star/model")
    assert mlp < wide_at
    wide_table = md[wide_at:]
    assert "| 21.5 s |" in wide_table and "| not reached |" in wide_table
    assert "| 40.2 s |" in wide_table or "| 40.3 s |" in wide_table
    assert "| not measured |" in md[mlp:wide_at]


def test_runs_whose_links_were_under_half_busy_are_named_cpu_bound(tmp_path):
    """The analytical model's bound column can say "link" where the CPU set the time (it is
    calibrated on one switch alone): the report names every run whose busiest host link was
    under half busy during a call, with that share, and no other."""
    def run(strategy, size, mean_s, tx, bw):
        row = allreduce_row(strategy, size, 1.0, bw=bw)
        row.update(mean_s=mean_s, host_tx_bytes=tx, host_rx_bytes=tx / 2)
        return row
    mib = 1 << 20
    rows = [  # 100 Mbit/s: 1 MiB in 0.2 s is 42% busy, in 0.1 s 84%
        run("passing", MIB, 0.2, mib, 100), run("ring", MIB, 0.1, mib, 100),
        run("passing", 64 * KIB, 0.1, 0.3 * 12.5e6 * 0.1, 100),
        # 1000 Mbit/s: every link at least half busy
        run("passing", MIB, 0.01, 0.6 * 125e6 * 0.01, 1000),
        # unshaped: nothing to say
        run("passing", MIB, 0.01, mib, 0)]
    csv_path = write_csv(tmp_path / "busy.csv", ALLREDUCE_COLUMNS, rows)
    out = tmp_path / "r.md"
    write_report(csv_path, None, [], out, {"date": "x"})
    md = out.read_text()
    shaped = md[md.index("### All-reduce: star/model, 4x2 GPUs, 100 Mbit/s"):]
    shaped = shaped[:shaped.index("Traffic per all-reduce")]
    assert ("**CPU-bound** (the busiest host link under 50% busy during a call, so this "
            "machine's CPU, not the emulated links, set the time): passing 64 KiB (30%), "
            "passing 1 MiB (42%).") in shaped
    fast = md[md.index("### All-reduce: star/model, 4x2 GPUs, 1000 Mbit/s"):]
    assert "Every run's busiest host link was at least 50% busy during a call." in \
        fast[:fast.index("Traffic per all-reduce")]
    unshaped = md[md.index("### All-reduce: star/model, 4x2 GPUs, unshaped"):]
    assert "busy" not in unshaped[:unshaped.index("Traffic per all-reduce")]


def test_runs_whose_cpus_were_saturated_are_named_and_older_files_still_load(tmp_path):
    """A run whose links were busy can still have had no CPU to spare (the kernel carrying
    its frames, which the model leaves out): the report names each run whose calls found
    the CPUs at least 90% busy, with the share, and no other; a file without the column
    (written before it) reports as before."""
    def run(strategy, size, cpu):
        row = allreduce_row(strategy, size, 1.0, bw=100)
        row.update(mean_s=0.1, host_tx_bytes=0.9 * 12.5e6 * 0.1, cpu_busy=cpu)
        return row
    rows = [run("passing", MIB, 0.93), run("ring", MIB, 0.89), run("passing", 64 * KIB, 0.97),
            run("hier-ring", MIB, "")]
    columns = (*ALLREDUCE_COLUMNS, "cpu_busy")
    out = tmp_path / "r.md"
    write_report(write_csv(tmp_path / "cpu.csv", columns, rows), None, [], out, {"date": "x"})
    md = out.read_text()
    assert ("The CPUs were at least 90% busy during the calls of: passing 64 KiB (97%), "
            "passing 1 MiB (93%);") in md
    assert "ring 1 MiB (89%)" not in md
    old = tmp_path / "old.md"
    for r in rows:
        del r["cpu_busy"]
    write_report(write_csv(tmp_path / "old.csv", ALLREDUCE_COLUMNS, rows), None, [], old,
                 {"date": "x"})
    assert "Every run's busiest host link was at least 50% busy" in old.read_text()
    assert "The CPUs were" not in old.read_text()
