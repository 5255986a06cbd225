"""Each job's aggregation tree over a fabric (controller.job_plan.plan, controller.job_tree):
which spine or core is its root, the roles of every switch of a tree of any depth, the quorum
per level, and that a job keeps the tree it was created with."""

from __future__ import annotations

import dataclasses

import pytest

from controller.job_plan import JobError, JobSpec, plan
from controller.topology import load, parse
from passing import protocol as P
from tests import REPO
from topologies.fabric import FabricLayout, document

# 4 racks of 2 hosts under 2 spines; and 8 racks of 2 hosts in 2 pods of 2 spines, 2 cores.
TWO_SPINES = parse(document(FabricLayout(4, 2, spines=2)))
THREE_TIERS = parse(document(FabricLayout(8, 2, spines=2, pods=2, cores=2)))


def free_slots(free: dict[str, int]):
    """The controller's ranking (JobLifecycle._rank) with every window fitting: most free
    slots first, then by name."""
    return lambda s: (False, -free.get(s, P.SLOT_CAPACITY), s)


def test_a_job_over_racks_goes_to_the_spine_with_the_most_free_slots():
    spec = JobSpec(1, ("h1", "h3", "h7"), 8)
    assert plan(spec, TWO_SPINES, free_slots({"spine1": 100, "spine2": 90})).tree == \
        ("spine1",)
    assert plan(spec, TWO_SPINES, free_slots({"spine1": 90, "spine2": 100})).tree == \
        ("spine2",)
    # Equal: the first by name.
    assert plan(spec, TWO_SPINES, free_slots({})).tree == ("spine1",)


def test_a_two_level_tree_under_the_second_spine():
    p = plan(JobSpec(1, ("h1", "h2", "h4", "h8"), 8), TWO_SPINES,
             free_slots({"spine1": 10}))
    assert p.tree == ("spine2",) and p.depth == 1
    assert p.switches == ["tor1", "tor2", "tor4", "spine2"]
    # Each ToR sends up its port to spine2 (hosts on 1-2, spine1 on 3, spine2 on 4), with its
    # position among the job's racks as its id there.
    for i, tor in enumerate(("tor1", "tor2", "tor4")):
        role = p.roles[tor]
        assert not role.is_root and role.level == 0
        assert (role.uplink.name, role.uplink.port, role.uplink.contributor) == ("spine2", 4, i)
        assert role.uplink.udp_port == P.PASSING_UDP_PORT
    assert [(m.name, m.contributor) for m in p.roles["tor1"].members] == [("h1", 0), ("h2", 1)]
    spine = p.roles["spine2"]
    assert spine.is_root and spine.uplink is None and spine.level == 1 and spine.fan_in == 3
    # spine2's port to tor r is r; the ToRs' addresses are the peers its results go to.
    assert [(m.name, m.port, m.contributor) for m in spine.members] == [
        ("tor1", 1, 0), ("tor2", 2, 1), ("tor4", 4, 2)]
    assert spine.members[2].mac == TWO_SPINES.switches["tor4"].mac


def test_a_job_across_pods_is_a_three_level_tree_under_a_core():
    hosts = ("h1", "h3", "h4", "h9", "h15")  # racks tor1, tor2 (pod 1), tor5, tor8 (pod 2)
    free = {"core1": 50, "core2": 60, "spine1": 5, "spine2": 7, "spine3": 9, "spine4": 9}
    p = plan(JobSpec(2, hosts, 8), THREE_TIERS, free_slots(free))
    assert p.tree == ("spine2", "spine3", "core2") and p.depth == 2
    assert p.switches == ["tor1", "tor2", "tor5", "tor8", "spine2", "spine3", "core2"]
    expect = {  # switch: (level, root, fan-in, uplink (switch, port, id), members (name, port, id))
        "tor1": (0, False, 1, ("spine2", 4, 0), [("h1", 1, 0)]),
        "tor2": (0, False, 2, ("spine2", 4, 1), [("h3", 1, 0), ("h4", 2, 1)]),
        "tor5": (0, False, 1, ("spine3", 3, 0), [("h9", 1, 0)]),
        "tor8": (0, False, 1, ("spine3", 3, 1), [("h15", 1, 0)]),
        # A spine's ports: its pod's 4 ToRs, then core1 on 5, core2 on 6.
        "spine2": (1, False, 2, ("core2", 6, 0), [("tor1", 1, 0), ("tor2", 2, 1)]),
        "spine3": (1, False, 2, ("core2", 6, 1), [("tor5", 1, 0), ("tor8", 4, 1)]),
        # A core's ports: spine1..spine4 on 1..4.
        "core2": (2, True, 2, None, [("spine2", 2, 0), ("spine3", 3, 1)]),
    }
    for sw, (level, root, fan_in, up, members) in expect.items():
        role = p.roles[sw]
        got_up = (role.uplink.name, role.uplink.port, role.uplink.contributor) \
            if role.uplink else None
        assert (role.level, role.is_root, role.fan_in, got_up) == (level, root, fan_in, up), sw
        assert [(m.name, m.port, m.contributor) for m in role.members] == members, sw


def test_a_job_inside_one_pod_stays_under_a_spine_of_that_pod():
    p = plan(JobSpec(3, ("h9", "h16"), 8), THREE_TIERS, free_slots({"spine3": 1}))
    assert p.tree == ("spine4",) and p.depth == 1


def test_a_job_in_one_rack_is_its_tor_alone():
    p = plan(JobSpec(4, ("h3", "h4"), 8), THREE_TIERS, free_slots({}))
    assert p.tree == () and p.depth == 0 and list(p.roles) == ["tor2"]
    assert p.roles["tor2"].is_root and p.roles["tor2"].uplink is None


@pytest.mark.parametrize("quorum,expected", [
    ((), {"tor1": 1, "tor2": 2, "spine2": 2, "core2": 2}),
    ((1,), {"tor1": 1, "tor2": 1, "spine2": 2, "core2": 2}),
    ((1, 1), {"tor1": 1, "tor2": 1, "spine2": 1, "core2": 2}),
    ((2, 2, 1), {"tor1": 1, "tor2": 2, "spine2": 2, "core2": 1}),  # at most a fan-in
])
def test_the_quorum_has_a_level_for_each_tier_of_the_tree(quorum, expected):
    spec = JobSpec(5, ("h1", "h3", "h4", "h9"), 8, quorum=quorum, tree=("spine2", "spine3",
                                                                        "core2"))
    p = plan(spec, THREE_TIERS)
    assert {s: p.quorum_at(s) for s in expected} == expected
    assert p.quorum_at("spine3") == 1 and p.quorum_at("tor5") == 1  # fan-in 1


def test_a_quorum_of_more_levels_than_a_fabric_has_is_refused():
    with pytest.raises(JobError, match=r"quorum \[1, 1, 1, 1\]: one to 3 whole numbers \(at "
                                       r"the hosts' switches, then at the spines, then at the "
                                       r"cores\), each in 1\.\.64"):
        JobSpec(6, ("h1",), 8, quorum=(1, 1, 1, 1))
    with pytest.raises(JobError, match=r"quorum \[1, 0\]"):
        JobSpec(6, ("h1",), 8, quorum=(1, 0))


def test_a_job_keeps_its_tree_whatever_the_slots_are_later():
    spec = JobSpec(7, ("h1", "h3"), 8)
    first = plan(spec, TWO_SPINES, free_slots({"spine1": 1}))
    stored = JobSpec.from_dict(dataclasses.replace(spec, tree=first.tree).to_dict())
    assert stored.tree == ("spine2",)
    # Planned again (install, delete, reconcile, resize: no ranking), and even when asked to
    # choose again: the stored tree.
    assert plan(stored, TWO_SPINES).tree == ("spine2",)
    assert plan(stored, TWO_SPINES, free_slots({"spine2": 0})).tree == ("spine2",)


def test_a_job_stored_before_trees_were_chosen_plans_as_it_did():
    """Its record has no "tree" (and a quorum of two levels): on leafspine, its one spine."""
    leafspine = load(REPO / "topologies" / "leafspine.json")
    d = JobSpec(8, ("h1", "h3"), 8, quorum=(1, 2)).to_dict()
    del d["tree"]
    p = plan(JobSpec.from_dict(d), leafspine)
    assert p.tree == ("spine",) and p.quorum_at("spine") == 2 and p.quorum_at("tor1") == 1
    assert (p.roles["tor2"].uplink.port, p.roles["tor2"].uplink.contributor) == (3, 1)
    assert [(m.name, m.port) for m in p.roles["spine"].members] == [("tor1", 1), ("tor2", 2)]


@pytest.mark.parametrize("topo,tree,message", [
    (TWO_SPINES, ("spine9",), r"job 9: its tree names spine9, which topology "
                              r"fabric-4x2x1-2sp does not have"),
    (TWO_SPINES, ("spine1", "spine2"), r"job 9: its tree \(spine1, spine2\) is not one that "
                                       r"joins its racks \(tor1, tor2\) in topology"),
    # Racks one spine joins are not sent up to a core.
    (THREE_TIERS, ("spine1", "core1"), r"job 9: its tree \(spine1, core1\) is not one"),
])
def test_a_stored_tree_that_does_not_fit_the_topology_is_refused(topo, tree, message):
    with pytest.raises(JobError, match=message):
        plan(JobSpec(9, ("h1", "h3"), 8, tree=tree), topo)


def test_racks_no_switch_joins_are_refused_saying_why():
    partial = document(FabricLayout(3, 1, spines=2))
    # tor3 reaches spine2 only, tor1 spine1 only: no spine has all of a job's racks.
    partial["links"] = [x for x in partial["links"]
                        if (x.get("switch"), x.get("peer")) not in (("tor1", "spine2"),
                                                                    ("tor3", "spine1"))]
    t = parse(partial)
    assert plan(JobSpec(1, ("h1", "h2"), 8), t).tree == ("spine1",)
    with pytest.raises(JobError, match=r"no spine links every one of the job's racks \(tor1, "
                                       r"tor3\), and there is no core"):
        plan(JobSpec(1, ("h1", "h3"), 8), t)


def test_a_spine_below_more_than_64_racks_of_a_job_is_refused():
    t = parse(document(FabricLayout(65, 1, spines=1)))
    with pytest.raises(JobError, match=r"spine1: 65 switches of the job below it, at most 64"):
        plan(JobSpec(1, tuple(t.hosts), 8), t)


def test_a_rack_of_64_hosts_is_one_tor_of_fan_in_64_and_a_65th_host_is_refused():
    t = parse(document(FabricLayout(2, 65, spines=1)))
    rack = [h for h in t.hosts if t.hosts[h].rack == "tor1"]
    p = plan(JobSpec(1, tuple(rack[:64]) + ("h66",), 8), t)
    assert p.roles["tor1"].fan_in == 64 and not p.roles["tor1"].is_root
    assert [m.contributor for m in p.roles["tor1"].members] == list(range(64))
    assert p.roles["spine1"].fan_in == 2 and p.roles["spine1"].is_root
    with pytest.raises(JobError, match=r"rack tor1: 65 hosts, at most 64 contributors"):
        plan(JobSpec(2, tuple(rack), 8), t)
    # Switch-only INA counts GPU ranks: 32 hosts of 2 GPUs fill the 64 ids.
    g = parse(document(FabricLayout(1, 33, gpus=2)))
    assert plan(JobSpec(3, tuple(sorted(g.hosts)[:32]), 8, mode="ina"), g).roles["tor1"].fan_in \
        == 64
    with pytest.raises(JobError, match=r"rack tor1: 66 GPUs, at most 64"):
        plan(JobSpec(4, tuple(g.hosts), 8, mode="ina"), g)
