"""Integrity on every target (docs/protocol.md, "What PASSING protects against"): forged results
never reach an agent, and no packet from a non-member, or from a member with wrong ids, changes
any register of any job. Every drop is counted."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Dot1Q, Ether

from controller.counters import StatsCounters
from controller.tables.forwarding import ForwardingTables
from host_agent.session import new_session
from host_agent.stream import SlotStreamer, StreamConfig
from passing import packet
from passing import protocol as P
from testbed.entries import (
    PortTransport,
    agent_port,
    contribution,
    host_ip,
    host_mac,
    install_job,
    switch_ip,
)
from testbed.fabric import Fabric
from tests.conformance.test_sessions import assert_exact, int_tensors, run, streamers

DEV, JOB, OTHER_JOB = 0, 3, 9
HOSTS, FORGER = [1, 2], 5  # the job's hosts; port 5 is no member of anything
SLOTS, N = 4, 8 * P.K


def udp_frame(port: int, payload: bytes, *, src_ip: str, dst_ip: str, sport: int,
              dport: int) -> bytes:
    return bytes(Ether(src=host_mac(DEV, port), dst=host_mac(DEV, 1)) / IP(src=src_ip, dst=dst_ip)
                 / UDP(sport=sport, dport=dport) / payload)


def forged_results(session: int) -> list[bytes]:
    """Results an attacker who knows the running session would send: every slot, version,
    fragment and call tag of the job's calls, with values that would ruin the sum."""
    out = []
    for slot in range(SLOTS):
        for version in (0, 1):
            for frag in range(slot, N // P.K, SLOTS):
                for tag in range(3):
                    out.append(packet.pack(np.full(P.K, 12345), job_id=JOB, slot=slot,
                                           version=version, frag=frag, tag=tag,
                                           flags=int(P.Flag.RESULT), num_contrib=2, exp=150,
                                           contributor=0, session=session))
    return out


def counters(sw) -> tuple[dict[str, int], dict[str, int]]:
    stats = StatsCounters(sw.conn)
    return stats.global_drops(), stats.job(0)


def test_forged_results_are_dropped_counted_and_never_accepted(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, JOB, members={p: p - 1 for p in HOSTS}, pool_size=SLOTS)
    # Ordinary forwarding between the hosts, so that nothing but the guard stands between a
    # forger and an agent.
    ForwardingTables(sw.conn).sync({host_mac(DEV, p): p for p in range(1, 6)}, range(1, 6), 1)
    session = new_session()
    payloads = forged_results(session)
    kinds = {
        # from the aggregation port, spoofing the switch: only a switch sends from 48879
        "from_48879": [udp_frame(FORGER, p, src_ip=switch_ip(DEV), dst_ip=host_ip(DEV, 1),
                                 sport=P.PASSING_UDP_PORT, dport=agent_port(1))
                       for p in payloads],
        # to an agent's result port from any other port
        "to_agent_port": [udp_frame(FORGER, p, src_ip=switch_ip(DEV), dst_ip=host_ip(DEV, 2),
                                    sport=4242, dport=agent_port(2)) for p in payloads],
        # a RESULT to the switch, from a non-member and from a member host
        "result_flag": [udp_frame(port, p, src_ip=host_ip(DEV, port), dst_ip=switch_ip(DEV),
                                  sport=agent_port(port), dport=P.PASSING_UDP_PORT)
                        for port in (FORGER, 2) for p in payloads[:40]],
    }
    stop = threading.Event()
    sent = dict.fromkeys(kinds, 0)

    def forge() -> None:
        while not stop.is_set():
            for kind, frames in kinds.items():
                port = FORGER if kind != "result_flag" else None
                for i, frame in enumerate(frames):
                    src_port = port or (FORGER if i < len(frames) // 2 else 2)
                    sw.test_ports[src_port].send(frame)
                    sent[kind] += 1
                    if i % 16 == 15:
                        # A pace the slowest target (BMv2) keeps up with beside the agents: a
                        # frame lost in a queue before the pipeline is no switch drop to count.
                        time.sleep(0.01)

    calls = [int_tensors(seed, 2, N) for seed in range(3)]
    forger = threading.Thread(target=forge)
    forger.start()
    try:
        out = run(streamers(sw, HOSTS, SLOTS, session), calls)
    finally:
        stop.set()
        forger.join(10)
    assert all(o.error is None and len(o.results) == 3 for o in out)
    assert_exact(out, calls)
    expected_job = sent["to_agent_port"] + sent["result_flag"]
    deadline = time.monotonic() + 20
    while True:
        gdrops, job = counters(sw)
        if (gdrops["forged"], job["drops_forged_result"]) == (sent["from_48879"], expected_job) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert gdrops["forged"] == sent["from_48879"]
    assert job["drops_forged_result"] == expected_job
    assert job["drops_not_member"] == 0


def test_udp_with_ip_options_is_dropped_as_unchecked(star):
    """IPv4 options hide the UDP ports from the parser, so such a datagram could carry a
    forged result past the checks: it is dropped and counted, and so is a cut UDP header."""
    sw = star["s1"]
    install_job(sw.conn, DEV, JOB, members={p: p - 1 for p in HOSTS}, pool_size=SLOTS)
    payload = forged_results(new_session())[0]
    opt = bytes(Ether(src=host_mac(DEV, FORGER), dst=host_mac(DEV, 1))
                / IP(src=switch_ip(DEV), dst=host_ip(DEV, 1), options=b"\x01\x01\x01\x00")
                / UDP(sport=P.PASSING_UDP_PORT, dport=agent_port(1)) / payload)
    cut = udp_frame(FORGER, payload, src_ip=host_ip(DEV, FORGER), dst_ip=host_ip(DEV, 1),
                    sport=1000, dport=2000)[:38]
    for frame in (opt, cut):
        sw.test_ports[FORGER].send(frame)
    time.sleep(1.0)
    assert sw.test_ports[1].recv(1, 0.5) == []
    assert counters(sw)[0]["unchecked_udp"] == 2


@pytest.mark.parametrize("tpid", [0x8100, 0x88A8, 0x9100])
def test_a_vlan_tag_does_not_smuggle_a_forged_result(star, tpid):
    """A receiver's kernel strips a VID-0 tag and delivers what is inside: a tagged frame
    could carry a forged result past the guard, so every tagged frame is dropped, counted."""
    sw = star["s1"]
    install_job(sw.conn, DEV, JOB, members={p: p - 1 for p in HOSTS}, pool_size=SLOTS)
    ForwardingTables(sw.conn).sync({host_mac(DEV, p): p for p in range(1, 6)}, range(1, 6), 1)
    inner = forged_results(new_session())[0]
    frame = bytes(Ether(src=host_mac(DEV, FORGER), dst=host_mac(DEV, 1), type=tpid)
                  / Dot1Q(vlan=0, type=0x0800)
                  / IP(src=switch_ip(DEV), dst=host_ip(DEV, 1))
                  / UDP(sport=P.PASSING_UDP_PORT, dport=agent_port(1)) / inner)
    sw.test_ports[FORGER].send(frame)
    assert sw.test_ports[1].recv(1, 1.0) == []
    assert counters(sw)[0]["tagged"] == 1


def _fuzz_frames(rng: np.random.Generator, count: int) -> list[tuple[int, bytes, str]]:
    """(ingress port, frame, what it is) of random and malformed packets that a correct switch
    drops and counts: a non-member's, and a member's with ids it does not own."""
    frames = []
    good_len = 14 + 20 + 8 + P.PAYLOAD_BYTES
    for i in range(count):
        kind = i % 8
        from_member = i % 2 == 0
        port = 2 if from_member else FORGER
        # Contributor ids port 2 does not own (it owns 1), and any job id.
        contributor = int(rng.choice([c for c in range(256) if c != 1]))
        job = int(rng.choice([JOB, OTHER_JOB, int(rng.integers(0, 1 << 16))]))
        flags = int(rng.choice([0, 1, 2, 3, 5, 6, 7, int(rng.integers(0, 256))]))
        fields = dict(job_id=job, slot=int(rng.integers(0, 1 << 16)),
                      version=int(rng.integers(0, 256)), level=int(rng.integers(0, 256)),
                      frag=int(rng.integers(0, 1 << 32)), num_contrib=int(rng.integers(0, 1 << 16)),
                      exp=int(rng.integers(0, 256)), tag=int(rng.integers(0, 256)),
                      session=int(rng.integers(0, 1 << 63)) * 2 + 1)
        vals = rng.integers(-(2**31), 2**31, P.K)
        if kind < 4:  # well-formed frames with wrong ids
            frame = bytearray(contribution(DEV, port, vals, contributor=contributor, flags=flags,
                                           **fields))
            what = "ids"
        else:
            frame = bytearray(contribution(DEV, port, vals, contributor=contributor,
                                           **{**fields, "flags": 1}))
            if kind == 4:  # truncated inside the PASSING part
                frame = frame[:int(rng.integers(42, good_len))]
                what = "truncated"
            elif kind == 5:  # a wrong IPv4 header checksum
                frame[24] ^= 0xFF
                what = "checksum"
            elif kind == 6:  # IPv4 or UDP length that disagrees with the format
                off = 16 if rng.integers(0, 2) else 38
                frame[off:off + 2] = int(rng.integers(0, 1 << 16) | 1).to_bytes(2, "big")
                what = "length"
            else:  # a UDP header cut short (parser cannot see the ports)
                frame = frame[:int(rng.integers(34, 42))]
                what = "cut_udp"
        frames.append((port, bytes(frame), what))
    return frames


@pytest.fixture
def fuzz_fabric(target, star, tmp_path):
    """The star fabric; on BMv2 a fresh one whose switch logs every register access (its
    Thrift API reads at most 64 bits of a cell, its trace log records every write whole)."""
    if target != "bmv2":
        yield star
        return
    fabric = Fabric("bmv2", {"s1": 5}, log_dir=tmp_path)
    try:
        yield fabric
    finally:
        fabric.close()


def _all_drops(sw) -> int:
    """Packets counted as dropped anywhere: switch-wide causes and every job row's reasons.
    Cell by cell: reading the whole job_stats counter from BMv2 takes seconds."""
    cells = [row * P.JOB_STATS_STRIDE + r for row in (0, 1) for r in P.JobDrop]
    return sum(StatsCounters(sw.conn).global_drops().values()) + sum(
        sw.conn.read_counter("job_stats", cell)[cell][0] for cell in cells)


def _snapshot(fabric) -> dict[str, list[int]]:
    return {r: fabric.register_cells("s1", r) for r in ("slot_state", "slot_values")}


def test_fuzz_changes_no_register_and_every_drop_is_counted(fuzz_fabric):
    fabric = fuzz_fabric
    sw = fabric["s1"]
    install_job(sw.conn, DEV, JOB, members={p: p - 1 for p in HOSTS}, pool_size=SLOTS,
                stat_idx=0)
    install_job(sw.conn, DEV, OTHER_JOB, members={3: 0, 4: 1}, pool_size=SLOTS, pool_base=64,
                gen=2, stat_idx=1, guard=False)
    # Both jobs hold state: a completed session each.
    for job, hosts in ((JOB, HOSTS), (OTHER_JOB, [3, 4])):
        calls = [int_tensors(job, 2, N)]
        agents = [SlotStreamer(StreamConfig(job, i, SLOTS, 2, new_session(), rto=0.05),
                               PortTransport(sw.test_ports[p], DEV, p))
                  for i, p in enumerate(hosts)]
        assert_exact(run(agents, calls), calls)
    before = _snapshot(fabric)
    assert any(before["slot_state"][:SLOTS]) and any(before["slot_state"][64:64 + SLOTS])
    writes = fabric.register_writes("s1") if not fabric.registers_whole else 0
    if not fabric.registers_whole and writes == 0:
        # The sessions above wrote slots: a log without them is a BMv2 built for speed.
        pytest.skip("this BMv2 logs no register writes (built --disable-logging-macros, as "
                    "p4lang's performance guide says): its registers cannot be checked whole")
    dropped = _all_drops(sw)

    frames = _fuzz_frames(np.random.default_rng(2026), 10_000)
    batch = 25
    for start in range(0, len(frames), batch):
        for port, frame, _ in frames[start:start + batch]:
            sw.test_ports[port].send(frame)
        # Each batch counted before the next goes: BMv2's capture buffer holds a few dozen
        # frames, and a frame lost before the pipeline is no switch drop to count.
        deadline = time.monotonic() + 30
        while _all_drops(sw) - dropped < start + batch and time.monotonic() < deadline:
            time.sleep(0.01)
    deadline = time.monotonic() + 60
    while _all_drops(sw) - dropped < len(frames) and time.monotonic() < deadline:
        time.sleep(0.2)
    # Every frame dropped and counted exactly once, none forwarded or answered.
    assert _all_drops(sw) - dropped == len(frames)
    for p in sw.test_ports.values():
        assert p.recv(1, 0.2) == [], "a fuzz frame was forwarded or answered"
    after = _snapshot(fabric)
    for r in before:
        changed = [i for i, (a, b) in enumerate(zip(before[r], after[r], strict=True)) if a != b]
        assert not changed, f"{r}: cells {changed[:10]} changed"
    if not fabric.registers_whole:
        assert fabric.register_writes("s1") == writes, "the fuzz wrote a register"
    # The job goes on: a new session is correct from its first call (and, on BMv2, its
    # register writes show in the log that the check above reads).
    calls = [int_tensors(seed, 2, N) for seed in (2, 3)]
    out = run(streamers(sw, HOSTS, SLOTS, new_session()), calls)
    assert all(o.error is None for o in out)
    assert_exact(out, calls)
    if not fabric.registers_whole:
        assert fabric.register_writes("s1") > writes


@pytest.fixture(autouse=True)
def _no_stray_frames(star):
    yield
    for p in star["s1"].test_ports.values():
        p.drain()
