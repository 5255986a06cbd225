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

import json
import signal
import sys
import threading
from pathlib import Path

from controller.cli_jobs import placed_text, run_job, table
from controller.cli_parser import build_parser as build_parser
from controller.core import (
    DEFAULT_MAX_JOBS,
    Controller,
    ControllerError,
    Endpoint,
    SwitchFailure,
)
from controller.job_plan import JobError
from controller.occupancy_map import occupancy_map
from controller.serve import ParamsServer
from controller.store import StoreError
from controller.switch import SwitchError
from controller.topology import TopologyError, load, read_json
from passing import protocol as P

EXIT_REFUSED, EXIT_SWITCH = 3, 4


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
            endpoints[name] = Endpoint(name, str(sw["address"]), int(sw.get("device_id", 0)),
                                       _preloaded(cfg_path, name, sw))
        except (KeyError, TypeError, ValueError):
            raise ControllerError(f"{cfg_path}: switches.{name} needs \"address\" and an "
                                  "integer \"device_id\"") from None
    max_jobs, shares = _job_limits(cfg, cfg_path)
    reserve = cfg.get("reserve", 0)
    if isinstance(reserve, bool) or not isinstance(reserve, int):
        raise ControllerError(f"{cfg_path}: reserve must be an integer number of slots, not "
                              f"{reserve!r}")
    return Controller(topo, endpoints, base / cfg["state"], max_jobs=max_jobs, shares=shares,
                      reserve=reserve,
                      connect_timeout=args.timeout, retries=args.retries,
                      dump_dir=Path(args.dump_p4runtime) if args.dump_p4runtime else None)


def _preloaded(cfg_path: Path, name: str, sw: dict) -> bool:
    how = sw.get("pipeline", "push")
    if how not in ("push", "preloaded"):
        raise ControllerError(
            f"{cfg_path}: switches.{name}.pipeline is {how!r}: \"push\" (the controller loads "
            "the PASSING pipeline; the default) or \"preloaded\" (the switch's own tools load "
            "it, as on Tofino: docs/tofino.md)")
    return how == "preloaded"


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
            if r["preloaded"] and r["reachable"]:
                # Nothing but the switch's own tools will change that: say so where it matters.
                r["status"] += (" (preloaded)" if r["pipeline"] == "ours" else
                                " (preloaded: load PASSING's with the switch's own tools)")
        return rows, table(rows, ["switch", "role", "address", "device_id", "status"])
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
                        f"{alloc.fair_share()}\n{occupancy_map(alloc)}")
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
    ctl.place_waiting()  # reading the counters may have retired old pools: slots to give
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
    parts = [table(rows, cols)]
    if read:
        drops = [{"job": r["job"], "switch": r["switch"],
                  **{k[6:]: v for k, v in r.items() if k.startswith("drops_")}} for r in read]
        # Switch-wide counters are the same under every job on a switch: shown once per switch.
        per_switch = {r["switch"]: r["switch_drops"] for r in read}
        switch_rows = [{"switch": sw, **counts} for sw, counts in per_switch.items()]
        parts += ["drops:\n" + table(drops, list(drops[0])),
                  "switch-wide drops (no job's row):\n"
                  + table(switch_rows, list(switch_rows[0]))]
    if unread:  # filled by ctl.stats: the same switches and reasons as the rows' "error"
        parts.append("not read:\n" + "\n".join(f"  {sw}: {why}" for sw, why in unread.items()))
    return res, "\n\n".join(parts) + placed_text(ctl)


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
