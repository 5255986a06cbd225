"""Turn the sweep's CSV files into the Markdown results section of docs/benchmarks.md.

The sweep writes `allreduce.csv` (one row per configuration and strategy) and optionally
`training.csv`; this module reads them (with bench/results.py) and rewrites only the text
between the results markers of the report, so the human-written parts of the document survive
every rerun.

    python -m bench.report --allreduce runs/allreduce.csv --training runs/training.csv \
        --plots-dir docs/benchmarks --out docs/benchmarks.md --readme README.md

With `--readme` it also rewrites the README's result block (between its bench markers) from the
same runs: the headline table and PASSING's speedup in every configuration, every number as the
report prints it, so tests/bench/test_readme_numbers.py can hold the one to the other.

The loaders and grouping helpers are in bench/results.py, shared with bench/plots.py, so both
outputs agree on what a group, the main group and a speedup are.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import shlex
import sys
from pathlib import Path

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
    load_allreduce,
    load_training,
    main_group,
    order_strategies,
    speedups,
    train_label,
    training_by_group,
)
from topologies.cpu_load import SATURATED_FROM
from topologies.link_rate import CPU_BOUND_BELOW

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
# The README's result block (README.md, "The result"): written from the same runs as the report.
README_BEGIN = "<!-- bench:begin -->"
README_END = "<!-- bench:end -->"

# Order of the headline summary line, weakest baseline first as the brief words it.
SUMMARY_BASELINES = ("ps", "ring", "hier-ring", "ina")
ACCURACY_TOLERANCE = 0.01

PLOT_CAPTIONS = {
    "allreduce_time": "All-reduce time vs tensor size (dashed: analytical prediction)",
    "speedup": "Speedup of PASSING over each baseline",
    "ratio": "Measured / predicted time per strategy",
    "scaling": "All-reduce time vs number of hosts / GPUs per host",
    "bandwidth": "All-reduce time vs link bandwidth",
    "training": "Training throughput and final accuracy",
    "training_curves": "training_curves",
}


# ---------------------------------------------------------------------------- summary

def summary(allreduce_csv: Path) -> dict:
    """Per group (keyed by its label): PASSING's speedup over each baseline and its
    measured/predicted ratio at the largest size PASSING ran at; for the closing report."""
    out: dict[str, dict] = {}
    for key, runs in group_runs(load_allreduce(allreduce_csv)).items():
        size = largest_passing_size(runs)
        at = by_size(runs).get(size, {}) if size is not None else {}
        passing = at.get("passing")
        out[group_label(key)] = {
            "topology": key[0], "target": key[1], "bw_mbps": key[2], "hosts": key[3],
            "gpus_per_host": key[4], "size_bytes": size,
            "speedup": speedups(at),
            "passing_ratio": passing.ratio if passing else None,
            "passing_bound": passing.bound if passing else None,
        }
    return out


# ---------------------------------------------------------------------------- markdown

def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _num(x: float, fmt: str) -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, fmt)


def _ms(seconds: float) -> str:
    """Milliseconds to about four significant digits, never in exponent form."""
    ms = seconds * 1e3
    if not (math.isfinite(ms) and ms > 0):
        return _num(ms, ".3f")
    return f"{ms:.{min(4, max(0, 3 - math.floor(math.log10(ms))))}f}"


def _meta_section(meta: dict[str, str]) -> list[str]:
    return ["Run:", ""] + [f"- **{k}**: {v}" for k, v in meta.items()] + [""]


def _correctness_section(runs: list[Run]) -> list[str]:
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
            ms = _ms(r.mean_s) + ("" if r.correct else " **WRONG**")
            row += [ms, _num(r.algbw_gbps, ".3f"), _num(r.ratio, ".2f"), r.bound]
        sp = speedups(at)
        row += [_num(sp[s], ".2f") + "x" if s in sp else "" for s in others]
        rows.append(row)
    return _md_table(header, rows)


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
                     _num(r.host_tx_bytes / size, ".2f") + "x", str(r.switch_packets),
                     str(r.slots)])
    header = ["strategy", "tx per host link", "rx per host link", "tx / tensor size",
              "switch packets", "slots"]
    return [f"Traffic per all-reduce at {format_size(size)}:", ""] + _md_table(header, rows)


def _speedup_line(key: GroupKey, runs: list[Run]) -> str:
    size = largest_passing_size(runs)
    if size is None:
        return f"- {group_label(key)}: no PASSING run"
    sp = speedups(by_size(runs)[size])
    parts = [f"{b} {sp[b]:.2f}x" if b in sp else f"{b} n/a" for b in SUMMARY_BASELINES]
    return (f"- PASSING speedup over ps/ring/hier-ring/ina at the largest size: "
            f"{', '.join(parts)} ({format_size(size)}; {group_label(key)})")


def _allreduce_section(runs: list[Run]) -> list[str]:
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


def _training_section(rows: list[TrainRow]) -> list[str]:
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
            table.append([s, _num(r.iters_per_s, ".3f"), _num(r.accuracy, ".4f"),
                          _num(r.final_loss, ".4f"), tta, check])
        header = ["strategy", "iters/s", "accuracy", "final loss", "time to target accuracy",
                  "accuracy equal to ring"]
        lines += _md_table(header, table) + [""]
    if failed:
        lines += [f"**WARNING: accuracy differs from ring by more than {ACCURACY_TOLERANCE} "
                  f"for: {', '.join(failed)}**", ""]
    return lines


def _plots_section(plots: list[Path], out: Path) -> list[str]:
    # Links relative to the report so they work on GitHub and in a local Markdown viewer.
    lines = ["### Plots", ""]
    for p in plots:
        rel = Path(os.path.relpath(Path(p).resolve(), out.resolve().parent)).as_posix()
        lines += [f"![{PLOT_CAPTIONS.get(Path(p).stem, Path(p).stem)}]({rel})", ""]
    return lines


def render_section(allreduce_csv: Path, training_csv: Path | None, plots: list[Path],
                   out: Path, meta: dict[str, str]) -> str:
    runs = load_allreduce(allreduce_csv)
    lines = ["<!-- generated by bench/report.py: text between the markers is overwritten -->",
             "", "## Results", ""]
    lines += _meta_section(meta)
    lines += _correctness_section(runs) if runs else ["No all-reduce runs in the CSV.", ""]
    if runs:
        lines += _allreduce_section(runs)
    if training_csv is not None:
        lines += _training_section(load_training(training_csv))
    if plots:
        lines += _plots_section(plots, out)
    return "\n".join(lines).rstrip() + "\n"


def merge_into(existing: str | None, section: str) -> str:
    """Replace only the text between the markers; without markers keep what is there and
    append a marked section, so no human-written text is ever lost."""
    block = f"{BEGIN}\n{section}{END}\n"
    if existing is None:
        return ("# PASSING benchmarks\n\nThe section between the results markers is written by "
                "`python -m bench.report`; text outside it is kept.\n\n" + block)
    start = existing.find(BEGIN)
    end = existing.find(END, start + len(BEGIN)) if start >= 0 else -1
    if start < 0 or end < 0:
        return existing.rstrip("\n") + "\n\n" + block
    return existing[:start] + BEGIN + "\n" + section + existing[end:]


# ---------------------------------------------------------------------------- README block

def headline_group(groups: dict[GroupKey, list[Run]]) -> GroupKey | None:
    """The main configuration at the fastest links the run gave it (unshaped counts as
    fastest): with make bench's plan, leafspine with its links as shipped, the regime a user of
    `make run-topology` gets."""
    main = main_group(groups)
    if main is None:
        return None
    same = [k for k in groups if (k[0], k[1], k[3], k[4]) == (main[0], main[1], main[3], main[4])]
    return max(same, key=lambda k: k[2] if k[2] else math.inf)  # max keeps the first of equals


def _readme_cell(at: dict[str, Run], s: str) -> str:
    r = at.get(s)
    if r is None:
        return ""
    cell = f"{_ms(r.mean_s)} ms"
    sp = speedups(at).get(s)
    if s != "passing" and sp is not None:
        cell += f" ({_num(sp, '.2f')}x)"
    return cell + ("" if r.correct else " **WRONG**")


def render_readme_block(allreduce_csv: Path, meta: dict[str, str]) -> str:
    """The README's result block: when and where the run was made, the headline configuration's
    times with PASSING's speedups, and PASSING's speedup in every configuration at its largest
    tensor, the losing and level ones included. Every number is formatted as the report's
    tables format it (the test compares them as printed)."""
    runs = load_allreduce(allreduce_csv)
    lines = ["<!-- written by bench/report.py (make bench) from the runs of the results section of "
             "docs/benchmarks.md; tests/bench/test_readme_numbers.py holds every number to it -->",
             ""]
    wrong = sum(not r.correct for r in runs)
    verdict = (f"every one of its {len(runs)} all-reduce runs correct" if not wrong else
               f"**{wrong} of its {len(runs)} all-reduce runs WRONG**")
    lines += [f"Latest `make bench`: **{meta.get('date', 'n/a')}** on "
              f"{meta.get('machine', 'n/a')}; {verdict}.", ""]
    groups = group_runs(runs)
    head = headline_group(groups)
    if head is None:
        return "\n".join(lines + ["No all-reduce runs."]) + "\n"
    strategies = order_strategies(r.strategy for r in runs)
    lines += [f"Time of one all-reduce (the slowest host's mean) and PASSING's speedup over each "
              f"baseline, `{group_label(head)}`:", ""]
    rows = [[format_size(size)] + [_readme_cell(at, s) for s in strategies]
            for size, at in by_size(groups[head]).items()]
    lines += _md_table(["tensor", *strategies], rows) + [""]
    others = [s for s in strategies if s != "passing"]
    lines += ["PASSING's speedup over each baseline in every configuration of the run, at its "
              "largest tensor (a speedup under one: PASSING was the slower):", ""]
    rows = []
    for key, group in groups.items():
        size = largest_passing_size(group)
        if size is None:
            continue
        at = by_size(group)[size]
        sp = speedups(at)
        rows.append([group_label(key), format_size(size), _readme_cell(at, "passing")]
                    + [_num(sp[s], ".2f") + "x" if s in sp else "" for s in others])
    lines += _md_table(["configuration", "tensor", "passing", *(f"vs {s}" for s in others)], rows)
    return "\n".join(lines) + "\n"


def merge_readme(existing: str, block: str, name: str = "README") -> str:
    """Replace the text between the README's bench markers; a README without them is an error,
    not a place to append results to."""
    start = existing.find(README_BEGIN)
    end = existing.find(README_END, start + len(README_BEGIN)) if start >= 0 else -1
    if start < 0 or end < 0:
        raise ValueError(f"{name}: no {README_BEGIN} ... {README_END} block to write the "
                         "results into")
    return existing[:start] + README_BEGIN + "\n" + block + existing[end:]


def readme_for(report: Path) -> Path | None:
    """The checkout's README.md when `report` is the checkout's docs/benchmarks.md (what make
    bench writes), else None: a report written elsewhere (make bench-quick, a subset into another
    file) leaves the README alone."""
    root = Path(__file__).resolve().parents[1]
    readme = root / "README.md"
    if Path(report).resolve() == root / "docs" / "benchmarks.md" and readme.exists():
        return readme
    return None


def write_report(allreduce_csv: Path, training_csv: Path | None, plots: list[Path], out: Path,
                 meta: dict, readme: Path | None = None) -> None:
    """The results section of `out`, and with `readme` that README's result block, from the
    same runs and meta."""
    out = Path(out)
    section = render_section(Path(allreduce_csv), Path(training_csv) if training_csv else None,
                             [Path(p) for p in plots], out, meta)
    existing = out.read_text() if out.exists() else None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(merge_into(existing, section))
    if readme is not None:
        readme = Path(readme)
        readme.write_text(merge_readme(readme.read_text(),
                                       render_readme_block(Path(allreduce_csv), meta),
                                       str(readme)))


# ---------------------------------------------------------------------------- CLI

def default_meta(allreduce_csv: Path, argv: list[str]) -> dict[str, str]:
    targets = sorted({r.target for r in load_allreduce(allreduce_csv)})
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.node()} ({platform.system()} {platform.machine()}, " \
              f"{os.cpu_count()} CPUs)"
    return {"date": now, "machine": machine,
            "command": "`" + shlex.join(["python", "-m", "bench.report", *argv]) + "`",
            "target": ", ".join(targets) or "n/a"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allreduce", type=Path, required=True)
    ap.add_argument("--training", type=Path)
    ap.add_argument("--plots-dir", type=Path,
                    help="where the PNGs go (default: next to --out, named after it)")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    ap.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                    help="add or override a meta line (date, machine, command, target, ...)")
    ap.add_argument("--no-plots", action="store_true",
                    help="link the PNGs already in --plots-dir instead of drawing them")
    ap.add_argument("--readme", type=Path, default=None,
                    help="also rewrite this README's result block (between its bench markers) "
                         "from the same runs")
    args = ap.parse_args(argv)
    if args.readme is not None and not args.readme.exists():
        ap.error(f"--readme: {args.readme} does not exist")
    plots_dir = args.plots_dir or args.out.parent / args.out.stem
    if args.no_plots:
        plots = [plots_dir / f"{n}.png" for n in PLOT_CAPTIONS
                 if (plots_dir / f"{n}.png").exists()]
    else:
        from bench.plots import make_plots  # matplotlib only when drawing
        plots = make_plots(args.allreduce, args.training, plots_dir)
    meta = default_meta(args.allreduce, argv)
    for kv in args.meta:
        key, sep, value = kv.partition("=")
        if not sep:
            ap.error(f"--meta wants KEY=VALUE, got {kv!r}")
        meta[key] = value
    try:
        write_report(args.allreduce, args.training, plots, args.out, meta, readme=args.readme)
    except ValueError as e:  # a README without the bench markers
        print(f"bench.report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({len(plots)} plots in {plots_dir})"
          + (f" and the result block of {args.readme}" if args.readme else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
