"""Congestion marks (docs/protocol.md, "Congestion control"): a switch marks the PASSING packets
that leave through a queue MARK_QDEPTH deep (FLAG_CONGESTED), a slot remembers a mark on any
packet it counts into its round, and everything the round sends on (the sum up, the result
down, a result sent again) carries it, so the hosts learn of congestion anywhere on the tree.
A mark never changes a sum, and a packet that is not counted (a duplicate) marks nothing."""

from __future__ import annotations

import numpy as np
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether

from controller.tables.forwarding import ForwardingTables
from passing import protocol as P
from switch_model.fastpath import MARK_BYTES
from testbed.entries import (
    Uplink,
    contribution,
    decode,
    host_ip,
    host_mac,
    install_job,
    received,
    results_at,
)
from testbed.queues import slow_egress

DEV, JOB = 0, 12
CONTRIB, RETRANS, MARK = int(P.Flag.CONTRIB), int(P.Flag.RETRANS), int(P.Flag.CONGESTED)


def _round(sw, vals, slot: int, rnd: int, flags=(CONTRIB, CONTRIB)) -> None:
    for port in (1, 2):
        sw.test_ports[port].send(contribution(DEV, port, vals[port - 1], job_id=JOB, slot=slot,
                                              round=rnd, flags=flags[port - 1]))


def _exact(vals) -> np.ndarray:
    return vals.sum(axis=0).astype(np.int64).astype(np.uint32).view(np.int32)


def test_a_counted_mark_reaches_every_host_and_only_for_its_round(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, JOB, members={1: 0, 2: 1}, pool_size=8)
    vals = np.random.default_rng(12).integers(-(2**24), 2**24, size=(2, P.K))
    _round(sw, vals, slot=1, rnd=0, flags=(CONTRIB | MARK, CONTRIB))
    for port in (1, 2):
        (rec,) = received(sw, port, 1)
        assert rec["flags"] == P.Flag.RESULT | P.Flag.CONGESTED, port
        assert np.array_equal(rec["values"], _exact(vals))
    # The round's result asked for again: still marked (it is the same round's).
    sw.test_ports[1].send(contribution(DEV, 1, vals[0], job_id=JOB, slot=1, round=0,
                                       flags=CONTRIB | RETRANS))
    (again,) = received(sw, 1, 1)
    assert again["flags"] & MARK and np.array_equal(again["values"], _exact(vals))
    # The slot's next round starts clean.
    _round(sw, vals, slot=1, rnd=1)
    for port in (1, 2):
        (rec,) = received(sw, port, 1)
        assert rec["flags"] == P.Flag.RESULT and rec["round"] == 1, port
        assert np.array_equal(rec["values"], _exact(vals)), port


def test_a_marked_duplicate_marks_nothing(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, JOB, members={1: 0, 2: 1}, pool_size=8)
    vals = np.random.default_rng(13).integers(-(2**24), 2**24, size=(2, P.K))
    sw.test_ports[1].send(contribution(DEV, 1, vals[0], job_id=JOB, slot=2))
    # A copy of the counted packet, marked (or a forged mark): not counted, so not remembered.
    sw.test_ports[1].send(contribution(DEV, 1, vals[0] + 5, job_id=JOB, slot=2,
                                       flags=CONTRIB | RETRANS | MARK))
    assert sw.test_ports[1].recv(1, 0.4) == []
    sw.test_ports[2].send(contribution(DEV, 2, vals[1], job_id=JOB, slot=2))
    for port in (1, 2):
        (rec,) = received(sw, port, 1)
        assert rec["flags"] == P.Flag.RESULT and np.array_equal(rec["values"], _exact(vals))


def test_a_mark_below_one_rack_reaches_the_other_rack(two_level):
    f = two_level
    for tor, dev in (("tor1", 0), ("tor2", 1)):
        install_job(f[tor].conn, dev, JOB, members={1: 0, 2: 1}, pool_size=8,
                    uplink=Uplink(port=3, contributor=dev, spine_dev=2))
    install_job(f["spine"].conn, 2, JOB, members={}, member_switches={1: 0, 2: 1}, pool_size=8)
    vals = np.random.default_rng(14).integers(-(2**24), 2**24, size=(4, P.K))
    for t, tor in enumerate(("tor1", "tor2")):
        for h in (1, 2):
            marked = MARK if (t, h) == (0, 2) else 0
            f[tor].test_ports[h].send(contribution(t, h, vals[2 * t + h - 1], job_id=JOB,
                                                   slot=3, flags=CONTRIB | marked))
    got = results_at(f, ("tor1", "tor2"))
    assert sorted(got) == [("tor1", 1), ("tor1", 2), ("tor2", 1), ("tor2", 2)]
    for where, rec in got.items():
        assert rec["flags"] == P.Flag.RESULT | P.Flag.CONGESTED, where
        assert np.array_equal(rec["values"], _exact(vals)), where


def test_a_deep_egress_queue_marks_what_leaves_through_it(star):
    """Port 1 made slow: the results queued behind MARK_QDEPTH others leave it marked; the same
    results out of port 2, whose queue stays empty, do not; every one is exact."""
    sw = star["s1"]
    # BMv2: under its 64-packet queue, well over MARK_QDEPTH. The model: well over its mark,
    # MARK_QDEPTH beyond one receive batch (switch_model.fastpath.MARK_BYTES).
    rounds = 56 if star.target == "bmv2" else 240
    install_job(sw.conn, DEV, JOB, members={1: 0, 2: 1}, pool_size=256)
    vals = np.random.default_rng(15).integers(-(2**24), 2**24, size=(rounds, 2, P.K))
    with slow_egress(star, "s1", 1, pps=40):
        for s in range(rounds):
            _round(sw, vals[s], slot=s, rnd=0)
        fast = received(sw, 2, rounds)
        slow = received(sw, 1, rounds, timeout=10.0)
    for recs in (fast, slow):
        assert sorted(r["slot"] for r in recs) == list(range(rounds))
        for r in recs:
            assert np.array_equal(r["values"], _exact(vals[r["slot"]]))
    assert not any(r["flags"] & MARK for r in fast)
    marked = [r["slot"] for r in slow if r["flags"] & MARK]
    assert slow[0]["flags"] == P.Flag.RESULT  # the first found the queue empty
    # Those behind MARK_QDEPTH or more, give or take a batch; the model's buffers are 1.5-2
    # times their frames, so its mark comes after MARK_BYTES / (2 frames) to / (1.5 frames).
    first = (P.MARK_QDEPTH if star.target == "bmv2"
             else int(MARK_BYTES / (1.5 * P.FRAME_BYTES)))
    assert len(marked) >= rounds - first - 8, marked
    assert slow[-1]["flags"] & MARK


def test_ordinary_frames_through_a_marking_queue_leave_unchanged(star):
    """The mark is PASSING's: a TCP segment or a UDP datagram queued in the same deep queue
    as marked results leaves byte for byte as it came (the model forwards such frames in C,
    beside the results it marks)."""
    sw = star["s1"]
    ForwardingTables(sw.conn).sync({host_mac(DEV, 1): 1}, flood_ports=range(1, 6),
                                   flood_group=1)
    rounds = 56 if star.target == "bmv2" else 240
    install_job(sw.conn, DEV, JOB, members={1: 0, 2: 1}, pool_size=256)
    vals = np.random.default_rng(16).integers(-(2**24), 2**24, size=(rounds, 2, P.K))
    # Byte 47 (where a PASSING header keeps its flags) is 0 in each: a mark would set a bit.
    ordinary = [bytes(Ether(src=host_mac(DEV, 3), dst=host_mac(DEV, 1))
                      / IP(src=host_ip(DEV, 3), dst=host_ip(DEV, 1))
                      / (TCP(sport=5201, dport=40000 + i, flags="A") if i % 2
                         else UDP(sport=40000 + i, dport=5201))
                      / bytes(1000)) for i in range(8)]
    with slow_egress(star, "s1", 1, pps=40):
        for s in range(rounds):
            _round(sw, vals[s], slot=s, rnd=0)
            if s >= rounds - len(ordinary):  # behind the queue the results built
                sw.test_ports[3].send(ordinary[s - rounds + len(ordinary)])
        got = sw.test_ports[1].recv(rounds + len(ordinary), 15.0)
    results = [decode(f)[1] for f in got if f[34:36] == P.PASSING_UDP_PORT.to_bytes(2, "big")]
    assert any(r["flags"] & MARK for r in results), "the queue never got deep enough to mark"
    assert [f for f in got if f in ordinary] == ordinary
    assert len(got) == rounds + len(ordinary)
