"""The SimGrid platform of a Topology: hosts, switches and links as SimGrid sees them.

Built with SimGrid's Python platform API (no XML), as nested zones so that a fabric of a
thousand hosts needs no route per pair of hosts:

* one star zone per rack: its ToR and its hosts, each host on a split-duplex link (full duplex,
  each direction its own bandwidth) at the topology's rate; a host's route to itself is its
  in-host bus (NVLink/PCIe, shared memory or loopback TCP: sim.costs), a shared link;
* one zone per switch above the ToRs (spines, and cores where a topology has them), holding
  the switch;
* a full zone above them: a route between every two zones (their switches are the gateways)
  over the switch links of a shortest path. Where several are as short, the choice is fixed
  by the pair: on a leaf-spine, racks i and j go through spine (i + j) mod (common spines), a
  stand-in for ECMP hashing that spreads rack pairs evenly;
* in the emulation, one more zone with "the machine": the host whose cores every process of
  the emulated fabric shares (sim.costs).

Links have no latency. SimGrid shares a link among flows in inverse proportion to their routes'
latencies (TCP's RTT unfairness), and with its cross-traffic (every flow also loads its reverse
path by 5%: ACKs) that made a ring across two racks of leafspine run at 64% of its links instead
of 92% (tests/sim/test_platform.py keeps the case). Without latencies every flow weighs the
same. What latency costs in the real
systems is modelled where it matters: the TCP strategies' per-message overhead
(sim.costs.Costs.step_s); the simulated calls are otherwise bandwidth-bound (a PASSING window
of 256 slots covers the bandwidth-delay product of every fabric simulated here).

Switches are SimGrid hosts, not routers, so that an aggregating switch can run an actor. CPU
work is expressed in seconds: every host's speed is CPU_SPEED flops/s per core, and an
exec of CPU_SPEED * t flops takes t seconds on an idle core.
"""

from __future__ import annotations

from typing import Any

from controller.topology import Topology
from sim import fabric
from sim.costs import Costs

CPU_SPEED = 1e9  # flops per second per core: 1 flop = 1 ns of CPU


def mbps_to_bytes(mbps: float) -> float:
    return mbps * 1e6 / 8


class Platform:
    """The SimGrid platform of `topo`. `bus_gbps`: the in-host bus rate this run's strategy
    uses (sim.costs.Costs.local_gbps or loopback_gbps)."""

    def __init__(self, sg: Any, topo: Topology, costs: Costs, bus_gbps: float):
        self.sg = sg
        self.topo = topo
        self.costs = costs
        self.hosts: dict[str, Any] = {}
        self.switches: dict[str, Any] = {}
        self.machine: Any | None = None
        self._hops: dict[tuple[str, str], int] = {}
        self._gateway: dict[str, Any] = {}  # zone name -> its gateway host
        up, self._down = sg.LinkInRoute.Direction.UP, sg.LinkInRoute.Direction.DOWN
        self._up = up
        self.top = sg.NetZone.create_full_zone("fabric")
        zones = {tor: self._rack(tor, bus_gbps) for tor in fabric.tors(topo)}
        zones.update({s: self._switch_zone(s) for s in fabric.above_tors(topo)})
        self._routes(zones)
        if costs.shared_cpu:
            self._machine(costs.machine_cores, list(zones.values()))
        self.top.seal()

    # -- building -------------------------------------------------------------------------
    def _link(self, zone: Any, name: str, mbps: float | None) -> Any:
        if not mbps:
            raise ValueError(f"{self.topo.name}: link {name} has no rate (bw); give every link "
                             "one, or --link-mbps")
        link = zone.create_split_duplex_link(name, mbps_to_bytes(mbps))
        link.set_latency(0)  # see the module doc
        return link.seal()

    def _rack(self, tor: str, bus_gbps: float) -> Any:
        sg = self.sg
        zone = sg.NetZone.create_star_zone(f"rack-{tor}")
        zone.set_parent(self.top)
        switch = zone.create_host(tor, CPU_SPEED)
        zone.add_route(switch.netpoint, None, None, None, [], True)
        self._loopback(zone, switch)
        self.switches[tor] = switch
        self._gateway[zone.name] = switch
        for h in self.topo.hosts_in(tor):
            host = zone.create_host(h.name, CPU_SPEED)
            link = self._link(zone, f"{h.name}-{tor}", h.link.bw)
            zone.add_route(host.netpoint, None, None, None, [sg.LinkInRoute(link, self._up)],
                           True)
            # The in-host bus: transfers between a host's ranks share it (a shared link).
            bus = zone.create_link(f"{h.name}-bus", bus_gbps * 1e9 / 8).set_latency(0).seal()
            zone.add_route(host.netpoint, host.netpoint, None, None, [sg.LinkInRoute(bus)],
                           False)
            self.hosts[h.name] = host
        zone.seal()
        return zone

    def _loopback(self, zone: Any, switch: Any) -> None:
        """A switch's route to itself (its aggregator handing chunks to its egress ports):
        no latency, no bandwidth limit."""
        link = zone.create_link(f"{switch.name}-internal", 1e15)
        link.set_sharing_policy(self.sg.Link.SharingPolicy.FATPIPE, None)
        link.set_latency(0).seal()
        zone.add_route(switch.netpoint, switch.netpoint, None, None,
                       [self.sg.LinkInRoute(link)], False)

    def _switch_zone(self, name: str) -> Any:
        """A spine's (or core's) zone: the switch alone, its gateway."""
        zone = self.sg.NetZone.create_star_zone(f"zone-{name}")
        zone.set_parent(self.top)
        switch = zone.create_host(name, CPU_SPEED)
        zone.add_route(switch.netpoint, None, None, None, [], True)
        self._loopback(zone, switch)
        zone.seal()
        self.switches[name] = switch
        self._gateway[zone.name] = switch
        return zone

    def _machine(self, cores: int, zones: list[Any]) -> None:
        """The emulation's shared CPU, and a control path to it from every rack and spine (a
        fat pipe without latency: only the CPU proxies' empty messages cross it)."""
        sg = self.sg
        zone = sg.NetZone.create_star_zone("zone-machine")
        zone.set_parent(self.top)
        self.machine = zone.create_host("machine", CPU_SPEED)
        self.machine.core_count = cores
        self.machine.seal()
        zone.add_route(self.machine.netpoint, None, None, None, [], True)
        zone.seal()
        ctl = self.top.create_link("control", 1e15)
        ctl.set_sharing_policy(sg.Link.SharingPolicy.FATPIPE, None)
        ctl.seal()
        for z in zones:
            gw = self._gateway[z.name]
            self.top.add_route(z.netpoint, zone.netpoint, gw.netpoint, self.machine.netpoint,
                               [sg.LinkInRoute(ctl)], True)

    def _routes(self, zones: dict[str, Any]) -> None:
        """A route between every two zones (`zones`: by their gateway switch), over the switch
        links of a shortest path between their switches (_path)."""
        sg = self.sg
        links = {fabric.ends(u): self._link(self.top, "-".join(fabric.ends(u)), u.link.bw)
                 for u in self.topo.uplinks}  # (lower, upper) -> its link
        names = list(zones)
        for i, a in enumerate(names):
            for j in range(i + 1, len(names)):
                b = names[j]
                path = self._path(a, b, i + j)
                if path is None:
                    continue
                for src, dst, hops in ((a, b, path), (b, a, path[::-1])):
                    route = [sg.LinkInRoute(links[x, y], self._up) if (x, y) in links
                             else sg.LinkInRoute(links[y, x], self._down)
                             for x, y in zip(hops, hops[1:], strict=False)]
                    self.top.add_route(zones[src].netpoint, zones[dst].netpoint,
                                       self.switches[src].netpoint,
                                       self.switches[dst].netpoint, route, False)

    def _path(self, a: str, b: str, salt: int) -> list[str] | None:
        """A shortest path of switches from a to b. Where several next hops are as short, the
        (salt + step)-th of them, by file order: a fixed stand-in for ECMP hashing that spreads
        pairs of racks over the spines ((i + j) mod spines on a leaf-spine)."""
        adjacent: dict[str, list[str]] = {s: [] for s in self.switches}
        for u in self.topo.uplinks:
            lower, upper = fabric.ends(u)
            adjacent[lower].append(upper)
            adjacent[upper].append(lower)
        dist, todo = {b: 0}, [b]
        for s in todo:  # breadth first from b
            for n in adjacent[s]:
                if n not in dist:
                    dist[n] = dist[s] + 1
                    todo.append(n)
        if a not in dist:
            return None
        order = {s.name: s.index for s in self.topo.switches.values()}
        path = [a]
        while path[-1] != b:
            step = sorted((n for n in adjacent[path[-1]] if dist.get(n) == dist[path[-1]] - 1),
                          key=order.get)
            path.append(step[(salt + len(path) - 1) % len(step)])
        return path

    # -- queries --------------------------------------------------------------------------
    def node(self, name: str) -> Any:
        """The SimGrid host of a fabric host or switch."""
        return self.hosts.get(name) or self.switches[name]

    def hops(self, src: str, dst: str) -> int:
        """Links a message from `src` to `dst` crosses (0 on one host's bus)."""
        key = (src, dst)
        if key not in self._hops:
            if src == dst:
                self._hops[key] = 0
            else:
                links, _ = self.node(src).route_to(self.node(dst))
                self._hops[key] = len(links)
        return self._hops[key]

    def cpu_host(self, own: str) -> Any:
        """Where the CPU work of fabric node `own` runs: the shared machine in the emulation,
        else the node itself."""
        return self.machine if self.machine is not None else self.node(own)
