"""One simulation per process.

SimGrid's engine can be created once per process, so every Case runs in a child process of its
own (forked: the parent never creates an engine), and a pool runs several at once. A Case is a
platform (a Topology and its costs) and the jobs that run on it at the same time; the result
is each job's all-reduce time (its slowest rank's) in simulated seconds.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from controller.topology import Topology
from sim.costs import Costs
from sim.strategies import JobRun

# SimGrid's network model as it comes (LV08: bandwidth factor 0.97, cross-traffic 5%); only
# its logging is quieter.
ENGINE_ARGS = ["sim", "--log=root.thres:warning", "--log=xbt_cfg.thres:warning"]
# LV08's cross-traffic is TCP's ACKs: each flow loads its reverse path with 5% of its rate.
# PASSING and INA send UDP, which has no ACKs, and their reverse traffic (the results) is
# simulated as flows of its own, so where every job of a case is one of them it is off.
DATAGRAM_STRATEGIES = ("passing", "ina")
NO_CROSSTRAFFIC = "--cfg=network/crosstraffic:0"


@dataclass(frozen=True)
class Case:
    topo: Topology
    jobs: tuple[JobRun, ...]
    costs: Costs
    max_chunks: int = 64  # chunks per PASSING/INA stream, and per parameter-server worker
    max_steps: int = 64  # rounds a ring's 2(N-1) steps are grouped into, at most
    label: str = ""
    # Concurrent jobs' roots: chosen as the controller chooses them (by free slots), or, False,
    # by name alone (every job of a leaf-spine under its first spine, as before the controller
    # chose).
    spread_roots: bool = True

    @property
    def engine_args(self) -> list[str]:
        datagrams = all(j.strategy in DATAGRAM_STRATEGIES for j in self.jobs)
        return ENGINE_ARGS + ([NO_CROSSTRAFFIC] if datagrams else [])

    @property
    def bus_gbps(self) -> float:
        """The in-host bus: shared memory / NVLink for the switched strategies' local stage,
        loopback TCP for the gloo ones (the same bus outside the emulation)."""
        switched = self.jobs[0].strategy in ("passing", "ina")
        return self.costs.local_gbps if switched else self.costs.loopback_gbps


@dataclass
class CaseResult:
    label: str
    seconds: dict[int, float]  # job id -> all-reduce time, simulated seconds
    comms: int
    wall_s: float
    notes: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def time(self) -> float:
        """The first job's time (the only one in most cases)."""
        return next(iter(self.seconds.values()))


def simulate(case: Case) -> CaseResult:
    """Run `case` in this process (which must not have run a SimGrid engine before)."""
    from sim import import_simgrid
    from sim.context import SimContext
    from sim.platform import Platform
    from sim.strategies import Launcher

    sg = import_simgrid()
    started = time.monotonic()
    engine = sg.Engine(case.engine_args)
    platform = Platform(sg, case.topo, case.costs, case.bus_gbps)
    ctx = SimContext(sg, platform, case.costs)
    ctx.start_cpu_proxies()
    launcher = Launcher(ctx, case.topo, case.max_chunks, case.max_steps, case.spread_roots)
    for job in case.jobs:
        launcher.launch(job)
    engine.run()
    seconds = {j.job_id: ctx.timings.job_time(j.job_id) for j in case.jobs}
    return CaseResult(case.label, seconds, ctx.timings.comms, time.monotonic() - started,
                      launcher.notes)


def _child(case: Case) -> CaseResult:
    try:
        return simulate(case)
    except Exception as e:  # reported with the case, not raised across the pool
        return CaseResult(case.label, {}, 0, 0.0, error=f"{type(e).__name__}: {e}")


def run_cases(cases: Iterable[Case], workers: int = 2,
              progress: Callable[[int, int, CaseResult], None] | None = None
              ) -> Iterator[CaseResult]:
    """Each case in a fresh process, `workers` at a time, results in the cases' order."""
    cases = list(cases)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(processes=max(1, workers), maxtasksperchild=1) as pool:
        for i, result in enumerate(pool.imap(_child, cases, chunksize=1)):
            if progress is not None:
                progress(i + 1, len(cases), result)
            yield result


def run_one(case: Case) -> CaseResult:
    """One case in a child process; raises if the simulation failed."""
    result = next(run_cases([case], workers=1))
    if result.error:
        raise RuntimeError(f"simulation {case.label or ''} failed: {result.error}")
    return result


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a fresh child process (one that may create a SimGrid engine), its result
    returned here; fn must be importable by name."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(processes=1, maxtasksperchild=1) as pool:
        return pool.apply(fn, args)
