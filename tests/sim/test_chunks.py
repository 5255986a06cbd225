"""Wire sizes and the chunking of streams (no SimGrid needed)."""

import pytest

from bench import analytic
from passing import protocol as P
from sim import collectives, wire
from sim.stream import chunking, ramp


@pytest.mark.parametrize("total,pieces", [(1, 16), (5, 128), (820, 64), (78125, 16),
                                          (13364, 128)])
def test_ramp_covers_the_stream(total, pieces):
    sizes = ramp(total, pieces)
    assert sum(sizes) == total
    assert sizes[0] == 1
    assert max(sizes) <= -(-total // pieces)
    head = [s for s in sizes if s < max(sizes)][:-1] if len(sizes) > 1 else []
    assert all(b == 2 * a for a, b in zip(head, head[1:], strict=False))


def test_chunking_counts_packets_as_the_analytic_model():
    size = 4 << 20
    plan = chunking(size, 256, speculating=False, max_chunks=64)
    assert plan.packets == analytic.stream_packets(size // 4, 256, False)
    assert plan.packets == -(-size // 4 // P.K) + P.slots_used(256, -(-size // 4 // P.K))
    assert plan.window == 205  # 3277 fragments use 205 slots: a slot per 16 fragments


def test_chunking_keeps_a_chunks_round_trip_in_flight():
    # 16 MiB in 128 chunks: chunks of 105 packets, more than a 256-slot window over 4 hops.
    plan = chunking(16 << 20, 256, speculating=False, max_chunks=128)
    assert plan.in_flight >= 6 * max(plan.sizes)
    small = chunking(256 << 10, 256, speculating=True, max_chunks=128)
    assert small.in_flight >= small.window


def test_tcp_wire_bytes():
    assert wire.tcp_wire_bytes(1448) == pytest.approx(1514)
    assert wire.parse_size("256K") == 256 << 10 and wire.parse_size("100MB") == 10**8
    assert wire.format_size(16 << 20) == "16 MiB" and wire.format_size(10**9) == "1 GB"


def test_ps_constants_are_the_agents():
    strategies = pytest.importorskip("passing_agent.strategies")
    assert collectives.PS_CHUNKS == strategies.PS_CHUNKS
    assert collectives.PS_CHUNK_MIN_BYTES == strategies.PS_CHUNK_MIN_BYTES
    assert collectives.PS_CHUNK_MAX_BYTES == strategies.PS_CHUNK_MAX_BYTES
    assert collectives.PS_WINDOW == strategies.PS_WINDOW
    for n in (16 << 10, 1 << 20, 16 << 20):
        assert collectives.ps_chunk_bytes(n) == strategies.ps_chunk_bytes(n)
