"""`python -m sim run`: strategies and sizes on one fabric, as `make bench` sweeps them.

A shipped topology (or a generated fabric) with every link at one rate and every host with one
GPU count, a job over n of its hosts (spread over the racks, as bench.sweep picks them), and
each strategy at each size. The costs are the emulation's at a `make bench` report's
calibration (`--costs emulation`, the default for topology files) or a datacenter's
(`--costs datacenter`, the default for generated fabrics).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.topology import Topology
from sim import fabric
from sim.costs import Calibration, Costs, datacenter, emulation
from sim.runner import Case, CaseResult
from sim.strategies import JobRun
from sim.validate import WINDOWS, speculates_on

COLUMNS = ["topology", "costs", "strategy", "hosts", "gpus_per_host", "size_bytes", "bw_mbps",
           "window", "speculating", "sim_s", "algbw_gbps", "comms", "wall_s", "notes", "error"]


@dataclass(frozen=True)
class RunSpec:
    topo: Topology
    strategies: list[str]
    sizes: list[int]
    hosts: int  # job size; 0: every host
    costs: Costs
    target: str  # model or bmv2 (window and calibration of the emulation)
    window: int | None
    calibration: Calibration | None  # for the emulation's call plan (speculation)
    max_chunks: int = 64


def make_costs(kind: str, cal: Calibration | None, gpus: int, in_host: str) -> Costs:
    if kind == "emulation":
        if cal is None:
            raise ValueError("--costs emulation needs a calibration (a make bench report)")
        return emulation(cal)
    return datacenter(in_host, gpus)


def cases(spec: RunSpec) -> list[tuple[Case, dict]]:
    topo = spec.topo
    hosts = fabric.spread(topo, spec.hosts or len(topo.hosts))
    gpus = topo.hosts[hosts[0]].gpus
    bw = fabric.host_mbps(topo)
    window = spec.window or WINDOWS[spec.target]
    out = []
    for size in spec.sizes:
        for strategy in spec.strategies:
            spec_call = (speculates_on(topo, hosts, strategy, size, bw, spec.calibration, window)
                         if spec.calibration is not None else True)
            job = JobRun(1, tuple(hosts), strategy, size, window, spec_call)
            meta = {"topology": topo.name, "costs": spec.costs.name, "strategy": strategy,
                    "hosts": len(hosts), "gpus_per_host": gpus, "size_bytes": size,
                    "bw_mbps": bw, "window": window, "speculating": spec_call}
            out.append((Case(topo, (job,), spec.costs, max_chunks=spec.max_chunks,
                             label=f"{strategy} {size}"), meta))
    return out


def row(meta: dict, result: CaseResult) -> dict:
    sim_s = result.time if not result.error else 0.0
    return {**meta, "sim_s": sim_s,
            "algbw_gbps": meta["size_bytes"] * 8 / sim_s / 1e9 if sim_s else 0.0,
            "comms": result.comms, "wall_s": round(result.wall_s, 2),
            "notes": "; ".join(result.notes), "error": result.error}
