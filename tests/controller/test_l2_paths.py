"""Ordinary traffic on fabrics with loops (several spines, cores): every host's frames reach
every other host along one path that visits no switch twice, a flood reaches every host
exactly once, and the shipped topologies keep the entries they had."""

from __future__ import annotations

import pytest

from controller.l2_paths import L2Paths
from controller.topology import Topology, load, parse
from tests import REPO
from topologies.fabric import FabricLayout, document

FABRICS = {
    "4 spines": FabricLayout(8, 4, spines=4),
    "3 tiers": FabricLayout(8, 4, spines=2, pods=2, cores=2),
    "3 tiers, 3 pods, 1 core": FabricLayout(6, 2, spines=3, pods=3, cores=1),
}


class Fabric:
    """A topology with each switch's forwarding as the controller installs it."""

    def __init__(self, topo: Topology):
        self.topo = topo
        l2 = L2Paths(topo)
        self.entries = {s: l2.to_hosts(s) for s in topo.switches}
        self.flood_ports = {s: l2.flood_ports(s) for s in topo.switches}
        self.ports = {s: topo.ports_of(s) for s in topo.switches}
        self.next_hop = l2.next_hop


def walk(f: Fabric, src: str, dst: str) -> list[str]:
    """The switches a frame from host `src` to host `dst` crosses, by the entries each
    switch has (to_hosts); fails on a switch visited twice or a frame that would flood."""
    topo = f.topo
    mac = topo.hosts[dst].mac
    path = [topo.hosts[src].rack]
    while True:
        port = f.entries[path[-1]].get(mac)
        assert port is not None, f"{src}->{dst}: {path[-1]} has no entry, it would flood"
        nxt = f.ports[path[-1]][port]
        if nxt == dst:
            return path
        assert nxt in topo.switches, f"{src}->{dst}: delivered to {nxt}"
        assert nxt not in path, f"{src}->{dst}: loop {path + [nxt]}"
        path.append(nxt)


def flood(f: Fabric, src: str) -> dict[str, int]:
    """Copies of a broadcast from host `src` each host receives: every switch replicates to
    its flood ports but the one the copy came in on (p4src/include/forwarding.p4)."""
    topo = f.topo
    got = dict.fromkeys(topo.hosts, 0)
    todo = [(topo.hosts[src].rack, topo.hosts[src].port)]
    copies = 0
    while todo:
        switch, ingress = todo.pop()
        copies += 1
        assert copies <= 10 * len(topo.switches), "the flood does not end: a loop"
        for port in f.flood_ports[switch]:
            if port == ingress:
                continue
            peer = f.ports[switch][port]
            if peer in topo.hosts:
                got[peer] += 1
            else:
                todo.append((peer, topo.neighbors(peer)[switch]))
    return got


@pytest.mark.parametrize("name", FABRICS)
def test_every_host_pair_has_one_loop_free_path(name):
    topo = parse(document(FABRICS[name]))
    f = Fabric(topo)
    tiers = max(s.tier for s in topo.switches.values())
    for src in topo.hosts:
        for dst in topo.hosts:
            if src == dst:
                continue
            path = walk(f, src, dst)
            # Shortest: up no higher than the racks' lowest common tier, then down.
            a, b = topo.hosts[src].rack, topo.hosts[dst].rack
            up = 0 if a == b else 1 if topo.pod_of(a) == topo.pod_of(b) else tiers
            assert len(path) == 2 * up + 1, (src, dst, path)


@pytest.mark.parametrize("name", FABRICS)
def test_a_flood_from_any_host_reaches_every_other_host_once(name):
    f = Fabric(parse(document(FABRICS[name])))
    for src in f.topo.hosts:
        got = flood(f, src)
        assert got.pop(src) == 0 and set(got.values()) == {1}, (src, got)


def test_racks_spread_over_the_spines():
    """Each ToR sends frames for a rack's hosts up to one spine, the rack's position modulo the
    spines: with 8 racks and 4 spines, two racks per spine, the same from every ToR."""
    topo = parse(document(FABRICS["4 spines"]))
    l2 = L2Paths(topo)
    for tor in ("tor1", "tor6"):
        ups = {rack: l2.next_hop(tor, rack) for rack in (f"tor{r}" for r in range(1, 9))
               if rack != tor}
        for rack, spine in ups.items():
            assert spine == f"spine{(int(rack[3:]) - 1) % 4 + 1}", (tor, rack)
    # A spine sends straight down to the rack.
    assert l2.to_hosts("spine3")[topo.hosts["h32"].mac] == 8


def test_the_32x32_fabric_forwards_every_rack_to_every_host():
    """1,024 hosts under 4 spines: every switch has an entry for every host (1,024: what
    l2_forward holds), and from each rack every host is reached without a loop."""
    f = Fabric(parse(document(FabricLayout(32, 32, 8, spines=4))))
    assert all(len(entries) == 1024 for entries in f.entries.values())
    for r in range(32):
        src = f"h{32 * r + 1}"
        for dst in f.topo.hosts:
            if dst != src:
                assert len(walk(f, src, dst)) in (1, 3)
    got = flood(f, "h1")
    assert got.pop("h1") == 0 and set(got.values()) == {1}


def test_the_shipped_topologies_keep_their_forwarding():
    star = load(REPO / "topologies" / "star.json")
    l2 = L2Paths(star)
    assert l2.to_hosts("s1") == {h.mac: h.port for h in star.hosts.values()}
    assert l2.flood_ports("s1") == [1, 2, 3, 4]
    leafspine = load(REPO / "topologies" / "leafspine.json")
    l2 = L2Paths(leafspine)
    mac = {h: leafspine.hosts[h].mac for h in leafspine.hosts}
    assert l2.to_hosts("tor1") == {mac["h1"]: 1, mac["h2"]: 2, mac["h3"]: 3, mac["h4"]: 3}
    assert l2.to_hosts("tor2") == {mac["h1"]: 3, mac["h2"]: 3, mac["h3"]: 1, mac["h4"]: 2}
    assert l2.to_hosts("spine") == {mac["h1"]: 1, mac["h2"]: 1, mac["h3"]: 2, mac["h4"]: 2}
    assert [l2.flood_ports(s) for s in ("tor1", "tor2", "spine")] == [[1, 2, 3], [1, 2, 3],
                                                                     [1, 2]]
