"""The strategies as SimGrid actors: a ring against the textbook, PASSING against a ring, and
every strategy finishing on the shipped topologies and on a generated fabric."""

import dataclasses

import pytest

from sim import fabric, wire
from sim.costs import (
    CALIBRATIONS,
    SIMGRID_BANDWIDTH_FACTOR,
    SIMGRID_CROSSTRAFFIC,
    datacenter,
    emulation,
)
from sim.runner import NO_CROSSTRAFFIC, Case, run_cases, run_one
from sim.strategies import STRATEGIES, JobRun
from tests.sim.simgrid_skip import needs_simgrid

MB = 1 << 20
EMULATION = emulation(CALIBRATIONS["2026-12-05 00:45"]["model"])


def _job(topo, strategy, size, **kw):
    return (JobRun(1, tuple(topo.hosts), strategy, size, **kw),)


@needs_simgrid
@pytest.mark.parametrize("gpus", [1, 2])
def test_ring_matches_the_textbook_on_a_star(gpus):
    mbps, size = 100.0, 8 * MB
    topo = fabric.reshape(fabric.load("star"), mbps, gpus)
    n = len(topo.hosts) * gpus
    costs = dataclasses.replace(datacenter("nvlink", gpus), step_s=0.0)  # bandwidth only
    sim = run_one(Case(topo, _job(topo, "ring", size), costs)).time
    # 2(N-1)/N of the tensor over each host's link, as TCP frames, both directions busy.
    bandwidth = mbps * 1e6 / 8 * SIMGRID_BANDWIDTH_FACTOR / (1 + SIMGRID_CROSSTRAFFIC)
    textbook = 2 * (n - 1) / n * wire.tcp_wire_bytes(size) / bandwidth
    assert sim == pytest.approx(textbook, rel=0.03)


@needs_simgrid
def test_passing_beats_ring_at_8_ranks_on_a_star_but_not_one_transfer():
    mbps, size = 20.0, 1 * MB
    topo = fabric.reshape(fabric.load("star"), mbps, 2)  # 4 hosts x 2 GPUs: 8 ranks
    passing, ring = (r.time for r in run_cases(
        [Case(topo, _job(topo, s, size), EMULATION) for s in ("passing", "ring")]))
    one_transfer = size / (mbps * 1e6 / 8)
    assert one_transfer < passing < ring


@needs_simgrid
@pytest.mark.parametrize("topo_name,mbps,gpus", [("leafspine", 20.0, 2), ("star", 100.0, 1)])
def test_every_strategy_finishes_on_the_shipped_topologies(topo_name, mbps, gpus):
    topo = fabric.reshape(fabric.load(topo_name), mbps, gpus)
    cases = [Case(topo, _job(topo, s, 256 << 10, speculating=spec), EMULATION, label=s)
             for s in STRATEGIES for spec in (True, False)]
    for r in run_cases(cases):
        assert not r.error, r.label
        assert 0 < r.time < 10, r.label
        assert r.comms > 0


@needs_simgrid
def test_every_strategy_finishes_on_a_generated_fabric_with_concurrent_jobs():
    spec = fabric.FabricSpec(4, 4, 2, gpus=2, host_mbps=10_000, oversubscription=4)
    topo = fabric.generate(spec)
    hosts = sorted(topo.hosts, key=lambda h: int(h[1:]))
    halves = (tuple(hosts[0::2]), tuple(hosts[1::2]))  # two jobs, each in every rack
    costs = datacenter("nvlink", 2)
    cases = [Case(topo, tuple(JobRun(j + 1, hs, s, 10**6) for j, hs in enumerate(halves)),
                  costs, max_chunks=8, max_steps=8, label=s) for s in STRATEGIES]
    for r in run_cases(cases):
        assert not r.error, r.label
        assert set(r.seconds) == {1, 2} and all(t > 0 for t in r.seconds.values()), r.label


@needs_simgrid
def test_pcie_makes_the_local_stage_cost():
    topo = fabric.generate(fabric.FabricSpec(2, 2, 1, gpus=8, host_mbps=100_000))
    nv, pcie = (run_one(Case(topo, _job(topo, "passing", 10**8), datacenter(h, 8))).time
                for h in ("nvlink", "pcie"))
    assert pcie > 2 * nv


@needs_simgrid
def test_passing_streams_get_the_link_without_tcp_acks():
    # UDP has no ACKs: where every job is PASSING or INA the engine's cross-traffic (5% of each
    # flow on its reverse path) is off, so a host's stream up and the results down each get the
    # 97% one flow alone gets; a ring's TCP flows keep paying for their ACKs.
    mbps, size = 100.0, 8 * MB
    topo = fabric.reshape(fabric.load("star"), mbps, 1)
    costs = datacenter("nvlink", 1)
    sim = run_one(Case(topo, _job(topo, "passing", size, speculating=True), costs)).time
    wire_s = wire.stream_packets(size, 256, True) * wire.FRAME_BYTES / (mbps * 1e6 / 8)
    assert sim == pytest.approx(wire_s / SIMGRID_BANDWIDTH_FACTOR, rel=0.03)
    assert Case(topo, _job(topo, "ring", size), costs).engine_args[-1] != NO_CROSSTRAFFIC
