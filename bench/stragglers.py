"""Training with a straggler, bulk-synchronous against quorum completion, in Mininet (as root).

    python -m bench.stragglers --out runs/stragglers      # star, model target, shipped links

Runs bench/straggler_train.py with torchrun on every host of a shipped topology (one job over
all its hosts) under these settings, in this order:

    bsp        no straggler         every round waits for everyone
    bsp        straggler            one host (the last) --slow-factor times slower
    quorum, fixed patience         the switch may close a round with --quorum of its hosts
      no straggler, straggler      once a packet waited --patience (PASSING_PATIENCE), at most
                                   PASSING_STALENESS calls in a row; the late host skips the
                                   steps the others completed without it (--catch-up)
    quorum, adaptive patience      the same with PASSING_PATIENCE=--adaptive (MIN..MAX: the
      no straggler, straggler      time rounds with everyone take, within those bounds)
    quorum, adaptive, no skipping  straggler: the late host computes every step (why the skip
                                   matters)

Every run's result is checked: every rank finished, and every replica ends with the same
weights. Writes stragglers.csv (a row per run), stragglers.json (every rank's report, with its
accuracy curve) and stragglers.png (accuracy against training time; time per iteration) to
--out, and prints the table docs/benchmarks.md shows.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from bench.progress import Progress
from bench.results import time_to
from controller.topology import load
from host_agent.backend_checks import PassingInitError, stream_options
from passing.pipeline_files import CHECKOUT, topology_file
from topologies.network import PassingNetwork

SCRIPT = Path(__file__).with_name("straggler_train.py")
JOB = 1


@dataclass(frozen=True)
class Setting:
    name: str
    straggler: bool
    patience: str = ""  # "": bulk-synchronous; "fixed" or "adaptive" patience with a quorum
    catch_up: bool = True


SETTINGS = (Setting("bsp", False), Setting("bsp", True),
            Setting("quorum, fixed patience", False, "fixed"),
            Setting("quorum, fixed patience", True, "fixed"),
            Setting("quorum, adaptive patience", False, "adaptive"),
            Setting("quorum, adaptive patience", True, "adaptive"),
            Setting("quorum, adaptive, no skipping", True, "adaptive", catch_up=False))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topo", default="star", help="shipped topology (default star)")
    ap.add_argument("--target", choices=("model", "bmv2"), default="model")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--compute-ms", type=float, default=100.0,
                    help="a normal node's compute per step (default 100)")
    ap.add_argument("--slow-factor", type=float, default=2.0)
    ap.add_argument("--slow-period", type=int, default=0,
                    help="the straggler is slow for this many steps, then normal for as many, "
                         "and so on (default 0: slow throughout)")
    ap.add_argument("--quorum", type=int, default=0,
                    help="hosts a round may close with at the hosts' switches (default: all "
                         "but one of the straggler's switch; the spine, if any, waits for "
                         "every rack)")
    ap.add_argument("--patience", type=float, default=0.05,
                    help="fixed PASSING_PATIENCE, seconds (default 0.05)")
    # MIN above this machine's jitter: with 5 ms, rounds of 6-9 ms taught a patience of ~20 ms
    # and delays past it made 20 of 300 calls short without any straggler (docs/history.md).
    ap.add_argument("--adaptive", default="0.02..0.05",
                    help="adaptive PASSING_PATIENCE, MIN..MAX seconds (default 0.02..0.05)")
    ap.add_argument("--staleness", type=int, default=4, help="PASSING_STALENESS (default 4)")
    ap.add_argument("--target-accuracy", type=float, default=0.92)
    ap.add_argument("--only", default="",
                    help="comma-separated run numbers (1-7, in the order above) to run")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--replot", action="store_true",
                    help="run nothing: the table and plot of the run saved in --out, with "
                         "--target-accuracy (no root needed)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.slow_factor < 1 or args.patience <= 0 or args.staleness < 0 \
            or args.slow_period < 0:
        ap.error("--steps >= 1, --slow-factor >= 1, --patience > 0, --staleness >= 0, "
                 "--slow-period >= 0")
    try:
        stream_options(timedelta(seconds=1), {"PASSING_PATIENCE": args.adaptive})
    except PassingInitError as e:
        ap.error(f"--adaptive: {e}")
    try:
        args.only = {int(x) for x in args.only.split(",") if x.strip()}
    except ValueError:
        ap.error(f"--only {args.only!r}: run numbers 1-{len(SETTINGS)}, comma-separated")
    if not args.only <= set(range(1, len(SETTINGS) + 1)):
        ap.error(f"--only: run numbers are 1-{len(SETTINGS)}")
    return args


def check(reports: dict[str, dict]) -> list[dict]:
    """Every rank's report, after checking that every rank finished and that every replica
    ends with the same weights (a wrong or missed sum would make them differ)."""
    bad = [f"{h}: {r['error']}" for h, r in reports.items() if not r["ok"]]
    if bad:
        raise RuntimeError("training failed: " + "; ".join(bad))
    ranks = [rank for r in reports.values() for rank in r["ranks"]]
    sums = {rank["param_checksum"] for rank in ranks}
    if len(sums) != 1:
        raise RuntimeError(f"the replicas differ at the end: weight checksums {sorted(sums)}")
    return ranks


def summarize(setting: Setting, ranks: list[dict], target: float) -> dict:
    seconds = max(r["seconds"] for r in ranks)  # the job ends with its slowest rank
    first = min(ranks, key=lambda r: r["rank"])  # node 0: never the straggler
    tta = time_to(first["curve"], target)
    return {"setting": setting.name, "straggler": setting.straggler,
            "steps": first["steps"], "seconds": round(seconds, 3),
            "ms_per_iter": round(seconds / first["steps"] * 1e3, 1),
            "accuracy": round(first["accuracy"], 4),
            "time_to_target_s": None if tta is None else round(tta, 3),
            "skipped_by_straggler": max(r["skipped"] for r in ranks),
            "short_calls": first.get("short_calls", 0)}


def replot(args: argparse.Namespace) -> int:
    """The table and plot of a saved run, time to accuracy taken at --target-accuracy."""
    everything = json.loads((args.out / "stragglers.json").read_text())
    rows = []
    for run in everything.values():
        first = min(run["ranks"], key=lambda r: r["rank"])
        tta = time_to(first["curve"], args.target_accuracy)
        run["row"]["time_to_target_s"] = None if tta is None else round(tta, 3)
        rows.append(run["row"])
    plot(everything, args.out / "stragglers.png", args.target_accuracy)
    print(table(rows, args))
    return 0


def straggler_quorum(topo, hosts: list[str], requested: int) -> tuple[int, str]:
    """The quorum to set at the hosts' switches (`requested`, or 0: all but one) and how the
    table names it. It is judged against the straggler's switch (the last host's: a ToR on
    leafspine, with fewer hosts than the job), where a quorum above the fan-in would mean
    "wait for everyone" and the run would measure bulk-synchronous under another name."""
    rack = topo.hosts[hosts[-1]].rack
    fan_in = sum(1 for h in hosts if topo.hosts[h].rack == rack)
    quorum = requested or fan_in - 1
    if not 1 <= quorum <= fan_in:
        raise ValueError(f"--quorum {requested}: the straggler's switch {rack} has {fan_in} "
                         f"hosts, so 1..{fan_in}")
    return quorum, f"{quorum}/{fan_in}" + (" per ToR" if fan_in < len(hosts) else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        return replot(args)
    topo_path = topology_file(args.topo)
    topo = load(topo_path)
    hosts = list(topo.hosts)
    try:
        quorum, where = straggler_quorum(topo, hosts, args.quorum)
    except ValueError as e:
        print(f"stragglers: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    pnet = PassingNetwork(topo, topo_path, args.target, args.out / "net")
    rows, everything = [], {}
    chosen = [(i, s) for i, s in enumerate(SETTINGS, 1) if not args.only or i in args.only]
    progress = Progress(len(chosen))
    pnet.start()
    try:
        pnet.create_job(JOB, hosts)
        for i, setting in chosen:
            pnet.ctl.set_quorum(JOB, (quorum,) if setting.patience else ())
            train_args = ["--steps", args.steps, "--compute-ms", args.compute_ms,
                          "--slow-factor", args.slow_factor, "--slow-period", args.slow_period,
                          "--slow-node", len(hosts) - 1 if setting.straggler else -1]
            if setting.catch_up:
                train_args.append("--catch-up")
            env = {"PYTHONPATH": str(CHECKOUT)} if CHECKOUT else {}
            patience = {"fixed": str(args.patience), "adaptive": args.adaptive,
                        "": None}[setting.patience]
            if patience:
                env |= {"PASSING_PATIENCE": patience, "PASSING_STALENESS": str(args.staleness)}
            reports = pnet.train(JOB, script=SCRIPT, args=[str(a) for a in train_args],
                                 env=env, timeout=120 + args.steps * args.compute_ms / 1e3
                                 * args.slow_factor * 4)
            ranks = check(reports)
            row = summarize(setting, ranks, args.target_accuracy)
            row |= {"run": i, "topo": args.topo, "target": args.target,
                    "compute_ms": args.compute_ms,
                    "slow_factor": args.slow_factor if setting.straggler else 1.0,
                    "slow_period": args.slow_period if setting.straggler else 0,
                    "quorum": where if patience else "all",
                    "patience_s": patience, "staleness": args.staleness if patience else None,
                    "catch_up": setting.catch_up if patience else None}
            rows.append(row)
            everything[f"run{i}"] = {"row": row, "ranks": ranks}
            print(f"{progress.step()} run {i}: {setting.name}, "
                  f"{'straggler' if setting.straggler else 'no straggler'}", flush=True)
            print("    " + json.dumps(row), flush=True)
    finally:
        pnet.stop()
    with open(args.out / "stragglers.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (args.out / "stragglers.json").write_text(json.dumps(everything, indent=1) + "\n")
    plot(everything, args.out / "stragglers.png", args.target_accuracy)
    print(table(rows, args))
    return 0


def table(rows: list[dict], args: argparse.Namespace) -> str:
    base = next((r for r in rows if r["setting"] == "bsp" and not r["straggler"]), None)
    lines = ["| run | straggler | quorum | ms/iteration | vs BSP, no straggler | final accuracy "
             f"| time to {args.target_accuracy:.0%} | short calls | steps the straggler "
             "skipped |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ms_per_iter'] / base['ms_per_iter']:.2f}x" if base else "-"
        tta = ("not reached" if r["time_to_target_s"] is None
               else f"{r['time_to_target_s']:.1f} s")
        slow = f"{r['slow_factor']:g}x" if r["straggler"] else "none"
        if r["straggler"] and r.get("slow_period"):
            slow += f", every other {r['slow_period']} steps"
        lines.append(f"| {r['setting']} | {slow} | {r['quorum']} | {r['ms_per_iter']:.0f} "
                     f"| {ratio} | {r['accuracy']:.2%} | {tta} | {r['short_calls']} "
                     f"| {r['skipped_by_straggler']} |")
    return "\n".join(lines)


def plot(everything: dict, path: Path, target: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, bars) = plt.subplots(1, 2, figsize=(11, 4))
    labels, per_iter = [], []
    for run in everything.values():
        row = run["row"]
        label = f"{row['setting']}, " + (f"{row['slow_factor']:g}x straggler"
                                         if row["straggler"] else "no straggler")
        first = min(run["ranks"], key=lambda r: r["rank"])
        t, _, a = zip(*first["curve"], strict=True)
        acc.plot(t, a, label=label, linestyle="-" if row["straggler"] else "--")
        short = {"bsp": "BSP", "quorum, fixed patience": "fixed",
                 "quorum, adaptive patience": "adaptive",
                 "quorum, adaptive, no skipping": "no skip"}.get(row["setting"], row["setting"])
        labels.append(f"{short}\n{row['slow_factor']:g}x" if row["straggler"]
                      else f"{short}\nnone")
        per_iter.append(row["ms_per_iter"])
    acc.axhline(target, color="grey", linewidth=0.8)
    acc.set_ylim(0.8, 0.96)  # the first steps look alike in every run
    acc.set_xlabel("training time (s), evaluations left out")
    acc.set_ylabel("test accuracy (node 0's replica)")
    acc.legend(fontsize=8)
    bars.bar(range(len(per_iter)), per_iter)
    bars.set_xticks(range(len(per_iter)), labels, fontsize=8)
    bars.set_xlabel("setting, straggler")
    bars.set_ylabel("ms per iteration (slowest rank)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
