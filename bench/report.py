"""Turn the sweep's CSV files into the Markdown results section of docs/benchmarks.md.

The sweep writes `allreduce.csv` (one row per configuration and strategy) and optionally
`training.csv`; this module reads them (csv module only, so it runs without pandas), and
rewrites only the text between the results markers of the report, so the human-written
parts of the document survive every rerun.

    python -m bench.report --allreduce runs/allreduce.csv --training runs/training.csv \
        --plots-dir docs/benchmarks --out docs/benchmarks.md

The loaders and grouping helpers here are shared with bench/plots.py, which imports them, so
both outputs agree on what a group, the main group and a speedup are.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import math
import os
import platform
import shlex
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"

# Fixed order everywhere (tables, legends), PASSING first; unknown strategies follow sorted.
STRATEGY_ORDER = ("passing", "ina", "ring", "hier-ring", "ps")
# Order of the headline summary line, weakest baseline first as the brief words it.
SUMMARY_BASELINES = ("ps", "ring", "hier-ring", "ina")
ACCURACY_TOLERANCE = 0.01

ALLREDUCE_COLUMNS = (
    "topology", "target", "strategy", "hosts", "gpus_per_host", "size_bytes", "bw_mbps",
    "iters", "mean_s", "std_s", "algbw_gbps", "host_tx_bytes", "host_rx_bytes",
    "switch_packets", "slots", "predicted_s", "ratio", "bound", "correct",
)
TRAINING_COLUMNS = (
    "topology", "target", "strategy", "hosts", "gpus_per_host", "bw_mbps", "steps", "seconds",
    "iters_per_s", "accuracy", "final_loss",
)

# (topology, target, bw_mbps, hosts, gpus_per_host): the runs that differ only in size.
GroupKey = tuple[str, str, float, int, int]

PLOT_CAPTIONS = {
    "allreduce_time": "All-reduce time vs tensor size (dashed: analytical prediction)",
    "speedup": "Speedup of PASSING over each baseline",
    "ratio": "Measured / predicted time per strategy",
    "scaling": "All-reduce time vs number of hosts / GPUs per host",
    "bandwidth": "All-reduce time vs link bandwidth",
    "training": "Training throughput and final accuracy",
}


@dataclass(frozen=True)
class Configured:
    """What identifies a configuration in both CSVs: runs with the same group differ only in
    tensor size (and strategy)."""

    topology: str
    target: str
    strategy: str
    hosts: int
    gpus_per_host: int
    bw_mbps: float

    @property
    def group(self) -> GroupKey:
        return (self.topology, self.target, self.bw_mbps, self.hosts, self.gpus_per_host)


@dataclass(frozen=True)
class Run(Configured):
    """One all-reduce measurement: a (configuration, strategy) row of allreduce.csv."""

    size_bytes: int
    iters: int
    mean_s: float
    std_s: float
    algbw_gbps: float
    host_tx_bytes: float
    host_rx_bytes: float
    switch_packets: int
    slots: int
    predicted_s: float
    ratio: float
    bound: str
    correct: bool


@dataclass(frozen=True)
class TrainRow(Configured):
    """One training run: a row of training.csv."""

    steps: int
    seconds: float
    iters_per_s: float
    accuracy: float
    final_loss: float


# ---------------------------------------------------------------------------- loading

def _read_rows(path: Path, columns: Iterable[str]) -> list[dict[str, str]]:
    """Rows of a CSV as dicts; a missing column is an error here, not a KeyError later,
    because a sweep/report mismatch should name the column."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        return [row for row in reader if any((v or "").strip() for v in row.values())]


def _int(s: str) -> int:
    # int(float(..)) so "3.0" written by a float-typed writer still parses.
    return int(float(s))


def _float(s: str) -> float:
    return float(s) if s.strip() else math.nan


def parse_bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {s!r}")


# A field's annotation (a string here: postponed annotations) names how its column parses.
_PARSERS: dict[str, Callable[[str], object]] = {"str": str, "int": _int, "float": _float,
                                                "bool": parse_bool}


def _load(path: Path, columns: Iterable[str], cls: type):
    rows = _read_rows(path, columns)
    fields = dataclasses.fields(cls)
    return [cls(**{f.name: _PARSERS[f.type](r[f.name]) for f in fields}) for r in rows]


def load_allreduce(path: Path) -> list[Run]:
    return _load(path, ALLREDUCE_COLUMNS, Run)


def load_training(path: Path) -> list[TrainRow]:
    return _load(path, TRAINING_COLUMNS, TrainRow)


# ---------------------------------------------------------------------------- grouping

def order_strategies(names: Iterable[str]) -> list[str]:
    present = set(names)
    known = [s for s in STRATEGY_ORDER if s in present]
    return known + sorted(present - set(STRATEGY_ORDER))


def training_by_group(rows: Iterable[TrainRow]) -> dict[GroupKey, dict[str, TrainRow]]:
    """Training rows by configuration, then strategy (a repeated strategy keeps the last)."""
    out: dict[GroupKey, dict[str, TrainRow]] = {}
    for r in rows:
        out.setdefault(r.group, {})[r.strategy] = r
    return out


def group_runs(runs: Iterable[Run]) -> dict[GroupKey, list[Run]]:
    """Runs by group, groups in order of first appearance (the sweep's order)."""
    groups: dict[GroupKey, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.group, []).append(r)
    return groups


def main_group(groups: dict[GroupKey, list[Run]]) -> GroupKey | None:
    """The group with the most rows (ties: first in the sweep): the sweep's main configuration,
    the others being scaling or bandwidth variations of it."""
    if not groups:
        return None
    return max(groups, key=lambda k: len(groups[k]))  # max keeps the first of equal keys


def by_size(runs: Iterable[Run]) -> dict[int, dict[str, Run]]:
    """size -> strategy -> run, sizes ascending. A repeated (size, strategy) keeps the last row,
    i.e. a rerun appended to the CSV wins."""
    table: dict[int, dict[str, Run]] = {}
    for r in runs:
        table.setdefault(r.size_bytes, {})[r.strategy] = r
    return dict(sorted(table.items()))


def speedups(at_size: dict[str, Run]) -> dict[str, float]:
    """Baseline mean / PASSING mean for every other strategy at one size (>1: PASSING faster)."""
    p = at_size.get("passing")
    if p is None or not p.mean_s > 0:
        return {}
    return {s: r.mean_s / p.mean_s for s, r in at_size.items() if s != "passing"}


def largest_passing_size(runs: Iterable[Run]) -> int | None:
    """The largest size PASSING ran at: speedups are quoted there, since large tensors are
    where aggregation bandwidth, not latency, decides."""
    sizes = [r.size_bytes for r in runs if r.strategy == "passing"]
    return max(sizes) if sizes else None


def bw_label(bw_mbps: float) -> str:
    return "unshaped" if not bw_mbps else f"{bw_mbps:g} Mbit/s"


def group_label(key: GroupKey) -> str:
    topology, target, bw, hosts, gpus = key
    return f"{topology}/{target}, {hosts}x{gpus} GPUs, {bw_label(bw)}"


def format_size(n: float) -> str:
    """Binary units, as tensor sizes are powers of two: 65536 -> '64 KiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.4g} B"


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
        if len(configs) > 1:
            lines += [f"{group_label(key)}:", ""]
        table = []
        for s in order_strategies(at):
            r = at[s]
            check, bad = _accuracy_check(r, at.get("ring"))
            if bad:
                failed.append(f"{s} ({group_label(key)})")
            table.append([s, _num(r.iters_per_s, ".3f"), _num(r.accuracy, ".4f"),
                          _num(r.final_loss, ".4f"), check])
        header = ["strategy", "iters/s", "accuracy", "final loss", "accuracy equal to ring"]
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


def write_report(allreduce_csv: Path, training_csv: Path | None, plots: list[Path], out: Path,
                 meta: dict) -> None:
    out = Path(out)
    section = render_section(Path(allreduce_csv), Path(training_csv) if training_csv else None,
                             [Path(p) for p in plots], out, meta)
    existing = out.read_text() if out.exists() else None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(merge_into(existing, section))


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
    args = ap.parse_args(argv)
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
    write_report(args.allreduce, args.training, plots, args.out, meta)
    print(f"wrote {args.out} ({len(plots)} plots in {plots_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
