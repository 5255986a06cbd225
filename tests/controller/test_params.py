"""A recorded job as its agents see it (controller.params.job_params), from the record and the
topology alone."""

from __future__ import annotations

from controller.job_plan import JobSpec
from controller.params import job_params
from controller.records import JobRecord, PoolRecord, RetiringPool
from controller.topology import load
from tests import REPO

TOPO = load(REPO / "topologies" / "leafspine.json")  # tor1: h1, h2; tor2: h3, h4; spine


def resized(installing: bool) -> JobRecord:
    """Job 4 on h1 and h3, resized from a window of 8 to one of 16 (pool epoch 1)."""
    spec = JobSpec(4, ("h1", "h3"), window=16, agent_port=61000, session_key="ab" * 16)
    pools = tuple(PoolRecord(s, 16, 16, 2, 0, 2, fan_in, s == "spine", 0 if s == "spine" else 3)
                  for s, fan_in in (("tor1", 1), ("tor2", 1), ("spine", 2)))
    old = tuple(RetiringPool(p.switch, 0, 8, 1, 0) for p in pools)
    return JobRecord(4, spec.to_dict(), pools, 0.0, 1, old, installing)


def test_agents_are_handed_the_hosts_at_their_tors_and_the_current_pool():
    params = job_params(resized(installing=False), TOPO)
    assert params.host_names == ["h1", "h3"]
    assert [params.host(h).switch_ip for h in ("h1", "h3")] == \
        [TOPO.switches["tor1"].ip, TOPO.switches["tor2"].ip]
    assert (params.window, params.pool, params.agent_udp_port) == (16, 1, 61000)


def test_a_resize_not_on_every_switch_yet_hands_out_the_old_pool():
    params = job_params(resized(installing=True), TOPO)
    assert (params.window, params.pool) == (8, 0)
