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
from collections.abc import Callable, Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on the benchmark machines

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from bench.results import (  # noqa: E402
    CURVES_FILE,
    GroupKey,
    Run,
    TrainRow,
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
    train_label,
    training_by_group,
)

DPI = 150
MAX_TIME_PANELS = 4

# Fixed per strategy so a colour means the same thing in every figure; PASSING in red.
STYLES: dict[str, tuple[str, str]] = {
    "passing": ("#d62728", "o"),
    "ina": ("#1f77b4", "s"),
    "ring": ("#2ca02c", "^"),
    "hier-ring": ("#9467bd", "D"),
    "ps": ("#7f7f7f", "v"),
}
_FALLBACK = [("#ff7f0e", "P"), ("#8c564b", "X"), ("#e377c2", "*"), ("#17becf", "h"),
             ("#bcbd22", "<")]


def style(strategy: str) -> dict:
    """Line kwargs for a strategy; unknown ones get a stable fallback (hash of the name would
    change between runs, so use a deterministic index)."""
    if strategy in STYLES:
        color, marker = STYLES[strategy]
    else:
        color, marker = _FALLBACK[sum(map(ord, strategy)) % len(_FALLBACK)]
    hi = strategy == "passing"
    return {"color": color, "marker": marker, "linewidth": 2.6 if hi else 1.6,
            "markersize": 7 if hi else 5.5, "zorder": 5 if hi else 3}


# ---------------------------------------------------------------------------- axes helpers

def _figure(n_panels: int, panel_size: tuple[float, float] = (5.6, 4.0)) -> tuple[Figure,
                                                                                  list[Axes]]:
    cols = 1 if n_panels == 1 else 2
    rows = math.ceil(n_panels / cols)
    # constrained layout keeps the figure-level legend below the panels inside the PNG.
    fig, axes = plt.subplots(rows, cols, figsize=(panel_size[0] * cols, panel_size[1] * rows),
                             layout="constrained", squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def _grid(ax: Axes) -> None:
    ax.grid(True, which="major", linestyle="-", alpha=0.35)
    ax.grid(True, which="minor", linestyle=":", alpha=0.2)


def _size_axis(ax: Axes, sizes: Iterable[int]) -> None:
    """Log2 x axis with a tick at each measured size, labelled in KiB/MiB."""
    ticks = sorted({s for s in sizes if s > 0})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: format_size(round(x))))
    ax.xaxis.set_minor_locator(NullLocator())
    if len(ticks) > 6:
        ax.tick_params(axis="x", labelrotation=45)
    ax.set_xlabel("tensor size")


def _log_if_wide(ax: Axes, values: Iterable[float], axis: str = "y", span: float = 10) -> None:
    """Log scale only when values span more than `span`x: small spreads read better linear."""
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    if vals and max(vals) / min(vals) > span:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")


def _strategy_handles(strategies: Iterable[str]) -> list[Line2D]:
    return [Line2D([], [], label=s, **style(s)) for s in order_strategies(strategies)]


def _bar_handles(strategies: Iterable[str]) -> list[Patch]:
    return [Patch(facecolor=style(s)["color"], label=s,
                  edgecolor="black" if s == "passing" else "none") for s in strategies]


def _model_handles() -> list[Line2D]:
    return [Line2D([], [], color="black", linestyle="-", label="measured"),
            Line2D([], [], color="black", linestyle="--", label="analytical prediction")]


def _legend_below(fig: Figure, handles: list[Line2D]) -> None:
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 7),
               frameon=False)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


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
    fig, axes = _figure(len(keys))
    for ax, key in zip(axes, keys, strict=True):
        runs = groups[key]
        _measured_and_predicted(ax, runs, lambda r: r.size_bytes)
        _size_axis(ax, (r.size_bytes for r in runs))
        ax.set_yscale("log")
        ax.set_ylabel("all-reduce time (ms)")
        ax.set_title(group_label(key), fontsize=10)
        _grid(ax)
    strategies = {r.strategy for k in keys for r in groups[k]}
    _legend_below(fig, _strategy_handles(strategies) + _model_handles())
    return _save(fig, out / "allreduce_time.png")


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
    fig, axes = _figure(len(keys))
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
        _size_axis(ax, table)
        _log_if_wide(ax, all_sp + [1.0])
        ax.set_ylabel("PASSING speedup (baseline time / PASSING time)", fontsize=9)
        ax.set_title(group_label(key), fontsize=10)
        _grid(ax)
    handles = _strategy_handles(baselines)
    handles.append(Line2D([], [], color="black", linestyle=":", label="parity (1x)"))
    _legend_below(fig, handles)
    return _save(fig, out / "speedup.png")


def _grouped_bars(ax: Axes, categories: list[str], strategies: list[str],
                  value: Callable[[int, str], float | None], fmt: str) -> list[float]:
    """Bars per strategy side by side within each category; returns the values drawn."""
    width = 0.8 / max(len(strategies), 1)
    drawn: list[float] = []
    for j, s in enumerate(strategies):
        xs, ys = [], []
        for i in range(len(categories)):
            v = value(i, s)
            if v is not None and math.isfinite(v):
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(v)
        if not xs:
            continue
        st = style(s)
        bars = ax.bar(xs, ys, width=width, color=st["color"], label=s, zorder=st["zorder"],
                      edgecolor="black" if s == "passing" else "none", linewidth=1.2)
        ax.bar_label(bars, fmt=fmt, fontsize=7, padding=1)
        drawn += ys
    ax.set_xticks(range(len(categories)), categories)
    ax.grid(True, axis="y", alpha=0.35)
    ax.set_axisbelow(True)
    return drawn


def _strategy_bars(ax: Axes, strategies: list[str], values: list[float], fmt: str) -> None:
    """One bar per strategy in its colour, PASSING outlined."""
    bars = ax.bar(range(len(strategies)), values, width=0.65,
                  color=[style(s)["color"] for s in strategies],
                  edgecolor=["black" if s == "passing" else "none" for s in strategies],
                  linewidth=1.2)
    ax.bar_label(bars, fmt=fmt, fontsize=8, padding=1)
    ax.set_xticks(range(len(strategies)), strategies)
    ax.grid(True, axis="y", alpha=0.35)
    ax.set_axisbelow(True)


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
    fig, (ax,) = _figure(1, (max(6.4, 2.0 + 0.3 * len(table) * len(strategies)), 4.2))
    drawn = _grouped_bars(ax, [format_size(s) for s in table], strategies, ratio, "%.2f")
    if not drawn:
        plt.close(fig)
        return None
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, zorder=6)
    _log_if_wide(ax, drawn + [1.0], span=20)
    ax.set_xlabel("tensor size")
    ax.set_ylabel("measured / predicted time")
    ax.set_title(f"Analytical model vs measurement: {group_label(main)}", fontsize=10)
    handles = _bar_handles(strategies)
    handles.append(Line2D([], [], color="black", linestyle="--", label="exact prediction"))
    _legend_below(fig, handles)
    return _save(fig, out / "ratio.png")


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
    fig, axes = _figure(len(panels))
    strategies: set[str] = set()
    for ax, (var, (key, rs)) in zip(axes, panels, strict=True):
        topology, target, bw, fixed, size = key
        _measured_and_predicted(ax, rs, lambda r, v=var: getattr(r, v))
        strategies |= {r.strategy for r in rs}
        ax.set_xticks(sorted({getattr(r, var) for r in rs}))
        _log_if_wide(ax, [r.mean_s for r in rs])
        ax.set_xlabel("hosts" if var == "hosts" else "GPUs per host")
        ax.set_ylabel("all-reduce time (ms)")
        fixed_txt = f"{fixed} GPUs/host" if var == "hosts" else f"{fixed} hosts"
        ax.set_title(f"{format_size(size)}, {topology}/{target}, {fixed_txt}, {bw_label(bw)}",
                     fontsize=10)
        _grid(ax)
    _legend_below(fig, _strategy_handles(strategies) + _model_handles())
    return _save(fig, out / "scaling.png")


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
    fig, (ax,) = _figure(1, (6.4, 4.4))
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
    _grid(ax)
    _legend_below(fig, _strategy_handles(r.strategy for r in rs) + _model_handles())
    return _save(fig, out / "bandwidth.png")


def plot_training(rows: list[TrainRow], out: Path) -> Path | None:
    if not rows:
        return None
    configs = training_by_group(rows)
    keys = list(configs)
    strategies = order_strategies(r.strategy for r in rows)
    single = len(keys) == 1
    width = 4.8 if single else max(5.6, 2.0 + 0.35 * len(strategies) * len(keys))
    fig, axes = _figure(2, (width, 4.2))
    panels = [("iters_per_s", "training throughput (iterations/s)", "%.2f"),
              ("accuracy", "final accuracy", "%.3f")]
    for ax, (field, ylabel, fmt) in zip(axes, panels, strict=True):
        if single:  # one configuration: one bar per strategy, named on the x axis
            at = configs[keys[0]]
            _strategy_bars(ax, strategies, [getattr(at[s], field) for s in strategies], fmt)
            ax.set_title(train_label(keys[0]), fontsize=10)
        else:
            def value(i: int, s: str, f: str = field) -> float | None:
                r = configs[keys[i]].get(s)
                return getattr(r, f) if r else None
            # Two-line labels: the full configuration fits under its bar group unrotated.
            labels = [train_label(k).replace(", ", "\n", 1) for k in keys]
            _grouped_bars(ax, labels, strategies, value, fmt)
        ax.set_ylabel(ylabel)
        ax.margins(y=0.12)  # room for the value labels above the bars
    if not single:
        _legend_below(fig, _bar_handles(strategies))
    return _save(fig, out / "training.png")


def plot_training_curves(curves: list[dict], out: Path) -> Path | None:
    """Test accuracy against training time, a line per strategy, a panel per configuration
    and model: `curves` as the sweep writes them to training_curves.json."""
    if not curves:
        return None
    panels: dict[str, list[dict]] = {}
    for c in curves:
        panels.setdefault(c["label"], []).append(c)
    fig, axes = _figure(len(panels), (4.8, 3.8))
    for ax, (label, runs) in zip(axes, panels.items(), strict=True):
        by_strategy = {c["strategy"]: c for c in runs}
        for name in order_strategies(by_strategy):
            t, _, acc = zip(*by_strategy[name]["curve"], strict=True)
            ax.plot(t, acc, **style(name))
        if runs[0].get("target_accuracy"):
            ax.axhline(runs[0]["target_accuracy"], color="0.6", lw=0.8, ls="--")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test accuracy")
        ax.set_title(label.replace(", ", "\n", 1), fontsize=10)
        _grid(ax)
    _legend_below(fig, _strategy_handles(c["strategy"] for c in curves))
    return _save(fig, out / "training_curves.png")


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
