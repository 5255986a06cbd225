"""Topology files of real fabrics: ToRs with several spines, a third tier of cores above pods,
and the mistakes such files can hold, each named by its field."""

from __future__ import annotations

import copy

import pytest

from controller.topology import TopologyError, parse


def fabric(racks=2, spines=2, pods=1, cores=0, per_rack=2) -> dict:
    """A fabric file written by hand: racks t1.. of per_rack hosts, spines s1.. (per pod),
    cores c1..; every ToR to each spine of its pod, every spine to each core."""
    per_pod = racks // pods
    data = {"switches": {}, "hosts": {}, "links": []}
    for r in range(racks):
        data["switches"][f"t{r + 1}"] = {"role": "tor"}
    for s in range(spines * pods):
        data["switches"][f"s{s + 1}"] = {"role": "spine"}
    for c in range(cores):
        data["switches"][f"c{c + 1}"] = {"role": "core"}
    for r in range(racks):
        for j in range(per_rack):
            name = f"h{r * per_rack + j + 1}"
            data["hosts"][name] = {}
            data["links"].append({"node": name, "switch": f"t{r + 1}", "port": j + 1})
        pod, k = divmod(r, per_pod)
        for s in range(spines):
            data["links"].append({"switch": f"t{r + 1}", "port": per_rack + s + 1,
                                  "peer": f"s{pod * spines + s + 1}", "peer_port": k + 1})
    for s in range(spines * pods):
        for c in range(cores):
            # Written from the core's end: a link's ends may come in either order.
            data["links"].append({"switch": f"c{c + 1}", "port": s + 1, "peer": f"s{s + 1}",
                                  "peer_port": per_pod + c + 1, "bw": 400})
    return data


def test_a_tor_with_four_spines_has_four_uplinks_in_file_order():
    t = parse(fabric(racks=3, spines=4))
    assert [(u.upper, u.lower_port, u.upper_port) for u in t.uplinks_of("t2")] == [
        ("s1", 3, 2), ("s2", 4, 2), ("s3", 5, 2), ("s4", 6, 2)]
    assert t.uplink_of("t2").upper == "s1"  # the first, as before several existed
    assert t.ports_of("t1") == {1: "h1", 2: "h2", 3: "s1", 4: "s2", 5: "s3", 6: "s4"}
    assert t.ports_of("s3") == {1: "t1", 2: "t2", 3: "t3"}
    assert t.link_between("s4", "t3") is t.link_between("t3", "s4") is not None
    assert t.link_between("t1", "t2") is None
    assert {t.pod_of(s) for s in t.switches} == {"t1"}


def test_three_tiers_have_pods_joined_by_cores():
    t = parse(fabric(racks=4, spines=2, pods=2, cores=2))
    assert [s.role for s in t.switches.values()] == ["tor"] * 4 + ["spine"] * 4 + ["core"] * 2
    assert [t.tier(s) for s in ("t1", "s1", "c1")] == [0, 1, 2]
    assert {s: t.pod_of(s) for s in t.switches} == {
        "t1": "t1", "t2": "t1", "s1": "t1", "s2": "t1",
        "t3": "t3", "t4": "t3", "s3": "t3", "s4": "t3", "c1": None, "c2": None}
    # Spine-core links are stored lower end first, whichever end the file names first.
    up = t.uplinks_of("s3")
    assert [(u.upper, u.lower_port, u.upper_port, u.link.bw) for u in up] == [
        ("c1", 3, 3, 400), ("c2", 4, 3, 400)]
    assert [u.lower for u in t.downlinks_of("c2")] == ["s1", "s2", "s3", "s4"]
    assert t.ports_of("c1") == {1: "s1", 2: "s2", 3: "s3", 4: "s4"}
    ips = [n.ip for n in [*t.switches.values(), *t.hosts.values()]]
    assert len(set(ips)) == len(ips)


def mutate(data: dict, fn) -> dict:
    data = copy.deepcopy(data)
    fn(data)
    return data


def _link(data: dict, a: str, b: str) -> dict:
    return next(x for x in data["links"] if {x.get("switch"), x.get("peer")} == {a, b})


def _drop_link(data: dict, a: str, b: str) -> None:
    data["links"].remove(_link(data, a, b))


TWO_TIERS = fabric(racks=2, spines=2)
THREE_TIERS = fabric(racks=4, spines=2, pods=2, cores=2)


@pytest.mark.parametrize("data,change,message", [
    (TWO_TIERS, lambda d: d["links"].append(
        {"switch": "t1", "port": 9, "peer": "t2", "peer_port": 9}),
     r"links\[8\]: switch links join adjacent tiers \(a ToR and a spine, or a spine and a "
     r"core\), not tor t1 and tor t2"),
    (THREE_TIERS, lambda d: d["links"].append(
        {"switch": "t1", "port": 9, "peer": "c1", "peer_port": 9}),
     r"links\[24\]: switch links join adjacent tiers .*not tor t1 and core c1"),
    (THREE_TIERS, lambda d: d["links"].append(
        {"switch": "c1", "port": 9, "peer": "c2", "peer_port": 9}),
     r"links\[24\]: .*not core c1 and core c2"),
    (TWO_TIERS, lambda d: d["links"].append(
        {"switch": "s1", "port": 9, "peer": "t1", "peer_port": 9}),
     r"links\[8\]: t1 and s1 are already linked by links\[2\] \(one link per pair"),
    (TWO_TIERS, lambda d: _link(d, "t2", "s2").update(peer_port=1),
     r"links\[7\]\.port: port 1 of s2 is used twice"),
    (TWO_TIERS, lambda d: (_drop_link(d, "t2", "s1"), _drop_link(d, "t2", "s2")),
     r"switches\.t2: ToR has no link to a spine"),
    (TWO_TIERS, lambda d: (_drop_link(d, "t1", "s2"), _drop_link(d, "t2", "s2")),
     r"switches\.s2: spine has no link to a ToR"),
    (THREE_TIERS, lambda d: (_drop_link(d, "s3", "c1"), _drop_link(d, "s3", "c2")),
     r"switches\.s3: spine has no link to a core"),
    (THREE_TIERS, lambda d: d["switches"].update(c3={"role": "core"}),
     r"switches\.c3: core has no link to a spine"),
    # Pod 2's spines reach only c2 and pod 1's only c1: two fabrics in one file.
    (THREE_TIERS, lambda d: [_drop_link(d, s, c) for s, c in (("s1", "c2"), ("s2", "c2"),
                                                              ("s3", "c1"), ("s4", "c1"))],
     r"switches\.t3: no path of links joins it to t1"),
    (TWO_TIERS, lambda d: d["switches"]["s1"].update(role="aggregation"),
     r"switches\.s1\.role: expected one of \('tor', 'spine', 'core'\)"),
    (THREE_TIERS, lambda d: d["links"].append({"node": "h1", "switch": "c1", "port": 7}),
     r"links\[24\]\.node: host h1 is linked twice"),
])
def test_fabric_mistakes_name_the_field(data, change, message):
    with pytest.raises(TopologyError, match=message):
        parse(mutate(data, change), "fabric.json")


def test_hosts_attach_to_tors_not_cores():
    data = mutate(THREE_TIERS, lambda d: d["hosts"].update(h99={}))
    data["links"].append({"node": "h99", "switch": "c1", "port": 9})
    with pytest.raises(TopologyError, match=r"links\[24\]\.switch: hosts attach to ToR switches, "
                                            r"c1 is a core"):
        parse(data)


def test_racks_without_a_spine_still_load_as_before():
    """Several ToRs and no spine: each rack's jobs stay in the rack (the plan says so)."""
    data = fabric(racks=2, spines=0)
    t = parse(data)
    assert t.uplinks == [] and [t.pod_of(s) for s in ("t1", "t2")] == ["t1", "t2"]
