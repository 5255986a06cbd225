"""Aggregation behaviour of one switch: sums, multicast, duplicates, loss recovery, slot reuse."""

from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP

from controller.counters import StatsCounters
from controller.switch import Update
from controller.tables.job_admission import JobAdmissionTables
from passing import protocol as P
from testbed.entries import (
    agent_port,
    contribution,
    decode,
    host_ip,
    host_mac,
    install_job,
    ipv4_checksum_ok,
    switch_ip,
)

DEV = 0


def rand_values(rng, n, lo=-(2**20), hi=2**20):
    return rng.integers(lo, hi, size=(n, P.K), dtype=np.int64)


def expect_results(star, ports, timeout=3.0):
    """One frame from each port, decoded."""
    out = {}
    for p in ports:
        frames = star["s1"].test_ports[p].recv(1, timeout)
        assert frames, f"no result on port {p}"
        out[p] = decode(frames[0])
    return out


def assert_silent(star, ports, wait=0.5):
    for p in ports:
        assert star["s1"].test_ports[p].recv(1, wait) == [], f"unexpected packet on port {p}"


@pytest.mark.parametrize("fan_in", [2, 4])
def test_sum_equals_numpy_and_reaches_every_member(star, fan_in):
    sw = star["s1"]
    ports = list(range(1, fan_in + 1))
    install_job(sw.conn, DEV, job_id=7, members={p: p - 1 for p in ports}, pool_size=8)
    rng = np.random.default_rng(fan_in)
    vals = rand_values(rng, fan_in)
    for i, p in enumerate(ports):
        sw.test_ports[p].send(contribution(DEV, p, vals[i], job_id=7, slot=3, frag=42,
                                           num_contrib=2, exp=10 + i))
    results = expect_results(star, ports)
    expected = vals.sum(axis=0).astype(np.int32)
    for p, (pkt, rec) in results.items():
        assert np.array_equal(rec["values"], expected)
        assert rec["flags"] == P.Flag.RESULT
        assert (rec["job_id"], rec["slot"], rec["version"], rec["frag"]) == (7, 3, 0, 42)
        assert rec["num_contrib"] == 2 * fan_in
        assert rec["exp"] == 10 + fan_in - 1
        assert rec["contributor"] == p - 1
        # Each replica is addressed to its member, from the switch, with valid checksums.
        assert pkt.dst == host_mac(DEV, p)
        assert pkt[IP].dst == host_ip(DEV, p) and pkt[IP].src == switch_ip(DEV)
        assert pkt[UDP].dport == agent_port(p) and pkt[UDP].sport == P.PASSING_UDP_PORT
        assert pkt[UDP].chksum == 0
        assert ipv4_checksum_ok(pkt)
    assert_silent(star, [5])
    stats = StatsCounters(sw.conn).job(0)
    assert stats["job_contributions"] == fan_in and stats["job_results"] == 1


def test_negative_values_and_overflow_wrap_like_int32(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=1, members={1: 0, 2: 1})
    a = np.zeros(P.K, dtype=np.int64)
    b = np.zeros(P.K, dtype=np.int64)
    a[:4] = [2**31 - 1, -(2**31), -5, 7]
    b[:4] = [1, -1, -6, -7]
    sw.test_ports[1].send(contribution(DEV, 1, a, job_id=1))
    sw.test_ports[2].send(contribution(DEV, 2, b, job_id=1))
    (_, rec), _ = expect_results(star, [1, 2]).values()
    assert rec["values"][:4].tolist() == [-(2**31), 2**31 - 1, -11, 0]
    assert not rec["values"][4:].any()


def test_duplicate_is_not_added_twice(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=3, members={1: 0, 2: 1, 3: 2})
    ones = np.ones(P.K, dtype=np.int64)
    sw.test_ports[1].send(contribution(DEV, 1, ones, job_id=3))
    sw.test_ports[1].send(contribution(DEV, 1, ones, job_id=3,
                                       flags=P.Flag.CONTRIB | P.Flag.RETRANS))
    sw.test_ports[2].send(contribution(DEV, 2, ones * 10, job_id=3))
    assert_silent(star, [1, 2, 3], wait=0.3)
    sw.test_ports[3].send(contribution(DEV, 3, ones * 100, job_id=3))
    for _, rec in expect_results(star, [1, 2, 3]).values():
        assert rec["values"].tolist() == [111] * P.K
        assert rec["num_contrib"] == 3
    stats = StatsCounters(sw.conn).job(0)
    assert stats["job_duplicates"] == 1 and stats["job_contributions"] == 3


def test_lost_result_recovered_by_retransmission_unicast(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=4, members={1: 0, 2: 1})
    v1, v2 = np.full(P.K, 3), np.full(P.K, -8)
    sw.test_ports[1].send(contribution(DEV, 1, v1, job_id=4, slot=5, version=1))
    sw.test_ports[2].send(contribution(DEV, 2, v2, job_id=4, slot=5, version=1))
    expect_results(star, [1, 2])
    # Host 2 "lost" its result and retransmits: only host 2 gets it again.
    sw.test_ports[2].send(contribution(DEV, 2, v2, job_id=4, slot=5, version=1,
                                       flags=P.Flag.CONTRIB | P.Flag.RETRANS))
    pkt, rec = expect_results(star, [2])[2]
    assert rec["values"].tolist() == [-5] * P.K and rec["flags"] == P.Flag.RESULT
    assert pkt[IP].dst == host_ip(DEV, 2) and rec["num_contrib"] == 2
    assert_silent(star, [1, 3])
    stats = StatsCounters(sw.conn).job(0)
    assert stats["job_result_retransmits"] == 1 and stats["job_results"] == 1


def test_slot_reuse_alternates_versions(star):
    """Round r on version 0, r+1 on version 1, r+2 on version 0 again: each result is exact and a
    late retransmission of round r+1 still gets r+1's result while r+2 is in progress."""
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=5, members={1: 0, 2: 1})
    rng = np.random.default_rng(5)
    rounds = [rand_values(rng, 2) for _ in range(3)]
    for r, vals in enumerate(rounds[:2]):
        for i, p in enumerate((1, 2)):
            sw.test_ports[p].send(contribution(DEV, p, vals[i], job_id=5, slot=0, round=r,
                                               frag=r))
        for _, rec in expect_results(star, [1, 2]).values():
            assert np.array_equal(rec["values"], vals.sum(axis=0).astype(np.int32))
    # Round 2 (version 0) starts with host 1 only; host 2 retransmits round 1 (version 1).
    sw.test_ports[1].send(contribution(DEV, 1, rounds[2][0], job_id=5, slot=0, round=2, frag=2))
    sw.test_ports[2].send(contribution(DEV, 2, rounds[1][1], job_id=5, slot=0, round=1, frag=1,
                                       flags=P.Flag.CONTRIB | P.Flag.RETRANS))
    _, rec = expect_results(star, [2])[2]
    assert rec["frag"] == 1
    assert np.array_equal(rec["values"], rounds[1].sum(axis=0).astype(np.int32))
    sw.test_ports[2].send(contribution(DEV, 2, rounds[2][1], job_id=5, slot=0, round=2, frag=2))
    for _, rec in expect_results(star, [1, 2]).values():
        assert rec["frag"] == 2
        assert np.array_equal(rec["values"], rounds[2].sum(axis=0).astype(np.int32))


def test_two_concurrent_jobs_stay_isolated(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=10, members={1: 0, 2: 1}, pool_base=0, pool_size=4,
                stat_idx=1)
    install_job(sw.conn, DEV, job_id=11, members={3: 0, 4: 1}, pool_base=4, pool_size=4,
                stat_idx=2)
    # Same slot index and version in both jobs, interleaved.
    sw.test_ports[1].send(contribution(DEV, 1, np.full(P.K, 1), job_id=10, slot=2))
    sw.test_ports[3].send(contribution(DEV, 3, np.full(P.K, 1000), job_id=11, slot=2,
                                       contributor=0))
    sw.test_ports[4].send(contribution(DEV, 4, np.full(P.K, 2000), job_id=11, slot=2,
                                       contributor=1))
    res_b = expect_results(star, [3, 4])
    sw.test_ports[2].send(contribution(DEV, 2, np.full(P.K, 2), job_id=10, slot=2))
    res_a = expect_results(star, [1, 2])
    assert all(r["values"].tolist() == [3000] * P.K for _, r in res_b.values())
    assert all(r["values"].tolist() == [3] * P.K for _, r in res_a.values())
    assert_silent(star, [5])
    stats = StatsCounters(sw.conn)
    assert stats.job(1)["job_results"] == 1 and stats.job(2)["job_results"] == 1


def test_new_job_generation_starts_with_empty_pool(star):
    """A job deleted mid-round leaves state behind; a new job on the same slots with a new
    generation must not see it."""
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=20, members={1: 0, 2: 1}, gen=1)
    sw.test_ports[1].send(contribution(DEV, 1, np.full(P.K, 99), job_id=20, slot=1))
    assert_silent(star, [1, 2], wait=0.3)
    adm = JobAdmissionTables(sw.conn)
    sw.conn.write([adm.job_delete(20), sw.conn.multicast_update(Update.DELETE, 120)])
    # (The agent ports job 20 reserved stay guarded for it: job 21's agents use the same.)
    install_job(sw.conn, DEV, job_id=21, members={3: 0, 2: 1}, gen=2, mcast_grp=121,
                guard=False)
    assert (20, 0) not in adm.jobs() and adm.jobs()[21, 0].gen == 2
    sw.test_ports[3].send(contribution(DEV, 3, np.full(P.K, 5), job_id=21, slot=1,
                                       contributor=0))
    assert_silent(star, [2, 3], wait=0.3)  # one contribution of two: not finished
    sw.test_ports[2].send(contribution(DEV, 2, np.full(P.K, 6), job_id=21, slot=1))
    for _, rec in expect_results(star, [2, 3]).values():
        assert rec["values"].tolist() == [11] * P.K


def test_a_whole_window_sent_at_once_is_summed_with_nothing_lost(star):
    """Every host sends its whole window back to back, as an agent does at a call's start: 128
    frames in one burst, more than a switch port's capture ring held when it was sized for
    64 KiB frames (BMv2 on a veth with offloads on lost all beyond about 32 per port)."""
    sw = star["s1"]
    window = 64
    install_job(sw.conn, DEV, job_id=7, members={1: 0, 2: 1}, pool_size=window)
    vals = rand_values(np.random.default_rng(64), 2 * window).reshape(window, 2, P.K)
    frames = [(p, contribution(DEV, p, vals[s, p - 1], job_id=7, slot=s))
              for s in range(window) for p in (1, 2)]
    for p, frame in frames:
        sw.test_ports[p].send(frame)
    for p in (1, 2):
        got = [decode(f)[1] for f in sw.test_ports[p].recv(window, 10.0)]
        assert sorted(int(r["slot"]) for r in got) == list(range(window)), p
        for r in got:
            assert np.array_equal(r["values"], vals[r["slot"]].sum(axis=0).astype(np.int32))
