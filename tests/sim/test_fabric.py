"""Fabrics and job trees for the simulator (no SimGrid needed)."""

import pytest

from sim import fabric, jobs
from sim.fabric import FabricSpec


def test_shipped_topologies_load_and_reshape():
    topo = fabric.reshape(fabric.load("leafspine"), 20, 4)
    assert {h.link.bw for h in topo.hosts.values()} == {20}
    assert {u.link.bw for u in topo.uplinks} == {20}
    assert {h.gpus for h in topo.hosts.values()} == {4}
    assert fabric.host_mbps(topo) == 20
    star = fabric.load(fabric.TOPOLOGY_DIR / "star.json")
    assert fabric.spines(star) == [] and fabric.tors(star) == ["s1"]


def test_spread_matches_bench_sweep():
    topo = fabric.load("leafspine")
    assert fabric.spread(topo, 2) == ["h1", "h3"]  # one per rack
    assert fabric.spread(topo, 3) == ["h1", "h2", "h3"]
    with pytest.raises(ValueError):
        fabric.spread(topo, 5)


def test_generated_fabric_rates_and_links():
    spec = FabricSpec(32, 32, 4, gpus=8, host_mbps=100_000, oversubscription=4)
    topo = fabric.generate(spec)
    assert len(topo.hosts) == 1024 and len(fabric.tors(topo)) == 32
    assert len(fabric.spines(topo)) == 4 and len(topo.uplinks) == 128
    # 32 hosts x 100 Gbit/s over 4 uplinks at 4:1: 200 Gbit/s each
    assert {u.link.bw for u in topo.uplinks} == {200_000}
    assert topo.uplink_of("tor7").spine == "spine1"  # the job plan's way up
    assert {h.gpus for h in topo.hosts.values()} == {8}
    assert len({h.ip for h in topo.hosts.values()}) == 1024


def test_parse_spec():
    spec = fabric.parse_spec("32x32x4", gpus=2, oversubscription=4)
    assert (spec.racks, spec.hosts_per_rack, spec.spines, spec.gpus) == (32, 32, 4, 2)
    assert fabric.parse_spec("2x3").spines == 1
    with pytest.raises(ValueError):
        fabric.parse_spec("32-32")


def test_job_tree_is_the_controllers_plan():
    topo = fabric.load("leafspine")
    tree = jobs.job_tree(topo, list(topo.hosts), "passing")
    assert tree.root == "spine"
    assert tree.nodes["tor1"].members == ("h1", "h2") and tree.nodes["tor1"].parent == "spine"
    assert tree.nodes["spine"].fan_in == 2 and tree.streams("h3") == 1
    ina = jobs.job_tree(topo, list(topo.hosts), "ina")
    assert ina.nodes["tor2"].fan_in == 4 and ina.streams("h1") == 2
    assert not ina.beyond_bitmap
    one_rack = jobs.job_tree(topo, ["h1", "h2"], "passing")
    assert one_rack.root == "tor1" and list(one_rack.nodes) == ["tor1"]


def test_ina_beyond_the_contributor_bitmap_is_flagged():
    topo = fabric.generate(FabricSpec(2, 32, 2, gpus=4))
    tree = jobs.job_tree(topo, list(topo.hosts), "ina")
    assert tree.beyond_bitmap and not jobs.fits_bitmap(tree)
    assert tree.nodes["tor1"].fan_in == 128 and tree.nodes[tree.root].fan_in == 2
    assert jobs.fits_bitmap(jobs.job_tree(topo, list(topo.hosts), "passing"))


def test_concurrent_jobs_get_the_spines_the_controller_would_give_them():
    from sim import study
    topo = fabric.generate(FabricSpec(8, 4, 4))
    book = jobs.SlotBook()
    spread = study.job_hosts(topo, 4, "spread")
    assert all(len(h) == 8 for h in spread) and len(set(sum(spread, ()))) == 32
    roots = [jobs.job_tree(topo, list(h), "passing", 256, j + 1, book).root
             for j, h in enumerate(spread)]
    assert sorted(roots) == ["spine1", "spine2", "spine3", "spine4"]  # most free slots first
    assert book.used["spine1"] == 256 and book.used["tor1"] == 4 * 256
    by_name = [jobs.job_tree(topo, list(h), "passing", 256, j + 1).root
               for j, h in enumerate(spread)]
    assert by_name == ["spine1"] * 4
    packed = study.job_hosts(topo, 4, "packed")
    assert {topo.hosts[h].rack for h in packed[1]} == {"tor3", "tor4"}
