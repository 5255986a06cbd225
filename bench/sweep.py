"""`make bench`: every all-reduce strategy on the same Mininet fabric, measured and compared with
the analytical model (bench/analytic.py); then data-parallel training with each; then the CSVs,
plots and docs/benchmarks.md.

    sudo .venv/bin/python -m bench.sweep                # the full sweep (make bench)
    sudo .venv/bin/python -m bench.sweep --quick        # small sizes, every strategy checked
    sudo .venv/bin/python -m bench.sweep --sizes 1M --strategies passing,ring   # a subset:
        # one size (float32 values), two strategies, leafspine's links as shipped

A subset (any of --topo, --bw, --gpus, --sizes, --strategies, --hosts) replaces the plan: every
combination of the bandwidths and GPU counts given, each with the sizes and strategies given
(default: the shipped topology's own link rates, its GPUs, 1M values, every strategy). Every run
prints a progress line: run i of N, time so far, and an estimate of the time left.

Per run it records the all-reduce time (the slowest host's mean over its timed calls), the
bytes each host's link carried per timed call (its interface counters in the host's namespace,
read by the host's agent around its timed calls), the packets the switches received (their
ports' counters; for passing and ina also the P4 job counters), the slots of the job and the
model's prediction. The switch counters' deltas cover the warm-up call too and are divided by
the calls made, except `retransmissions`: all hosts' over all the run's calls. A run
whose calls the model predicts at --long-call seconds or more makes one timed call and no
warm-up (call_plan), others a warm-up and --iters timed calls (the CSV's `warmup` and `iters`
say which): at the sweep's largest sizes the extra calls were most of the sweep's time.

Scenarios in a row that differ only in link rate run on one network, its links re-shaped
between them and read back from the kernel (fabric_groups, topologies/link_rate.py); a new GPU
count or target starts a new network.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from bench import report, results
from bench.analytic import Rates
from bench.progress import Progress
from bench.report_readme import readme_for
from bench.sweep_cli import parse_args
from bench.sweep_plan import fabric_groups, runs_in, scenarios, subset
from bench.sweep_runs import agent_rate, calibrate, run_fabric
from passing_agent import STRATEGIES
from passing_agent.sizes import parse_size
from topologies.exclusive import busy_message

# What bench.report reads, then what only the CSV keeps (the model's three bounds, and more).
ALLREDUCE_COLUMNS = [*results.ALLREDUCE_COLUMNS, "agg_packets", "predicted_link_s",
                     "predicted_switch_s", "predicted_host_s", "retransmissions", "warmup",
                     "cpu_busy"]
# speculated / spec_missed: the hosts' fragments sent at a speculative scale, and those sent
# again (docs/protocol.md, "Speculative scale"): how often real gradients beat the prediction.
TRAINING_COLUMNS = [*results.TRAINING_COLUMNS, "model", "time_to_target_s", "speculated",
                    "spec_missed"]


class CsvOut:
    def __init__(self, path: Path, columns: list[str]):
        self.fh = path.open("w", newline="")
        self.w = csv.DictWriter(self.fh, columns, extrasaction="ignore")
        self.w.writeheader()
        self.rows: list[dict] = []

    def __call__(self, row: dict) -> None:
        self.w.writerow(row)
        self.fh.flush()  # a long sweep that is interrupted keeps what it measured
        self.rows.append(row)

    def close(self) -> None:
        self.fh.close()


def main(argv: list[str] | None = None) -> int:
    args, picked = parse_args(argv, __doc__)
    if os.geteuid() != 0:
        print("bench.sweep: Mininet needs root (sudo make bench)", file=sys.stderr)
        return 2
    busy = busy_message()  # before minutes of calibration, not after
    if busy:
        print(f"bench.sweep: {busy}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if picked:
        todo = subset(args.topo or "leafspine", args.target, args.bw or [None], args.gpus or [0],
                      [4 * n for n in args.sizes or [parse_size("1M")]],
                      args.strategies or list(STRATEGIES), args.hosts or [],
                      args.train_steps, args.iters, args.train_model, args.target_accuracy)
    else:
        todo = scenarios(args.quick, args.target)
    todo = [dataclasses.replace(sc, long_call_s=args.long_call) for sc in todo]
    log_file = (out / "sweep.log").open("w")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    t0 = time.time()
    rates, calib = {}, {}
    agent_pps = agent_rate()
    for target in sorted({sc.target for sc in todo}):
        calib[target] = calibrate(target, 1.0 if args.quick else args.calibrate_seconds,
                                  agent_pps)
        rates[target] = Rates(calib[target]["switch_agg_pps"], calib[target]["switch_fwd_pps"],
                              calib[target]["agent_pps"], calib[target]["cores"])
        log(f"calibration {target}: {calib[target]}")
    (out / "calibration.json").write_text(json.dumps(calib, indent=2) + "\n")
    a_csv, t_csv = out / "allreduce.csv", out / "training.csv"
    writer_a, writer_t = CsvOut(a_csv, ALLREDUCE_COLUMNS), CsvOut(t_csv, TRAINING_COLUMNS)
    curves: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="passing-bench-") as tmp:
            progress = Progress(runs_in(todo))
            for group in fabric_groups(todo):
                run_fabric(group, rates, Path(tmp), writer_a, writer_t, log, progress, curves)
    finally:
        writer_a.close()
        writer_t.close()
        (out / results.CURVES_FILE).write_text(json.dumps(curves) + "\n")
    wrong = [r for r in writer_a.rows if not r["correct"]]
    for r in wrong:
        log(f"WRONG: {r['strategy']} {r['size_bytes']} bytes: {r.get('errors')}")
    log(f"sweep done in {time.time() - t0:.0f} s: {len(writer_a.rows)} all-reduce runs, "
        f"{len(writer_t.rows)} training runs, {len(wrong)} wrong; CSVs in {out}")
    if args.report:
        report_path = Path(args.report)
        plots_dir = report_path.parent / report_path.stem
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": f"{platform.node()}, {platform.platform()}, "
                           f"{os.cpu_count()} cores",
                "command": "make bench" + (" (quick)" if args.quick else ""),
                "sweep time": f"{time.time() - t0:.0f} s",
                "calls per run": "a warm-up, then " + (
                    f"the timed calls in the CSV's iters column; one timed call and no warm-up "
                    f"where the analytical model predicts {args.long_call:g} s or more"
                    if args.long_call else "the timed calls in the CSV's iters column"),
                "calibration": "; ".join(
                    f"{t}: switch {c['switch_agg_pps']:.0f} aggregation / "
                    f"{c['switch_fwd_pps']:.0f} forwarding packets/s (per CPU second "
                    f"{c['switch_agg_cpu_pps']:.0f} / {c['switch_fwd_cpu_pps']:.0f}), agent "
                    f"{c['agent_pps']:.0f} packets/s" for t, c in calib.items())}
        from bench.plots import make_plots
        plots = make_plots(a_csv, t_csv if writer_t.rows else None, plots_dir)
        # make bench's report (docs/benchmarks.md) also rewrites the README's result block.
        readme = readme_for(report_path)
        report.write_report(a_csv, t_csv if writer_t.rows else None, plots, report_path, meta,
                            readme=readme)
        log(f"report {report_path}, plots in {plots_dir}"
            + (f", result block of {readme}" if readme else ""))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
