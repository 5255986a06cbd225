"""A job's aggregation tree, taken from the controller's own plan (controller.job_plan.plan).

The plan says, for every switch of the job, whether it is the root, who its members are (hosts
at a ToR, the switches below at a spine or core) with how many contributions each sends (1 per
host in `passing`, the host's GPUs in `ina`), and its way up. Where several spines (or cores)
could be a job's root, the controller picks one by the slots its switches have free
(controller/lifecycle.py): SlotBook keeps the simulated jobs' slots and ranks switches by the
same rule, so concurrent jobs spread over the spines as the controller spreads them. The
simulator's switches do what those entries make the real switch do: wait for every member's
contribution to a slot, send the sum up (or, at the root, multicast the result down), and pass
a result from above down to their members.

An `ina` job with more GPUs in a rack than a switch's 64 contributor ids (P.MAX_FAN_IN) is
refused by the controller (the contributor bitmap is 64 bits). For fabrics where that happens
the tree is taken from the `passing` plan of the same hosts with each host counting its GPUs,
and the JobTree says so (`beyond_bitmap`): what INA would cost if the switch had the ids.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from controller.job_plan import JobError, JobPlan, JobSpec, plan
from controller.topology import Topology
from passing import protocol as P


@dataclass(frozen=True)
class TreeNode:
    """One switch of a job's tree."""

    switch: str
    parent: str | None  # where its sums go; None at the root
    members: tuple[str, ...]  # hosts (at a ToR) or ToRs (at the spine), in contributor order
    counts: tuple[int, ...]  # contributions each member sends per slot

    @property
    def fan_in(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class JobTree:
    job_id: int
    mode: str
    hosts: tuple[str, ...]
    nodes: dict[str, TreeNode]
    window: int
    beyond_bitmap: bool = False  # the controller would refuse this ina job (see module doc)

    @property
    def root(self) -> str:
        return next(n.switch for n in self.nodes.values() if n.parent is None)

    def tor_of(self, host: str) -> str:
        return next(n.switch for n in self.nodes.values() if host in n.members)

    def streams(self, host: str) -> int:
        """Contributions (streams) a host sends: 1 in passing, its GPUs in ina."""
        node = self.nodes[self.tor_of(host)]
        return node.counts[node.members.index(host)]

    def children(self, switch: str) -> tuple[str, ...]:
        return self.nodes[switch].members

    def is_switch(self, name: str) -> bool:
        return name in self.nodes

    @property
    def depth(self) -> int:
        """Switch levels from a host to the root: 1 for a rack's ToR, 2 under a spine, ..."""
        levels, node = 1, self.nodes[self.tor_of(self.hosts[0])]
        while node.parent is not None:
            levels, node = levels + 1, self.nodes[node.parent]
        return levels


class SlotBook:
    """Slots the simulated jobs hold on each switch, and the controller's rule for choosing a
    new job's root among the switches that could be it (controller/lifecycle.py, `_rank`):
    first those where the job's window fits, then the most free slots, then by name."""

    def __init__(self, capacity: int = P.SLOT_CAPACITY):
        self.capacity = capacity
        self.used: Counter[str] = Counter()

    def rank(self, window: int) -> Callable[[str], tuple]:
        return lambda s: (self.capacity - self.used[s] < window, self.used[s] - self.capacity, s)

    def take(self, tree: JobTree) -> None:
        for switch in tree.nodes:
            self.used[switch] += tree.window


def _plan(spec: JobSpec, topo: Topology, book: SlotBook | None) -> JobPlan:
    """controller.job_plan.plan, choosing the tree by `book` where the plan takes a rank (a
    controller of one spine per fabric has no choice to make, and no rank)."""
    if book is not None and "rank" in inspect.signature(plan).parameters:
        return plan(spec, topo, rank=book.rank(spec.window))
    return plan(spec, topo)


def job_tree(topo: Topology, hosts: list[str], mode: str = "passing", window: int = 256,
             job_id: int = 1, book: SlotBook | None = None) -> JobTree:
    """The tree the controller would install for a job of `hosts` in `mode`, next to the jobs
    whose slots `book` holds (and then holds this one's)."""
    beyond = False
    try:
        job_plan = _plan(JobSpec(job_id, tuple(hosts), window, mode=mode), topo, book)
    except JobError:
        if mode != "ina":
            raise
        # More GPUs in a rack than contributor ids: the passing plan's tree, GPUs counted.
        job_plan = _plan(JobSpec(job_id, tuple(hosts), window, mode="passing"), topo, book)
        beyond = True
    nodes: dict[str, TreeNode] = {}
    for name, role in job_plan.roles.items():
        members = tuple(m.name for m in role.members)
        if beyond:  # hosts count their GPUs; ToRs (members at the spine) one sum each
            counts = tuple(topo.hosts[m].gpus if m in topo.hosts else 1 for m in members)
        else:
            counts = tuple(m.count for m in role.members)
        parent = role.uplink.name if role.uplink is not None else None
        nodes[name] = TreeNode(name, parent, members, counts)
    tree = JobTree(job_id, mode, tuple(hosts), nodes, window, beyond)
    if book is not None:
        book.take(tree)
    return tree


def fits_bitmap(tree: JobTree) -> bool:
    return all(n.fan_in <= P.MAX_FAN_IN for n in tree.nodes.values())
