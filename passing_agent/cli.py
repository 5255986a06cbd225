"""`passing-agent`: run timed PASSING all-reduces on this host with G local ranks.

Every host of the job runs it at the same time with the same --size, --iters, --warmup and
--seed. Each
local rank fills its tensor from (seed, host, rank), so each host can compute the exact global
sum with numpy and check what came back through the switch: every call is checked, the first
(untimed warm-up) ones included, on every local rank. The hosts' leaders first meet at the first
host (--rendezvous-port) to agree on a new session (host_agent.session).

A live resize (`passing-ctl job resize`) reaches a running passing agent as it reaches the
`passing` backend: the leader re-reads the job's parameters every PASSING_POOL_POLL seconds
(default 2; 0: never) from where they came from, the --params file (write it with
`job resize --params-out`) or the controller, and the hosts move to the new pool after the
same call. The report gives the moves ([call, pool, window]) and the window it ended in.

Exit codes: 0 correct result, 1 wrong result or the switch did not answer, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

from host_agent.job_source import JobSourceError, params_from_env, pool_poll, this_host
from host_agent.transport import (
    DEFAULT_SEGMENTS,
    MAX_SEGMENTS,
    SEGMENTS_ENV,
    default_segments,
)
from passing.contract import JobParams, ParamsError
from passing_agent import STRATEGIES
from passing_agent.options import RunOptions
from passing_agent.pool import RankPool
from passing_agent.sizes import parse_size
from passing_agent.workloads import MODELS as TRAIN_MODELS

EXAMPLE = ("passing-ctl job show 7 --json | jq .agent_params > job7.json\n"
           "  passing-agent --params job7.json --host h1 --size 4M --iters 5\n"
           "  PASSING_CONTROLLER=10.0.0.100:7700 PASSING_JOB=7 passing-agent --size 4M")


class UsageError(ValueError):
    """A command line passing-agent refuses (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: error: {message}")


def run(params: JobParams, host: str, opts: RunOptions) -> dict:
    """Timed all-reduces of `opts.size` values (or, with train_steps, data-parallel training of
    the digits MLP for that many steps) on `host` of the job `params`; the leader's report."""
    with RankPool() as pool:
        return pool.run(params, host, opts)


def parser() -> argparse.ArgumentParser:
    """passing-agent's command line; its error() raises UsageError instead of exiting."""
    ap = _Parser(
        prog="passing-agent", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run timed PASSING all-reduces on this host: G local ranks pre-aggregate "
                    "with torch.distributed, the leader streams through the switch.",
        epilog="example:\n  " + EXAMPLE)
    ap.add_argument("--params", default=None,
                    help="the job's agent parameters (JSON from passing-ctl); default: from "
                         "the environment, PASSING_PARAMS or PASSING_JOB + PASSING_CONTROLLER "
                         "(`passing-ctl serve`)")
    ap.add_argument("--host", default=None,
                    help="this host's name in the job (default: PASSING_HOST, else the job's "
                         "host whose address is this machine's)")
    ap.add_argument("--size", type=parse_size, default=parse_size("1M"),
                    help="float32 values per tensor, K/M suffixes (default 1M)")
    ap.add_argument("--iters", type=int, default=3, help="timed all-reduces (default 3)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed all-reduces before the timed ones, checked all the same; "
                         "same on every host (default 1; 0: the first call is timed, start-up "
                         "costs included)")
    ap.add_argument("--seed", type=int, default=0, help="same on every host (default 0)")
    ap.add_argument("--rto", type=float, default=0.05,
                    help="retransmission timeout until round trips are measured, seconds "
                         "(default 0.05)")
    ap.add_argument("--min-rto", type=float, default=RunOptions.min_rto,
                    help="lower bound of the probe timer (docs/protocol.md, \"Loss recovery\"; "
                         f"default {RunOptions.min_rto:g})")
    ap.add_argument("--gather-max", type=float, default=RunOptions.gather_max,
                    metavar="SECONDS",
                    help="passing and ina: the longest a host waits for more results after a "
                         "pass that took few while many packets wait in queues "
                         f"(docs/host_agent.md, \"Gathering\"; default {RunOptions.gather_max:g}; "
                         "0: never)")
    ap.add_argument("--timeout", type=float, default=10.0,
                    help="give up after this many seconds without progress (default 10)")
    ap.add_argument("--strategy", choices=STRATEGIES, default="passing",
                    help="passing (default), or a baseline: ina (needs a job in mode ina), "
                         "ring, hier-ring, ps")
    ap.add_argument("--udp-segments", type=int, default=0, metavar="N",
                    help="passing and ina: datagrams per message the agent's socket hands the "
                         "kernel (UDP segmentation; 1: one per message; default 0: "
                         f"${SEGMENTS_ENV} or {DEFAULT_SEGMENTS}; on shaped links about a "
                         "millisecond of the link: docs/host_agent.md, \"Transport\")")
    ap.add_argument("--ifname", default=None,
                    help="baselines: the interface gloo uses between hosts (e.g. h1-eth0)")
    ap.add_argument("--rendezvous-port", type=int, default=None,
                    help="TCP port on the first host where the hosts meet to start a session "
                         "(and, for the baselines, all ranks) (default 29500 + job id)")
    ap.add_argument("--rendezvous-timeout", type=float, default=60.0,
                    help="seconds to wait for every host of the job to start (default 60)")
    ap.add_argument("--train", type=int, default=0, metavar="STEPS",
                    help="instead of timed all-reduces: train a small MLP on scikit-learn's "
                         "digits for STEPS data-parallel steps (every rank a worker) and report "
                         "iterations/s and test accuracy")
    ap.add_argument("--global-batch", type=int, default=0,
                    help="with --train: samples per step over all ranks (default 8 x ranks)")
    ap.add_argument("--model", choices=sorted(TRAIN_MODELS), default="digits-mlp",
                    help="with --train: digits-mlp (9,610 parameters, default) or digits-wide "
                         "(1,126,410 parameters: the all-reduce is most of each step)")
    ap.add_argument("--eval-every", type=int, default=0, metavar="STEPS",
                    help="with --train: also measure test accuracy every STEPS steps, the "
                         "clock stopped (the report's curve: seconds, step, accuracy)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    return ap


def parse_command(argv: list[str]) -> tuple[JobParams, str, RunOptions, argparse.Namespace]:
    """(the job, this host, what to run, the parsed arguments) of a passing-agent command line;
    UsageError says what is wrong with it, as the command line's usage would."""
    ap = parser()
    args = ap.parse_args(argv)
    try:
        params = JobParams.load(args.params) if args.params else params_from_env()
        if args.host is None:
            args.host = this_host(params)
    except ParamsError as e:
        ap.error(f"--params {args.params}: {e}")
    except JobSourceError as e:
        ap.error(str(e))
    if args.host not in params.host_names:
        ap.error(f"--host: {args.host} is not in job {params.job_id} "
                 f"(hosts: {', '.join(params.host_names)})")
    if args.iters < 1:
        ap.error("--iters must be at least 1")
    if args.warmup < 0:
        ap.error("--warmup must be a number of calls (0: none)")
    if not 0 <= args.udp_segments <= MAX_SEGMENTS:
        ap.error(f"--udp-segments must be from 1 to {MAX_SEGMENTS}, or 0 for the default")
    if not args.udp_segments:
        try:
            default_segments()  # said here, once, not by every rank after the rendezvous
        except ValueError as e:
            ap.error(str(e))
    if not 0 <= args.gather_max <= 1:  # (NaN too)
        ap.error("--gather-max must be seconds, from 0 (never) to 1")
    try:
        poll = pool_poll()
    except JobSourceError as e:
        ap.error(str(e))
    if args.strategy in ("passing", "ina") and params.mode != args.strategy:
        ap.error(f"--strategy {args.strategy}: job {params.job_id} was created in mode "
                 f"{params.mode} (passing-ctl job create --mode {args.strategy})")
    if args.train < 0:
        ap.error("--train must be a number of steps (0: no training)")
    if args.eval_every < 0:
        ap.error("--eval-every must be a number of steps (0: accuracy at the end only)")
    if args.train and importlib.util.find_spec("sklearn") is None:
        # Said here, once, rather than by every rank as an ImportError.
        ap.error("--train needs scikit-learn (its digits data set is the training data): "
                 "pip install 'passing[bench]' or pip install scikit-learn")
    opts = RunOptions(size=args.size, iters=args.iters, warmup=args.warmup, seed=args.seed,
                      rto=args.rto, timeout=args.timeout, min_rto=args.min_rto,
                      gather_max=args.gather_max, strategy=args.strategy,
                      ifname=args.ifname, udp_segments=args.udp_segments,
                      rendezvous_port=args.rendezvous_port,
                      rendezvous_timeout=args.rendezvous_timeout, train_steps=args.train,
                      global_batch=args.global_batch, model=args.model,
                      eval_every=args.eval_every, params_file=args.params, pool_poll=poll)
    return params, args.host, opts, args


def main(argv: list[str] | None = None) -> int:
    try:
        params, host, opts, args = parse_command(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        parser().print_usage(sys.stderr)
        print(e, file=sys.stderr)
        return 2
    # Before the ranks start (they import torch at once): torch's store logs every wait it
    # retries; the agent reports its own clear error.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    res = run(params, host, opts)
    if args.json:
        print(json.dumps(res))
    elif not res["ok"]:
        print(f"passing-agent: {res['error']}", file=sys.stderr)
    elif args.train:
        print(f"{args.host} [{args.strategy}]: {res['steps']} steps on {res['world']} ranks, "
              f"{res['iters_per_s']:.1f} it/s, test accuracy {res['accuracy']:.4f}, "
              f"final loss {res['final_loss']:.4f}")
        return 0
    else:
        print(f"{args.host} [{args.strategy}]: {res['local_ranks']} local ranks, "
              f"{res['bytes'] / 2**20:.1f} MiB, "
              f"{res['mean_s'] * 1e3:.1f} ms per all-reduce, {res['goodput_gbps']:.3f} Gbit/s, "
              f"{'correct in every call' if res['correct'] else 'WRONG'} (max error "
              f"{res['max_error']:.2e}, {res['error_vs_bound']:.2f} of the bound; "
              f"{res['wrong_values']} values beyond it), "
              f"{res['retransmissions']} retransmissions"
              + (f", {res['spec_missed']} of {res['speculated']} speculated fragments sent "
                 "again" if res.get("speculated") else ""))
    return 0 if res.get("ok") and (args.train or res.get("correct")) else 1


if __name__ == "__main__":
    sys.exit(main())
