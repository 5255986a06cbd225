"""The command line of `bench.sweep`: its options, their types, and the checks that refuse a
plan that cannot run, each with the reason."""

from __future__ import annotations

import argparse

from bench.sweep_plan import LONG_CALL_S
from controller.topology import load
from passing.pipeline_files import topology_file
from passing_agent import STRATEGIES
from passing_agent.sizes import parse_size
from passing_agent.workloads import DEFAULT_MODEL, MODELS


def comma_list(parse):
    """An argparse type: comma-separated values, each parsed by `parse`."""
    def parse_all(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected one value or more, comma-separated")
        return [parse(t) for t in items]
    return parse_all


def link_rate_arg(text: str) -> float | None:
    if text == "shipped":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e6:
        raise argparse.ArgumentTypeError(f"{text!r}: Mbit/s (0: unshaped) or 'shipped'")
    return value


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number, at least 1")
    return int(text)


def strategy_name(text: str) -> str:
    if text not in STRATEGIES:
        raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(STRATEGIES)}")
    return text


def parse_args(argv: list[str] | None,
               doc: str) -> tuple[argparse.Namespace, list[str]]:
    """The options, checked (argparse exits with the reason otherwise), and which of the
    subset's options were given (none: the whole plan). `doc`: the sweep's docstring."""
    ap = argparse.ArgumentParser(prog="bench.sweep", description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=doc.split("\n\n", 1)[1])
    ap.add_argument("--quick", action="store_true",
                    help="CI mode: star, software model, small sizes, few training steps")
    ap.add_argument("--target", choices=["auto", "model", "bmv2"], default="auto",
                    help="auto (default): the model for the big sweeps, plus BMv2 at low "
                         "bandwidth when installed; model: the model only")
    ap.add_argument("--out", default="build/bench", help="CSV, calibration, plots (default "
                    "build/bench)")
    ap.add_argument("--report", default=None,
                    help="write the results into this Markdown file (make bench: "
                         "docs/benchmarks.md, plots next to it)")
    # Two seconds per rate: its spread from run to run is this machine's (about 15% here), not the
    # measurement's.
    ap.add_argument("--calibrate-seconds", type=float, default=2.0,
                    help="how long each switch and agent rate of the calibration is measured "
                         "(default 2)")
    sub = ap.add_argument_group("a subset instead of the whole plan")
    sub.add_argument("--topo", default=None, help="shipped topology (default leafspine)")
    sub.add_argument("--bw", type=comma_list(link_rate_arg), default=None, metavar="MBITS[,...]",
                     help="link rates in Mbit/s, 0 unshaped, 'shipped' as the topology file "
                          "has them (default shipped)")
    sub.add_argument("--gpus", type=comma_list(positive_int), default=None, metavar="G[,...]",
                     help="GPUs per host (default: as the topology file has them)")
    sub.add_argument("--sizes", type=comma_list(parse_size), default=None, metavar="SIZE[,...]",
                     help="float32 values per tensor, K/M suffixes, as the allreduce command "
                          "takes them (default 1M)")
    sub.add_argument("--strategies", type=comma_list(strategy_name), default=None,
                     metavar="S[,...]",
                     help=f"of {', '.join(STRATEGIES)} (default all)")
    sub.add_argument("--hosts", type=comma_list(positive_int), default=None, metavar="N[,...]",
                     help="job sizes in hosts (default every host)")
    sub.add_argument("--train-steps", type=int, default=0,
                     help="also train an MLP this many steps per strategy (default 0)")
    sub.add_argument("--train-model", choices=sorted(MODELS), default=DEFAULT_MODEL,
                     help="with --train-steps: digits-mlp (9,610 parameters, default) or "
                          "digits-wide (1,126,410: bandwidth-bound)")
    sub.add_argument("--target-accuracy", type=float, default=0.9,
                     help="with --train-steps: report the training time to this test "
                          "accuracy (default 0.9)")
    sub.add_argument("--iters", type=positive_int, default=2,
                     help="timed calls per run, after a warm-up call (default 2; one call, "
                          "untimed warm-up none, where --long-call applies)")
    ap.add_argument("--long-call", type=float, default=LONG_CALL_S, metavar="SECONDS",
                    help="a run whose calls the analytical model predicts at SECONDS or more "
                         "makes one timed call and no warm-up (default %(default)g; 0: every "
                         "run makes a warm-up call and --iters timed calls)")
    args = ap.parse_args(argv)
    picked = [a for a in ("topo", "bw", "gpus", "sizes", "strategies", "hosts")
              if getattr(args, a) is not None]
    if not args.long_call >= 0:  # (NaN too)
        ap.error("--long-call must be a number of seconds (0: never)")
    if args.train_steps < 0 or not 0 < args.target_accuracy <= 1:
        ap.error("--train-steps at least 0, --target-accuracy in (0, 1]")
    if (args.train_model != DEFAULT_MODEL or args.train_steps) and not picked:
        ap.error("--train-steps and --train-model go with a subset (e.g. --strategies or "
                 "--sizes); the whole plan trains the digits MLP itself")
    if picked and args.quick:
        ap.error(f"--quick is a plan of its own; drop it or --{picked[0]}")
    if picked:
        try:
            shipped = load(topology_file(args.topo or "leafspine"))
        except FileNotFoundError as e:
            ap.error(f"--topo: {e}")
        too_many = [n for n in args.hosts or [] if n > len(shipped.hosts)]
        if too_many:
            ap.error(f"--hosts: {shipped.name} has {len(shipped.hosts)} hosts, not "
                     f"{too_many[0]}")
    return args, picked
