"""`passing-ctl`: the operator's command line for the PASSING controller.

Every invocation connects to the switches it needs, does one thing and exits; the job table is
kept in SQLite, so nothing is lost between invocations or when one is interrupted.

`serve` is the exception: it answers the host agents' requests for their job parameters over
HTTP (controller.serve) until SIGINT or SIGTERM, reading the state file and never a switch.

Exit codes: 0 done (`serve`: stopped by SIGINT/SIGTERM), 2 bad command line (a malformed
`serve --listen`, `job resize --window 0`), 3 request refused (unknown job, duplicate id, host
not in the topology, job that does not fit, a resize while the previous one still retires its
old pool, bad topology; `serve`: the listen address is in use or not this machine's),
4 a switch is unreachable or refused a write (`stats`: the counters of the switches that
answered are printed all the same).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from controller.core import (
    DEFAULT_MAX_JOBS,
    Controller,
    ControllerError,
    Endpoint,
    SwitchFailure,
    port_span,
)
from controller.job_plan import LEVEL_NAMES, MAX_LEVELS, JobError, JobSpec
from controller.serve import DEFAULT_LISTEN, ParamsServer, parse_listen
from controller.store import StoreError
from controller.switch import SwitchError
from controller.topology import TopologyError, load, read_json
from passing import protocol as P
from passing.contract import MAX_STALENESS, parse_patience

EXIT_REFUSED, EXIT_SWITCH = 3, 4

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
               '   "switches": {"s1": {"address": "127.0.0.1:50001", "device_id": 0}}}\n'
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


def _patience_text(patience: tuple[float, ...]) -> str:
    if not patience:
        return "no patience (never ask to close)"
    if len(patience) == 1:
        return f"patience {patience[0]:g} s"
    return f"patience {patience[0]:g}..{patience[1]:g} s (adaptive)"


def _listen(text: str) -> tuple[str, int]:
    try:
        return parse_listen(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def load_controller(args) -> Controller:
    if not args.config:
        raise ControllerError("no controller configuration: pass --config FILE or set "
                              "PASSING_CTL_CONFIG (see passing-ctl --help)")
    cfg_path = Path(args.config)
    cfg = read_json(cfg_path, "configuration", ControllerError)
    base = cfg_path.parent
    for key in ("topology", "state", "switches"):
        if key not in cfg:
            raise ControllerError(f"{cfg_path}: missing \"{key}\"")
    topo = load(base / cfg["topology"])
    endpoints = {}
    for name, sw in cfg["switches"].items():
        if name not in topo.switches:
            raise ControllerError(f"{cfg_path}: switches.{name} is not in the topology")
        try:
            endpoints[name] = Endpoint(name, str(sw["address"]), int(sw.get("device_id", 0)))
        except (KeyError, TypeError, ValueError):
            raise ControllerError(f"{cfg_path}: switches.{name} needs \"address\" and an "
                                  "integer \"device_id\"") from None
    max_jobs, shares = _job_limits(cfg, cfg_path)
    return Controller(topo, endpoints, base / cfg["state"], max_jobs=max_jobs, shares=shares,
                      connect_timeout=args.timeout, retries=args.retries,
                      dump_dir=Path(args.dump_p4runtime) if args.dump_p4runtime else None)


def _job_limits(cfg: dict, cfg_path: Path) -> tuple[int, int | None]:
    """The configuration's jobs per switch (at most half the pipeline's job_config entries,
    since a job holds two of them while it resizes) and equal shares of its slots (None where
    it names none: the controller's default)."""
    most = P.MAX_JOBS // 2
    max_jobs = _bounded(cfg_path, "max_jobs", cfg.get("max_jobs", DEFAULT_MAX_JOBS), most,
                        f"the pipeline's job_config holds {P.MAX_JOBS} entries, two per job "
                        "while it resizes")
    if "shares" not in cfg:
        return max_jobs, None
    return max_jobs, _bounded(cfg_path, "shares", cfg["shares"], max_jobs,
                              "max_jobs: each share is some job's to take")


def _bounded(cfg_path: Path, key: str, value: object, most: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ControllerError(f"{cfg_path}: {key} must be an integer from 1 to {most} ({why}), "
                              f"not {value!r}")
    return value


def _waiting_text(spec: JobSpec) -> str:
    """What a job waiting for slots does meanwhile, and when that ends."""
    want = f"a window of {spec.window}" + (f" (at least {spec.min_window})"
                                           if spec.min_window else "")
    return (f"its switches cannot hold {want} now, so its hosts sum with a host collective "
            "(the in-host stage, then a ring among the hosts' leaders); the controller moves it "
            "onto the switches, live, at the first call (job create, delete, resize, show, "
            "reconcile) after which they can")


def _placed(ctl: Controller) -> list[dict]:
    return [{"job_id": r.job_id, "window": r.pools[0].size, "pool_epoch": r.pool_epoch}
            for r in ctl.placed]


def _placed_text(ctl: Controller) -> str:
    """The waiting jobs this call moved onto their switches."""
    return "".join(f"\njob {r.job_id} moved onto its switches: window {r.pools[0].size} (pool "
                   f"epoch {r.pool_epoch}); its agents leave the host collective at a call "
                   "boundary" for r in ctl.placed)


def _pools(rec) -> list[dict]:
    return [{"switch": p.switch, "slots": f"{p.base}-{p.base + p.size - 1}" if p.size else "-",
             "size": p.size,
             "fan_in": p.fan_in, "role": "root" if p.is_root else "non-root",
             "generation": p.gen} for p in rec.pools]


def _retiring(rec) -> list[dict]:
    return [{"switch": r.switch, "slots": f"{r.base}-{r.base + r.size - 1}", "size": r.size,
             "generation": r.gen, "pool_bit": r.bit} for r in rec.retiring]


def _move_text(rec, move: dict | None, error: str | None) -> str:
    """`job show`'s line on the job's pool epoch and, during a resize, who has not moved."""
    text = f"pool epoch {rec.pool_epoch} (FLAG_POOL {rec.pool_bit})"
    if rec.installing:
        return text + ("; its resize was interrupted before every switch had the new pool: "
                       "run `passing-ctl reconcile`")
    if error is not None:
        return text + f"; old pool retiring, cannot tell which hosts have moved: {error}"
    if move is None or not move["pending"]:
        return text
    return (text + "; old pool retiring until every host has contributed to the new one; "
            f"moved: {', '.join(move['moved']) or 'none'}; not yet: "
            f"{', '.join(move['waiting'])}\nretiring:\n"
            + _table(_retiring(rec), ["switch", "slots", "size", "generation"]))


def _agent_ports(ctl: Controller, rec) -> str:
    return port_span(JobSpec.from_dict(rec.spec).agent_ports(ctl.topo))


def _table(rows: list[dict], cols: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def run(args) -> tuple[object, str]:
    """(JSON-able result, human text)."""
    with load_controller(args) as ctl:
        return run_with(ctl, args)


def run_with(ctl: Controller, args) -> tuple[object, str]:
    """One command against an existing controller (also used by the Mininet CLI)."""
    if args.cmd == "switches":
        rows = ctl.switch_status()
        for r in rows:
            r["status"] = ("pipeline loaded" if r["pipeline"] == "ours" else
                           "no pipeline" if r["pipeline"] == "none" else
                           "another pipeline" if r["pipeline"] else
                           "UNREACHABLE: " + r.get("error", ""))
        return rows, _table(rows, ["switch", "role", "address", "device_id", "status"])
    if args.cmd == "prepare":
        res = {name: ctl.prepare(name) for name in ctl.topo.switches}
        return res, "\n".join(f"{n}: pipeline {v}, forwarding installed"
                              for n, v in res.items())
    if args.cmd == "job":
        return run_job(ctl, args)
    if args.cmd == "slots":
        res, text = {}, []
        for name, alloc in ctl.slots().items():
            res[name] = {"capacity": alloc.capacity, "used": alloc.used(),
                         "jobs": {j: [r.base, r.size] for j, r in alloc.allocations().items()},
                         "retiring": {j: [r.base, r.size]
                                      for j, r in alloc.retiring().items()},
                         "free": [[r.base, r.size] for r in alloc.free_ranges()]}
            text.append(f"{name}: {alloc.used()}/{alloc.capacity} slots used, fair share "
                        f"{alloc.fair_share()}\n{alloc.occupancy_map()}")
        return res, "\n\n".join(text)
    if args.cmd == "stats":
        return stats(ctl, args.job_id)
    if args.cmd == "reconcile":
        rep = ctl.reconcile(fix=not args.dry_run)
        lines = []
        for name, entry in rep.items():
            lines.append(f"{name}: " + (", ".join(entry.get("pipeline", [])) or "checked"))
            lines += [f"  repaired {x}" for x in entry["repaired"]]
            lines += [f"  STRAY {x} (not removed)" for x in entry["stray"]]
            lines += [f"  ERROR {x}" for x in entry["errors"]]
        return rep, "\n".join(lines)
    raise AssertionError(args.cmd)


def stats(ctl: Controller, job_id: int | None) -> tuple[object, str]:
    """Per job and switch: the job's counters and drops; per switch: the drops no job's row
    takes (in the JSON, under each job's switch as "switch_drops"). A switch that could not be
    read has a row of "-" and its reason at the end (in the JSON, "error")."""
    ids = [job_id] if job_id is not None else [j.job_id for j in ctl.store.jobs()]
    unread: dict[str, str] = {}  # a switch found down is not asked again for the next job
    res = {jid: ctl.stats(jid, unread) for jid in ids}
    if not res:
        return res, "no jobs"
    rows = [{"job": jid, "switch": sw, **counts}
            for jid, per in res.items() for sw, counts in per.items()]
    cols = ["job", "switch", "job_contributions", "job_duplicates", "job_results",
            "job_result_retransmits", "job_uplink", "job_downlink", "quorum",
            "job_quorum_rounds", "job_late", "late_by"]
    read = [r for r in rows if "error" not in r]
    for r in rows:
        r["quorum"] = f"{r['quorum']}/{r['fan_in']}"
        if "error" in r:
            r.update({c: "-" for c in cols if c not in r})
        else:
            r["late_by"] = ",".join(f"{m}:{n}" for m, n in r["late_by"].items()) or "-"
    parts = [_table(rows, cols)]
    if read:
        drops = [{"job": r["job"], "switch": r["switch"],
                  **{k[6:]: v for k, v in r.items() if k.startswith("drops_")}} for r in read]
        # Switch-wide counters are the same under every job on a switch: shown once per switch.
        per_switch = {r["switch"]: r["switch_drops"] for r in read}
        switch_rows = [{"switch": sw, **counts} for sw, counts in per_switch.items()]
        parts += ["drops:\n" + _table(drops, list(drops[0])),
                  "switch-wide drops (no job's row):\n"
                  + _table(switch_rows, list(switch_rows[0]))]
    if unread:  # filled by ctl.stats: the same switches and reasons as the rows' "error"
        parts.append("not read:\n" + "\n".join(f"  {sw}: {why}" for sw, why in unread.items()))
    return res, "\n\n".join(parts)


def _unread(stats_result: dict) -> dict[str, str]:
    """The switches `stats` could not read, with the reason."""
    return {sw: counts["error"] for per in stats_result.values()
            for sw, counts in per.items() if "error" in counts}


def serve(args, ctl: Controller | None = None) -> int:
    """Serve until SIGINT/SIGTERM; prints the URL first (stdout, flushed) for whoever started
    it, e.g. the Mininet runner, which may have asked for port 0. Signals can only be caught in
    the main thread: a program serving from another thread uses controller.serve.ParamsServer,
    which it can shut down."""
    own = ctl is None
    if own:
        ctl = load_controller(args)
    try:
        server = ParamsServer(ctl, *args.listen, log=sys.stderr)

        def stop(signum, frame) -> None:
            # shutdown() waits for serve_forever() to return, so it cannot run in the handler,
            # which interrupts serve_forever's own thread.
            threading.Thread(target=server.shutdown, daemon=True).start()

        previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            print(json.dumps({"url": server.url}) if args.json else server.url, flush=True)
            print(f"passing-ctl: serving the agent parameters of the jobs in "
                  f"{ctl.store.path} (GET /v1/jobs, /v1/jobs/ID); stop with Ctrl-C or SIGTERM",
                  file=sys.stderr, flush=True)
            server.serve_forever()
        finally:
            server.shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        if own:
            ctl.close()
    return 0


def _write_params(path: str | None, params: dict) -> None:
    """--params-out: the agents' parameters as the file agents load (JobParams.load)."""
    if path:
        Path(path).write_text(json.dumps(params, indent=2) + "\n")


def run_job(ctl: Controller, args) -> tuple[object, str]:
    if args.job_cmd == "create":
        hosts = tuple(ctl.topo.hosts) if args.all_hosts else \
            tuple(h.strip() for h in args.hosts.split(",") if h.strip())
        spec = JobSpec(args.job_id, hosts, args.window, args.min_window,
                       agent_port=args.agent_port, mode=args.mode, quorum=args.quorum,
                       patience=args.patience, staleness=args.staleness,
                       fallback=not args.no_fallback)
        rec = ctl.create_job(spec)
        params = ctl.agent_params(rec.job_id).to_dict()
        _write_params(args.params_out, params)
        res = {"job_id": rec.job_id, "pools": _pools(rec), "waiting": rec.waiting,
               "placed": _placed(ctl), "agent_params": params}
        head = (f"job {rec.job_id} created on {', '.join(p.switch for p in rec.pools)}, "
                f"agent ports {_agent_ports(ctl, rec)}")
        if rec.waiting:
            return res, (f"{head}, WAITING for slots: {_waiting_text(spec)}"
                         + _placed_text(ctl))
        return res, (f"{head}:\n" + _table(_pools(rec), ["switch", "slots", "size", "fan_in",
                                                         "role"]) + _placed_text(ctl))
    if args.job_cmd == "set":
        rec = ctl.set_policy(args.job_id, quorum=args.quorum, patience=args.patience,
                             staleness=args.staleness)
        spec = JobSpec.from_dict(rec.spec)
        per = ctl.quorums(args.job_id)
        rows = [{"switch": sw, **q} for sw, q in per.items()]
        agents = {"patience": list(spec.patience), "staleness": spec.staleness,
                  "policy": spec.policy}
        if args.params_out:
            _write_params(args.params_out, ctl.agent_params(args.job_id).to_dict())
        return {"job_id": args.job_id, "quorum": per, "agents": agents}, (
            f"job {args.job_id}: " + ("rounds wait for everyone" if not spec.quorum else
                                      f"quorum {','.join(map(str, spec.quorum))}")
            + f"; agents: {_patience_text(spec.patience)}, staleness {spec.staleness} (policy "
            f"{spec.policy}: running agents of the passing backend change to it after the same "
            "call, within their PASSING_POOL_POLL; new ones start with it)\n"
            + _table(rows, ["switch", "fan_in", "quorum"]))
    if args.job_cmd == "resize":
        return resize(ctl, args)
    if args.job_cmd == "delete":
        rec = ctl.delete_job(args.job_id)
        freed = ", ".join(f"{p.switch} {p.base}-{p.base + p.size - 1}"
                          for p in (*rec.pools, *rec.retiring) if p.size)
        return {"job_id": rec.job_id, "freed": _pools(rec) + _retiring(rec),
                "placed": _placed(ctl)}, \
            f"job {rec.job_id} deleted; slots freed: {freed or 'none'}" + _placed_text(ctl)
    if args.job_cmd == "list":
        rows = [{"job": r.job_id, "mode": r.spec.get("mode", "passing"),
                 "hosts": ",".join(r.spec["hosts"]),
                 "window": (f"waiting ({r.spec['window']})" if r.waiting
                            else r.pools[0].size),
                 "switches": ",".join(p.switch for p in r.pools)}
                for r in ctl.store.jobs()]
        cols = ["job", "mode", "hosts", "window", "switches"]
        return rows, _table(rows, cols) if rows else "no jobs"
    if args.job_cmd == "show":
        ctl.job(args.job_id)  # an unknown job is refused before any switch is asked
        move, error = None, None
        try:
            move = ctl.retire_pools(args.job_id).to_dict()
        except ControllerError as e:  # shown, not fatal: the rest comes from the state file
            error = str(e)
        rec = ctl.job(args.job_id)
        params = ctl.agent_params(args.job_id).to_dict()
        res = {"job_id": rec.job_id, "spec": rec.spec, "pools": _pools(rec),
               "waiting": rec.waiting, "pool_epoch": rec.pool_epoch,
               "installing": rec.installing,
               "retiring": _retiring(rec), "move": move, "agent_params": params}
        if error is not None:
            res["move_error"] = error
        where = (f"WAITING for slots: {_waiting_text(JobSpec.from_dict(rec.spec))}"
                 if rec.waiting else _move_text(rec, move, error))
        return res, (f"job {rec.job_id}: hosts {', '.join(rec.spec['hosts'])}, agent ports "
                     f"{_agent_ports(ctl, rec)}, {where}\n"
                     + _table(_pools(rec), ["switch", "slots", "size", "fan_in", "role",
                                            "generation"])
                     + "\n\nagent parameters:\n" + json.dumps(params, indent=2))
    raise AssertionError(args.job_cmd)


def resize(ctl: Controller, args) -> tuple[object, str]:
    """`job resize`: the job's new pools, its retiring ones and the agents' new parameters."""
    if args.min_window is not None and args.min_window > args.window:
        raise ControllerError(f"job {args.job_id} not resized: --min-window {args.min_window} "
                              f"is larger than --window {args.window}")
    rec = ctl.resize_job(args.job_id, args.window, args.min_window)
    params = ctl.agent_params(rec.job_id).to_dict()
    _write_params(args.params_out, params)
    size = rec.pools[0].size
    res = {"job_id": rec.job_id, "window": size, "pool_epoch": rec.pool_epoch,
           "pools": _pools(rec), "retiring": _retiring(rec), "agent_params": params}
    return res, (f"job {rec.job_id} resized to a window of {size} (pool epoch "
                 f"{rec.pool_epoch}) on {', '.join(p.switch for p in rec.pools)}; its agents "
                 "move at a call boundary, and the old pool is freed once every host has "
                 "contributed to the new one:\n"
                 + _table(_pools(rec), ["switch", "slots", "size", "fan_in", "role"])
                 + "\nretiring:\n" + _table(_retiring(rec), ["switch", "slots", "size"]))


def main(argv: list[str] | None = None, ctl: Controller | None = None) -> int:
    """passing-ctl; with `ctl`, the command runs on that controller (no --config needed)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "job_cmd", None) == "set" and args.quorum is None \
            and args.patience is None and args.staleness is None:
        parser.error("job set: give --quorum, --patience or --staleness")
    try:
        if args.cmd == "serve":
            return serve(args, ctl)
        result, text = run_with(ctl, args) if ctl is not None else run(args)
    except SwitchFailure as e:
        print(f"passing-ctl: {e}", file=sys.stderr)
        return EXIT_SWITCH
    except (ControllerError, JobError, TopologyError, StoreError) as e:
        print(f"passing-ctl: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except SwitchError as e:
        print(f"passing-ctl: {e}", file=sys.stderr)
        return EXIT_SWITCH
    print(json.dumps(result, indent=2, default=str) if getattr(args, "json", False) else text)
    if args.cmd == "stats" and (unread := _unread(result)):
        # What could be read is printed above; the exit code says that some could not.
        print(f"passing-ctl: stats incomplete: no counters from {', '.join(unread)}",
              file=sys.stderr)
        return EXIT_SWITCH
    return 0


if __name__ == "__main__":
    sys.exit(main())
