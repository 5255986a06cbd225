"""Which switches aggregate a job: its tree over the fabric, from its racks' ToRs up to a root.

* A job in one rack: its ToR alone, the root.
* A job whose racks one spine links to all: ToRs -> that spine (the root). Which spine, among
  all that qualify, is the `rank` of the caller's choosing (the controller's: most free slots).
* Otherwise its racks are grouped by pod (Topology.pod_of) and a core is the root: one under
  which every group has a spine linked to the core and to all of the group's racks. ToRs ->
  their group's spine -> the core; the core, and each group's spine among those that qualify,
  taken by `rank`.

A tree chosen once is the job's for its life: the job stores its switches above the ToRs
(`Tree.above`, JobSpec.tree) and `rebuild` makes the same tree again from them, whatever the
slots are by then.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.topology_model import Topology

# Orders candidate switches: the smallest key is taken.
Rank = Callable[[str], tuple]


class TreeError(ValueError):
    """No tree joins the job's racks, or its stored tree no longer fits the topology."""


def by_name(switch: str) -> tuple:
    return (switch,)


@dataclass(frozen=True)
class Tree:
    root: str
    parent: dict[str, str]  # every switch of the tree but the root -> the switch above it

    def children(self, switch: str) -> list[str]:
        """The switches right below `switch`, ordered by name: their contributor ids there."""
        return sorted(c for c, p in self.parent.items() if p == switch)

    @property
    def switches(self) -> list[str]:
        return [*self.parent, self.root]

    def above(self, topo: Topology) -> tuple[str, ...]:
        """The tree's switches above the ToRs, by tier then name: what a job stores."""
        return tuple(sorted((s for s in self.switches if topo.switches[s].role != "tor"),
                            key=lambda s: (topo.tier(s), s)))


def choose(topo: Topology, racks: Sequence[str], rank: Rank = by_name) -> Tree:
    """The job's tree over `racks` (ToR names), with each choice among equals made by
    `rank` (see the module doc)."""
    if len(racks) == 1:
        return Tree(racks[0], {})
    spines = [s.name for s in topo.of_role("spine")
              if all(topo.link_between(r, s.name) for r in racks)]
    if spines:
        root = min(spines, key=rank)
        return Tree(root, {r: root for r in racks})
    groups: dict[str, list[str]] = {}
    for r in racks:
        groups.setdefault(topo.pod_of(r) or r, []).append(r)
    options = {}
    for core in topo.of_role("core"):
        under = {pod: [s.name for s in topo.of_role("spine")
                       if topo.link_between(s.name, core.name)
                       and all(topo.link_between(r, s.name) for r in rs)]
                 for pod, rs in groups.items()}
        if all(under.values()):
            options[core.name] = under
    if not options:
        raise TreeError(_no_tree(topo, racks, groups))
    root = min(options, key=rank)
    parent = {}
    for pod, rs in groups.items():
        spine = min(options[root][pod], key=rank)
        parent[spine] = root
        parent.update({r: spine for r in rs})
    return Tree(root, parent)


def rebuild(topo: Topology, racks: Sequence[str], above: Sequence[str]) -> Tree:
    """The tree a job chose when it was created, from its stored switches above the ToRs (none
    for jobs stored before trees were chosen: the choice by name, which on a fabric of one
    spine is that spine)."""
    unknown = [s for s in above if s not in topo.switches]
    if unknown:
        raise TreeError(f"its tree names {', '.join(unknown)}, which topology {topo.name} does "
                        "not have")
    chosen = set(above)
    tree = choose(topo, racks, lambda s: (s not in chosen, s))
    if above and set(tree.above(topo)) != chosen:
        raise TreeError(f"its tree ({', '.join(above)}) is not one that joins its racks "
                        f"({', '.join(racks)}) in topology {topo.name}")
    return tree


def _no_tree(topo: Topology, racks: Sequence[str], groups: dict[str, list[str]]) -> str:
    names = ", ".join(racks)
    if not topo.of_role("spine"):
        return "the job spans racks but the topology has no spine"
    if not topo.of_role("core"):
        return f"no spine links every one of the job's racks ({names}), and there is no core"
    pods = "; ".join(f"pod of {pod}: {', '.join(rs)}" for pod, rs in groups.items())
    return (f"no core has, in each pod of the job's racks ({pods}), a spine linked to it and to "
            "all of the job's racks there")
