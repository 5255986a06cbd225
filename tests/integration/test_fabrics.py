"""A generated two-spine fabric in Mininet, end to end on the model switch: every uplink built,
the controller's job over all 16 hosts aggregated through one spine, a second job through the
other, and ordinary traffic across racks over the fabric's loops."""

from __future__ import annotations

import pytest

from controller.job_plan import JobSpec
from controller.topology import load
from tests.conftest import skip_reason
from topologies import fabric
from topologies.network import PassingNetwork


@pytest.fixture
def two_spines(tmp_path):
    """4 racks x 4 hosts x 1 GPU, each ToR up to 2 spines (python -m topologies.fabric)."""
    reason = skip_reason("model")
    if reason:
        pytest.skip(reason)
    path = tmp_path / "fabric.json"
    assert fabric.main(["--racks", "4", "--hosts-per-rack", "4", "--gpus", "1", "--spines", "2",
                        "-o", str(path)]) == 0
    pnet = PassingNetwork(load(path), path, "model", tmp_path / "run")
    pnet.start()
    yield pnet
    pnet.stop()


def test_allreduce_and_ping_across_a_generated_two_spine_fabric(two_spines):
    pnet = two_spines
    # Mininet built every link: 16 host links and each ToR's two uplinks.
    links = {frozenset((ln.intf1.node.name, ln.intf2.node.name)) for ln in pnet.net.links}
    for r in range(1, 5):
        assert {frozenset((f"tor{r}", f"spine{s}")) for s in (1, 2)} <= links, r
    assert len(links & {frozenset((h, pnet.topo.hosts[h].rack)) for h in pnet.topo.hosts}) == 16

    pnet.create_job(1, window=16)
    assert JobSpec.from_dict(pnet.ctl.job(1).spec).tree == ("spine1",)
    res = pnet.allreduce("16K", iters=1)
    assert set(res) == {f"h{i}" for i in range(1, 17)}
    for host, r in res.items():
        assert r.get("ok") and r["correct"] and r["contributors"] == 16, (host, r)
    stats = pnet.ctl.stats(1)
    assert stats["spine1"]["job_contributions"] > 0 and stats["spine1"]["job_results"] > 0
    assert all(stats[f"tor{r}"]["job_uplink"] > 0 for r in range(1, 5)), stats

    # spine1 holds job 1's slots now: a job over one host per rack goes to spine2.
    hosts = ["h1", "h5", "h9", "h13"]
    pnet.create_job(2, hosts, window=8)
    assert JobSpec.from_dict(pnet.ctl.job(2).spec).tree == ("spine2",)
    res = pnet.allreduce("4K", job_id=2, iters=1)
    assert set(res) == set(hosts)
    for host, r in res.items():
        assert r.get("ok") and r["correct"] and r["contributors"] == 4, (host, r)
    assert pnet.ctl.stats(2)["spine2"]["job_results"] > 0

    # Ordinary traffic: h1's frames for racks 2 and 4 go up through spine2, for rack 3 through
    # spine1, and the replies by other spines; every ping gets through.
    h1 = pnet.net.get("h1")
    for dst in ("h2", "h6", "h11", "h16"):
        # -w: up to 10 s for 3 replies (software switches on two shared cores may lose one).
        out = h1.cmd(f"ping -c 3 -i 0.2 -w 10 {pnet.topo.hosts[dst].ip}")
        assert " 3 received" in out, (dst, out)
