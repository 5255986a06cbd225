"""`make run-topology`'s machinery end to end: Mininet hosts and links, the switches (the model,
and BMv2 when installed), the controller, the default job, agents on every host."""

from __future__ import annotations

import pytest

from controller.topology import load
from passing.pipeline_files import REPO
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
    assert " 0% packet loss" in h1.cmd(f"ping -c 2 -W 2 {h4.IP()}")


def test_jobs_survive_a_controller_restart(network):
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=8)
    pnet.restart_controller()
    assert [j.job_id for j in pnet.ctl.store.jobs()] == [2]
    assert all(not r["repaired"] for r in pnet.ctl.reconcile().values())
    res = pnet.allreduce("4K", job_id=2, iters=1)
    assert set(res) == {"h1", "h2"} and all(r.get("correct") for r in res.values())
