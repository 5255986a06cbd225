"""The fair-share mark (docs/protocol.md, "Fair shares of a port"), on both targets: two jobs
whose results share one slow egress port, one sending three times what the other does, with the
port's queue kept between FAIR_QDEPTH and MARK_QDEPTH. The job above its half is marked on part
of its results there, the job under it on none; the same results out of the jobs' own fast
ports are never marked; every result is exact."""

from __future__ import annotations

import time

import numpy as np

from passing import packet
from passing import protocol as P
from testbed.entries import contribution, install_job
from testbed.queues import slow_egress

DEV, BIG, SMALL = 0, 21, 22
MARK = int(P.Flag.CONGESTED)
PPS = 400  # the shared port's rate, in results per second: 3.3 per interval (8.2 ms)
# Rounds whose results port 1 has not yet delivered, kept so: the port's queue then stands
# between FAIR_QDEPTH and MARK_QDEPTH (less what is still on its way through the switch).
OUTSTANDING = 20
ROUNDS = 1200


def _exact(vals) -> np.ndarray:
    return vals.sum(axis=0).astype(np.int64).astype(np.uint32).view(np.int32)


def test_a_job_over_its_fair_share_of_a_port_is_marked_there_the_other_not(star):
    sw = star["s1"]
    # BIG on ports 1 and 2, SMALL on ports 1 and 3: port 1 carries the results of both.
    install_job(sw.conn, DEV, BIG, members={1: 0, 2: 1}, pool_size=256, stat_idx=3)
    install_job(sw.conn, DEV, SMALL, members={1: 0, 3: 1}, pool_base=256, pool_size=256,
                stat_idx=4, guard=False)
    rng = np.random.default_rng(47)
    vals = {BIG: rng.integers(-(2**24), 2**24, size=(2, P.K)),
            SMALL: rng.integers(-(2**24), 2**24, size=(2, P.K))}
    ports = {BIG: (1, 2), SMALL: (1, 3)}
    sent = {BIG: 0, SMALL: 0}
    got: dict[int, list[bytes]] = {1: [], 2: [], 3: []}

    def send_round(job: int) -> None:
        i = sent[job]
        sent[job] += 1
        for c, port in enumerate(ports[job]):
            sw.test_ports[port].send(contribution(DEV, port, vals[job][c], job_id=job,
                                                  contributor=c, slot=i % 256,
                                                  round=i // 256))

    def collect() -> None:
        for port in got:
            while (frame := sw.test_ports[port].recv_nowait()) is not None:
                got[port].append(frame)

    pattern = (BIG, BIG, BIG, SMALL)
    with slow_egress(star, "s1", 1, pps=PPS):
        deadline = time.monotonic() + 10 + ROUNDS / PPS
        n = 0
        while time.monotonic() < deadline:
            collect()
            if len(got[1]) >= ROUNDS:
                break
            if n < ROUNDS and n - len(got[1]) < OUTSTANDING:
                send_round(pattern[n % 4])
                n += 1
            else:
                time.sleep(0.0005)
    collect()

    # Each frame a PASSING result (UDP from the aggregation port, no IPv4 options).
    for port, frames in got.items():
        assert all(f[34:36] == P.PASSING_UDP_PORT.to_bytes(2, "big") for f in frames), port
    decoded = {port: [packet.unpack(f[42:]) for f in frames] for port, frames in got.items()}

    def results(port: int, job: int) -> list:
        return [r for r in decoded[port] if r["job_id"] == job]

    for port, job in ((1, BIG), (1, SMALL), (2, BIG), (3, SMALL)):
        recs = results(port, job)
        assert len(recs) == sent[job], (port, job, len(recs), sent[job],
                                        {p: len(d) for p, d in decoded.items()})
        for r in recs:
            assert np.array_equal(r["values"], _exact(vals[job])), (port, job)
    for port, job in ((2, BIG), (3, SMALL)):
        assert not any(r["flags"] & MARK for r in results(port, job)), (port, job)
    big = [r["flags"] & MARK != 0 for r in results(1, BIG)]
    small = [r["flags"] & MARK != 0 for r in results(1, SMALL)]
    # BIG, at 3/4 of the port, is marked on up to 1 - (1/2)/(3/4) = 1/3 of its results there
    # (21-23% measured on both targets: at 3.3 results per interval, some intervals see SMALL
    # too little to count it active); SMALL, at 1/4, within its half, on none.
    assert sum(big) >= 0.12 * len(big), (sum(big), len(big), sum(small))
    assert sum(small) <= 0.01 * len(small), (sum(big), len(big), sum(small), len(small))
