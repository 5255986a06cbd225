"""`passing-ctl`'s command line: every command and option, its help and example, and the
checks of option values that argparse reports as usage errors (exit 2)."""

from __future__ import annotations

import argparse
import os

from controller.job_plan import LEVEL_NAMES, MAX_LEVELS
from controller.serve import DEFAULT_LISTEN, parse_listen
from passing import protocol as P
from passing.contract import MAX_STALENESS, parse_patience

EXAMPLES = {
    "switches": "passing-ctl --config runs/star/controller.json switches",
    "prepare": "passing-ctl --config runs/star/controller.json prepare",
    "job create": "passing-ctl job create 7 --hosts h1,h2,h3 --window 128\n"
                  "  passing-ctl job create 8 --all-hosts --window 512 --min-window 64 --json",
    "job set": "passing-ctl job set 7 --quorum 3      # a round may close with 3 of its hosts\n"
               "  passing-ctl job set 8 --quorum 1,2    # 1 host per ToR, 2 racks at the spine\n"
               "  passing-ctl job set 7 --quorum all    # back to waiting for everyone",
    "job resize": "passing-ctl job resize 7 --window 256   # live: agents move at a call "
                  "boundary\n"
                  "  passing-ctl job resize 7 --window 512 --min-window 128 --json",
    "job delete": "passing-ctl job delete 7",
    "job list": "passing-ctl job list --json",
    "job show": "passing-ctl job show 7   # pools per switch and the host agents' parameters",
    "slots": "passing-ctl slots",
    "stats": "passing-ctl stats 7 --json",
    "reconcile": "passing-ctl reconcile --dry-run",
    "serve": "passing-ctl serve --listen 10.0.0.100:7700\n"
             "  # then on a host: PASSING_CONTROLLER=10.0.0.100:7700 PASSING_JOB=7 <agent>\n"
             "  curl http://10.0.0.100:7700/v1/jobs/7",
}



def _epilog(cmd: str) -> str:
    return f"example:\n  {EXAMPLES[cmd]}"



def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="passing-ctl", formatter_class=fmt,
        description="Control plane of PASSING: share the switches' aggregation slots among "
                    "training jobs over P4Runtime.",
        epilog="The controller configuration (JSON) names the topology file, each switch's "
               "P4Runtime address and device id, and the state file:\n"
               '  {"topology": "topologies/star.json", "state": "controller.sqlite",\n'
               '   "switches": {"s1": {"address": "127.0.0.1:10001", "device_id": 0}}}\n'
               "Paths are relative to the configuration file. Default: $PASSING_CTL_CONFIG.")
    p.add_argument("--config", default=os.environ.get("PASSING_CTL_CONFIG"),
                   help="controller configuration file (default: $PASSING_CTL_CONFIG)")
    p.add_argument("--timeout", type=float, default=5.0,
                   help="seconds to wait for a switch per attempt (default 5)")
    p.add_argument("--retries", type=int, default=3, help="connection attempts (default 3)")
    p.add_argument("--dump-p4runtime", metavar="DIR", default=None,
                   help="append every P4Runtime message to DIR/<switch>-p4runtime.log")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name: str, help_: str, parent=sub, key: str | None = None):
        sp = parent.add_parser(name, help=help_, description=help_, formatter_class=fmt,
                               epilog=_epilog(key or name))
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        return sp

    add("switches", "show each switch: reachable? which pipeline does it run?")
    add("prepare", "push the pipeline where missing and install forwarding on every switch")
    job = sub.add_parser("job", help="create, resize, delete, list or show jobs",
                         description="create, resize, delete, list or show jobs")
    jsub = job.add_subparsers(dest="job_cmd", required=True, metavar="ACTION")
    c = add("create", "create a job: slot pools on its switches, membership, multicast",
            jsub, "job create")
    c.add_argument("job_id", type=int, help="job id, 1..65535")
    who = c.add_mutually_exclusive_group(required=True)
    who.add_argument("--hosts", help="comma-separated host names of the topology")
    who.add_argument("--all-hosts", action="store_true", help="every host of the topology")
    c.add_argument("--window", type=int, required=True,
                   help="the job's window: slots wanted on each of its switches, and the agents' "
                        "packets in flight")
    c.add_argument("--min-window", type=int, default=None,
                   help="accept a smaller window down to this many slots when space is short")
    c.add_argument("--agent-port", type=int, default=0,
                   help="first UDP port the host agents receive results on (one per host, "
                        "one per GPU in ina mode); it must not overlap another job's. Default: "
                        "the lowest free range from 61000")
    c.add_argument("--mode", choices=("passing", "ina"), default="passing",
                   help="passing (default): each server pre-aggregates its GPUs and is one "
                        "contributor; ina: switch-only baseline, every GPU is a contributor")
    c.add_argument("--params-out", default=None,
                   help="also write the host agents' job parameters (JSON) to this file")
    c.add_argument("--no-fallback", action="store_true",
                   help="refuse the job when its switches cannot hold it now; by default a "
                        "passing job then waits for slots, its hosts summing with a host "
                        "collective, and moves onto the switches when they free")
    c.add_argument("--quorum", type=_quorum, default=(), metavar="Q[,Q1[,Q2]]",
                   help=QUORUM_HELP)
    c.add_argument("--patience", type=_patience, default=(), metavar="P|MIN..MAX",
                   help=PATIENCE_HELP)
    c.add_argument("--staleness", type=_staleness, default=1, metavar="S",
                   help=STALENESS_HELP + " (default 1)")
    js = add("set", "change a running job's quorum (live: rounds in flight keep their sums), "
                    "its agents' patience or staleness bound", jsub, "job set")
    js.add_argument("job_id", type=int)
    js.add_argument("--quorum", type=_quorum, default=None, metavar="Q[,Q1[,Q2]]|all",
                    help=QUORUM_HELP + "; 'all' goes back to waiting for everyone")
    js.add_argument("--patience", type=_patience, default=None, metavar="P|MIN..MAX|none",
                    help=PATIENCE_HELP + "; 'none': never ask")
    js.add_argument("--staleness", type=_staleness, default=None, metavar="S",
                    help=STALENESS_HELP)
    js.add_argument("--params-out", default=None,
                    help="also write the host agents' new job parameters (JSON) to this file "
                         "(agents given a file re-read it)")
    rz = add("resize", "give a running job a new pool of another window, beside its current "
                       "one, which is freed once every host has moved to the new pool",
             jsub, "job resize")
    rz.add_argument("job_id", type=int)
    rz.add_argument("--window", type=_window, required=True,
                    help="the job's new window: slots on each of its switches")
    rz.add_argument("--min-window", type=_window, default=None,
                    help="accept a smaller window down to this many slots when space is short")
    rz.add_argument("--params-out", default=None,
                    help="also write the host agents' new job parameters (JSON) to this file")
    d = add("delete", "delete a job and free its slots", jsub, "job delete")
    d.add_argument("job_id", type=int)
    add("list", "list jobs", jsub, "job list")
    s = add("show", "a job's pools per switch and its host agents' parameters", jsub, "job show")
    s.add_argument("job_id", type=int)
    add("slots", "slot occupancy per switch, as a map")
    st = add("stats", "per-job counters from the switches")
    st.add_argument("job_id", type=int, nargs="?", help="one job (default: all)")
    r = add("reconcile", "compare switches with the job table; re-install what is missing")
    r.add_argument("--dry-run", action="store_true", help="report only, change nothing")
    sv = add("serve", "serve the host agents' job parameters over HTTP (GET /v1/jobs, "
                      "/v1/jobs/ID), read-only, until SIGINT/SIGTERM")
    sv.add_argument("--listen", type=_listen, default=DEFAULT_LISTEN, metavar="HOST:PORT",
                    help=f"address to listen on (default {DEFAULT_LISTEN}: this machine only; "
                         "port 0 picks a free one). Give the address of the hosts' management "
                         "network: anyone who can reach it reads the jobs' session keys")
    return p



QUORUM_HELP = ("how many of a slot's contributions a host that waited long enough (CLOSE) may "
               "complete a round with: Q at the switches the hosts are on, Q1 at the spines, Q2 "
               "at the cores (levels the job's tree does not reach are not used); a switch with "
               "fewer contributors uses all of them. Default: every round waits for everyone "
               "(bulk-synchronous)")



PATIENCE_HELP = ("for the host agents: seconds a round waits for the other hosts before a host "
                 "asks the switch to close it with the quorum; MIN..MAX: adaptive, the time "
                 "rounds with every host in time take, within those bounds. Running agents of "
                 "the passing backend change to a new one after the same call; their "
                 "PASSING_PATIENCE overrides it. Default: never ask (every round waits for "
                 "everyone)")



STALENESS_HELP = ("for the host agents: calls in a row that may leave some GPU out before one "
                  "waits for everyone; running agents of the passing backend change to a new "
                  "one after the same call (PASSING_STALENESS overrides it)")



def _patience(text: str) -> tuple[float, ...]:
    if text.strip().lower() == "none":
        return ()
    try:
        return parse_patience(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: P or MIN..MAX seconds, positive and finite, MIN <= MAX (or 'none' with "
            "job set)") from None



def _window(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of slots, at least 1")
    return int(text)



def _staleness(text: str) -> int:
    if not text.strip().isdigit() or int(text) > MAX_STALENESS:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of calls, 0..{MAX_STALENESS}")
    return int(text)



def _quorum(text: str) -> tuple[int, ...]:
    if text.strip().lower() == "all":
        return ()
    try:
        q = tuple(int(x) for x in text.split(","))
    except ValueError:
        q = None
    if not q or len(q) > MAX_LEVELS or any(not 1 <= x <= P.MAX_FAN_IN for x in q):
        raise argparse.ArgumentTypeError(
            f"{text!r}: Q, Q,Q1 or Q,Q1,Q2 ({LEVEL_NAMES}), each 1..{P.MAX_FAN_IN}, or 'all'")
    return q



def _listen(text: str) -> tuple[str, int]:
    try:
        return parse_listen(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None

