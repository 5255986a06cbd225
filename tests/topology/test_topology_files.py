"""Topology files: the shipped ones load, and every kind of mistake names its field."""

from __future__ import annotations

import copy
import json

import pytest

from controller.topology import TopologyError, load, parse
from tests import REPO

STAR = json.loads((REPO / "topologies" / "star.json").read_text())


def test_star_has_four_hosts_with_two_gpus_on_one_switch():
    t = load(REPO / "topologies" / "star.json")
    assert list(t.switches) == ["s1"] and t.switches["s1"].role == "tor"
    assert [(h.name, h.rack, h.port, h.gpus) for h in t.hosts.values()] == [
        ("h1", "s1", 1, 2), ("h2", "s1", 2, 2), ("h3", "s1", 3, 2), ("h4", "s1", 4, 2)]
    assert t.uplinks == [] and t.ports_of("s1") == {1: "h1", 2: "h2", 3: "h3", 4: "h4"}


def test_leafspine_has_two_racks_and_a_spine():
    t = load(REPO / "topologies" / "leafspine.json")
    assert {s: t.switches[s].role for s in t.switches} == {
        "tor1": "tor", "tor2": "tor", "spine": "spine"}
    assert [h.name for h in t.hosts_in("tor2")] == ["h3", "h4"]
    assert t.uplink_of("tor1").spine_port == 1 and t.uplink_of("tor2").tor_port == 3
    assert t.ports_of("spine") == {1: "tor1", 2: "tor2"}
    ips = [n.ip for n in [*t.switches.values(), *t.hosts.values()]]
    assert len(set(ips)) == len(ips)


def mutate(fn):
    data = copy.deepcopy(STAR)
    fn(data)
    return data


@pytest.mark.parametrize("change,message", [
    (lambda d: d["switches"]["s1"].update(role="router"), r"switches\.s1\.role: expected one of"),
    (lambda d: d["links"][1].update(port=1), r"links\[1\]\.port: port 1 of s1 is used twice"),
    (lambda d: d["links"][0].update(switch="s9"), r"links\[0\]\.switch: unknown switch 's9'"),
    (lambda d: d["links"][0].update(node="h9"), r"links\[0\]\.node: unknown host 'h9'"),
    (lambda d: d["links"][2].update(loss=150), r"links\[2\]\.loss: expected a percentage"),
    (lambda d: d["links"][2].update(delay="fast"), r"links\[2\]\.delay: expected"),
    (lambda d: d["links"][0].update(bw=-1), r"links\[0\]\.bw: expected Mbit/s"),
    (lambda d: d["links"][0].update(port="one"), r"links\[0\]\.port: expected an integer"),
    (lambda d: d["hosts"]["h2"].update(gpus=0), r"hosts\.h2\.gpus: expected an integer"),
    (lambda d: d["hosts"]["h2"].update(ip="10.0.0.999"), r"hosts\.h2\.ip: not an IPv4"),
    (lambda d: d["hosts"]["h2"].update(mac="zz"), r"hosts\.h2\.mac: not a MAC"),
    (lambda d: d["hosts"].update(h5={"gpus": 1}), r"hosts\.h5: host has no link"),
    (lambda d: d.pop("links"), r"links: expected a list"),
    (lambda d: d["links"].append({"switch": "s1", "port": 9}), r"links\[4\]: needs \"node\""),
])
def test_mistakes_name_the_field(change, message):
    with pytest.raises(TopologyError, match=message):
        parse(mutate(change), "star.json")


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(TopologyError, match="no such topology file"):
        load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TopologyError, match="not valid JSON"):
        load(bad)


def test_hosts_attach_to_tors_only():
    data = {"switches": {"t": {"role": "tor"}, "sp": {"role": "spine"}},
            "hosts": {"h1": {}},
            "links": [{"node": "h1", "switch": "sp", "port": 1},
                      {"switch": "t", "port": 1, "peer": "sp", "peer_port": 2}]}
    with pytest.raises(TopologyError, match=r"links\[0\]\.switch: hosts attach to ToR"):
        parse(data)


def _racks(racks: int, per_rack: int) -> dict:
    """`racks` ToRs of `per_rack` hosts each under one spine, every address derived."""
    data: dict = {"name": "big", "switches": {f"tor{r}": {"role": "tor"} for r in range(racks)},
                  "hosts": {}, "links": []}
    data["switches"]["spine"] = {"role": "spine"}
    for r in range(racks):
        for j in range(per_rack):
            name = f"h{r * per_rack + j + 1}"
            data["hosts"][name] = {"gpus": 8}
            data["links"].append({"node": name, "switch": f"tor{r}", "port": j + 1})
        data["links"].append({"switch": f"tor{r}", "port": per_rack + 1, "peer": "spine",
                              "peer_port": r + 1})
    return data


def test_the_shipped_topologies_keep_their_addresses():
    t = load(REPO / "topologies" / "leafspine.json")
    assert [(h.ip, h.mac) for h in t.hosts.values()] == [
        ("10.0.0.1", "08:00:00:00:00:01"), ("10.0.0.2", "08:00:00:00:00:02"),
        ("10.0.1.3", "08:00:00:00:01:03"), ("10.0.1.4", "08:00:00:00:01:04")]
    assert [s.ip for s in t.switches.values()] == ["10.0.0.254", "10.0.1.254", "10.0.2.254"]


@pytest.mark.parametrize("racks,per_rack", [(32, 32), (4, 64), (2, 128), (1, 253)])
def test_large_fabrics_derive_a_unique_address_for_every_host(racks, per_rack):
    t = parse(_racks(racks, per_rack))
    nodes = [*t.hosts.values(), *t.switches.values()]
    assert len(nodes) == racks * per_rack + racks + 1
    assert len({n.ip for n in nodes}) == len(nodes) and len({n.mac for n in nodes}) == len(nodes)
    # Every address is a host address of 10.0.0.0/8, the hosts' on-link prefix.
    for n in nodes:
        octets = [int(o) for o in n.ip.split(".")]
        assert octets[0] == 10 and 1 <= octets[3] <= 254, n


def test_a_fabric_of_more_than_253_hosts_puts_the_rack_in_the_address():
    t = parse(_racks(32, 32))
    assert t.hosts["h256"].ip == "10.1.7.32" and t.hosts["h257"].ip == "10.1.8.1"
    assert t.hosts["h1024"].mac == "08:00:01:00:1f:20"


def test_a_rack_too_large_for_derived_addresses_says_so_and_takes_written_ones():
    data = _racks(1, 300)
    with pytest.raises(TopologyError, match=r"hosts\.h254: more than 253 hosts in one rack"):
        parse(data)
    for i, name in enumerate(data["hosts"], start=1):
        data["hosts"][name].update(ip=f"10.9.{i // 250}.{1 + i % 250}",
                                   mac=f"08:00:09:00:{i // 250:02x}:{1 + i % 250:02x}")
    assert parse(data).hosts["h300"].ip == "10.9.1.51"
