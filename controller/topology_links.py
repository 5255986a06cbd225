"""A topology file's links, and the checks that make its switches one fabric: host links go to
ToRs, switch links join adjacent tiers (ToR-spine, spine-core), one link per pair of switches,
no switch port used twice, every ToR up to a spine and every spine up to a core where there are
any, and every switch reachable from every other once there is a spine."""

from __future__ import annotations

from controller.topology_fields import integer, link_params, obj
from controller.topology_model import (
    TIER,
    Host,
    LinkParams,
    Switch,
    SwitchLink,
    TopologyError,
)

# Where a host is attached: (its ToR, that ToR's port, the link's shaping).
HostLink = tuple[str, int, LinkParams]


def read_links(links: list, switches: dict[str, Switch],
               hosts_in: dict) -> tuple[dict[str, HostLink], list[SwitchLink]]:
    """Each host's link, and the switch links lower end first, in file order."""
    used_ports: dict[tuple[str, int], str] = {}
    host_links: dict[str, HostLink] = {}
    switch_links: list[SwitchLink] = []
    joined: dict[frozenset, str] = {}
    for n, link in enumerate(links):
        where = f"links[{n}]"
        link = obj(link, where)
        sw = link.get("switch")
        if sw not in switches:
            raise TopologyError(f"{where}.switch: unknown switch {sw!r}")
        port = integer(link, "port", where, 1, 510)
        params = link_params(link, where)
        ends = [(sw, port)]
        if "node" in link:
            host = _host_end(link, where, switches[sw], hosts_in, host_links)
            host_links[host] = (sw, port, params)
        elif "peer" in link:
            up = _switch_link(link, where, switches, sw, port, params)
            pair = frozenset((up.lower, up.upper))
            # A second link between two switches would be a loop that forwarding by MAC, one
            # port per destination, cannot use; bandwidth is the link's "bw".
            if pair in joined:
                raise TopologyError(f"{where}: {up.lower} and {up.upper} are already linked by "
                                    f"{joined[pair]} (one link per pair of switches)")
            joined[pair] = where
            switch_links.append(up)
            ends.append((link["peer"], link["peer_port"]))
        else:
            raise TopologyError(f"{where}: needs \"node\" (a host) or \"peer\" (a switch)")
        for end in ends:
            if end in used_ports:
                raise TopologyError(f"{where}.port: port {end[1]} of {end[0]} is used twice")
            used_ports[end] = where
    return host_links, switch_links


def _host_end(link: dict, where: str, switch: Switch, hosts_in: dict,
              host_links: dict[str, HostLink]) -> str:
    """The host a host link attaches to `switch`, which must be a ToR."""
    host = link["node"]
    if host not in hosts_in:
        raise TopologyError(f"{where}.node: unknown host {host!r}")
    if host in host_links:
        raise TopologyError(f"{where}.node: host {host} is linked twice")
    if switch.role != "tor":
        raise TopologyError(f"{where}.switch: hosts attach to ToR switches, {switch.name} is a "
                            f"{switch.role}")
    return host


def _switch_link(link: dict, where: str, switches: dict[str, Switch], sw: str, port: int,
                 params: LinkParams) -> SwitchLink:
    """A switch link, which joins adjacent tiers, whichever end the file names first."""
    peer = link["peer"]
    if peer not in switches:
        raise TopologyError(f"{where}.peer: unknown switch {peer!r}")
    peer_port = integer(link, "peer_port", where, 1, 510)
    a, b = switches[sw], switches[peer]
    if abs(TIER[a.role] - TIER[b.role]) != 1:
        raise TopologyError(f"{where}: switch links join adjacent tiers (a ToR and a spine, or "
                            f"a spine and a core), not {a.role} {sw} and {b.role} {peer}")
    if TIER[a.role] < TIER[b.role]:
        return SwitchLink(sw, port, peer, peer_port, params)
    return SwitchLink(peer, peer_port, sw, port, params)


def check_fabric(switches: dict[str, Switch], hosts: dict[str, Host],
                 links: list[SwitchLink]) -> None:
    """Every switch linked up and down as its tier needs, one connected fabric once there is a
    spine, no address twice."""
    has = {role: any(s.role == role for s in switches.values()) for role in TIER}
    ups = {u.lower for u in links}
    downs = {u.upper for u in links}
    for s in switches.values():
        if s.role == "tor" and has["spine"] and s.name not in ups:
            raise TopologyError(f"switches.{s.name}: ToR has no link to a spine")
        if s.role == "spine" and s.name not in downs:
            raise TopologyError(f"switches.{s.name}: spine has no link to a ToR")
        if s.role == "spine" and has["core"] and s.name not in ups:
            raise TopologyError(f"switches.{s.name}: spine has no link to a core")
        if s.role == "core" and s.name not in downs:
            raise TopologyError(f"switches.{s.name}: core has no link to a spine")
    if has["spine"]:
        _check_connected(switches, links)
    seen_ips: dict[str, str] = {}
    for node in [*switches.values(), *hosts.values()]:
        if node.ip in seen_ips:
            raise TopologyError(f"{node.name}.ip: {node.ip} is also {seen_ips[node.ip]}'s")
        seen_ips[node.ip] = node.name


def _check_connected(switches: dict[str, Switch], links: list[SwitchLink]) -> None:
    """Jobs and ordinary traffic between any two racks need a path of links between them."""
    near: dict[str, set[str]] = {s: set() for s in switches}
    for u in links:
        near[u.lower].add(u.upper)
        near[u.upper].add(u.lower)
    first = next(iter(switches))
    seen, todo = {first}, [first]
    while todo:
        for n in near[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    apart = next((s for s in switches if s not in seen), None)
    if apart is not None:
        raise TopologyError(f"switches.{apart}: no path of links joins it to {first} (pods "
                            "are joined through cores)")
