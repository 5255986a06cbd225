"""The controller on fabrics with several spines and three tiers, against live switches (the
model always, BMv2 when installed): jobs spread over the spines by free slots, a job across
pods sums through spine and core, each host gets the exact sum, and ordinary traffic crosses
the loops of a two-spine fabric once."""

from __future__ import annotations

import json
import time

import pytest
from scapy.layers.inet import ICMP, IP
from scapy.layers.l2 import Ether

from controller.core import Controller, Endpoint
from controller.job_plan import JobSpec
from controller.lifecycle import JobLifecycle
from controller.recorded_jobs import RecordedJobs
from controller.store import JobRecord, JobStore, PoolRecord
from controller.topology import load, parse
from tests.controller.test_controller_fabric import allreduce, port_of


def _host_links(racks: list[str], per_rack: int = 2) -> tuple[dict, list]:
    hosts, links = {}, []
    for r, tor in enumerate(racks):
        for j in range(per_rack):
            name = f"h{r * per_rack + j + 1}"
            hosts[name] = {"gpus": 2}
            links.append({"node": name, "switch": tor, "port": j + 1})
    return hosts, links


def _switch_links(pairs) -> list[dict]:
    return [{"switch": a, "port": pa, "peer": b, "peer_port": pb} for (a, pa), (b, pb) in pairs]


def two_spines_file() -> dict:
    """tests/conftest.py LAYOUTS["two_spines"] as a topology: h1, h2 on tor1; h3, h4 on tor2;
    each ToR up to spine1 on port 3 and to spine2 on port 4."""
    hosts, links = _host_links(["tor1", "tor2"])
    links += _switch_links([(("tor1", 3), ("spine1", 1)), (("tor2", 3), ("spine1", 2)),
                            (("tor1", 4), ("spine2", 1)), (("tor2", 4), ("spine2", 2))])
    roles = {"tor1": "tor", "tor2": "tor", "spine1": "spine", "spine2": "spine"}
    return {"name": "two_spines", "switches": {s: {"role": r} for s, r in roles.items()},
            "hosts": hosts, "links": links}


def three_level_file() -> dict:
    """LAYOUTS["three_level"] as a topology: h1-h6 two per rack; tor1, tor2 under spine1,
    tor3 under spine2 (pods), both spines under the core."""
    hosts, links = _host_links(["tor1", "tor2", "tor3"])
    links += _switch_links([(("tor1", 3), ("spine1", 1)), (("tor2", 3), ("spine1", 2)),
                            (("tor3", 3), ("spine2", 1)), (("spine1", 3), ("core", 1)),
                            (("spine2", 2), ("core", 2))])
    roles = {"tor1": "tor", "tor2": "tor", "tor3": "tor", "spine1": "spine",
             "spine2": "spine", "core": "core"}
    return {"name": "three_level", "switches": {s: {"role": r} for s, r in roles.items()},
            "hosts": hosts, "links": links}


FILES = {"two_spines": two_spines_file, "three_level": three_level_file}


@pytest.fixture
def fabric_controller(fabric_of, tmp_path):
    """make(layout) -> (Controller, Fabric): a controller of the layout's topology file
    driving that layout's fabric (reset)."""
    made = []

    def make(layout: str, **kw):
        fabric = fabric_of(layout)
        path = tmp_path / f"{layout}.json"
        path.write_text(json.dumps(FILES[layout]()))
        topo = load(path)
        endpoints = {n: Endpoint(n, fabric[n].grpc_address, fabric[n].device_id)
                     for n in topo.switches}
        ctl = Controller(topo, endpoints, tmp_path / f"{layout}.sqlite", **kw)
        made.append(ctl)
        return ctl, fabric
    yield make
    for ctl in made:
        ctl.close()


def roles(rec: JobRecord) -> dict[str, tuple[int, bool, int]]:
    return {p.switch: (p.fan_in, p.is_root, p.uplink_port) for p in rec.pools}


def test_jobs_spread_over_the_spines_and_each_sums_through_its_own(fabric_controller):
    ctl, fabric = fabric_controller("two_spines")
    first = ctl.create_job(JobSpec(1, ("h1", "h3"), window=16))
    # Both spines have every slot free: the first by name.
    assert roles(first) == {"tor1": (1, False, 3), "tor2": (1, False, 3),
                            "spine1": (2, True, 0)}
    assert JobSpec.from_dict(first.spec).tree == ("spine1",)
    second = ctl.create_job(JobSpec(2, ("h2", "h4"), window=16))
    # spine1 has 16 slots fewer now: the ToRs send job 2 up their port 4, to spine2.
    assert roles(second) == {"tor1": (1, False, 4), "tor2": (1, False, 4),
                             "spine2": (2, True, 0)}
    allreduce(ctl, fabric, 2, ["h2", "h4"], seed=2)
    allreduce(ctl, fabric, 1, ["h1", "h3"], seed=1)
    assert ctl.stats(2)["spine2"]["job_contributions"] == 2 and "spine1" not in ctl.stats(2)
    assert ctl.stats(1)["spine1"]["job_results"] == 1
    # A smaller job on spine2 (its tree given) leaves spine2 the emptier: the next job goes
    # there, by free slots, not by name.
    ctl.delete_job(2)
    ctl.create_job(JobSpec(3, ("h2", "h4"), window=8, tree=("spine2",)))
    assert JobSpec.from_dict(ctl.create_job(JobSpec(4, ("h1", "h4"), window=8)).spec).tree == \
        ("spine2",)
    # Each job keeps its tree through a restart and a reconcile.
    ctl.close()
    again = Controller(ctl.topo, ctl.connections.endpoints, ctl.store.path)
    try:
        report = again.reconcile(fix=False)
        assert all(not r["repaired"] and not r["stray"] for r in report.values()), report
        allreduce(again, fabric, 3, ["h2", "h4"], slot=1, seed=3)
    finally:
        again.close()


def test_a_job_across_pods_sums_through_its_spines_and_the_core(fabric_controller):
    ctl, fabric = fabric_controller("three_level")
    hosts = ["h1", "h2", "h3", "h4", "h5", "h6"]
    rec = ctl.create_job(JobSpec(5, tuple(hosts), window=8, quorum=(2, 2, 1)))
    assert JobSpec.from_dict(rec.spec).tree == ("spine1", "spine2", "core")
    assert roles(rec) == {"tor1": (2, False, 3), "tor2": (2, False, 3), "tor3": (2, False, 3),
                          "spine1": (2, False, 3), "spine2": (1, False, 2),
                          "core": (2, True, 0)}
    assert ctl.quorums(5)["core"] == {"fan_in": 2, "quorum": 1}
    assert ctl.quorums(5)["spine1"] == {"fan_in": 2, "quorum": 2}
    for slot in range(3):
        allreduce(ctl, fabric, 5, hosts, slot=slot, seed=slot)
    stats = ctl.stats(5)
    assert stats["core"]["job_results"] == 3 and stats["spine2"]["job_downlink"] == 3
    assert all(stats[t]["job_uplink"] == 3 for t in ("tor1", "tor2", "tor3", "spine1"))
    # A job inside pod 1 stays under spine1.
    rec = ctl.create_job(JobSpec(6, ("h2", "h4"), window=8))
    assert roles(rec) == {"tor1": (1, False, 3), "tor2": (1, False, 3), "spine1": (2, True, 0)}
    allreduce(ctl, fabric, 6, ["h2", "h4"], seed=6)


def _frames(ctl, fabric, host: str, wait: float) -> list[bytes]:
    """Every frame `host`'s port has received, waiting `wait` seconds for more."""
    out, deadline = [], time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        out += port_of(ctl, fabric, host).recv(64, left)
    while (frame := port_of(ctl, fabric, host).recv_nowait()) is not None:
        out.append(frame)
    return out


@pytest.mark.parametrize("layout", ["two_spines", "three_level"])
def test_ordinary_traffic_crosses_the_fabric_once(fabric_controller, layout):
    """A broadcast (what ARP sends) reaches every other host exactly once, though the
    two-spine fabric has a loop, and a ping to each host of another rack arrives once."""
    ctl, fabric = fabric_controller(layout)
    for name in ctl.topo.switches:
        ctl.prepare(name)
    src = ctl.topo.hosts["h1"]
    hosts = [h for h in ctl.topo.hosts if h != "h1"]
    for h in ctl.topo.hosts:
        port_of(ctl, fabric, h).drain()
    bcast = bytes(Ether(src=src.mac, dst="ff:ff:ff:ff:ff:ff") / IP(src=src.ip, dst="10.255.255.255")
                  / ICMP(id=7))
    port_of(ctl, fabric, "h1").send(bcast)
    # A looping copy would keep arriving: wait long enough to see a second one.
    got = {h: _frames(ctl, fabric, h, 1.0 if h == hosts[0] else 0.1) for h in ctl.topo.hosts}
    assert got.pop("h1") == [] and all(frames == [bcast] for frames in got.values()), \
        {h: len(f) for h, f in got.items()}
    for dst in (h for h in hosts if ctl.topo.hosts[h].rack != src.rack):
        d = ctl.topo.hosts[dst]
        ping = bytes(Ether(src=src.mac, dst=d.mac) / IP(src=src.ip, dst=d.ip) / ICMP(id=8))
        port_of(ctl, fabric, "h1").send(ping)
        assert _frames(ctl, fabric, dst, 0.5) == [ping], dst
        assert all(_frames(ctl, fabric, h, 0.05) == [] for h in ctl.topo.hosts if h != dst), dst


def _pool(switch: str, base: int, size: int, n: int) -> PoolRecord:
    """The n-th pool on `switch` (its own generation, counter row and group)."""
    return PoolRecord(switch, base, size, n, n, n + 1, 2, True, 0)


def test_the_root_is_a_spine_where_the_window_fits_then_the_one_with_most_free_slots(tmp_path):
    """JobLifecycle's ranking, on the state file alone: spine2 holds two small jobs (more free
    slots than spine1's one big job), so it comes first, unless it admits no more jobs."""
    topo = parse(two_spines_file())
    store = JobStore(tmp_path / "state.sqlite")
    store.add_job(JobRecord(1, {}, (_pool("spine1", 0, 500, 1),), 0.0))
    store.add_job(JobRecord(2, {}, (_pool("spine2", 0, 1, 1),), 0.0))
    store.add_job(JobRecord(3, {}, (_pool("spine2", 1, 1, 2),), 0.0))
    spec = JobSpec(9, ("h1", "h3"), window=8)
    for max_jobs, root in ((8, "spine2"), (2, "spine1")):
        lifecycle = JobLifecycle(RecordedJobs(topo, store, max_jobs), None, None, None, None)
        rank = lifecycle._rank(spec)
        assert min(("spine1", "spine2"), key=rank) == root, max_jobs
    store.close()
