"""The controller at scale: a generated fabric (default 32 racks x 32 hosts x 8 GPUs, 4 spines),
one software-model switch process per switch, each with its own P4Runtime (gRPC) server, and
many concurrent jobs created through `passing-ctl`'s own code path.

    python -m bench.controller_scale --out build/controller-scale        # 1,024 hosts, 256 jobs
    python -m bench.controller_scale --racks 4 --hosts-per-rack 8 --jobs 12 --largest 16 ...

What it times, on one controller held across calls (as `passing-ctl serve` or a scheduler
holds it): `prepare` (every switch's pipeline and forwarding), each `job create`, `job list`,
and `reconcile` by a fresh controller on the same state file (a controller restart: it reads
every switch back). Also a few `passing-ctl job create` as separate processes, as a user types
them (the process start and the connections to the job's switches included). Then it reads
every table of every switch back over P4Runtime and counts the entries, against the sizes the
P4 program declares. Refused jobs are counted with the controller's reason, never dropped.

The switches are real processes with real gRPC servers, but no ports: no packet flows here, so
no Mininet (its 1,061 links would not start on two cores). Results: <out>/controller-scale.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.scale_jobs import ScaleJob, place
from bench.switch_farm import SwitchFarm
from controller.cli import build_parser, load_controller, run_with
from controller.core import Controller
from controller.errors import ControllerError
from controller.topology import Topology, load
from passing.pipeline_files import committed_p4info
from topologies.fabric import FabricLayout, document

# Below Linux's ephemeral ports (32768-60999 by default), which outgoing connections take.
GRPC_BASE = 24001


def _args(cfg: Path, *argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["--config", str(cfg), *argv])


def _timed(ctl: Controller, cfg: Path, *argv: str) -> tuple[float, object]:
    t0 = time.perf_counter()
    result, _ = run_with(ctl, _args(cfg, *argv))
    return time.perf_counter() - t0, result


def _create_argv(job: ScaleJob, window: int, min_window: int) -> list[str]:
    return ["job", "create", str(job.job_id), "--hosts", ",".join(job.hosts),
            "--window", str(window), "--min-window", str(min_window)]


def _summary(times: list[float]) -> dict:
    if not times:
        return {"n": 0}
    return {"n": len(times), "median_s": statistics.median(times), "max_s": max(times),
            "mean_s": statistics.fmean(times), "total_s": sum(times)}


def table_entries(ctl: Controller) -> dict[str, dict[str, int]]:
    """Entries of every table (and multicast groups) on every switch, read back."""
    tables = [t.preamble.name for t in committed_p4info().tables]
    out = {}
    for name in ctl.topo.switches:
        conn = ctl.conn(name)
        out[name] = {t.split(".")[-1]: len(conn.read_table(t)) for t in tables}
        out[name]["multicast_groups"] = len(conn.read_multicast_groups())
    return out


def table_sizes() -> dict[str, int]:
    return {t.preamble.name.split(".")[-1]: t.size for t in committed_p4info().tables}


def run(layout: FabricLayout, jobs: list[ScaleJob], out: Path, window: int, min_window: int,
        max_jobs: int | None, cli_samples: int, shares: int | None = None,
        reserve: int | None = None) -> dict:
    """max_jobs, shares, reserve: the controller configuration's (None: its defaults)."""
    topo_file = out / "fabric.json"  # written by write_fabric
    topo = load(topo_file)
    ports = {s.name: GRPC_BASE + s.index for s in topo.switches.values()}
    cfg = out / "controller.json"
    (out / "controller.sqlite").unlink(missing_ok=True)
    limits = {k: v for k, v in (("max_jobs", max_jobs), ("shares", shares),
                                ("reserve", reserve)) if v is not None}
    cfg.write_text(json.dumps({
        "topology": topo_file.name, "state": "controller.sqlite", **limits,
        "switches": {n: {"address": f"127.0.0.1:{p}", "device_id": topo.switches[n].index}
                     for n, p in ports.items()}}, indent=1))
    res: dict = {"fabric": layout.title(), "hosts": len(topo.hosts),
                 "switches": len(topo.switches), "jobs_asked": len(jobs), "window": window,
                 "min_window": min_window}
    with SwitchFarm(ports, out / "switch-logs") as farm:
        res["switch_start_s"] = farm.started_in
        ctl = load_controller(_args(cfg, "job", "list"))
        a = next(iter(ctl.slots().values()))
        res["max_jobs"], res["shares"], res["share"] = a.max_jobs, a.shares, a.fair_share()
        res["reserve"] = a.reserve
        try:
            res["prepare_s"], _ = _timed(ctl, cfg, "prepare")
            creates, refused, shrunk = [], {}, []
            for job in jobs:
                t0 = time.perf_counter()
                try:
                    run_with(ctl, _args(cfg, *_create_argv(job, window, min_window)))
                    creates.append(time.perf_counter() - t0)
                    shrunk += [(r.job_id, r.pools[0].size) for r in ctl.shrunk]
                except ControllerError as e:
                    refused[job.job_id] = {"hosts": len(job.hosts), "racks": job.racks,
                                           "why": str(e)}
            res["create"] = _summary(creates)
            res["refused"] = refused
            res["shrunk"] = shrunk
            res["waiting"] = [r.job_id for r in ctl.waiting_jobs()]
            res["list_s"], listed = _timed(ctl, cfg, "job", "list")
            res["listed"] = len(listed)
            res["jobs"] = {str(r["job"]): {"hosts": r["hosts"].split(","), "window": r["window"],
                                           "switches": r["switches"].split(",")}
                           for r in listed}
            res["entries"] = table_entries(ctl)
            res["table_sizes"] = table_sizes()
        finally:
            ctl.close()
        ctl = load_controller(_args(cfg, "job", "list"))
        try:
            res["reconcile_s"], rep = _timed(ctl, cfg, "reconcile")
            res["reconcile_repaired"] = sum(len(e["repaired"]) for e in rep.values())
            res["reconcile_errors"] = [x for e in rep.values() for x in e["errors"]]
            samples = [j for j in jobs if j.job_id not in res["refused"]][:cli_samples]
            for j in samples:
                run_with(ctl, _args(cfg, "job", "delete", str(j.job_id)))
            res["moved"] = free_for_waiting(ctl, cfg)
            res["still_waiting"] = [r.job_id for r in ctl.waiting_jobs()]
        finally:
            ctl.close()
        res["cli_create"] = _summary([_cli_create(cfg, j, window, min_window)
                                      for j in samples])
        res["switches_alive"] = farm.alive()
    (out / "controller-scale.json").write_text(json.dumps(res, indent=1))
    return res


def free_for_waiting(ctl, cfg: Path) -> list[dict]:
    """For each job still waiting for slots, oldest first: delete the jobs sharing a switch
    with it, oldest first, until one delete moves it onto its switches; what that took (the
    deletes, the time of the delete that moved it, which includes placing it)."""
    moved = []
    for w in ctl.waiting_jobs():
        if not ctl.job(w.job_id).waiting:
            continue  # placed meanwhile, by a delete made for an older one
        switches = {p.switch for p in w.pools}
        deletes = 0
        for other in ctl.store.jobs():
            if other.waiting or not switches & {p.switch for p in other.pools}:
                continue
            t0 = time.perf_counter()
            run_with(ctl, _args(cfg, "job", "delete", str(other.job_id)))
            deletes += 1
            if w.job_id in [r.job_id for r in ctl.placed]:
                moved.append({"job": w.job_id, "deletes": deletes,
                              "delete_s": time.perf_counter() - t0,
                              "window": ctl.job(w.job_id).pools[0].size})
                break
    return moved


def _cli_create(cfg: Path, job: ScaleJob, window: int, min_window: int) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "controller.cli", "--config", str(cfg),
                    *_create_argv(job, window, min_window)], check=True,
                   capture_output=True, text=True)
    return time.perf_counter() - t0


def refusal_kind(why: str) -> str:
    """Which of the allocator's rules refused a job, from the controller's message."""
    if "(max_jobs" in why:
        return "a switch already holds max_jobs jobs"
    return "no window fits (shares, free ranges)"


def report(res: dict) -> str:
    c, cli = res["create"], res["cli_create"]
    lines = [f"{res['fabric']}: {res['hosts']} hosts, {res['switches']} switch processes "
             f"(started in {res['switch_start_s']:.1f} s), max_jobs {res['max_jobs']}, "
             f"shares {res.get('shares', res['max_jobs'])}, reserve {res.get('reserve', 0)}",
             f"prepare: {res['prepare_s']:.2f} s",
             f"job create: {c['n']} of {res['jobs_asked']} created, median "
             f"{c.get('median_s', 0):.3f} s, slowest {c.get('max_s', 0):.3f} s, all "
             f"{c.get('total_s', 0):.1f} s, {len(res.get('waiting', []))} of them waiting "
             f"for slots; {len(res['refused'])} refused",
             f"job list ({res['listed']} jobs): {res['list_s']:.3f} s",
             f"reconcile by a fresh controller: {res['reconcile_s']:.2f} s, "
             f"{res['reconcile_repaired']} repaired, {len(res['reconcile_errors'])} errors",
             f"passing-ctl job create as a process: median {cli.get('median_s', 0):.2f} s "
             f"over {cli['n']}"]
    granted: dict[int, int] = {}
    for job in res.get("jobs", {}).values():
        if isinstance(job["window"], int):  # else "waiting (W)"
            granted[job["window"]] = granted.get(job["window"], 0) + 1
    lines.append(f"windows granted (asked {res['window']}, at least {res['min_window']}): "
                 + ", ".join(f"{n} jobs {w}" for w, n in sorted(granted.items(), reverse=True)))
    reasons: dict[str, dict[int, int]] = {}
    for r in res["refused"].values():
        by_size = reasons.setdefault(refusal_kind(r["why"]), {})
        by_size[r["hosts"]] = by_size.get(r["hosts"], 0) + 1
    for kind, by_size in reasons.items():
        sizes = ", ".join(f"{n} of {h} hosts" for h, n in sorted(by_size.items()))
        lines.append(f"  refused, {kind}: {sum(by_size.values())} ({sizes})")
    if res.get("shrunk"):
        lines.append(f"  running jobs shrunk for waiting ones during the creates: "
                     f"{len(res['shrunk'])} (" + ", ".join(f"job {j} to {w}"
                                                            for j, w in res["shrunk"]) + ")")
    for m in res.get("moved", []):
        lines.append(f"  waiting job {m['job']} moved onto its switches (window {m['window']}) "
                     f"by the delete of the {_nth(m['deletes'])} job sharing one of its "
                     f"switches: that delete took {m['delete_s']:.2f} s")
    sizes = res["table_sizes"]
    for table in sorted(sizes):
        most = max(res["entries"].items(), key=lambda kv: kv[1].get(table, 0))
        lines.append(f"  {table}: most entries {most[1].get(table, 0)} (on {most[0]}) of "
                     f"{sizes[table]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.controller_scale",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--racks", type=int, default=32)
    p.add_argument("--hosts-per-rack", type=int, default=32)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--spines", type=int, default=4)
    p.add_argument("--jobs", type=int, default=256)
    p.add_argument("--smallest", type=int, default=8, help="hosts of the smallest job")
    p.add_argument("--largest", type=int, default=512, help="hosts of the largest job")
    p.add_argument("--window", type=int, default=64, help="each job's wanted window")
    p.add_argument("--min-window", type=int, default=8, help="each job's smallest window")
    p.add_argument("--max-jobs", type=int, help="jobs per switch (the controller's max_jobs; "
                   "default: its default)")
    p.add_argument("--shares", type=int, help="equal shares of a switch's slots (the "
                   "controller's shares; default: its default)")
    p.add_argument("--reserve", type=int, help="slots per switch kept for shrinking running "
                   "jobs (the controller's reserve; default: its default, 0)")
    p.add_argument("--cli-samples", type=int, default=3,
                   help="jobs re-created by passing-ctl as separate processes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("build/controller-scale"))
    a = p.parse_args(argv)
    layout = FabricLayout(a.racks, a.hosts_per_rack, a.gpus, a.spines)
    jobs = place(write_fabric(layout, a.out), a.jobs, a.seed, a.smallest, a.largest)
    res = run(layout, jobs, a.out, a.window, a.min_window, a.max_jobs, a.cli_samples, a.shares,
              a.reserve)
    print(report(res))
    return 0 if res["switches_alive"] else 1


def write_fabric(layout: FabricLayout, out: Path) -> Topology:
    """<out>/fabric.json, loaded."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "fabric.json"
    path.write_text(json.dumps(document(layout), indent=1))
    return load(path)


def _nth(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


if __name__ == "__main__":
    sys.exit(main())
