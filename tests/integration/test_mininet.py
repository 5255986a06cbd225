"""`make run-topology`'s machinery end to end: Mininet hosts and links, the switches (the model,
and BMv2 when installed), the controller, the default job, agents on every host."""

from __future__ import annotations

import sys
import threading

import pytest

from controller.topology import load
from tests import REPO
from topologies.network import PassingNetwork


@pytest.fixture
def network(target, tmp_path):
    made = []

    def start(topo_name: str) -> PassingNetwork:
        path = REPO / "topologies" / f"{topo_name}.json"
        pnet = PassingNetwork(load(path), path, target, tmp_path / topo_name)
        made.append(pnet)
        pnet.start()
        return pnet
    yield start
    for pnet in made:
        pnet.stop()


@pytest.mark.parametrize("topo", ["star", "leafspine"])
def test_allreduce_on_every_host_is_correct(network, topo):
    pnet = network(topo)
    pnet.create_job(1, window=16)
    res = pnet.allreduce("16K", iters=1)
    assert set(res) == {"h1", "h2", "h3", "h4"}
    for host, r in res.items():
        assert r.get("ok") and r["correct"] and r["contributors"] == 8, (host, r)
    # Ordinary traffic crosses the same switches.
    h1, h4 = pnet.net.get("h1"), pnet.net.get("h4")
    # -w: keep going until 3 replies came back (an occasional lost echo through three software
    # switches sharing two cores is tolerated; forwarding itself must work)
    assert " 3 received" in h1.cmd(f"ping -c 3 -i 0.2 -w 10 {h4.IP()}")


def test_jobs_survive_a_controller_restart(network):
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=8)
    pnet.restart_controller()
    assert [j.job_id for j in pnet.ctl.store.jobs()] == [2]
    assert all(not r["repaired"] for r in pnet.ctl.reconcile().values())
    res = pnet.allreduce("4K", job_id=2, iters=1)
    assert set(res) == {"h1", "h2"} and all(r.get("correct") for r in res.values())


def test_one_percent_loss_on_every_link(network):
    pnet = network("leafspine")
    pnet.create_job(1, window=16)
    for link in pnet.net.links:
        pnet.set_loss(link.intf1.node.name, link.intf2.node.name, 1.0)
    res = pnet.allreduce("8K", iters=1)
    assert all(r.get("ok") and r["correct"] for r in res.values()), res
    assert sum(r["retransmissions"] for r in res.values()) > 0


def test_two_concurrent_jobs_on_disjoint_hosts(network):
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=8)
    pnet.create_job(3, ["h3", "h4"], window=8)
    results = {}
    threads = [threading.Thread(target=lambda j=j: results.update(
        {j: pnet.allreduce("8K", job_id=j, iters=1)})) for j in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert set(results[2]) == {"h1", "h2"} and set(results[3]) == {"h3", "h4"}
    assert all(r.get("correct") for res in results.values() for r in res.values()), results


FORGE = """
import socket, numpy as np
from passing import packet, protocol as P
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for slot in range(8):
    for cid in (0, 1):
        for version in (0, 1):
            s.sendto(packet.pack(np.full(P.K, 10**6), job_id=2, slot=slot, contributor=cid,
                                 version=version, flags=1, num_contrib=1),
                     ("{switch_ip}", P.PASSING_UDP_PORT))
"""


def test_forged_contributions_from_a_host_outside_the_job_change_nothing(network):
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=8)
    h3 = pnet.net.get("h3")
    out = h3.cmd(f"{sys.executable} -c '{FORGE.format(switch_ip=pnet.topo.switches['s1'].ip)}'")
    assert "Error" not in out, out
    res = pnet.allreduce("4K", job_id=2, iters=1)
    assert all(r.get("correct") for r in res.values()), res
    stats = pnet.ctl.stats(2)["s1"]
    assert stats["drops_not_member"] == 32


@pytest.mark.parametrize("strategy", ["ina", "ring", "hier-ring", "ps"])
def test_baseline_strategies_return_the_correct_sum(network, strategy):
    """Quick mode of the comparison: the same hosts, links and check for every strategy."""
    pnet = network("leafspine")
    pnet.create_job(1, window=16)
    res = pnet.allreduce("4K", iters=1, strategy=strategy)
    assert set(res) == {"h1", "h2", "h3", "h4"}
    assert all(r.get("ok") and r["correct"] and r["strategy"] == strategy
               for r in res.values()), res
    if strategy == "ina":
        # Every GPU rank was its own contributor: each ToR summed 4 streams (2 hosts x 2).
        for tor in ("tor1", "tor2"):
            stats = pnet.ctl.stats(1001)[tor]
            assert stats["job_contributions"] >= 4 * (4096 // 64), stats
