"""PNG plots of the simulator's results, in bench/plots.py's colours (one per strategy, PASSING
red and on top). Each function returns the files it wrote; a plot with nothing to show is
skipped, not drawn empty.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on the benchmark machines

import matplotlib.pyplot as plt  # noqa: E402

from bench.plot_style import style  # noqa: E402
from sim.strategies import STRATEGIES  # noqa: E402
from sim.study import StudyRow  # noqa: E402
from sim.validate import Row  # noqa: E402
from sim.wire import format_size  # noqa: E402

DPI = 130


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _order(strategies) -> list[str]:
    known = [s for s in STRATEGIES if s in strategies]
    return known + sorted(set(strategies) - set(known))


def plot_runs(rows: list[dict], out: Path) -> list[Path]:
    """`python -m sim run`: simulated time against tensor size, per strategy."""
    ok = [r for r in rows if r["sim_s"]]
    sizes = sorted({r["size_bytes"] for r in ok})
    if not ok:
        return []
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for s in _order({r["strategy"] for r in ok}):
        pts = sorted((r["size_bytes"], r["sim_s"]) for r in ok if r["strategy"] == s)
        ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], label=s, **style(s))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [format_size(x) for x in sizes])
    ax.set_xlabel("tensor size")
    ax.set_ylabel("simulated all-reduce time (ms)")
    first = ok[0]
    ax.set_title(f"{first['topology']}, {first['hosts']}x{first['gpus_per_host']} GPUs, "
                 f"{first['bw_mbps']:g} Mbit/s ({first['costs']})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return [_save(fig, out / "sim_time.png")]


def plot_validation(rows: list[Row], out: Path) -> Path | None:
    """Simulated against measured, one point per cell, the 1.15x band shaded."""
    ok = [r for r in rows if r.simulated_s and not r.error]
    if not ok:
        return None
    fig, ax = plt.subplots(figsize=(6.0, 5.6))
    lo = min(min(r.cell.ms, r.simulated_s * 1e3) for r in ok) / 1.5
    hi = max(max(r.cell.ms, r.simulated_s * 1e3) for r in ok) * 1.5
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", linewidth=0.8)
    ax.fill_between(xs, [x / 1.15 for x in xs], [x * 1.15 for x in xs], color="0.85",
                    label="within 1.15x")
    for s in _order({r.cell.strategy for r in ok}):
        pts = [(r.cell.ms, r.simulated_s * 1e3) for r in ok if r.cell.strategy == s]
        st = style(s)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=s, color=st["color"],
                   marker=st["marker"], zorder=st["zorder"], s=28)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured in Mininet (ms, make bench)")
    ax.set_ylabel("simulated (ms)")
    ax.set_title("Simulated against measured, 256 KiB-16 MiB", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / "validation.png")


def plot_study(rows: list[StudyRow], out: Path) -> list[Path]:
    written = [p for p in (_study_gpus(rows, out), _study_rates(rows, out),
                           _study_jobs(rows, out)) if p is not None]
    return written


# The parameter server takes 10^3-10^4 times PASSING's time on 1,024 hosts: on the same axis it
# squeezes every other line into a band; the tables have its numbers.
LEFT_OUT_OF_TIME_PLOTS = ("ps",)


def _time_panel(ax, rows, x_of, title: str, xlabel: str, xlog: bool = False) -> None:
    for s in _order({r.case.strategy for r in rows} - set(LEFT_OUT_OF_TIME_PLOTS)):
        pts = sorted((x_of(r), r.seconds) for r in rows if r.case.strategy == s and r.seconds)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], label=s, **style(s))
    ax.set_yscale("log")
    if xlog:
        ax.set_xscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("all-reduce time (ms)")
    ax.grid(True, which="both", alpha=0.3)


def _study_gpus(rows, out: Path) -> Path | None:
    mine = [r for r in rows if r.case.part == "gpus"]
    panels = sorted({(r.case.size_bytes, r.case.oversubscription) for r in mine})
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.3 * len(panels), 4.2), squeeze=False)
    for ax, (size, over) in zip(axes[0], panels, strict=True):
        sel = [r for r in mine if (r.case.size_bytes, r.case.oversubscription) == (size, over)]
        _time_panel(ax, sel, lambda r: r.case.gpus, f"{format_size(size)}, {over:g}:1",
                    "GPUs per host")
        ax.set_xticks([1, 2, 4, 8])
    axes[0][0].legend(fontsize=8)
    fig.suptitle("1,024 hosts (32 racks x 32, 4 spines), 100 Gbit/s host links, NVLink "
                 "(ps: in the table)", fontsize=10)
    return _save(fig, out / "study_gpus.png")


def _study_rates(rows, out: Path) -> Path | None:
    mine = [r for r in rows if (r.case.part == "rates" or r.case.part == "gpus"
                                and r.case.gpus == 8 and r.case.oversubscription == 1.0)]
    sizes = sorted({r.case.size_bytes for r in mine if r.case.part == "rates"})
    if not sizes:
        return None
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.0 * len(sizes), 4.2), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        sel = [r for r in mine if r.case.size_bytes == size]
        _time_panel(ax, sel, lambda r: r.case.host_mbps / 1e3, format_size(size),
                    "host link (Gbit/s)", xlog=True)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("1,024 hosts x 8 GPUs, 1:1, NVLink: time against link rate (ps: in the "
                 "table)", fontsize=10)
    return _save(fig, out / "study_rates.png")


def _study_jobs(rows, out: Path) -> Path | None:
    mine = [r for r in rows if r.case.part == "jobs"]
    if not mine:
        return None
    groups = sorted({(r.case.oversubscription, r.case.placement) for r in mine})
    strategies = _order({r.case.strategy for r in mine})
    single = {r.case.strategy: r.seconds for r in rows if r.case.part == "gpus"
              and r.case.gpus == 8 and r.case.oversubscription == 1.0
              and r.case.size_bytes == mine[0].case.size_bytes}
    labels = ["one job of\n1,024 hosts, 1:1"] + [f"4 jobs {p},\n{o:g}:1" for o, p in groups]
    fig, ax = plt.subplots(figsize=(9.0, 4.6))
    width = 0.8 / max(1, len(strategies))
    by = defaultdict(dict)
    for r in mine:
        by[r.case.strategy][(r.case.oversubscription, r.case.placement)] = r.seconds
    for k, s in enumerate(strategies):
        vals = [single.get(s, math.nan)] + [by[s].get(g, math.nan) for g in groups]
        st = style(s)
        ax.bar([i + k * width for i in range(len(labels))], [v * 1e3 for v in vals], width,
               label=s, color=st["color"])
    ax.set_xticks([i + width * (len(strategies) - 1) / 2 for i in range(len(labels))], labels,
                  fontsize=8)
    ax.set_ylabel("slowest job's all-reduce time (ms)")
    ax.set_title(f"Concurrent jobs sharing the spines: 1,024 hosts x 8 GPUs, "
                 f"{format_size(mine[0].case.size_bytes)} per job", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / "study_jobs.png")
