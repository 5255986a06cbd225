"""Ordinary traffic's ways through a fabric: the port each switch forwards a host's MAC to, and
the ports it floods to (ARP, unknown unicast).

A fabric with several spines (or cores) has loops, and switches that forward by MAC alone have
no TTL to end a frame that goes round one, so both are chosen to be loop-free:

* Towards a host: each switch sends the frame to a neighbor one hop closer to the host's ToR
  (shortest paths over the switch links). Among several such neighbors (a ToR's spines, a
  spine's cores, a core's spines in the host's pod), it takes, in order of switch index, the
  one at the destination rack's position among the ToRs modulo their number: racks spread over
  the spines, and each switch's way to one host is one port. Every hop gets closer, so no
  frame visits a switch twice.
* Flooding: a spanning tree of the switch links, rooted at the first switch (file order) of
  the top tier; every other switch is attached to its neighbor one hop closer to the root with
  the lowest index (a ToR floods up to its first spine only, and only the first spine or core
  floods down to it). A switch floods to its hosts and to its tree links; as a flooded copy
  never leaves through the port it came in on (p4src/include/forwarding.p4), a flood reaches
  every host once.
"""

from __future__ import annotations

import functools

from controller.topology_model import Topology


class L2Paths:
    """The forwarding of ordinary traffic on `topo`'s switches."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        # A rack's position among the ToRs picks its way up among equals: racks spread.
        self._position = {s.name: i for i, s in enumerate(topo.of_role("tor"))}
        self._by_rack: dict[str, dict[str, int]] = {}  # rack -> hops to it, filled as asked

    def to_hosts(self, switch: str) -> dict[str, int]:
        """Host MAC -> the port of `switch` it forwards frames for that host to; hosts it has no
        path to (racks no link joins) are left out, and flooded."""
        out = {}
        for h in self.topo.hosts.values():
            if h.rack == switch:
                out[h.mac] = h.port
                continue
            nxt = self.next_hop(switch, h.rack)
            if nxt is not None:
                out[h.mac] = self.topo.neighbors(switch)[nxt]
        return out

    def next_hop(self, switch: str, rack: str) -> str | None:
        """The neighbor `switch` sends frames for hosts of `rack` to; None at the rack itself
        or where no path leads there."""
        dist = self._distances(rack)
        if switch == rack or switch not in dist:
            return None
        closer = sorted((n for n in self.topo.neighbors(switch) if dist.get(n) == dist[switch] - 1),
                        key=self._index)
        return closer[self._position[rack] % len(closer)]

    def flood_ports(self, switch: str) -> list[int]:
        """The ports `switch` floods to: its hosts' and its spanning-tree links'."""
        ports = [h.port for h in self.topo.hosts.values() if h.rack == switch]
        near = self.topo.neighbors(switch)
        ports += [near[n] for n in near
                  if self._tree_parent.get(switch) == n or self._tree_parent.get(n) == switch]
        return sorted(ports)

    @functools.cached_property
    def _tree_parent(self) -> dict[str, str]:
        """Switch -> its parent in the flood tree (the root and unreachable switches: none)."""
        top = max(s.tier for s in self.topo.switches.values())
        root = next(s.name for s in self.topo.switches.values() if s.tier == top)
        dist = self._bfs(root)
        return {s: min((n for n in self.topo.neighbors(s) if dist.get(n) == d - 1),
                       key=self._index)
                for s, d in dist.items() if d > 0}

    def _distances(self, rack: str) -> dict[str, int]:
        if rack not in self._by_rack:
            self._by_rack[rack] = self._bfs(rack)
        return self._by_rack[rack]

    def _bfs(self, start: str) -> dict[str, int]:
        """Hops from `start` to every switch a path of links reaches."""
        dist = {start: 0}
        frontier = [start]
        while frontier:
            nxt = []
            for s in frontier:
                for n in self.topo.neighbors(s):
                    if n not in dist:
                        dist[n] = dist[s] + 1
                        nxt.append(n)
            frontier = nxt
        return dist

    def _index(self, switch: str) -> int:
        return self.topo.switches[switch].index
