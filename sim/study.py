"""The 1,024-host study: what the strategies cost on a fabric no machine here can emulate.

A leaf-spine fabric of 32 racks x 32 hosts under 4 spines (sim.fabric), datacenter costs
(sim.costs.datacenter: switch ASICs at line rate, agents at NIC rate, NVLink in the servers
unless said otherwise), one job over every host unless said otherwise. Four parts:

* `gpus`: GPUs per host 1, 2, 4, 8 at 100 Gbit/s host links, oversubscription 1:1 and 4:1,
  100 MB and 1 GB, every strategy;
* `rates`: host links from 100 Mbit/s to 100 Gbit/s, 8 GPUs per host, 1:1;
* `jobs`: four jobs of 256 hosts at once, either each in 8 whole racks (`packed`) or each with
  8 hosts in every rack (`spread`), 8 GPUs per host, 1 GB, 1:1 and 4:1. The controller roots
  each job at the spine with the most free slots, so four jobs get four spines;
  `spread-spine1` roots them all at the first spine, as the plan did before it chose;
* `pcie`: the in-host stage over PCIe instead of NVLink, 8 GPUs per host, 100 Gbit/s.

Granularity (what keeps a case to a minute on two cores): PASSING and INA streams in chunks
of at most 1/16 of the stream, after a ramp from one packet (sim.stream); rings in at most 16
rounds (sim.collectives); the parameter server in at most 16 chunks after a ramp.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from controller.topology import Topology
from sim import fabric
from sim.costs import datacenter
from sim.runner import Case, CaseResult
from sim.strategies import STRATEGIES, JobRun

RACKS, HOSTS_PER_RACK, SPINES = 32, 32, 4
MB, GB = 10**6, 10**9
SIZES = (100 * MB, 1 * GB)
GPUS = (1, 2, 4, 8)
RATES_MBPS = (100.0, 1_000.0, 10_000.0, 100_000.0)
MAX_CHUNKS = 16
MAX_ROUNDS = 16
WINDOW = 256  # the window make run-topology gives a job on the model switch
CONCURRENT_JOBS = 4
CONCURRENT_STRATEGIES = ("passing", "ring", "hier-ring")
PLACEMENTS = ("packed", "spread", "spread-spine1")


@dataclass(frozen=True)
class StudyCase:
    part: str
    strategy: str
    size_bytes: int
    gpus: int
    host_mbps: float
    oversubscription: float = 1.0
    jobs: int = 1
    placement: str = "one job"  # or packed / spread / spread-spine1 (several jobs)
    in_host: str = "nvlink"

    @property
    def label(self) -> str:
        return (f"{self.part}: {self.strategy} {self.size_bytes / MB:g} MB, {self.gpus} GPUs, "
                f"{self.host_mbps:g} Mbit/s, {self.oversubscription:g}:1, {self.jobs} job(s) "
                f"{self.placement}, {self.in_host}")


def cases(parts: Iterable[str] = ("gpus", "rates", "jobs", "pcie"),
          strategies: Iterable[str] = STRATEGIES, quick: bool = False) -> list[StudyCase]:
    """The study's cases; `quick`: 100 MB only, 1 and 8 GPUs, 100 Gbit/s and 1 Gbit/s."""
    parts, strategies = set(parts), list(strategies)
    sizes = SIZES[:1] if quick else SIZES
    gpus = (1, 8) if quick else GPUS
    rates = (1_000.0, 100_000.0) if quick else RATES_MBPS
    out: list[StudyCase] = []
    if "gpus" in parts:
        out += [StudyCase("gpus", s, size, g, 100_000.0, o)
                for o in (1.0, 4.0) for size in sizes for g in gpus for s in strategies]
    if "rates" in parts:
        out += [StudyCase("rates", s, size, 8, r)
                for size in sizes for r in rates for s in strategies
                if not ("gpus" in parts and r == 100_000.0 and 8 in gpus)]
    if "jobs" in parts:
        out += [StudyCase("jobs", s, sizes[-1], 8, 100_000.0, o, CONCURRENT_JOBS, p)
                for o in (1.0, 4.0) for p in PLACEMENTS
                for s in strategies if s in CONCURRENT_STRATEGIES]
    if "pcie" in parts:
        out += [StudyCase("pcie", s, size, 8, 100_000.0, in_host="pcie")
                for size in sizes for s in strategies if s != "ps"]
    return out


def job_hosts(topo: Topology, jobs: int, placement: str) -> list[tuple[str, ...]]:
    """The hosts of each job: one job over all; `packed`: each job whole racks; `spread`: each
    job the same share of every rack."""
    racks = fabric.tors(topo)
    by_rack = {r: [h.name for h in topo.hosts_in(r)] for r in racks}
    if jobs == 1:
        return [tuple(h for r in racks for h in by_rack[r])]
    if placement == "packed":
        per = len(racks) // jobs
        return [tuple(h for r in racks[j * per:(j + 1) * per] for h in by_rack[r])
                for j in range(jobs)]
    return [tuple(h for r in racks for i, h in enumerate(by_rack[r]) if i % jobs == j)
            for j in range(jobs)]  # spread, spread-spine1


def build(sc: StudyCase) -> Case:
    spec = fabric.FabricSpec(RACKS, HOSTS_PER_RACK, SPINES, sc.gpus, sc.host_mbps,
                             sc.oversubscription)
    topo = fabric.generate(spec)
    runs = tuple(JobRun(j + 1, hosts, sc.strategy, sc.size_bytes, WINDOW, True)
                 for j, hosts in enumerate(job_hosts(topo, sc.jobs, sc.placement)))
    return Case(topo, runs, datacenter(sc.in_host, sc.gpus), max_chunks=MAX_CHUNKS,
                max_steps=MAX_ROUNDS, label=sc.label,
                spread_roots=sc.placement != "spread-spine1")


@dataclass(frozen=True)
class StudyRow:
    case: StudyCase
    seconds: float  # the slowest job's all-reduce time
    mean_job_s: float
    comms: int
    wall_s: float
    notes: str
    error: str = ""

    def to_dict(self) -> dict:
        d = asdict(self.case)
        d.update(seconds=self.seconds, mean_job_s=self.mean_job_s,
                 algbw_gbps=self.case.size_bytes * 8 / self.seconds / 1e9 if self.seconds else 0,
                 comms=self.comms, wall_s=round(self.wall_s, 1), notes=self.notes,
                 error=self.error)
        return d


def row(sc: StudyCase, result: CaseResult) -> StudyRow:
    times = list(result.seconds.values())
    return StudyRow(sc, max(times) if times else 0.0,
                    sum(times) / len(times) if times else 0.0, result.comms, result.wall_s,
                    "; ".join(dict.fromkeys(result.notes)), result.error)


def load_csv(path: str | Path) -> list[StudyRow]:
    """The rows of a study.csv written earlier (to redraw plots and tables without rerunning)."""
    rows = []
    with open(path, newline="") as f:
        for d in csv.DictReader(f):
            sc = StudyCase(d["part"], d["strategy"], int(d["size_bytes"]), int(d["gpus"]),
                           float(d["host_mbps"]), float(d["oversubscription"]), int(d["jobs"]),
                           d["placement"], d["in_host"])
            rows.append(StudyRow(sc, float(d["seconds"]), float(d["mean_job_s"]),
                                 int(d["comms"]), float(d["wall_s"]), d["notes"], d["error"]))
    return rows


COLUMNS = ["part", "strategy", "size_bytes", "gpus", "host_mbps", "oversubscription", "jobs",
           "placement", "in_host", "seconds", "mean_job_s", "algbw_gbps", "comms", "wall_s",
           "notes", "error"]
