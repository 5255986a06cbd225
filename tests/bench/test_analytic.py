"""The analytical model's arithmetic, on cases worked out by hand."""

from __future__ import annotations

import pytest

from bench.analytic import TCP_FRAME, TCP_MSS, FabricModel, Rates, predict
from passing import protocol as P

FAST = Rates(switch_agg_pps=1e9, switch_fwd_pps=1e9, agent_pps=1e9)
MIB = 1 << 20
BLOCKS = -(-MIB // 4 // P.K)  # value packets of 1 MiB of float32 (4096 at K=64; 820 at K=320)


def test_passing_link_time_is_its_packets_on_the_wire():
    # 1 MiB = BLOCKS blocks of K values, plus 64 exponent packets (one per slot of the window).
    p = predict("passing", FabricModel((4,), 2, 10e6), MIB, FAST, window=64)
    assert p.host_link_bytes == (BLOCKS + 64) * P.FRAME_BYTES
    assert p.seconds == pytest.approx(P.FRAME_BYTES * (BLOCKS + 64) * 8 / 10e6)
    assert p.bound == "link"


def test_ina_sends_one_stream_per_gpu():
    fab = FabricModel((4,), 4, 10e6)
    assert predict("ina", fab, MIB, FAST).host_link_bytes == \
        4 * predict("passing", fab, MIB, FAST).host_link_bytes


def test_ring_carries_2_p_minus_1_over_p_and_ps_the_other_ranks():
    fab = FabricModel((4,), 2, 10e6)
    ring = predict("ring", fab, MIB, FAST)
    assert ring.host_link_bytes == pytest.approx(2 * 7 / 8 * MIB / TCP_MSS * TCP_FRAME)
    hier = predict("hier-ring", fab, MIB, FAST)
    assert hier.host_link_bytes == pytest.approx(2 * 3 / 4 * MIB / TCP_MSS * TCP_FRAME)
    ps = predict("ps", fab, MIB, FAST)  # 6 ranks on the 3 other hosts push to the server
    assert ps.host_link_bytes == pytest.approx(6 * MIB / TCP_MSS * TCP_FRAME)
    assert ps.seconds > ring.seconds > hier.seconds > predict("passing", fab, MIB, FAST).seconds


def test_a_slow_switch_is_the_bound_and_the_spine_sees_one_stream_per_rack():
    slow = Rates(switch_agg_pps=1000, switch_fwd_pps=1e9, agent_pps=1e9, cores=64)
    p = predict("passing", FabricModel((2, 2), 2, 1e9, 1e9), MIB, slow)
    # A ToR: 2 hosts' streams plus the spine's results = 3 streams of BLOCKS + 64 packets.
    stream = BLOCKS + 64
    assert p.bound == "switch" and p.switch_s == pytest.approx(3 * stream / 1000)
    assert p.switch_packets == 2 * 3 * stream + 2 * stream


def test_one_host_needs_no_link_for_tcp_and_unknown_strategies_are_refused():
    assert predict("ring", FabricModel((1,), 4, 1e6), MIB, FAST).seconds == 0.0
    with pytest.raises(ValueError, match="no model"):
        predict("allgather", FabricModel((2,), 1, 1e6), MIB, FAST)
