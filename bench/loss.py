"""All-reduce under random frame loss on a Mininet fabric: each strategy's time with loss against
its own time without, in one run (issue 15's loss goals: 1% on every link at most 1.3x the
no-loss time, 5% at most 2.5x, 20% on one host link at most 3x).

    sudo .venv/bin/python -m bench.loss                       # leafspine as shipped, 256K values
    sudo .venv/bin/python -m bench.loss --strategies passing --iters 5 --json-out loss.json

Loss is nftables' random drop on both interfaces of a link (topologies/link_loss.py), so a lost
frame is lost in either direction. Every call's result is checked on every host: a run counts
only if all its calls were correct. A run's time is the slowest host's mean over its timed calls
(a warm-up call comes first); the whole sequence of conditions runs --rounds times, and a
condition's time is the median of its rounds."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.progress import Progress
from bench.sweep_cli import comma_list, positive_int, strategy_name
from controller.topology import load
from passing.pipeline_files import topology_file
from passing_agent import STRATEGIES
from passing_agent.sizes import parse_size
from topologies.exclusive import busy_message
from topologies.network import PassingNetwork

# How long the hosts' TCP meetings may take under loss (RunOptions.rendezvous_timeout).
RENDEZVOUS_UNDER_LOSS_S = 300.0


@dataclass(frozen=True)
class Condition:
    """Loss of `percent` % on every link, or on the link of the topology's first host only."""

    percent: float
    one_host_link: bool = False

    @property
    def label(self) -> str:
        if not self.percent:
            return "no loss"
        return f"{self.percent:g}% on " + ("one host link" if self.one_host_link
                                          else "every link")


NO_LOSS = Condition(0.0)
# The goals: (condition, most its time may be, as a multiple of the no-loss time).
GOALS = ((Condition(1.0), 1.3), (Condition(5.0), 2.5), (Condition(20.0, True), 3.0))


def _condition(text: str) -> Condition:
    """`P` (P % on every link) or `P@host` (P % on the first host's link)."""
    pct, _, where = text.partition("@")
    try:
        value = float(pct)
    except ValueError:
        value = -1.0
    if not 0 < value < 100 or where not in ("", "host"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a loss percentage in (0, 100), on every link, or P@host for the first "
            "host's link only (e.g. 1, 5, 20@host)")
    return Condition(value, where == "host")


@dataclass
class Row:
    condition: str
    percent: float
    one_host_link: bool
    strategy: str
    mean_s: float  # median over the rounds of the slowest host's mean; nan if a host failed
    rounds_s: list[float]  # each round's slowest-host mean
    correct: bool  # every call on every host, every round
    resends: int  # PASSING packets resent, all hosts, calls and rounds (0 for the baselines)
    packets: int  # PASSING packets sent, resends included, likewise
    vs_no_loss: float  # mean_s / the same strategy's no-loss mean_s
    goal: float | None  # the bound on vs_no_loss for this condition, if it sets one
    errors: dict[str, str]


def _slowest_mean(reports: dict[str, dict]) -> float:
    """The slowest host's mean call time of one run; nan unless every host finished."""
    if not reports or not all(r.get("ok") for r in reports.values()):
        return float("nan")
    return max(float(r["mean_s"]) for r in reports.values())


def summarize(cond: Condition, strategy: str, runs: list[dict[str, dict]],
              base: float | None) -> Row:
    """A condition's row from every host's passing-agent report of each round's run; `base`
    is the strategy's no-loss time (None for the no-loss row itself)."""
    means = [_slowest_mean(r) for r in runs]
    # The median: a round that another process on this machine slowed counts less.
    mean = float(np.median(means)) if means else float("nan")
    every = [r for run in runs for r in run.values()]
    correct = bool(every) and all(r.get("ok") and r.get("correct") for r in every)
    # The goals are PASSING's; the baselines' rows show how they fare beside it.
    goal = next((g for c, g in GOALS if c == cond), None) if strategy == "passing" else None
    return Row(cond.label, cond.percent, cond.one_host_link, strategy, mean, means, correct,
               sum(int(r.get("retransmissions", 0)) for r in every),
               sum(int(r.get("packets", 0)) for r in every),
               mean / base if base else (1.0 if cond == NO_LOSS else float("nan")), goal,
               {h: str(r.get("error")) for run in runs for h, r in run.items()
                if not r.get("ok")})


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table: time, multiple of no loss (and the goal), resends."""
    out = ["| loss | strategy | time per call | x no loss | goal | resent packets | correct |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        goal = "" if r.goal is None else (f"<= {r.goal:g}x " + (
            "met" if r.vs_no_loss <= r.goal else "not met"))
        resent = f"{r.resends} of {r.packets} ({r.resends / r.packets:.1%})" if r.packets \
            else "-"
        out.append(f"| {r.condition} | {r.strategy} | {r.mean_s:.3f} s | {r.vs_no_loss:.3f}x | "
                   f"{goal} | {resent} | {'yes' if r.correct else 'NO'} |")
    return "\n".join(out)


def _apply(pnet: PassingNetwork, cond: Condition) -> None:
    first = min(pnet.topo.hosts)
    for a, b, _ in pnet.links():
        on = cond.percent and (not cond.one_host_link or a == first)
        pnet.set_loss(a, b, cond.percent if on else 0.0)


def run(topo: str, target: str, size: int, strategies: list[str], conditions: list[Condition],
        iters: int, rounds: int, work: Path, log) -> list[Row]:
    """Every condition with every strategy, the whole sequence `rounds` times over (so that a
    slow spell of this machine does not fall on one condition only); a row per condition and
    strategy."""
    topo_path = topology_file(topo)  # its links as shipped
    pnet = PassingNetwork(load(topo_path), topo_path, target, work / f"run-{topo}-{target}")
    pnet.start()
    runs: dict[tuple[Condition, str], list[dict[str, dict]]] = {}
    progress = Progress(rounds * len(conditions) * len(strategies))
    try:
        job_id = 1
        pnet.create_job(job_id)
        for _ in range(rounds):
            for cond in conditions:
                _apply(pnet, cond)
                for strategy in strategies:
                    # Every host's TCP meetings (session, process groups) cross lossy links
                    # too: at 20% on every link TCP's backoff alone took over a minute once.
                    reports = pnet.allreduce(str(size), job_id, iters, timeout=120.0,
                                             strategy=strategy,
                                             rendezvous_timeout=RENDEZVOUS_UNDER_LOSS_S)
                    runs.setdefault((cond, strategy), []).append(reports)
                    one = summarize(cond, strategy, [reports], None)
                    log(f"{progress.step()} {cond.label:22s} {strategy:9s}: "
                        f"{one.mean_s:8.3f} s, {one.resends} resent, "
                        f"{'correct' if one.correct else 'WRONG or failed'}"
                        + (f" {one.errors}" if one.errors else ""))
    finally:
        pnet.stop()
    rows = []
    for strategy in strategies:
        base = summarize(NO_LOSS, strategy, runs[NO_LOSS, strategy], None)
        rows.append(base)
        ok_base = base.mean_s if base.correct else None
        rows += [summarize(c, strategy, runs[c, strategy], ok_base)
                 for c in conditions if c != NO_LOSS]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.loss", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--topo", default="leafspine", help="shipped topology, its links as "
                    "shipped (default leafspine)")
    ap.add_argument("--target", choices=["model", "bmv2"], default="model")
    ap.add_argument("--size", type=parse_size, default=parse_size("256K"),
                    help="float32 values per tensor, K/M suffixes (default 256K: 1 MiB)")
    ap.add_argument("--strategies", type=comma_list(strategy_name), default=["passing", "ring"],
                    metavar="S[,...]", help=f"of {', '.join(STRATEGIES)} "
                    "(default passing,ring)")
    ap.add_argument("--loss", type=comma_list(_condition), default=[c for c, _ in GOALS],
                    metavar="P[,...]", help="loss conditions after the no-loss run: P %% on "
                    "every link, or P@host on the first host's link (default 1,5,20@host)")
    ap.add_argument("--iters", type=positive_int, default=3, help="timed calls per run (default 3)")
    ap.add_argument("--rounds", type=positive_int, default=2,
                    help="times the whole sequence of conditions runs; each row is the median "
                         "over them (default 2)")
    ap.add_argument("--json-out", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    try:
        topology_file(args.topo)
    except FileNotFoundError as e:
        ap.error(f"--topo: {e}")
    if os.geteuid() != 0:
        print("bench.loss: Mininet needs root (sudo)", file=sys.stderr)
        return 2
    busy = busy_message()
    if busy:
        print(f"bench.loss: {busy}", file=sys.stderr)
        return 2
    conditions = [NO_LOSS, *dict.fromkeys(args.loss)]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="passing-loss-") as work:
        rows = run(args.topo, args.target, args.size, args.strategies, conditions, args.iters,
                   args.rounds, Path(work), lambda msg: print(msg, flush=True))
    print(f"\n{args.topo}, {args.target}, links as shipped, {args.size} values "
          f"({args.size * 4 / (1 << 20):g} MiB), {args.iters} timed calls per run, "
          f"median of {args.rounds} rounds, "
          f"{time.monotonic() - t0:.0f} s in all\n")
    print(table(rows))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0 if all(r.correct for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
