"""The compiled PASSING path (switch_model/fastpath.c) against the Python pipeline it mirrors:
the same frames into two switches with the same tables, one all Python, one compiled; every
frame that leaves, every counter cell and every register must be the same, after every batch.

The frames are a random mix of what a fabric carries and what an adversary or a restart sends:
contributions and results of a root job and of a ToR's job (CLOSE, RETRANS, duplicates, old,
new and wrapped rounds, mismatched versions, other sessions, unknown jobs and flags, foreign
ports), corrupted checksums and lengths, truncated frames and trailers, and frames of other
kinds between them (which take the Python pipeline on both), with table writes in between.
"""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from controller import installer
from passing import cbuild
from passing import protocol as P
from passing.pipeline_files import load_p4info
from switch_model import fastpath
from switch_model.p4runtime_server import P4RuntimeService
from switch_model.pipeline import PASSING_END, PASSING_OFF, VALUES_OFF, Pipeline
from switch_model.state import Action
from testbed.entries import Uplink, contribution, job_entries
from testbed.loopback import InProcessConnection

DEV = 1
UPLINK = 4
SESSIONS = (0x5E55_1011_0000_0001, 0x0BAD_5E55_0000_0002)
HEADER = struct.Struct("!HHBBBBIIHBBQ")
FLAG_CHOICES = [P.Flag.CONTRIB] * 6 + [P.Flag.RESULT] * 3 + [
    P.Flag.CONTRIB | P.Flag.CLOSE, P.Flag.CONTRIB | P.Flag.RETRANS, P.Flag.RESULT | P.Flag.CLOSE,
    P.Flag.CONTRIB | P.Flag.RESULT, 0, 0x20 | P.Flag.CONTRIB, P.Flag.CONTRIB | P.Flag.POOL]


def _switch(compiled: bool) -> Pipeline:
    """A switch holding a root job (ports 1-3, two ranks behind port 2) and a ToR's job (ports
    1-2, up to the spine on UPLINK), installed as the controller installs them."""
    info = load_p4info()
    pipe = Pipeline.from_p4info(info)
    if compiled:
        assert pipe.use_compiled(), "the compiled path could not be built (is cc installed?)"
    conn = InProcessConnection(P4RuntimeService(pipe, DEV, info))
    installer.install(conn, job_entries(DEV, 1, {1: 0, 2: (1, 2), 3: 3}, pool_size=6,
                                        mcast_grp=11, quorum=2, guard=False))
    installer.install(conn, job_entries(DEV, 2, {1: 0, 2: 1}, pool_base=8, pool_size=4, gen=7,
                                        stat_idx=1, mcast_grp=12, uplink=Uplink(UPLINK, 1, 9),
                                        quorum=1))
    # Ordinary traffic: hosts' MACs to their ports, the rest flooded (the controller's default).
    for mac, port in L2_ENTRIES.items():
        pipe.state.insert("l2_forward", (mac,), Action("l2_to_port", {"port": port}))
    pipe.state.mcast_write("INSERT", FLOOD_GROUP, [(p, 0) for p in (1, 2, 3, UPLINK, 5)])
    pipe.state.set_default("l2_forward", Action("l2_flood", {"mcast_grp": FLOOD_GROUP}))
    return pipe


L2_ENTRIES = {0x02_00_00_00_01_01: 1, 0x02_00_00_00_01_03: 3, 0x02_00_00_00_09_00: UPLINK,
              0x02_00_00_00_01_05: 5}
FLOOD_GROUP = 900
# UDP ports the result guard holds for job 2's agents (job 1's are not guarded).
GUARDED = sorted({port for port in job_entries(DEV, 2, {1: 0, 2: 1}).guards})


def _ordinary(rng: random.Random, base: bytearray) -> bytes:
    """A frame off the PASSING path, from a PASSING frame: TCP or ARP to a known MAC or not,
    UDP to a guarded port or from the aggregation port, with IPv4 options, a later fragment,
    or cut short."""
    mac = rng.choice([*L2_ENTRIES, 0x02_00_00_00_07_07, 0xFF_FF_FF_FF_FF_FF])
    base[0:6] = mac.to_bytes(6, "big")
    kind = rng.randrange(7)
    if kind == 0:
        base[23] = 6  # TCP
    elif kind == 1:
        base[12:14] = b"\x08\x06"  # ARP
    elif kind == 2:
        base[36:38] = rng.choice(GUARDED).to_bytes(2, "big")
    elif kind == 3:
        base[34:36], base[36:38] = P.PASSING_UDP_PORT.to_bytes(2, "big"), b"\x13\x88"
    elif kind == 4:
        base[14] = 0x46  # IPv4 options: the parser cannot see the ports
    elif kind == 5:
        base[20:22] = b"\x00\x10"  # a later fragment: no UDP header
    else:
        base[36:38] = b"\x00\x35"
        base = base[:rng.randrange(14, 60)]
    return bytes(base)


# Contributor ids behind each port, per job (as _switch installs them).
MEMBERS = {1: {1: (0,), 2: (1, 2), 3: (3,)}, 2: {1: (0,), 2: (1,)}}


def _frame(rng: random.Random, templates: dict[int, bytes], port: int) -> bytes:
    """Mostly what agents and a spine would send on `port` (so that slots fill, complete and
    come back), the rest anything at all."""
    if rng.random() < 0.7:
        job = rng.choice((1, 2))
        members = MEMBERS[job].get(port)
        result = port == UPLINK and job == 2
        if members is None and not result:
            job, members = 1, (rng.randrange(4),)
        contributor = rng.choice(members) if members else rng.randrange(4)
        rnd = rng.choice((1, 1, 1, 2, 2, 3, 0))
        slot = rng.randrange(3)
        flags = P.Flag.RESULT if result else rng.choice(
            (P.Flag.CONTRIB,) * 8 + (P.Flag.CONTRIB | P.Flag.CLOSE,
                                     P.Flag.CONTRIB | P.Flag.RETRANS))
        version, session = rnd & 1, SESSIONS[0] if rng.random() < 0.95 else SESSIONS[1]
    else:
        job, slot = rng.choice((1, 1, 2, 2, 3)), rng.randrange(7)
        contributor = rng.choice((0, 1, 2, 3, 4, 0, 1, 2, 40))
        rnd = rng.choice((0, 1, 2, 3, 4, 0xFFFFFFFF, 0x80000001))
        version = (rnd & 1) | (rng.choice((0, 0, 0, 1, 5)) << 1)
        if rng.random() < 0.1:
            version ^= 1
        flags, session = int(rng.choice(FLAG_CHOICES)), rng.choice(SESSIONS)
    header = HEADER.pack(job, slot, contributor, int(flags), version, rng.randrange(2),
                         rng.randrange(1 << 32), rnd, rng.choice((1, 1, 1, 2, 3, 200, 65535)),
                         rng.randrange(6),
                         rng.randrange(256), session)
    values = np.array([rng.randrange(-(1 << 31), 1 << 31) for _ in range(4)] * (P.K // 4),
                      dtype=">i4").tobytes()
    base = bytearray(templates[port])
    base[PASSING_OFF:VALUES_OFF] = header
    base[VALUES_OFF:PASSING_END] = values
    r = rng.random()
    if r < 0.02:
        base[14 + rng.randrange(20)] ^= 1 << rng.randrange(8)  # IPv4 header: bad checksum
    elif r < 0.04:
        base = base[:rng.randrange(len(base))]  # truncated
    elif r < 0.06:
        base += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))  # a trailer
    elif r < 0.065:
        base += bytes(1500)  # a trailer too long for the compiled path
    elif r < 0.075:
        base[38:40] = b"\x01\x00"  # wrong UDP length
    elif r < 0.095:
        base[36:38] = rng.choice((b"\x13\x88", b"\x00\x35"))  # another UDP port: L2 / guard
    elif r < 0.16:
        return _ordinary(rng, base)
    elif r < 0.10:
        base[12:14] = b"\x81\x00"  # tagged
    return bytes(base)


def _templates() -> dict[int, bytes]:
    zeros = np.zeros(P.K, dtype=np.int64)
    return {port: contribution(DEV, port, zeros, job_id=1) for port in (1, 2, 3, UPLINK, 5)}


def _assert_same(py: Pipeline, fast: Pipeline, where: str) -> None:
    for name, cells in py.state.counters.items():
        diff = np.nonzero((cells != fast.state.counters[name]).any(axis=1))[0]
        assert not len(diff), f"{where}: counter {name} differs at {diff[:5].tolist()}: " \
            f"python {cells[diff[:5]].tolist()}, compiled " \
            f"{fast.state.counters[name][diff[:5]].tolist()}"
    for i, (a, b) in enumerate(zip(py.slots.arrays(), fast.slots.arrays(), strict=True)):
        assert np.array_equal(a, b), f"{where}: register array {i} differs"


def test_the_compiled_path_makes_what_the_python_pipeline_makes_frame_for_frame():
    rng = random.Random(15)
    py, fast = _switch(False), _switch(True)
    templates = _templates()
    kinds: dict[bool, int] = {True: 0, False: 0}
    events = np.zeros(P.JOB_STATS_STRIDE, dtype=np.int64)
    for batch in range(300):
        port = rng.choice((1, 2, 3, UPLINK, 5))
        frames = [_frame(rng, templates, port) for _ in range(rng.randrange(1, 40))]
        expected = [out for f in frames for out in py.process(port, f)]
        got = fast.process_batch(port, frames)
        assert got == expected, f"batch {batch}: the frames that leave differ"
        _assert_same(py, fast, f"batch {batch}")
        for f in frames:
            kinds[len(f) >= 42 and f[36:38] == P.PASSING_UDP_PORT.to_bytes(2, "big")] += 1
        if batch in (100, 200):
            # The controller moves job 1 to a new generation and takes a peer away; job 2's
            # ToR gets a wider group: both switches must see the same tables from then on.
            for pipe in (py, fast):
                old = pipe.state.tables["job_config"].entries[(1, 0)]
                pipe.state.modify("job_config", (1, 0), Action(
                    "set_job", {**old.params, "gen": old.params["gen"] + 1}))
                key = (1, 3, 3)
                if key in pipe.state.tables["peer_rewrite"].entries:
                    pipe.state.delete("peer_rewrite", key)
                pipe.state.mcast_write("MODIFY", 12, [(1, 0), (2, 1), (3, 0)])
    for p in (0, 1):
        events += py.state.counters["job_stats"][p * P.JOB_STATS_STRIDE:
                                                 (p + 1) * P.JOB_STATS_STRIDE, 0].astype(np.int64)
    # The mix reached every outcome worth comparing, not just drops.
    for e in (P.JobEvent.PARTIAL, P.JobEvent.COMPLETE_ROOT, P.JobEvent.COMPLETE_UP,
              P.JobEvent.DUPLICATE, P.JobEvent.RESULT_AGAIN, P.JobEvent.DOWNLINK,
              P.JobEvent.CLOSED_ROOT, P.JobEvent.LATE, P.JobDrop.STALE_ROUND,
              P.JobDrop.STALE_RESULT, P.JobDrop.BAD_VERSION, P.JobDrop.NOT_MEMBER,
              P.JobDrop.SLOT_RANGE, P.JobDrop.BAD_FLAGS):
        assert events[e] > 0, f"the mix never produced {e!r}"
    gd = py.state.counters["global_drops"][:, 0]
    assert gd[P.GlobalDrop.MALFORMED] > 0 and gd[P.GlobalDrop.UNKNOWN_JOB] > 0
    assert py.state.counters["egress_drops"][0, 0] > 0
    assert kinds[True] > 5000 and kinds[False] > 100


def test_a_wrong_sum_in_the_compiled_path_is_caught_by_the_comparison(monkeypatch):
    """The comparison above can fail: a compiled switch whose slot values were bumped by one
    lane's worth makes a different result frame."""
    py, fast = _switch(False), _switch(True)
    zeros = np.zeros(P.K, dtype=np.int64)
    first = [contribution(DEV, 1, zeros + 5, job_id=1, slot=2, round=1)]
    assert fast.process_batch(1, first) == [o for f in first for o in py.process(1, f)]
    fast.slots.values[2 * 2 + 1, 7] += 1  # one lane of the slot's round-1 version
    rest = [contribution(DEV, 2, zeros + 1, job_id=1, slot=2, round=1, contributor=c)
            for c in (1, 2)]
    rest.append(contribution(DEV, 3, zeros, job_id=1, slot=2, round=1, contributor=3))
    got = fast.process_batch(2, rest[:2]) + fast.process_batch(3, rest[2:])
    expected = [o for f in rest[:2] for o in py.process(2, f)] + \
        [o for f in rest[2:] for o in py.process(3, f)]
    assert len(got) == len(expected) == 4  # the completed slot, multicast to 4 contributors
    assert got != expected


def test_without_a_compiler_the_switch_keeps_the_python_pipeline(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(cbuild, "build_dir", lambda name: tmp_path)
    pipe = Pipeline.from_p4info(load_p4info())
    assert not pipe.use_compiled()
    frame = contribution(DEV, 1, np.zeros(P.K, dtype=np.int64), job_id=1)
    assert pipe.process_batch(1, [frame]) == pipe.process(1, frame) == []
    assert pipe.state.counters["global_drops"][P.GlobalDrop.UNKNOWN_JOB, 0] == 2


@pytest.mark.parametrize("k", [64, 128])
def test_every_k_builds(k, monkeypatch, tmp_path):
    """The library is built per K (the constants are compiled in): another K is another file,
    never a stale library."""
    monkeypatch.setattr(cbuild, "build_dir", lambda name: tmp_path / name)
    monkeypatch.setattr(fastpath.P, "K", k)
    lib = fastpath.build()
    assert lib.exists() and lib.parent == tmp_path / "fastpath"
    monkeypatch.setattr(fastpath.P, "K", k + 64)
    assert fastpath.build() != lib
