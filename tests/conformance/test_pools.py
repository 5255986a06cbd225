"""A job's two pools (docs/protocol.md, "Live pool resizing"): FLAG_POOL picks the job_config
entry, each pool sums in its own slots under its own generation, whatever leaves carries the
bit it came in with, and pool_contribs tells the controller who has used which pool."""

from __future__ import annotations

import dataclasses

import numpy as np

from controller.switch import Update
from controller.tables.job_admission import JobAdmissionTables
from passing import protocol as P
from testbed.entries import Uplink, contribution, decode, install_job

DEV = 0
POOL = int(P.Flag.POOL)
CONTRIB = int(P.Flag.CONTRIB)


def values(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-(2**20), 2**20, size=(n, P.K), dtype=np.int64)


def add_pool(conn, cfg, *, pool_base: int, pool_size: int, gen: int):
    """The job's other pool, as a resize installs it: its own slots and generation."""
    new = dataclasses.replace(cfg, pool=1 - cfg.pool, pool_base=pool_base, pool_size=pool_size,
                              gen=gen)
    conn.write([JobAdmissionTables(conn).job_update(Update.INSERT, new)])
    return new


def results(sw, ports, timeout=3.0) -> dict[int, np.void]:
    out = {}
    for p in ports:
        frames = sw.test_ports[p].recv(1, timeout)
        assert frames, f"no result on port {p}"
        out[p] = decode(frames[0])[1]
    return out


def silent(sw, ports, wait=0.4) -> None:
    for p in ports:
        assert sw.test_ports[p].recv(1, wait) == [], f"unexpected packet on port {p}"


def pool_contribs(conn, stat_idx: int, pool: int, contributors: int) -> list[int]:
    cells = conn.read_counter("pool_contribs")
    base = (stat_idx * 2 + pool) * P.MAX_FAN_IN
    return [cells[base + c][0] for c in range(contributors)]


def test_the_pool_bit_picks_the_pool_and_each_sums_apart(star):
    """Both pools use slot 0 and round 0 in one session, with contributions interleaved: each
    result holds its own pool's values only, carries its bit, and a resend into the old pool
    after the hosts moved on is still answered from the old pool."""
    sw = star["s1"]
    old = install_job(sw.conn, DEV, job_id=9, members={1: 0, 2: 1}, pool_size=4, gen=3,
                      stat_idx=5)
    add_pool(sw.conn, old, pool_base=200, pool_size=2, gen=4)
    a, b = values(1, 2), values(2, 2)
    for i, p in enumerate((1, 2)):
        sw.test_ports[p].send(contribution(DEV, p, a[i], job_id=9, slot=0))
        sw.test_ports[p].send(contribution(DEV, p, b[i], job_id=9, slot=0, flags=CONTRIB | POOL,
                                           tag=1))
    got: dict[int, list] = {1: [], 2: []}
    for _ in range(2):
        for p, rec in results(sw, [1, 2]).items():
            got[p].append(rec)
    for p in (1, 2):
        by_pool = {int(r["flags"]) & POOL: r for r in got[p]}
        assert set(by_pool) == {0, POOL}, "one result from each pool"
        assert by_pool[0]["flags"] == P.Flag.RESULT
        assert by_pool[POOL]["flags"] == P.Flag.RESULT | P.Flag.POOL
        assert np.array_equal(by_pool[0]["values"], a.sum(axis=0))
        assert np.array_equal(by_pool[POOL]["values"], b.sum(axis=0))
        assert (by_pool[0]["tag"], by_pool[POOL]["tag"]) == (0, 1)
    # The new pool's slot 0 took its sum into slot 200, not slot 0: the old result is intact.
    sw.test_ports[2].send(contribution(DEV, 2, a[1], job_id=9, slot=0,
                                       flags=CONTRIB | int(P.Flag.RETRANS)))
    again = results(sw, [2])[2]
    assert again["flags"] == P.Flag.RESULT
    assert np.array_equal(again["values"], a.sum(axis=0))
    silent(sw, [1])
    # Slot 1 exists in the new pool (size 2), slot 2 only in the old one (size 4).
    sw.test_ports[1].send(contribution(DEV, 1, a[0], job_id=9, slot=2, flags=CONTRIB | POOL))
    silent(sw, [1, 2])
    job = sw.conn.read_counter("job_stats")
    assert job[5 * P.JOB_STATS_STRIDE + P.JobDrop.SLOT_RANGE][0] == 1
    # Every admitted contribution counted once, under its pool and contributor.
    assert pool_contribs(sw.conn, 5, 0, 2) == [1, 2]
    assert pool_contribs(sw.conn, 5, 1, 2) == [1, 1]


def test_a_pool_bit_without_an_entry_is_an_unknown_job(star):
    """Before a resize installs the other pool, or after the controller retired it, packets
    naming it belong to no job: dropped, counted in global_drops, no pool_contribs."""
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=9, members={1: 0, 2: 1}, pool_size=4, stat_idx=5)
    before = sw.conn.read_counter("global_drops")[P.GlobalDrop.UNKNOWN_JOB][0]
    for p in (1, 2):
        sw.test_ports[p].send(contribution(DEV, p, values(3, 1)[0], job_id=9,
                                           flags=CONTRIB | POOL))
    silent(sw, [1, 2])
    assert sw.conn.read_counter("global_drops")[P.GlobalDrop.UNKNOWN_JOB][0] == before + 2
    assert pool_contribs(sw.conn, 5, 1, 2) == [0, 0]
    assert pool_contribs(sw.conn, 5, 0, 2) == [0, 0]


def test_two_levels_sum_in_the_pool_the_hosts_named(two_level):
    """A rack's sum goes up with the hosts' pool bit, the spine sums it in that pool, and the
    result comes down into the ToRs' same pool and out to the hosts with the bit."""
    f = two_level
    tors = (("tor1", 0), ("tor2", 1))
    for tor, dev in tors:
        cfg = install_job(f[tor].conn, dev, 30, members={1: 0, 2: 1}, pool_size=8,
                          uplink=Uplink(port=3, contributor=dev, spine_dev=2))
        add_pool(f[tor].conn, cfg, pool_base=64, pool_size=4, gen=7)
    spine = install_job(f["spine"].conn, 2, 30, members={}, member_switches={1: 0, 2: 1},
                        pool_size=8)
    add_pool(f["spine"].conn, spine, pool_base=300, pool_size=4, gen=9)
    vals = values(30, 4)
    for t, (tor, dev) in enumerate(tors):
        for h in (1, 2):
            f[tor].test_ports[h].send(contribution(dev, h, vals[2 * t + h - 1], job_id=30,
                                                   slot=3, flags=CONTRIB | POOL))
    for tor, _ in tors:
        for p, rec in results(f[tor], [1, 2]).items():
            assert rec["flags"] == P.Flag.RESULT | P.Flag.POOL, (tor, p)
            assert rec["slot"] == 3
            assert np.array_equal(rec["values"], vals.sum(axis=0)), (tor, p)
    assert pool_contribs(f["spine"].conn, 0, 1, 2) == [1, 1]
    assert pool_contribs(f["spine"].conn, 0, 0, 2) == [0, 0]
    for tor, _ in tors:
        assert pool_contribs(f[tor].conn, 0, 1, 2) == [1, 1]
