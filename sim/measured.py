"""The measured all-reduce times of a `make bench` report (docs/benchmarks.md's results section,
which bench/report.py writes between its markers): the tables the simulator is validated
against, and the run's calibration line.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from sim.costs import Calibration
from sim.wire import parse_size

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
_SECTION = re.compile(r"^### All-reduce: (?P<topo>[\w-]+)/(?P<target>\w+), (?P<hosts>\d+)x"
                      r"(?P<gpus>\d+) GPUs, (?P<bw>[\d.]+) Mbit/s")
_DATE = re.compile(r"^- \*\*date\*\*: (?P<date>.+)$")
_CAL = re.compile(r"(?P<target>\w+): switch (?P<agg>\d+) aggregation / (?P<fwd>\d+) forwarding "
                  r"packets/s(?: \(per CPU second (?P<aggc>\d+) / (?P<fwdc>\d+)\))?, "
                  r"agent (?P<agent>\d+) packets/s")


class MeasuredError(ValueError):
    """A report the simulator cannot read its measurements from."""


@dataclass(frozen=True)
class Cell:
    """One measured all-reduce: a strategy at one size in one scenario."""

    topology: str
    target: str  # model or bmv2
    hosts: int
    gpus: int
    bw_mbps: float
    size_bytes: int
    strategy: str
    ms: float

    @property
    def scenario(self) -> str:
        return (f"{self.topology}/{self.target}, {self.hosts}x{self.gpus} GPUs, "
                f"{self.bw_mbps:g} Mbit/s")


@dataclass(frozen=True)
class Report:
    date: str
    calibration: dict[str, Calibration]  # per target
    cells: tuple[Cell, ...]


def results_section(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise MeasuredError(f"no results section (between {BEGIN} and {END})")
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)]


def parse(text: str) -> Report:
    """The measurements of a report's results section."""
    lines = results_section(text).splitlines()
    date, calibration, cells = "", {}, []
    section: dict | None = None
    header: list[str] | None = None
    for line in lines:
        if m := _DATE.match(line):
            date = m["date"].strip()
        elif line.startswith("- **calibration**"):
            calibration = _calibrations(line)
        elif line.startswith("### "):
            m = _SECTION.match(line)
            section = m.groupdict() if m else None
            header = None
        elif section is not None and line.startswith("| size |"):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
        elif section is not None and header is not None and re.match(r"^\| \d", line):
            cells += _row(section, header, line)
        elif not line.strip():
            header = None
    if not cells:
        raise MeasuredError("no all-reduce tables in the results section")
    return Report(date, calibration, tuple(cells))


def _calibrations(line: str) -> dict[str, Calibration]:
    cal = {m["target"]: Calibration(float(m["agg"]), float(m["fwd"]), float(m["agent"]),
                                    switch_agg_cpu_pps=_rate(m["aggc"]),
                                    switch_fwd_cpu_pps=_rate(m["fwdc"]))
           for m in _CAL.finditer(line)}
    if "model" in cal:
        unit = cal["model"].switch_fwd_pps
        cal = {t: dataclasses.replace(c, kernel_unit_pps=unit) for t, c in cal.items()}
    return cal


def _rate(text: str | None) -> float | None:
    return float(text) if text else None  # absent from reports before 2026-12-08


def _row(section: dict, header: list[str], line: str) -> list[Cell]:
    values = [c.strip() for c in line.strip().strip("|").split("|")]
    size = parse_size(values[0].replace(" ", ""))
    out = []
    for col, value in zip(header, values, strict=False):
        if col.endswith(" ms"):
            try:
                ms = float(value)
            except ValueError:  # a failed run's "-" or a flag
                continue
            out.append(Cell(section["topo"], section["target"], int(section["hosts"]),
                            int(section["gpus"]), float(section["bw"]), size, col[:-3], ms))
    return out


def load(path: str | Path) -> Report:
    path = Path(path)
    try:
        return parse(path.read_text())
    except FileNotFoundError:
        raise MeasuredError(f"{path}: no such file") from None
