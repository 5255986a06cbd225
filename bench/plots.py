"""PNG plots of the sweep's CSV files (allreduce.csv, optionally training.csv).

    python -m bench.plots --allreduce runs/allreduce.csv --training runs/training.csv \
        --out docs/benchmarks

Every plot is skipped, not drawn empty, when the data has nothing for it (one size, no varied
host count, ...); make_plots returns only the files it wrote. Each strategy keeps one colour
and marker in every plot, PASSING drawn thicker and on top.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on the benchmark machines

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from bench.plot_style import (  # noqa: E402
    MAX_TIME_PANELS,
    add_grid,
    bar_handles,
    grouped_bars,
    legend_below,
    log_if_wide,
    model_handles,
    new_figure,
    save_png,
    size_axis,
    strategy_handles,
    style,
)
from bench.plots_training import plot_training, plot_training_curves  # noqa: E402
from bench.results import (  # noqa: E402
    CURVES_FILE,
    GroupKey,
    Run,
    bw_label,
    by_size,
    format_size,
    group_label,
    group_runs,
    load_allreduce,
    load_training,
    main_group,
    order_strategies,
    speedups,
)


def _measured_and_predicted(ax: Axes, runs: list[Run], x: Callable[[Run], float]) -> None:
    """Per strategy: measured mean (solid, markers) and the model's prediction (dashed)."""
    for s in order_strategies(r.strategy for r in runs):
        pts = sorted((x(r), r) for r in runs if r.strategy == s)
        st = style(s)
        ax.plot([p[0] for p in pts], [p[1].mean_s * 1e3 for p in pts], **st)
        pred = [(px, r.predicted_s * 1e3) for px, r in pts if r.predicted_s > 0]
        if pred:
            ax.plot([p[0] for p in pred], [p[1] for p in pred], linestyle="--",
                    color=st["color"], linewidth=st["linewidth"] * 0.7, alpha=0.8,
                    zorder=st["zorder"] - 1)


# ---------------------------------------------------------------------------- plots

def time_plot_groups(groups: dict[GroupKey, list[Run]]) -> list[GroupKey]:
    """Groups worth a time-vs-size panel (more than one size), most rows first, at most 4."""
    multi = [k for k, rs in groups.items() if len({r.size_bytes for r in rs}) > 1]
    return sorted(multi, key=lambda k: -len(groups[k]))[:MAX_TIME_PANELS]


def plot_time(groups: dict[GroupKey, list[Run]], out: Path) -> Path | None:
    keys = time_plot_groups(groups)
    if not keys:
        return None
    fig, axes = new_figure(len(keys))
    for ax, key in zip(axes, keys, strict=True):
        runs = groups[key]
        _measured_and_predicted(ax, runs, lambda r: r.size_bytes)
        size_axis(ax, (r.size_bytes for r in runs))
        ax.set_yscale("log")
        ax.set_ylabel("all-reduce time (ms)")
        ax.set_title(group_label(key), fontsize=10)
        add_grid(ax)
    strategies = {r.strategy for k in keys for r in groups[k]}
    legend_below(fig, strategy_handles(strategies) + model_handles())
    return save_png(fig, out / "allreduce_time.png")


def plot_speedup(groups: dict[GroupKey, list[Run]], out: Path) -> Path | None:
    keys = [k for k in time_plot_groups(groups) if any(r.strategy == "passing"
                                                       for r in groups[k])]
    main = main_group(groups)
    if not keys and main is not None and any(r.strategy == "passing" for r in groups[main]):
        keys = [main]
    # A panel needs at least one baseline measured at a size PASSING also ran at.
    keys = [k for k in keys if any(speedups(at) for at in by_size(groups[k]).values())]
    if not keys:
        return None
    fig, axes = new_figure(len(keys))
    baselines: set[str] = set()
    for ax, key in zip(axes, keys, strict=True):
        table = by_size(groups[key])
        all_sp = []
        for b in order_strategies(r.strategy for r in groups[key]):
            pts = [(size, speedups(at)[b]) for size, at in table.items() if b in speedups(at)]
            if not pts:
                continue
            baselines.add(b)
            all_sp += [p[1] for p in pts]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], **style(b))
        ax.axhline(1.0, color="black", linestyle=":", linewidth=1, zorder=1)
        size_axis(ax, table)
        log_if_wide(ax, all_sp + [1.0])
        ax.set_ylabel("PASSING speedup (baseline time / PASSING time)", fontsize=9)
        ax.set_title(group_label(key), fontsize=10)
        add_grid(ax)
    handles = strategy_handles(baselines)
    handles.append(Line2D([], [], color="black", linestyle=":", label="parity (1x)"))
    legend_below(fig, handles)
    return save_png(fig, out / "speedup.png")



def plot_ratio(groups: dict[GroupKey, list[Run]], out: Path) -> Path | None:
    main = main_group(groups)
    if main is None:
        return None
    table = by_size(groups[main])
    columns = list(table.values())

    def ratio(i: int, s: str) -> float | None:
        r = columns[i].get(s)
        if r is None:
            return None
        # Fall back to computing it when the sweep left the column empty.
        if math.isfinite(r.ratio):
            return r.ratio
        return r.mean_s / r.predicted_s if r.predicted_s > 0 else None

    # Only strategies with a prediction get a slot: a bar gap would read as "ratio 0".
    strategies = [s for s in order_strategies(r.strategy for r in groups[main])
                  if any(ratio(i, s) is not None for i in range(len(columns)))]
    if not strategies:
        return None
    fig, (ax,) = new_figure(1, (max(6.4, 2.0 + 0.3 * len(table) * len(strategies)), 4.2))
    drawn = grouped_bars(ax, [format_size(s) for s in table], strategies, ratio, "%.2f")
    if not drawn:
        plt.close(fig)
        return None
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, zorder=6)
    log_if_wide(ax, drawn + [1.0], span=20)
    ax.set_xlabel("tensor size")
    ax.set_ylabel("measured / predicted time")
    ax.set_title(f"Analytical model vs measurement: {group_label(main)}", fontsize=10)
    handles = bar_handles(strategies)
    handles.append(Line2D([], [], color="black", linestyle="--", label="exact prediction"))
    legend_below(fig, handles)
    return save_png(fig, out / "ratio.png")


def scaling_series(runs: list[Run], var: str) -> tuple[tuple, list[Run]] | None:
    """The runs where only `var` (hosts or gpus_per_host) varies, at one size: the candidate
    with the most distinct values, then the most rows, then the largest size."""
    other = "gpus_per_host" if var == "hosts" else "hosts"
    series: dict[tuple, list[Run]] = {}
    for r in runs:
        key = (r.topology, r.target, r.bw_mbps, getattr(r, other), r.size_bytes)
        series.setdefault(key, []).append(r)
    ok = [(k, rs) for k, rs in series.items() if len({getattr(r, var) for r in rs}) > 1]
    if not ok:
        return None
    return max(ok, key=lambda kv: (len({getattr(r, var) for r in kv[1]}), len(kv[1]),
                                   kv[0][4]))


def plot_scaling(runs: list[Run], out: Path) -> Path | None:
    panels = [(v, s) for v in ("hosts", "gpus_per_host")
              if (s := scaling_series(runs, v)) is not None]
    if not panels:
        return None
    fig, axes = new_figure(len(panels))
    strategies: set[str] = set()
    for ax, (var, (key, rs)) in zip(axes, panels, strict=True):
        topology, target, bw, fixed, size = key
        _measured_and_predicted(ax, rs, lambda r, v=var: getattr(r, v))
        strategies |= {r.strategy for r in rs}
        ax.set_xticks(sorted({getattr(r, var) for r in rs}))
        log_if_wide(ax, [r.mean_s for r in rs])
        ax.set_xlabel("hosts" if var == "hosts" else "GPUs per host")
        ax.set_ylabel("all-reduce time (ms)")
        fixed_txt = f"{fixed} GPUs/host" if var == "hosts" else f"{fixed} hosts"
        ax.set_title(f"{format_size(size)}, {topology}/{target}, {fixed_txt}, {bw_label(bw)}",
                     fontsize=10)
        add_grid(ax)
    legend_below(fig, strategy_handles(strategies) + model_handles())
    return save_png(fig, out / "scaling.png")


def bandwidth_series(runs: list[Run]) -> tuple[tuple, list[Run]] | None:
    """Runs differing only in shaped bandwidth at one size; unshaped rows (bw 0) have no place
    on a bandwidth axis and are left out."""
    series: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.bw_mbps > 0:
            key = (r.topology, r.target, r.hosts, r.gpus_per_host, r.size_bytes)
            series.setdefault(key, []).append(r)
    ok = [(k, rs) for k, rs in series.items() if len({r.bw_mbps for r in rs}) > 1]
    if not ok:
        return None
    return max(ok, key=lambda kv: (len({r.bw_mbps for r in kv[1]}), len(kv[1]), kv[0][4]))


def plot_bandwidth(runs: list[Run], out: Path) -> Path | None:
    found = bandwidth_series(runs)
    if found is None:
        return None
    (topology, target, hosts, gpus, size), rs = found
    fig, (ax,) = new_figure(1, (6.4, 4.4))
    _measured_and_predicted(ax, rs, lambda r: r.bw_mbps)
    ax.set_xscale("log")
    bws = sorted({r.bw_mbps for r in rs})
    ax.xaxis.set_major_locator(FixedLocator(bws))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_yscale("log")
    ax.set_xlabel("link bandwidth (Mbit/s)")
    ax.set_ylabel("all-reduce time (ms)")
    ax.set_title(f"{format_size(size)}, {topology}/{target}, {hosts}x{gpus} GPUs", fontsize=10)
    add_grid(ax)
    legend_below(fig, strategy_handles(r.strategy for r in rs) + model_handles())
    return save_png(fig, out / "bandwidth.png")



# ---------------------------------------------------------------------------- entry points

def make_plots(allreduce_csv: Path, training_csv: Path | None, out_dir: Path) -> list[Path]:
    """Draw every plot the data supports into out_dir; return the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = load_allreduce(Path(allreduce_csv))
    groups = group_runs(runs)
    written = [plot_time(groups, out_dir), plot_speedup(groups, out_dir),
               plot_ratio(groups, out_dir), plot_scaling(runs, out_dir),
               plot_bandwidth(runs, out_dir)]
    if training_csv is not None:
        written.append(plot_training(load_training(Path(training_csv)), out_dir))
        curves = Path(training_csv).with_name(CURVES_FILE)
        if curves.exists():
            written.append(plot_training_curves(json.loads(curves.read_text()), out_dir))
    return [p for p in written if p is not None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="PNG plots of the benchmark sweep's CSV files")
    ap.add_argument("--allreduce", type=Path, required=True)
    ap.add_argument("--training", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="directory for the PNGs")
    args = ap.parse_args(argv)
    for p in make_plots(args.allreduce, args.training, args.out):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
