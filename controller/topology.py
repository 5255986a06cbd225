"""Topology files: hosts with their rack and local GPUs, switches with their role, links.

A topology is a JSON file (topologies/*.json), in the spirit of p4lang/tutorials' topology.json:

    {
      "name": "star",
      "switches": {"s1": {"role": "tor"}},
      "hosts": {"h1": {"gpus": 2}, ...},
      "links": [
        {"node": "h1", "switch": "s1", "port": 1, "bw": 100, "delay": "0.1ms", "loss": 0},
        {"switch": "s1", "port": 5, "peer": "sp1", "peer_port": 1}
      ]
    }

A host's rack is the switch its link goes to. Addresses are derived unless given as "ip"/"mac"
(controller.addresses: host i of a file of at most 253 hosts is 10.0.<rack index>.<i>, switch d
10.0.<d>.254; a larger file gives host j of rack r 10.1.<r>.<j>). Errors name the field:
`links[3].port: port 5 of s1 is used twice`.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from controller.addresses import AddressPlanError, host_address, is_small, switch_address

ROLES = ("tor", "spine")
_MAC = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")
_DELAY = re.compile(r"^\d+(\.\d+)?(us|ms|s)$")


class TopologyError(ValueError):
    """A topology file that cannot be used; the message names the offending field."""


@dataclass(frozen=True)
class LinkParams:
    bw: float | None = None  # Mbit/s
    delay: str | None = None  # e.g. "0.1ms"
    loss: float = 0.0  # percent


@dataclass(frozen=True)
class Host:
    name: str
    rack: str  # the ToR it is attached to
    port: int  # that ToR's port
    gpus: int
    ip: str
    mac: str
    link: LinkParams


@dataclass(frozen=True)
class Switch:
    name: str
    role: str
    index: int  # position in the file: device id, address block
    ip: str
    mac: str


@dataclass(frozen=True)
class SpineLink:
    """The link from a ToR up to the spine. (A job's way up from a ToR, with the ToR's id at
    the spine, is controller.job_plan.SwitchRole.uplink.)"""

    tor: str
    tor_port: int
    spine: str
    spine_port: int
    link: LinkParams


@dataclass
class Topology:
    name: str
    switches: dict[str, Switch]
    hosts: dict[str, Host]
    uplinks: list[SpineLink] = field(default_factory=list)

    def hosts_in(self, rack: str) -> list[Host]:
        return [h for h in self.hosts.values() if h.rack == rack]

    def uplink_of(self, tor: str) -> SpineLink | None:
        return next((u for u in self.uplinks if u.tor == tor), None)

    def ports_of(self, switch: str) -> dict[int, str]:
        """port -> what is attached (host or switch name)."""
        ports = {h.port: h.name for h in self.hosts.values() if h.rack == switch}
        for u in self.uplinks:
            if u.tor == switch:
                ports[u.tor_port] = u.spine
            if u.spine == switch:
                ports[u.spine_port] = u.tor
        return ports


def _obj(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise TopologyError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _int(d: dict, key: str, where: str, lo: int, hi: int, default: int | None = None) -> int:
    if key not in d:
        if default is None:
            raise TopologyError(f"{where}.{key}: missing")
        return default
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise TopologyError(f"{where}.{key}: expected an integer in {lo}..{hi}, got {v!r}")
    return v


def _link_params(d: dict, where: str) -> LinkParams:
    bw, delay, loss = d.get("bw"), d.get("delay"), d.get("loss", 0)
    if bw is not None and (not isinstance(bw, int | float) or bw <= 0):
        raise TopologyError(f"{where}.bw: expected Mbit/s > 0, got {bw!r}")
    if delay is not None and (not isinstance(delay, str) or not _DELAY.match(delay)):
        raise TopologyError(f"{where}.delay: expected e.g. \"0.5ms\", got {delay!r}")
    if not isinstance(loss, int | float) or not 0 <= loss < 100:
        raise TopologyError(f"{where}.loss: expected a percentage in [0, 100), got {loss!r}")
    return LinkParams(bw, delay, float(loss))


def _addr(d: dict, where: str, ip: str, mac: str) -> tuple[str, str]:
    ip = d.get("ip", ip)
    mac = str(d.get("mac", mac)).lower()
    try:
        ipaddress.IPv4Address(ip)
    except (ValueError, TypeError):
        raise TopologyError(f"{where}.ip: not an IPv4 address: {ip!r}") from None
    if not _MAC.match(mac):
        raise TopologyError(f"{where}.mac: not a MAC address: {mac!r}")
    return ip, mac


def parse(data: dict, source: str = "topology") -> Topology:
    data = _obj(data, source)
    name = data.get("name", Path(source).stem)
    switches_in = _obj(data.get("switches"), "switches")
    hosts_in = _obj(data.get("hosts"), "hosts")
    links = data.get("links")
    if not isinstance(links, list):
        raise TopologyError("links: expected a list")
    if not switches_in:
        raise TopologyError("switches: at least one switch is needed")
    switches = _switches(switches_in)
    host_links, uplinks = _links(links, switches, hosts_in)
    hosts = _hosts(hosts_in, host_links, switches)
    _check_fabric(switches, hosts, uplinks)
    return Topology(name, switches, hosts, uplinks)


# Where a host is attached: (its ToR, that ToR's port, the link's shaping).
_HostLink = tuple[str, int, LinkParams]


def _switches(switches_in: dict) -> dict[str, Switch]:
    switches: dict[str, Switch] = {}
    for i, (sname, sd) in enumerate(switches_in.items()):
        where = f"switches.{sname}"
        sd = _obj(sd, where)
        role = sd.get("role")
        if role not in ROLES:
            raise TopologyError(f"{where}.role: expected one of {ROLES}, got {role!r}")
        ip, mac = _addr(sd, where, *switch_address(i))
        switches[sname] = Switch(sname, role, i, ip, mac)
    return switches


def _links(links: list, switches: dict[str, Switch],
           hosts_in: dict) -> tuple[dict[str, _HostLink], list[SpineLink]]:
    """Each host's link and each ToR's link to the spine; no switch port is used twice."""
    used_ports: dict[tuple[str, int], str] = {}
    host_links: dict[str, _HostLink] = {}
    uplinks: list[SpineLink] = []
    for n, link in enumerate(links):
        where = f"links[{n}]"
        link = _obj(link, where)
        sw = link.get("switch")
        if sw not in switches:
            raise TopologyError(f"{where}.switch: unknown switch {sw!r}")
        port = _int(link, "port", where, 1, 510)
        params = _link_params(link, where)
        ends = [(sw, port)]
        if "node" in link:
            host = _host_end(link, where, switches[sw], hosts_in, host_links)
            host_links[host] = (sw, port, params)
        elif "peer" in link:
            up = _spine_link(link, where, switches, sw, port, params)
            if any(u.tor == up.tor for u in uplinks):
                raise TopologyError(f"{where}: ToR {up.tor} has a second uplink (one is "
                                    "supported)")
            uplinks.append(up)
            ends.append((link["peer"], link["peer_port"]))
        else:
            raise TopologyError(f"{where}: needs \"node\" (a host) or \"peer\" (a switch)")
        for end in ends:
            if end in used_ports:
                raise TopologyError(f"{where}.port: port {end[1]} of {end[0]} is used twice")
            used_ports[end] = where
    return host_links, uplinks


def _host_end(link: dict, where: str, switch: Switch, hosts_in: dict,
              host_links: dict[str, _HostLink]) -> str:
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


def _spine_link(link: dict, where: str, switches: dict[str, Switch], sw: str, port: int,
                params: LinkParams) -> SpineLink:
    """A switch link, which joins a ToR and the spine, whichever end the file names first."""
    peer = link["peer"]
    if peer not in switches:
        raise TopologyError(f"{where}.peer: unknown switch {peer!r}")
    peer_port = _int(link, "peer_port", where, 1, 510)
    if {switches[sw].role, switches[peer].role} != {"tor", "spine"}:
        raise TopologyError(f"{where}: switch links join a ToR and a spine")
    if switches[sw].role == "tor":
        return SpineLink(sw, port, peer, peer_port, params)
    return SpineLink(peer, peer_port, sw, port, params)


def _hosts(hosts_in: dict, host_links: dict[str, _HostLink],
           switches: dict[str, Switch]) -> dict[str, Host]:
    hosts: dict[str, Host] = {}
    small = is_small(len(hosts_in), max((s.index for s in switches.values()), default=0))
    in_rack: dict[str, int] = {}
    for i, (hname, hd) in enumerate(hosts_in.items(), start=1):
        where = f"hosts.{hname}"
        hd = _obj(hd, where)
        if hname not in host_links:
            raise TopologyError(f"{where}: host has no link to a switch")
        rack, port, params = host_links[hname]
        gpus = _int(hd, "gpus", where, 1, 64, default=1)
        in_rack[rack] = in_rack.get(rack, 0) + 1
        try:
            derived = host_address(small, i, switches[rack].index, in_rack[rack])
        except AddressPlanError as e:
            if "ip" not in hd or "mac" not in hd:
                raise TopologyError(f"{where}: {e}") from None
            derived = (hd["ip"], hd["mac"])
        ip, mac = _addr(hd, where, *derived)
        hosts[hname] = Host(hname, rack, port, gpus, ip, mac, params)
    return hosts


def _check_fabric(switches: dict[str, Switch], hosts: dict[str, Host],
                  uplinks: list[SpineLink]) -> None:
    """At most one spine, every ToR linked to it when there is one, no address twice."""
    spines = [s for s in switches.values() if s.role == "spine"]
    if len(spines) > 1:
        raise TopologyError("switches: at most one spine is supported")
    for s in switches.values():
        if s.role == "tor" and spines and not any(u.tor == s.name for u in uplinks):
            raise TopologyError(f"switches.{s.name}: ToR has no link to the spine")
    seen_ips: dict[str, str] = {}
    for node in [*switches.values(), *hosts.values()]:
        if node.ip in seen_ips:
            raise TopologyError(f"{node.name}.ip: {node.ip} is also {seen_ips[node.ip]}'s")
        seen_ips[node.ip] = node.name


def read_json(path: Path, what: str, error: type[Exception]):
    """The JSON document in `path`, or `error` saying the file is missing or not JSON."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON: {e}") from None


def load(path: str | Path) -> Topology:
    path = Path(path)
    return parse(read_json(path, "topology", TopologyError), str(path))
