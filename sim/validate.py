"""Simulated against measured: every all-reduce of a `make bench` report from 256 KiB to 16 MiB
simulated on the same fabric, job, link rate, window and calibration, and the ratio
simulated / measured per cell.

Each scenario is rebuilt as bench.sweep builds it: the shipped topology with every link at the
scenario's rate and every host with its GPUs, a job of n hosts spread over the racks, a window
of 256 slots on the model switch and 64 on BMv2, and the same call plan: a call the analytical
model predicts at 2 s or more is made once without a warm-up, so it does not speculate on its
scale and carries its exponent packets; the others do speculate. The emulation's costs come from
the report's own calibration line (sim.costs.emulation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bench import analytic
from controller.topology import Topology
from sim import fabric
from sim.costs import Calibration, emulation
from sim.measured import Cell, Report
from sim.runner import Case, CaseResult, run_cases
from sim.strategies import JobRun
from sim.wire import format_size

TOLERANCE = 1.15  # the goal: simulated within 1.15x of measured, either way
SIZES = (256 << 10, 1 << 20, 4 << 20, 16 << 20)  # what is validated: 256 KiB to 16 MiB
WINDOWS = {"model": 256, "bmv2": 64}  # make run-topology's default window per target
LONG_CALL_S = 2.0  # bench.sweep_plan.LONG_CALL_S: calls predicted this long are made once


@dataclass(frozen=True)
class Row:
    cell: Cell
    simulated_s: float
    speculating: bool
    error: str = ""

    @property
    def ratio(self) -> float:
        return self.simulated_s * 1e3 / self.cell.ms if self.simulated_s else math.nan

    @property
    def flagged(self) -> bool:
        return flag(self.ratio)


def flag(ratio: float, tolerance: float = TOLERANCE) -> bool:
    """Outside the goal: more than `tolerance` times off, either way (or no number at all)."""
    return not (1 / tolerance <= ratio <= tolerance)


def speculates_on(topo: Topology, hosts: list[str], strategy: str, size_bytes: int, bw_mbps: float,
                  cal: Calibration, window: int) -> bool:
    """Whether bench.sweep's timed calls of this run speculate on their scale: they follow a
    warm-up call when the analytical model predicts the first call under 2 s."""
    racks = sorted({topo.hosts[h].rack for h in hosts})
    gpus = topo.hosts[hosts[0]].gpus
    model = analytic.FabricModel(tuple(sum(1 for h in hosts if topo.hosts[h].rack == r)
                                       for r in racks), gpus, bw_mbps * 1e6, bw_mbps * 1e6)
    rates = analytic.Rates(cal.switch_agg_pps, cal.switch_fwd_pps, cal.agent_pps, cal.cores)
    pred = analytic.predict(strategy, model, size_bytes, rates, window=window)
    return pred.seconds < LONG_CALL_S


def case_for(cell: Cell, report: Report, max_chunks: int = 64,
             constants: dict[str, float] | None = None) -> tuple[Case, bool]:
    topo = fabric.reshape(fabric.load(cell.topology), cell.bw_mbps, cell.gpus)
    hosts = fabric.spread(topo, cell.hosts)
    cal = report.calibration[cell.target]
    spec = speculates_on(topo, hosts, cell.strategy, cell.size_bytes, cell.bw_mbps, cal,
                         WINDOWS[cell.target])
    job = JobRun(1, tuple(hosts), cell.strategy, cell.size_bytes, WINDOWS[cell.target], spec)
    label = f"{cell.scenario} {format_size(cell.size_bytes)} {cell.strategy}"
    return Case(topo, (job,), emulation(cal, constants), max_chunks=max_chunks,
                label=label), spec


def cells_in(report: Report, sizes: Iterable[int] = SIZES,
             strategies: Iterable[str] | None = None) -> list[Cell]:
    sizes, wanted = set(sizes), set(strategies) if strategies else None
    return [c for c in report.cells
            if c.size_bytes in sizes and (wanted is None or c.strategy in wanted)]


def validate(report: Report, cells: list[Cell], workers: int = 2, max_chunks: int = 64,
             progress: Callable[[int, int, CaseResult], None] | None = None,
             constants: dict[str, float] | None = None) -> list[Row]:
    built = [case_for(c, report, max_chunks, constants) for c in cells]
    rows = []
    results = run_cases([case for case, _ in built], workers, progress)
    for cell, (_, spec), result in zip(cells, built, results, strict=True):
        sim = result.time if not result.error else 0.0
        rows.append(Row(cell, sim, spec, result.error))
    return rows


def summary(rows: list[Row]) -> str:
    ok = [r for r in rows if not r.flagged]
    ratios = [r.ratio for r in rows if not math.isnan(r.ratio)]
    if not ratios:
        return "no cell simulated"
    return (f"{len(ok)} of {len(rows)} cells within {TOLERANCE}x of measured; simulated / "
            f"measured {min(ratios):.2f}-{max(ratios):.2f}, geometric mean "
            f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


def markdown_table(rows: list[Row]) -> str:
    """Per scenario and size, each strategy's simulated and measured ms and their ratio; a
    ratio outside the goal is in bold with a mark."""
    strategies = list(dict.fromkeys(r.cell.strategy for r in rows))
    head = "| scenario | size | " + " | ".join(f"{s} sim / meas ms (ratio)" for s in strategies)
    lines = [head + " |", "|---|---|" + "---|" * len(strategies)]
    keys = list(dict.fromkeys((r.cell.scenario, r.cell.size_bytes) for r in rows))
    by_key = {(r.cell.scenario, r.cell.size_bytes, r.cell.strategy): r for r in rows}
    for scenario, size in keys:
        cols = []
        for s in strategies:
            r = by_key.get((scenario, size, s))
            cols.append("" if r is None else _cell_text(r))
        lines.append(f"| {scenario} | {format_size(size)} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def _ms(ms: float) -> str:
    return f"{ms:,.0f}" if ms >= 1000 else f"{ms:.4g}"


def _cell_text(r: Row) -> str:
    if r.error:
        return f"error: {r.error}"
    text = f"{_ms(r.simulated_s * 1e3)} / {_ms(r.cell.ms)} ({r.ratio:.2f})"
    return f"**{text} !**" if r.flagged else text


def print_rows(rows: list[Row], out: Callable[[str], None] = print) -> None:
    for r in rows:
        mark = "  <-- outside 1.15x" if r.flagged else ""
        spec = "" if r.speculating else " (first call)"
        out(f"{r.cell.scenario:42s} {format_size(r.cell.size_bytes):>8s} {r.cell.strategy:9s} "
            f"sim {r.simulated_s * 1e3:9.1f} ms  measured {r.cell.ms:9.1f} ms  "
            f"ratio {r.ratio:5.2f}{spec}{mark}{'  ' + r.error if r.error else ''}")


CSV_COLUMNS = ["topology", "target", "hosts", "gpus", "bw_mbps", "size_bytes", "strategy",
               "measured_ms", "simulated_ms", "ratio", "speculating", "flagged", "error"]


def csv_row(r: Row) -> dict:
    c = r.cell
    return {"topology": c.topology, "target": c.target, "hosts": c.hosts, "gpus": c.gpus,
            "bw_mbps": c.bw_mbps, "size_bytes": c.size_bytes, "strategy": c.strategy,
            "measured_ms": c.ms, "simulated_ms": round(r.simulated_s * 1e3, 3),
            "ratio": round(r.ratio, 4), "speculating": r.speculating, "flagged": r.flagged,
            "error": r.error}
