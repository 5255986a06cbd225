"""The training plots of `make bench`: throughput and final accuracy per strategy, and test
accuracy against training time."""

from __future__ import annotations

from pathlib import Path

from bench.plot_style import (
    add_grid,
    bar_handles,
    grouped_bars,
    legend_below,
    new_figure,
    save_png,
    strategy_bars,
    strategy_handles,
    style,
)
from bench.results import TrainRow, order_strategies, train_label, training_by_group


def plot_training(rows: list[TrainRow], out: Path) -> Path | None:
    if not rows:
        return None
    configs = training_by_group(rows)
    keys = list(configs)
    strategies = order_strategies(r.strategy for r in rows)
    single = len(keys) == 1
    width = 4.8 if single else max(5.6, 2.0 + 0.35 * len(strategies) * len(keys))
    fig, axes = new_figure(2, (width, 4.2))
    panels = [("iters_per_s", "training throughput (iterations/s)", "%.2f"),
              ("accuracy", "final accuracy", "%.3f")]
    for ax, (field, ylabel, fmt) in zip(axes, panels, strict=True):
        if single:  # one configuration: one bar per strategy, named on the x axis
            at = configs[keys[0]]
            strategy_bars(ax, strategies, [getattr(at[s], field) for s in strategies], fmt)
            ax.set_title(train_label(keys[0]), fontsize=10)
        else:
            def value(i: int, s: str, f: str = field) -> float | None:
                r = configs[keys[i]].get(s)
                return getattr(r, f) if r else None
            # Two-line labels: the full configuration fits under its bar group unrotated.
            labels = [train_label(k).replace(", ", "\n", 1) for k in keys]
            grouped_bars(ax, labels, strategies, value, fmt)
        ax.set_ylabel(ylabel)
        ax.margins(y=0.12)  # room for the value labels above the bars
    if not single:
        legend_below(fig, bar_handles(strategies))
    return save_png(fig, out / "training.png")


def plot_training_curves(curves: list[dict], out: Path) -> Path | None:
    """Test accuracy against training time, a line per strategy, a panel per configuration
    and model: `curves` as the sweep writes them to training_curves.json."""
    if not curves:
        return None
    panels: dict[str, list[dict]] = {}
    for c in curves:
        panels.setdefault(c["label"], []).append(c)
    fig, axes = new_figure(len(panels), (4.8, 3.8))
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
        add_grid(ax)
    legend_below(fig, strategy_handles(c["strategy"] for c in curves))
    return save_png(fig, out / "training_curves.png")
