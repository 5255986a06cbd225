"""The all-reduce and training sections of docs/benchmarks.md's results: correctness first,
then per configuration the times, speedups, traffic and where the CPU, not the links, bound
the run; then training throughput and accuracy."""

from __future__ import annotations

import math

from bench.report_format import md_table, millis, number
from bench.results import (
    GroupKey,
    Run,
    TrainRow,
    by_size,
    format_size,
    group_label,
    group_runs,
    largest_passing_size,
    link_busy,
    main_group,
    order_strategies,
    speedups,
    train_label,
    training_by_group,
)
from topologies.cpu_load import SATURATED_FROM
from topologies.link_rate import CPU_BOUND_BELOW

# Order of the headline summary line, weakest baseline first as the brief words it.
SUMMARY_BASELINES = ("ps", "ring", "hier-ring", "ina")
ACCURACY_TOLERANCE = 0.01



def correctness_section(runs: list[Run]) -> list[str]:
    """Put first and bold: a fast wrong all-reduce is a bug, not a result."""
    wrong = [r for r in runs if not r.correct]
    if not wrong:
        return [f"**Correctness: all {len(runs)} runs correct.**", ""]
    lines = [f"**WARNING: {len(wrong)} of {len(runs)} runs produced a WRONG result:**", ""]
    lines += [f"- **WRONG**: {r.strategy}, {format_size(r.size_bytes)}, {group_label(r.group)}"
              for r in wrong]
    return lines + [""]


def _group_table(runs: list[Run]) -> list[str]:
    strategies = order_strategies(r.strategy for r in runs)
    others = [s for s in strategies if s != "passing"] if "passing" in strategies else []
    header = ["size"]
    for s in strategies:
        header += [f"{s} ms", f"{s} Gbit/s", f"{s} ratio", f"{s} bound"]
    header += [f"passing speedup vs {s}" for s in others]
    rows = []
    for size, at in by_size(runs).items():
        row = [format_size(size)]
        for s in strategies:
            r = at.get(s)
            if r is None:
                row += ["", "", "", ""]
                continue
            ms = millis(r.mean_s) + ("" if r.correct else " **WRONG**")
            row += [ms, number(r.algbw_gbps, ".3f"), number(r.ratio, ".2f"), r.bound]
        sp = speedups(at)
        row += [number(sp[s], ".2f") + "x" if s in sp else "" for s in others]
        rows.append(row)
    return md_table(header, rows)


def _cpu_bound_line(runs: list[Run]) -> list[str]:
    """Which runs this machine's CPU, not the emulated links, limited: the analytical model's
    bound column is calibrated on one switch process alone, not on a fabric's switches and
    agents sharing the cores."""
    shaped = [(r, b) for r in runs if (b := link_busy(r)) is not None]
    if not shaped:
        return []
    order = order_strategies(r.strategy for r in runs)
    under = sorted(((r, b) for r, b in shaped if b < CPU_BOUND_BELOW),
                   key=lambda rb: (rb[0].size_bytes, order.index(rb[0].strategy)))
    limit = f"{CPU_BOUND_BELOW:.0%}"
    if not under:
        lines = [f"Every run's busiest host link was at least {limit} busy during a call."]
    else:
        named = ", ".join(f"{r.strategy} {format_size(r.size_bytes)} ({b:.0%})"
                          for r, b in under)
        lines = [f"**CPU-bound** (the busiest host link under {limit} busy during a call, so "
                 f"this machine's CPU, not the emulated links, set the time): {named}."]
    return lines + _cpu_saturated(runs, order) + [""]


def _cpu_saturated(runs: list[Run], order: list[str]) -> list[str]:
    """The runs during whose calls the machine's CPUs were nearly all busy (kernel included,
    which the model leaves out): their time may be this machine's even with busy links."""
    full = sorted((r for r in runs if r.cpu_busy >= SATURATED_FROM),
                  key=lambda r: (r.size_bytes, order.index(r.strategy)))
    if not full:
        return []
    named = ", ".join(f"{r.strategy} {format_size(r.size_bytes)} ({r.cpu_busy:.0%})"
                      for r in full)
    return [f"The CPUs were at least {SATURATED_FROM:.0%} busy during the calls of: {named}; "
            "their times may be this machine's as well as the links' (the model's host bound "
            "leaves out the kernel, which carries every frame through the shaped veths)."]


def _traffic_table(runs: list[Run]) -> list[str]:
    """Bytes per host link and switch packets at the largest size: the traffic that explains
    the times (ring sends ~2x the tensor, PASSING/INA ~1x)."""
    size = max(r.size_bytes for r in runs)
    at = by_size(runs)[size]
    rows = []
    for s in order_strategies(at):
        r = at[s]
        rows.append([s, format_size(r.host_tx_bytes), format_size(r.host_rx_bytes),
                     number(r.host_tx_bytes / size, ".2f") + "x", str(r.switch_packets),
                     str(r.slots)])
    header = ["strategy", "tx per host link", "rx per host link", "tx / tensor size",
              "switch packets", "slots"]
    return [f"Traffic per all-reduce at {format_size(size)}:", ""] + md_table(header, rows)


def _speedup_line(key: GroupKey, runs: list[Run]) -> str:
    size = largest_passing_size(runs)
    if size is None:
        return f"- {group_label(key)}: no PASSING run"
    sp = speedups(by_size(runs)[size])
    parts = [f"{b} {sp[b]:.2f}x" if b in sp else f"{b} n/a" for b in SUMMARY_BASELINES]
    return (f"- PASSING speedup over ps/ring/hier-ring/ina at the largest size: "
            f"{', '.join(parts)} ({format_size(size)}; {group_label(key)})")


def allreduce_section(runs: list[Run]) -> list[str]:
    groups = group_runs(runs)
    main = main_group(groups)
    ordered = [main] + [k for k in groups if k != main]  # main configuration first
    lines = ["### Summary", ""] + [_speedup_line(k, groups[k]) for k in ordered] + [""]
    for key in ordered:
        title = group_label(key) + (" (main)" if key == main and len(groups) > 1 else "")
        lines += [f"### All-reduce: {title}", ""]
        lines += _group_table(groups[key]) + [""]
        lines += _cpu_bound_line(groups[key])
        lines += _traffic_table(groups[key]) + [""]
    return lines


def _accuracy_check(row: TrainRow, ring: TrainRow | None) -> tuple[str, bool]:
    """Cell text and whether it failed: aggregation must not change what the model learns."""
    if row.strategy == "ring":
        return "reference", False
    if ring is None:
        return "n/a (no ring run)", False
    diff = row.accuracy - ring.accuracy
    if not math.isfinite(diff):
        return "n/a", False
    if abs(diff) <= ACCURACY_TOLERANCE:
        return f"yes ({diff:+.4f})", False
    return f"**NO** ({diff:+.4f})", True


def training_section(rows: list[TrainRow]) -> list[str]:
    configs = training_by_group(rows)
    lines = ["### Training", ""]
    failed: list[str] = []
    for key, at in configs.items():
        lines += [f"{train_label(key)}:", ""]
        table = []
        for s in order_strategies(at):
            r = at[s]
            check, bad = _accuracy_check(r, at.get("ring"))
            if bad:
                failed.append(f"{s} ({train_label(key)})")
            tta = "not measured" if math.isnan(r.time_to_target_s) else \
                "not reached" if math.isinf(r.time_to_target_s) else \
                f"{r.time_to_target_s:.1f} s"
            table.append([s, number(r.iters_per_s, ".3f"), number(r.accuracy, ".4f"),
                          number(r.final_loss, ".4f"), tta, check])
        header = ["strategy", "iters/s", "accuracy", "final loss", "time to target accuracy",
                  "accuracy equal to ring"]
        lines += md_table(header, table) + [""]
    if failed:
        lines += [f"**WARNING: accuracy differs from ring by more than {ACCURACY_TOLERANCE} "
                  f"for: {', '.join(failed)}**", ""]
    return lines

