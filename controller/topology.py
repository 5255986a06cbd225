"""Topology files: hosts with their rack and local GPUs, switches with their tier, links.

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

Roles are tiers, from the hosts up: "tor", "spine", "core". Hosts attach to ToRs; a switch link
joins adjacent tiers (a ToR and a spine, or a spine and a core), one link per pair of switches.
A ToR may link to any number of spines, and a spine to any number of cores. Where there are
spines, every ToR links to one at least (and every spine to a ToR); where there are cores,
every spine links to one (and every core to a spine); and then every switch is reachable from
every other. A pod is what ToR-spine links join (Topology.pod_of); cores join pods. The file
order of the switches is their index (device id, derived address).

A host's rack is the switch its link goes to. Addresses are derived unless given as "ip"/"mac"
(controller.addresses: host i of a file of at most 253 hosts is 10.0.<rack index>.<i>, switch d
10.0.<d>.254; a larger file gives host j of rack r 10.1.<r>.<j>). Errors name the field:
`links[3].port: port 5 of s1 is used twice`. topologies/fabric.py writes such files for
generated fabrics.
"""

from __future__ import annotations

import json
from pathlib import Path

from controller.addresses import AddressPlanError, host_address, is_small, switch_address
from controller.topology_fields import address, integer, obj
from controller.topology_links import HostLink, check_fabric, read_links
from controller.topology_model import (
    ROLES,
    TIER,
    Host,
    LinkParams,
    SpineLink,
    Switch,
    SwitchLink,
    Topology,
    TopologyError,
)

__all__ = ["ROLES", "TIER", "Host", "LinkParams", "SpineLink", "Switch", "SwitchLink",
           "Topology", "TopologyError", "load", "parse", "read_json"]


def parse(data: dict, source: str = "topology") -> Topology:
    data = obj(data, source)
    name = data.get("name", Path(source).stem)
    switches_in = obj(data.get("switches"), "switches")
    hosts_in = obj(data.get("hosts"), "hosts")
    links = data.get("links")
    if not isinstance(links, list):
        raise TopologyError("links: expected a list")
    if not switches_in:
        raise TopologyError("switches: at least one switch is needed")
    switches = _switches(switches_in)
    host_links, switch_links = read_links(links, switches, hosts_in)
    hosts = _hosts(hosts_in, host_links, switches)
    check_fabric(switches, hosts, switch_links)
    return Topology(name, switches, hosts, switch_links)


def _switches(switches_in: dict) -> dict[str, Switch]:
    switches: dict[str, Switch] = {}
    for i, (sname, sd) in enumerate(switches_in.items()):
        where = f"switches.{sname}"
        sd = obj(sd, where)
        role = sd.get("role")
        if role not in ROLES:
            raise TopologyError(f"{where}.role: expected one of {ROLES}, got {role!r}")
        try:
            derived = switch_address(i)
        except AddressPlanError as e:
            if "ip" not in sd or "mac" not in sd:
                raise TopologyError(f"{where}: {e}") from None
            derived = (sd["ip"], sd["mac"])
        ip, mac = address(sd, where, *derived)
        switches[sname] = Switch(sname, role, i, ip, mac)
    return switches


def _hosts(hosts_in: dict, host_links: dict[str, HostLink],
           switches: dict[str, Switch]) -> dict[str, Host]:
    hosts: dict[str, Host] = {}
    small = is_small(len(hosts_in), max((s.index for s in switches.values()), default=0))
    in_rack: dict[str, int] = {}
    for i, (hname, hd) in enumerate(hosts_in.items(), start=1):
        where = f"hosts.{hname}"
        hd = obj(hd, where)
        if hname not in host_links:
            raise TopologyError(f"{where}: host has no link to a switch")
        rack, port, params = host_links[hname]
        gpus = integer(hd, "gpus", where, 1, 64, default=1)
        in_rack[rack] = in_rack.get(rack, 0) + 1
        try:
            derived = host_address(small, i, switches[rack].index, in_rack[rack])
        except AddressPlanError as e:
            if "ip" not in hd or "mac" not in hd:
                raise TopologyError(f"{where}: {e}") from None
            derived = (hd["ip"], hd["mac"])
        ip, mac = address(hd, where, *derived)
        hosts[hname] = Host(hname, rack, port, gpus, ip, mac, params)
    return hosts


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
