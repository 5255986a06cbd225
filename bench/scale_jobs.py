"""The jobs of the controller-at-scale benchmark (bench.controller_scale): many concurrent jobs
of 8 to 512 hosts on a generated fabric, placed the way a cluster scheduler places them.

Sizes are powers of two from `smallest` to `largest` hosts, each size half as many jobs as the
one below it (most jobs are small, a few are very large: the shape of shared training clusters'
job-size distributions); what is left over goes to the smallest size. A job of at most a rack's
hosts lies in one rack; a larger one takes whole consecutive racks. Where it starts is drawn
(seeded), so jobs overlap: a host may serve several jobs (one GPU each, say); which of its GPUs
a job uses is the scheduler's business, not the controller's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from controller.topology import Topology


@dataclass(frozen=True)
class ScaleJob:
    job_id: int
    hosts: tuple[str, ...]
    racks: int  # ToRs the job spans


def sizes(jobs: int, smallest: int = 8, largest: int = 512) -> list[int]:
    """`jobs` sizes, largest first: each power of two from `largest` down to `smallest`, the
    count doubling at each halving, the rest at `smallest`."""
    if jobs < 1 or smallest < 1 or largest < smallest:
        raise ValueError(f"jobs {jobs}, sizes {smallest}..{largest}: nothing to place")
    steps = []
    size = largest
    while size >= smallest:
        steps.append(size)
        size //= 2
    # Counts 1, 2, 4, ... from the largest size: scaled so that they sum to at most `jobs`.
    counts = [1 << i for i in range(len(steps))]
    scale = max(1, jobs // sum(counts))
    counts = [c * scale for c in counts]
    while sum(counts) > jobs:
        counts[-1 - next(i for i, c in enumerate(reversed(counts)) if c)] -= 1
    counts[-1] += jobs - sum(counts)
    return [s for s, c in zip(steps, counts, strict=True) for _ in range(c)]


def racks_of(topo: Topology) -> list[list[str]]:
    """Each ToR's hosts, in port order, ToRs in the topology's order."""
    by_rack: dict[str, list[tuple[int, str]]] = {}
    for h in topo.hosts.values():
        by_rack.setdefault(h.rack, []).append((h.port, h.name))
    return [[name for _, name in sorted(by_rack[t])] for t in topo.switches if t in by_rack]


def place(topo: Topology, jobs: int, seed: int = 1, smallest: int = 8,
          largest: int = 512, first_id: int = 1) -> list[ScaleJob]:
    """`jobs` jobs over `topo`'s racks (see the module doc), ids from `first_id`."""
    racks = racks_of(topo)
    per_rack = min(len(r) for r in racks)
    total = sum(len(r) for r in racks)
    if largest > total:
        raise ValueError(f"a job of {largest} hosts does not fit {total} hosts")
    rng = random.Random(seed)
    out = []
    for i, size in enumerate(sizes(jobs, smallest, largest)):
        if size <= per_rack:
            rack = racks[rng.randrange(len(racks))]
            start = rng.randrange(len(rack))
            hosts = tuple(rack[(start + j) % len(rack)] for j in range(size))
            spanned = 1
        else:
            spanned = -(-size // per_rack)
            first = rng.randrange(len(racks))
            chosen = [racks[(first + r) % len(racks)] for r in range(spanned)]
            hosts = tuple(h for rack in chosen for h in rack)[:size]
        out.append(ScaleJob(first_id + i, hosts, spanned))
    return out
