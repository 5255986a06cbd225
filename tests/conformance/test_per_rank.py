"""Switch-only INA (the `ina` baseline): several contributors behind one port, each GPU rank
its own stream. The port's member entry admits a range of ids; results reach every rank."""

from __future__ import annotations

import numpy as np
from scapy.layers.inet import UDP

from controller.counters import StatsCounters
from passing import protocol as P
from testbed.entries import agent_port, contribution, install_job, received_decoded

DEV = 0
# Port 1: a server with 2 GPU ranks (ids 0, 1); port 2: a server with 3 (ids 2, 3, 4).
MEMBERS = {1: (0, 2), 2: (2, 3)}
RANKS = [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]  # (port, rank behind that port)


def test_every_rank_contributes_and_every_rank_gets_the_sum(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=4, members=MEMBERS, pool_size=8)
    rng = np.random.default_rng(11)
    vals = rng.integers(-(2**20), 2**20, size=(len(RANKS), P.K), dtype=np.int64)
    for i, (port, rank) in enumerate(RANKS):
        first = MEMBERS[port][0]
        sw.test_ports[port].send(contribution(DEV, port, vals[i], job_id=4, slot=2,
                                              contributor=first + rank))
    expected = vals.sum(axis=0).astype(np.int32)
    for port, (first, count) in MEMBERS.items():
        results = received_decoded(sw, port, count, timeout=3.0)
        assert len(results) == count, f"port {port}: {len(results)} results for {count} ranks"
        # One replica per rank, each addressed to that rank's UDP port and id.
        got = sorted((pkt[UDP].dport, rec["contributor"]) for pkt, rec in results)
        assert got == [(agent_port(port, r), first + r) for r in range(count)]
        for _, rec in results:
            assert np.array_equal(rec["values"], expected)
            assert rec["num_contrib"] == len(RANKS)
    stats = StatsCounters(sw.conn).job(0)
    assert stats["job_contributions"] == len(RANKS) and stats["job_results"] == 1


def test_id_outside_the_ports_range_is_refused_and_changes_nothing(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=4, members=MEMBERS, pool_size=8)
    ones = np.ones(P.K, dtype=np.int64)
    # Port 1 owns ids 0..1: id 2 belongs to port 2 and 7 to nobody.
    for cid in (2, 7):
        sw.test_ports[1].send(contribution(DEV, 1, ones * 1000, job_id=4, slot=0,
                                           contributor=cid))
    for i, (port, rank) in enumerate(RANKS):
        sw.test_ports[port].send(contribution(DEV, port, ones * (i + 1), job_id=4, slot=0,
                                              contributor=MEMBERS[port][0] + rank))
    results = received_decoded(sw, 1, 2, timeout=3.0)
    assert len(results) == 2
    assert all(np.all(rec["values"] == sum(range(1, len(RANKS) + 1))) for _, rec in results)
    stats = StatsCounters(sw.conn).job(0)
    assert stats["drops_bad_contributor"] == 2


def test_retransmission_after_completion_is_answered_to_the_asking_rank_only(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=4, members=MEMBERS, pool_size=8)
    ones = np.ones(P.K, dtype=np.int64)
    for port, rank in RANKS:
        sw.test_ports[port].send(contribution(DEV, port, ones, job_id=4, slot=5,
                                              contributor=MEMBERS[port][0] + rank))
    for port, (_, count) in MEMBERS.items():
        assert len(received_decoded(sw, port, count, timeout=3.0)) == count
    # Rank 2 behind port 2 (id 4) lost its result and asks again.
    sw.test_ports[2].send(contribution(DEV, 2, ones, job_id=4, slot=5, contributor=4,
                                       flags=int(P.Flag.CONTRIB | P.Flag.RETRANS)))
    answer = received_decoded(sw, 2, 1, timeout=3.0)
    assert len(answer) == 1
    pkt, rec = answer[0]
    assert (pkt[UDP].dport, rec["contributor"]) == (agent_port(2, 2), 4)
    assert np.all(rec["values"] == len(RANKS))
    assert sw.test_ports[1].recv(1, 0.5) == [] and sw.test_ports[2].recv(1, 0.3) == []
