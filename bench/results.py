"""The sweep's CSV files as typed rows, and how runs group: shared by bench/report.py (the
Markdown results) and bench/plots.py (the PNGs), so both agree on what a group, the main group
and a speedup are. csv module only, so it runs without pandas.

The sweep writes `allreduce.csv` (one row per configuration and strategy) and optionally
`training.csv`.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from topologies import link_rate

# Fixed order everywhere (tables, legends), PASSING first; unknown strategies follow sorted.
STRATEGY_ORDER = ("passing", "ina", "ring", "hier-ring", "ps")

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
    # The machine's CPUs busy during the timed calls (topologies.cpu_load); older files lack it.
    cpu_busy: float = math.nan


@dataclass(frozen=True)
class TrainRow(Configured):
    """One training run: a row of training.csv. Files written before the wide workload have
    no model (the digits MLP was the only one) and no time to the target accuracy."""

    steps: int
    seconds: float
    iters_per_s: float
    accuracy: float
    final_loss: float
    model: str = "digits-mlp"
    time_to_target_s: float = math.nan


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
    """Rows of `cls`; a field with a default may lack its column (older files)."""
    rows = _read_rows(path, columns)
    fields = dataclasses.fields(cls)
    return [cls(**{f.name: _PARSERS[f.type](r[f.name]) for f in fields if r.get(f.name)
                   is not None}) for r in rows]


def load_allreduce(path: Path) -> list[Run]:
    return _load(path, ALLREDUCE_COLUMNS, Run)


def load_training(path: Path) -> list[TrainRow]:
    return _load(path, TRAINING_COLUMNS, TrainRow)


# ---------------------------------------------------------------------------- grouping

def order_strategies(names: Iterable[str]) -> list[str]:
    present = set(names)
    known = [s for s in STRATEGY_ORDER if s in present]
    return known + sorted(present - set(STRATEGY_ORDER))


# Next to training.csv: every training run's accuracy curve (bench.plots draws it).
CURVES_FILE = "training_curves.json"

# (configuration, model): the training runs that differ only in strategy.
TrainKey = tuple[GroupKey, str]


def training_by_group(rows: Iterable[TrainRow]) -> dict[TrainKey, dict[str, TrainRow]]:
    """Training rows by configuration and model, then strategy (a repeated strategy keeps the
    last)."""
    out: dict[TrainKey, dict[str, TrainRow]] = {}
    for r in rows:
        out.setdefault((r.group, r.model), {})[r.strategy] = r
    return out


def time_to(curve: Iterable[tuple[float, int, float]], target: float) -> float | None:
    """The training seconds at the first point of an accuracy curve ((seconds, step,
    accuracy), in order) that reaches `target`; None if none does."""
    return next((t for t, _, acc in curve if acc >= target), None)


def train_label(key: TrainKey) -> str:
    group, model = key
    return f"{model}, {group_label(group)}"


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


def host_link_busy(tx_bytes: float, rx_bytes: float, mean_s: float,
                   bw_mbps: float) -> float | None:
    """The share of its rate the busiest host link used during a call, from its bytes per call
    each way (None on unshaped links or without a time): under link_rate.CPU_BOUND_BELOW the
    link did not set the time."""
    if not bw_mbps or not mean_s > 0:
        return None
    return link_rate.busy(max(tx_bytes, rx_bytes), mean_s, bw_mbps)


def link_busy(r: Run) -> float | None:
    """host_link_busy of a run."""
    return host_link_busy(r.host_tx_bytes, r.host_rx_bytes, r.mean_s, r.bw_mbps)


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
