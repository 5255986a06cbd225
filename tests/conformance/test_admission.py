"""Packets that must not touch any slot: dropped, counted under the documented reason, registers
unchanged; and malformed input never takes the switch down."""

from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from controller.counters import StatsCounters
from passing import protocol as P
from testbed.entries import contribution, decode, install_job, switch_ip, switch_mac

DEV = 0


def slot_registers(star, job_slots):
    """Register contents where the target lets tests read them (the model); on BMv2 an empty
    dict, and the finish_slot0 check proves through behaviour that nothing changed."""
    if not star.registers_readable:
        return {}
    # slot_values: VALUE_WORDS words per slot and version, at (2*slot+version)*VALUE_WORDS + w.
    words = [(2 * i + v) * P.VALUE_WORDS + w
             for i in job_slots for v in (0, 1) for w in range(P.VALUE_WORDS)]
    return {(name, i): star.register_read("s1", name, i)
            for i in job_slots for name in ("slot_state",)} | {
        ("slot_values", x): star.register_read("s1", "slot_values", x) for x in words}


@pytest.fixture
def job(star):
    """Job 7: members on ports 1 (id 0) and 2 (id 1), pool of 4 slots at 0; port 3 is not a
    member. Slot 0 holds one contribution (5s) from port 1."""
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=7, members={1: 0, 2: 1}, pool_size=4)
    sw.test_ports[1].send(contribution(DEV, 1, np.full(P.K, 5), job_id=7, slot=0))
    assert sw.test_ports[1].recv(1, 0.3) == []
    return sw


def finish_slot0(star, sw):
    """Port 2 completes slot 0: the result must be exactly 5 + 6 despite everything before."""
    sw.test_ports[2].send(contribution(DEV, 2, np.full(P.K, 6), job_id=7, slot=0))
    for p in (1, 2):
        frames = sw.test_ports[p].recv(1, 3)
        assert frames, f"no result on port {p}"
        assert decode(frames[0])[1]["values"].tolist() == [11] * P.K


@pytest.mark.parametrize("case,reason", [
    ("non_member", "drops_not_member"),
    ("wrong_contributor", "drops_bad_contributor"),
    ("slot_out_of_range", "drops_slot_range"),
    ("bad_version", "drops_bad_version"),
    ("version_not_the_rounds", "drops_bad_version"),
    ("another_pools_epoch", "drops_stale_pool"),
    ("another_pools_epoch_beyond_the_slots", "drops_stale_pool"),
    ("close_on_a_result", "drops_bad_flags"),
    ("no_kind_flag", "drops_bad_flags"),
    ("both_kind_flags", "drops_bad_flags"),
    ("unknown_flag_bit", "drops_bad_flags"),
    ("result_from_host", "drops_forged_result"),
])
def test_rejected_contribution_is_counted_and_changes_nothing(star, job, case, reason):
    sw = job
    big = np.full(P.K, 1000)
    frames = {
        "non_member": (3, contribution(DEV, 3, big, job_id=7, slot=0, contributor=1)),
        "wrong_contributor": (2, contribution(DEV, 2, big, job_id=7, slot=0, contributor=0)),
        "slot_out_of_range": (2, contribution(DEV, 2, big, job_id=7, slot=4)),
        "bad_version": (2, contribution(DEV, 2, big, job_id=7, slot=0, version=1, round=0)),
        # version 2: epoch 1, round 0; the job's pool is epoch 0. The epoch is checked before
        # the slot range: a stale pool's packet is counted as what it is.
        "another_pools_epoch": (2, contribution(DEV, 2, big, job_id=7, slot=0, version=2)),
        "another_pools_epoch_beyond_the_slots": (2, contribution(DEV, 2, big, job_id=7, slot=4,
                                                                 version=2)),
        "version_not_the_rounds": (2, contribution(DEV, 2, big, job_id=7, slot=0, version=0,
                                                   round=3)),
        "close_on_a_result": (2, contribution(DEV, 2, big, job_id=7, slot=0,
                                              flags=int(P.Flag.RESULT | P.Flag.CLOSE))),
        "no_kind_flag": (2, contribution(DEV, 2, big, job_id=7, slot=0, flags=0)),
        "both_kind_flags": (2, contribution(DEV, 2, big, job_id=7, slot=0, flags=3)),
        "unknown_flag_bit": (2, contribution(DEV, 2, big, job_id=7, slot=0, flags=0x41)),
        "result_from_host": (2, contribution(DEV, 2, big, job_id=7, slot=0,
                                             flags=int(P.Flag.RESULT))),
    }
    port, frame = frames[case]
    before = slot_registers(star, range(0, 5))
    sw.test_ports[port].send(frame)
    for p in (1, 2, 3):
        assert sw.test_ports[p].recv(1, 0.4) == []
    assert slot_registers(star, range(0, 5)) == before
    stats = StatsCounters(sw.conn).job(0)
    assert stats[reason] == 1
    assert sum(v for k, v in stats.items() if k.startswith("drops_")) == 1
    finish_slot0(star, sw)


def test_unknown_job_is_dropped_and_counted_globally(star, job):
    sw = job
    before = slot_registers(star, range(0, 4))
    sw.test_ports[2].send(contribution(DEV, 2, np.full(P.K, 9), job_id=8, slot=0))
    assert sw.test_ports[2].recv(1, 0.4) == []
    assert slot_registers(star, range(0, 4)) == before
    assert StatsCounters(sw.conn).global_drops()["unknown_job"] == 1
    finish_slot0(star, sw)


def malformed_frames():
    good = contribution(DEV, 2, np.full(P.K, 77), job_id=7, slot=0)
    eth_ip_udp = 14 + 20 + 8
    truncated = [good[:eth_ip_udp + n] for n in (0, 1, 15, 16, 17, P.PAYLOAD_BYTES - 1)]
    bad_len = bytearray(good)
    bad_len[eth_ip_udp - 4:eth_ip_udp - 2] = (8 + P.PAYLOAD_BYTES + 4).to_bytes(2, "big")
    bad_csum = bytearray(good)
    bad_csum[14 + 10] ^= 0xFF
    garbage = bytes(Ether(dst=switch_mac(DEV)) / IP(dst=switch_ip(DEV))
                    / UDP(dport=P.PASSING_UDP_PORT) / (b"\xde\xad" * 40))
    return truncated + [bytes(bad_len), bytes(bad_csum), garbage]


def test_truncated_and_garbage_packets_change_nothing(star, job):
    sw = job
    before = slot_registers(star, range(0, 4))
    frames = malformed_frames()
    for f in frames:
        sw.test_ports[2].send(f)
    try:
        sw.test_ports[2].send(b"\x01\x02\x03")  # not even an Ethernet header
    except OSError:
        pass  # the kernel may refuse a frame this short; then there is nothing to test
    for p in (1, 2, 3):
        assert sw.test_ports[p].recv(1, 0.5) == []
    assert slot_registers(star, range(0, 4)) == before
    assert StatsCounters(sw.conn).global_drops()["malformed"] == len(frames)
    finish_slot0(star, sw)
