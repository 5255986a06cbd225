"""The look every benchmark plot shares: one colour and marker per strategy (PASSING drawn
thicker and on top), the figure and legend layout, axes of tensor sizes, bars, and saving."""

from __future__ import annotations

import math
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

from bench.results import format_size, order_strategies  # noqa: E402

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

def new_figure(n_panels: int, panel_size: tuple[float, float] = (5.6, 4.0)) -> tuple[Figure,
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


def add_grid(ax: Axes) -> None:
    ax.grid(True, which="major", linestyle="-", alpha=0.35)
    ax.grid(True, which="minor", linestyle=":", alpha=0.2)


def size_axis(ax: Axes, sizes: Iterable[int]) -> None:
    """Log2 x axis with a tick at each measured size, labelled in KiB/MiB."""
    ticks = sorted({s for s in sizes if s > 0})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: format_size(round(x))))
    ax.xaxis.set_minor_locator(NullLocator())
    if len(ticks) > 6:
        ax.tick_params(axis="x", labelrotation=45)
    ax.set_xlabel("tensor size")


def log_if_wide(ax: Axes, values: Iterable[float], axis: str = "y", span: float = 10) -> None:
    """Log scale only when values span more than `span`x: small spreads read better linear."""
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    if vals and max(vals) / min(vals) > span:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")


def strategy_handles(strategies: Iterable[str]) -> list[Line2D]:
    return [Line2D([], [], label=s, **style(s)) for s in order_strategies(strategies)]


def bar_handles(strategies: Iterable[str]) -> list[Patch]:
    return [Patch(facecolor=style(s)["color"], label=s,
                  edgecolor="black" if s == "passing" else "none") for s in strategies]


def model_handles() -> list[Line2D]:
    return [Line2D([], [], color="black", linestyle="-", label="measured"),
            Line2D([], [], color="black", linestyle="--", label="analytical prediction")]


def legend_below(fig: Figure, handles: list[Line2D]) -> None:
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 7),
               frameon=False)


def save_png(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path



def grouped_bars(ax: Axes, categories: list[str], strategies: list[str],
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


def strategy_bars(ax: Axes, strategies: list[str], values: list[float], fmt: str) -> None:
    """One bar per strategy in its colour, PASSING outlined."""
    bars = ax.bar(range(len(strategies)), values, width=0.65,
                  color=[style(s)["color"] for s in strategies],
                  edgecolor=["black" if s == "passing" else "none" for s in strategies],
                  linewidth=1.2)
    ax.bar_label(bars, fmt=fmt, fontsize=8, padding=1)
    ax.set_xticks(range(len(strategies)), strategies)
    ax.grid(True, axis="y", alpha=0.35)
    ax.set_axisbelow(True)

