"""README.md's result block (between `<!-- bench:begin -->` and `<!-- bench:end -->`) says
exactly what the results section of docs/benchmarks.md says: the same run (date, machine, how
many runs were correct), and every time and speedup in its tables the number the report prints
for that configuration, tensor and strategy. bench/report.py writes both from the same CSV
(`make bench` passes it the README: report_readme.readme_for); this test keeps a hand edit, or a
report rewritten without the README, from letting them drift apart. It also checks that the
block names every configuration of the run (the losing and level ones too) and that no number
in it goes unchecked.

No Mininet, no root: it reads two committed files, and writes synthetic ones in tmp_path."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench import report
from bench.report_readme import README_BEGIN, README_END, readme_for
from bench.results import ALLREDUCE_COLUMNS, STRATEGY_ORDER

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"

WRONG = " **WRONG**"
LATEST = re.compile(
    r"^Latest `make bench`: \*\*(?P<date>[^*]+)\*\* on (?P<machine>.+); "
    r"(?:every one of its (?P<runs>\d+) all-reduce runs correct"
    r"|\*\*(?P<wrong>\d+) of its (?P<runs_w>\d+) all-reduce runs WRONG\*\*)\.$")
TIME_CELL = re.compile(r"^(?P<ms>\d+(?:\.\d+)?) ms(?: \((?P<sp>\d+\.\d+)x\))?(?P<wrong>"
                       + re.escape(WRONG) + ")?$")
SPEEDUP_CELL = re.compile(r"^(?P<sp>\d+\.\d+)x$")


# ------------------------------------------------------------------------ the report's numbers

@dataclass
class Group:
    """One `### All-reduce: LABEL` table of the report: per tensor size (as printed, ascending),
    each strategy's time in ms and PASSING's speedup over it."""

    sizes: list[str] = field(default_factory=list)
    ms: dict[tuple[str, str], float] = field(default_factory=dict)
    wrong: set[tuple[str, str]] = field(default_factory=set)
    speedup: dict[tuple[str, str], float] = field(default_factory=dict)
    strategies: set[str] = field(default_factory=set)

    def largest_passing_size(self) -> str | None:
        with_passing = [s for s in self.sizes if (s, "passing") in self.ms]
        return with_passing[-1] if with_passing else None


@dataclass
class Report:
    date: str
    machine: str
    runs: int
    wrong: int
    groups: dict[str, Group]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "n/a", empty


def parse_report(text: str) -> Report:
    begin, end = text.find(report.BEGIN), text.find(report.END)
    assert 0 <= begin < end, "docs/benchmarks.md: no results section between its markers"
    section = text[begin:end]
    meta = dict(re.findall(r"^- \*\*(\w[\w ]*)\*\*: (.+)$", section, re.M))
    assert "date" in meta and "machine" in meta, "the report's run has no date or machine line"
    ok = re.search(r"^\*\*Correctness: all (\d+) runs correct\.\*\*$", section, re.M)
    bad = re.search(r"^\*\*WARNING: (\d+) of (\d+) runs produced a WRONG result:\*\*$",
                    section, re.M)
    assert ok or bad, "the report says nothing about correctness"
    runs, wrong = (int(ok.group(1)), 0) if ok else (int(bad.group(2)), int(bad.group(1)))
    groups: dict[str, Group] = {}
    heading = re.compile(r"^### All-reduce: (.+?)(?: \(main\))?\n\n((?:\|.*\n)+)", re.M)
    for m in heading.finditer(section):
        g = groups.setdefault(m.group(1), Group())
        rows = m.group(2).strip().splitlines()
        header = _cells(rows[0])
        g.strategies = {h[:-3] for h in header if h.endswith(" ms")}
        for line in rows[2:]:
            cell = dict(zip(header, _cells(line), strict=True))
            size = cell["size"]
            g.sizes.append(size)
            for s in g.strategies:
                text_ms = cell[f"{s} ms"]
                if text_ms.endswith(WRONG):
                    g.wrong.add((size, s))
                    text_ms = text_ms[:-len(WRONG)]
                if (ms := _number(text_ms)) is not None:
                    g.ms[(size, s)] = ms
                sp = cell.get(f"passing speedup vs {s}", "")
                if sp.endswith("x") and (value := _number(sp[:-1])) is not None:
                    g.speedup[(size, s)] = value
    assert groups, "the report's results section has no all-reduce tables"
    return Report(meta["date"], meta["machine"], runs, wrong, groups)


# ------------------------------------------------------------------------ the README's block

def readme_block(text: str) -> str:
    begin = text.find(README_BEGIN)
    end = text.find(README_END, begin + 1)
    assert 0 <= begin < end, f"README: no {README_BEGIN} ... {README_END} block"
    return text[begin + len(README_BEGIN):end]


def _check_time_cell(cell: str, g: Group, where: str, size: str, s: str) -> None:
    if not cell:
        assert (size, s) not in g.ms, f"{where}: README leaves out {s}, the report has it"
        return
    m = TIME_CELL.match(cell)
    assert m, f"{where}: {cell!r} is not 'N ms' or 'N ms (Sx)'"
    assert (size, s) in g.ms, f"{where}: the report has no {s} time"
    assert float(m["ms"]) == g.ms[(size, s)], \
        f"{where}: README {m['ms']} ms, the report {g.ms[(size, s)]:g} ms"
    assert bool(m["wrong"]) == ((size, s) in g.wrong), f"{where}: WRONG flag differs"
    if s == "passing":
        assert m["sp"] is None, f"{where}: a speedup of PASSING over itself"
    else:
        _check_speedup(m["sp"], g, where, size, s)


def _check_speedup(text: str | None, g: Group, where: str, size: str, s: str) -> None:
    if (size, s) not in g.speedup:
        assert text is None, f"{where}: README gives a speedup the report does not"
        return
    assert text is not None, f"{where}: README leaves out the speedup over {s}"
    assert float(text) == g.speedup[(size, s)], \
        f"{where}: README {text}x, the report {g.speedup[(size, s)]:.2f}x"


def check_readme(readme_text: str, report_text: str) -> None:
    """AssertionError naming the first thing in the README's block that the report does not
    say, or a number in the block that nothing checked."""
    rep = parse_report(report_text)
    lines = readme_block(readme_text).splitlines()
    residue: list[str] = []  # the block's text with everything checked taken out
    caption_label: str | None = None
    header: list[str] | None = None
    headline_sizes: list[str] = []
    every: dict[str, str] = {}  # configuration -> tensor, of the every-configuration table
    saw_latest = False
    for line in lines:
        if not line.startswith("|"):
            header = None
        if m := LATEST.match(line):
            saw_latest = True
            assert m["date"] == rep.date, f"README's run {m['date']}, the report's {rep.date}"
            assert m["machine"] == rep.machine, \
                f"README's machine {m['machine']!r}, the report's {rep.machine!r}"
            runs = int(m["runs"] or m["runs_w"])
            wrong = int(m["wrong"] or 0)
            assert (runs, wrong) == (rep.runs, rep.wrong), \
                f"README: {wrong} of {runs} runs wrong, the report: {rep.wrong} of {rep.runs}"
            continue
        if not line.startswith("|"):
            if (m := re.search(r"`([^`]+)`:$", line)) and m[1] in rep.groups:
                caption_label = m[1]
                line = line.replace(m[0], ":")
            residue.append(line)
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            continue
        if all(set(c) <= set("-:") for c in cells):
            continue
        row = dict(zip(header, cells, strict=True))
        if header[0] == "tensor":  # the headline configuration's times
            assert caption_label, "README: a time table without its configuration in backticks"
            g = rep.groups[caption_label]
            size = row["tensor"]
            assert size in g.sizes, f"README: {caption_label} has no {size} in the report"
            headline_sizes.append(size)
            for s in header[1:]:
                _check_time_cell(row[s], g, f"README {caption_label}, {size}, {s}", size, s)
            assert g.strategies <= set(header[1:]), \
                f"README {caption_label}: leaves out {sorted(g.strategies - set(header[1:]))}"
        elif header[0] == "configuration":  # PASSING's speedup, every configuration
            label, size = row["configuration"], row["tensor"]
            assert label in rep.groups, f"README: {label!r} is no configuration of the report"
            g = rep.groups[label]
            assert size == g.largest_passing_size(), \
                f"README {label}: {size}, the report's largest tensor {g.largest_passing_size()}"
            every[label] = size
            _check_time_cell(row["passing"], g, f"README {label}, passing", size, "passing")
            for col in header[3:]:
                s = col.removeprefix("vs ")
                text = row[col]
                m = SPEEDUP_CELL.match(text)
                assert m or not text, f"README {label}: {text!r} is not a speedup"
                _check_speedup(m["sp"] if m else None, g, f"README {label}, vs {s}", size, s)
            assert g.strategies - {"passing"} <= {c.removeprefix("vs ") for c in header[3:]}, \
                f"README {label}: a baseline of the report left out"
        else:
            raise AssertionError(f"README block: a table of unknown kind ({header[0]!r})")
    assert saw_latest, "README block: no 'Latest `make bench`: **DATE** on MACHINE' line"
    assert caption_label is not None, "README block: no headline table"
    assert sorted(headline_sizes) == sorted(rep.groups[caption_label].sizes), \
        f"README: {caption_label} shows {headline_sizes}, the report " \
        f"{rep.groups[caption_label].sizes}"
    expected = {k for k, g in rep.groups.items() if g.largest_passing_size()}
    assert set(every) == expected, \
        f"README: configurations missing from its speedup table: {sorted(expected - set(every))}"
    left = "\n".join(residue)
    assert not re.search(r"\d", left), f"README block: a number nothing checks:\n{left}"


# ------------------------------------------------------------------------ the committed files

def test_readme_numbers_are_the_latest_reports():
    check_readme(README.read_text(), BENCHMARKS.read_text())


def test_the_readme_shows_the_losing_and_level_cases_too():
    """Every configuration is in the block, so the cases where PASSING does not win show."""
    rep = parse_report(BENCHMARKS.read_text())
    block = readme_block(README.read_text())
    for label in rep.groups:
        assert f"| {label} |" in block


def _numbers(block: str) -> list[re.Match]:
    return list(re.finditer(r"\d+(?:\.\d+)?", block))


def _edited(text: str, m: re.Match) -> str:
    number = m[0]
    last = number[-1]
    changed = number[:-1] + ("1" if last == "0" else str(int(last) - 1))
    return text[:m.start()] + changed + text[m.end():]


def test_editing_any_number_of_the_readme_block_fails():
    """Each number of the block, changed alone by one in its last digit, is caught."""
    readme, bench = README.read_text(), BENCHMARKS.read_text()
    start = readme.find(README_BEGIN) + len(README_BEGIN)
    block = readme_block(readme)
    numbers = _numbers(block)
    assert len(numbers) > 50  # the tables are there
    for m in numbers:
        edited = readme[:start] + _edited(block, m) + readme[start + len(block):]
        with pytest.raises(AssertionError):
            check_readme(edited, bench)


def test_a_number_added_to_the_block_fails():
    readme = README.read_text()
    edited = readme.replace(README_END, "PASSING is 3x faster.\n" + README_END)
    with pytest.raises(AssertionError, match="nothing checks"):
        check_readme(edited, BENCHMARKS.read_text())


def test_a_configuration_dropped_from_the_block_fails():
    readme, bench = README.read_text(), BENCHMARKS.read_text()
    level = next(line for line in readme_block(readme).splitlines()
                 if line.startswith("| leafspine/model, 2x2 GPUs"))
    with pytest.raises(AssertionError, match="missing"):
        check_readme(readme.replace(level + "\n", ""), bench)


def test_a_new_report_without_the_readme_fails():
    """A report rewritten on its own (another date) no longer matches the README."""
    readme, bench = README.read_text(), BENCHMARKS.read_text()
    date = parse_report(bench).date
    with pytest.raises(AssertionError, match="README's run"):
        check_readme(readme, bench.replace(f"**date**: {date}", "**date**: 2099-01-01 00:00 UTC"))


# ------------------------------------------------------------------------ bench/report.py writes it

def _row(strategy: str, size: int, seconds: float, *, bw: float, hosts: int = 4,
         gpus: int = 2, correct: bool = True) -> dict:
    return {"topology": "leafspine", "target": "model", "strategy": strategy, "hosts": hosts,
            "gpus_per_host": gpus, "size_bytes": size, "bw_mbps": bw, "iters": 2,
            "mean_s": seconds, "std_s": 0.0, "algbw_gbps": size * 8 / seconds / 1e9,
            "host_tx_bytes": size, "host_rx_bytes": size, "switch_packets": 0, "slots": 256,
            "predicted_s": seconds, "ratio": 1.0, "bound": "link", "correct": str(correct)}


@pytest.fixture
def sweep_csv(tmp_path: Path) -> Path:
    """A small make bench: a main configuration at 20 Mbit/s (three sizes), the same at 100
    (two sizes, ps wrong at one), and a 2-host job where hierarchical ring wins."""
    mib = 1 << 20
    factors = {"passing": 1.0, "ina": 2.1, "ring": 1.87, "hier-ring": 1.613, "ps": 6.4}
    rows = [_row(s, n * mib, 0.1234567 * n * f, bw=20)
            for n in (1, 4, 16) for s, f in factors.items()]
    rows += [_row(s, n * mib, 0.0371 * n * f, bw=100, correct=not (s == "ps" and n == 4))
             for n in (1, 4) for s, f in factors.items()]
    rows += [_row(s, mib, 0.45 * f, bw=20, hosts=2)
             for s, f in {**factors, "hier-ring": 0.97}.items()]
    path = tmp_path / "allreduce.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ALLREDUCE_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


README_TEMPLATE = f"""# A project

Text before.

{README_BEGIN}
old numbers 1.23x
{README_END}

Text after.
"""
META = {"date": "2026-12-31 23:59 UTC", "machine": "box, Linux, 2 cores"}


def test_report_writes_a_readme_block_the_check_accepts(sweep_csv, tmp_path):
    readme, out = tmp_path / "README.md", tmp_path / "benchmarks.md"
    readme.write_text(README_TEMPLATE)
    report.write_report(sweep_csv, None, [], out, META, readme=readme)
    text = readme.read_text()
    check_readme(text, out.read_text())
    assert text.startswith("# A project\n\nText before.\n\n") and text.endswith("\nText after.\n")
    assert "old numbers" not in text
    block = readme_block(text)
    # The headline is the main configuration at its fastest links, the losing case is listed,
    # and the wrong run is flagged in both files.
    assert "`leafspine/model, 4x2 GPUs, 100 Mbit/s`:" in block
    assert re.search(r"\| leafspine/model, 2x2 GPUs, 20 Mbit/s \| 1 MiB \| 450\.0 ms \| "
                     r"[\d.]+x \| [\d.]+x \| 0\.97x \|", block)
    assert "**1 of its 30 all-reduce runs WRONG**" in block and WRONG in block
    # Written again from the same data: the same file.
    report.write_report(sweep_csv, None, [], out, META, readme=readme)
    assert readme.read_text() == text


def test_report_refuses_a_readme_without_the_markers(sweep_csv, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# A project\n\nno block here\n")
    with pytest.raises(ValueError, match="bench:begin"):
        report.write_report(sweep_csv, None, [], tmp_path / "benchmarks.md", META,
                            readme=readme)
    assert readme.read_text() == "# A project\n\nno block here\n"


def test_report_cli_readme_option(sweep_csv, tmp_path):
    readme, out = tmp_path / "README.md", tmp_path / "benchmarks.md"
    readme.write_text(README_TEMPLATE)
    assert report.main(["--allreduce", str(sweep_csv), "--out", str(out), "--no-plots",
                        "--readme", str(readme)]) == 0
    check_readme(readme.read_text(), out.read_text())
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    assert report.main(["--allreduce", str(sweep_csv), "--out", str(out), "--no-plots",
                        "--readme", str(bare)]) == 2


def test_make_bench_report_path_brings_the_readme(tmp_path):
    """bench.sweep passes the README only for the checkout's docs/benchmarks.md (make bench),
    not for make bench-quick's report or a report written elsewhere."""
    assert readme_for(BENCHMARKS) == README
    assert readme_for(ROOT / "build" / "bench-quick" / "benchmarks.md") is None
    assert readme_for(tmp_path / "benchmarks.md") is None


def test_strategy_columns_follow_the_report_order():
    header = next(line for line in readme_block(README.read_text()).splitlines()
                  if line.startswith("| tensor |"))
    assert _cells(header)[1:] == list(STRATEGY_ORDER)
