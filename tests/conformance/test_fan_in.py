"""Fan-in up to MAX_FAN_IN (64) contributors at one switch (docs/protocol.md, "Limits per
switch"): every id has its own bit of the slot's contributor bitmap, ids 32-63 included, so a
duplicate from any of them is never counted twice and a round waits for every one."""

from __future__ import annotations

import numpy as np

from controller.counters import StatsCounters
from passing import protocol as P
from testbed.entries import contribution, install_job, received

DEV = 0
HALF = P.MAX_FAN_IN // 2
# Two servers of 32 ranks each (switch-only INA: every rank its own contributor), ids 0-63.
MEMBERS = {1: (0, HALF), 2: (HALF, HALF)}
LAST = 47  # the id held back until the end: one of the upper 32 bits


def _send(sw, vals, cid: int, *, flags: int = int(P.Flag.CONTRIB)) -> None:
    port = 1 if cid < HALF else 2
    sw.test_ports[port].send(contribution(DEV, port, vals[cid], job_id=9, slot=3,
                                          contributor=cid, flags=flags))


def test_sixty_four_contributors_complete_one_exact_round(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=9, members=MEMBERS, pool_size=8)
    vals = np.random.default_rng(64).integers(-(2**20), 2**20, size=(P.MAX_FAN_IN, P.K),
                                              dtype=np.int64)
    for cid in range(P.MAX_FAN_IN):
        if cid != LAST:
            _send(sw, vals, cid)
    # Resends from ids in both halves (a 32-bit bitmap would lose the upper ones' bits and
    # count these again, completing the round early with a wrong sum).
    for cid in (5, 40, 63):
        _send(sw, vals, cid, flags=int(P.Flag.CONTRIB | P.Flag.RETRANS))
    assert sw.test_ports[1].recv(1, 0.6) == [] and sw.test_ports[2].recv(1, 0.3) == []
    _send(sw, vals, LAST)
    expected = vals.sum(axis=0).astype(np.int64).astype(np.uint32).view(np.int32)
    for port, (first, count) in MEMBERS.items():
        recs = received(sw, port, count)
        assert sorted(r["contributor"] for r in recs) == list(range(first, first + count))
        for r in recs:
            assert np.array_equal(r["values"], expected)
            assert r["num_contrib"] == P.MAX_FAN_IN
    stats = StatsCounters(sw.conn).job(0)
    assert stats["job_contributions"] == P.MAX_FAN_IN and stats["job_results"] == 1
    assert stats["job_duplicates"] == 3

