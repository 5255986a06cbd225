"""A job spanning two racks: each ToR sums its hosts and sends one contribution to the spine,
the spine multicasts the total to the ToRs, and each ToR multicasts it to its hosts."""

from __future__ import annotations

import time

import numpy as np
import pytest

from controller.counters import StatsCounters
from passing import protocol as P
from testbed.entries import Uplink, contribution, decode, install_job, results_at

TOR1, TOR2, SPINE = 0, 1, 2
JOB = 30


@pytest.fixture
def job(two_level):
    f = two_level
    for tor, dev in (("tor1", TOR1), ("tor2", TOR2)):
        install_job(f[tor].conn, dev, JOB, members={1: 0, 2: 1}, pool_size=8,
                    uplink=Uplink(port=3, contributor=dev, spine_dev=SPINE))
    install_job(f["spine"].conn, SPINE, JOB, members={}, member_switches={1: TOR1, 2: TOR2},
                pool_size=8)
    return f


def wait_for(condition, timeout=3.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def send_round(f, vals, slot=2, version=0):
    for t, tor in enumerate(("tor1", "tor2")):
        for h in (1, 2):
            f[tor].test_ports[h].send(contribution(t, h, vals[2 * t + h - 1], job_id=JOB,
                                                   slot=slot, version=version, num_contrib=2,
                                                   exp=4 * t + h))


def collect(f, timeout=3.0):
    return results_at(f, ("tor1", "tor2"), timeout=timeout)


def test_every_host_gets_the_global_sum(job):
    f = job
    vals = np.random.default_rng(30).integers(-(2**24), 2**24, size=(4, P.K))
    send_round(f, vals)
    expected = vals.sum(axis=0).astype(np.int32)
    for (tor, h), rec in collect(f).items():
        assert np.array_equal(rec["values"], expected), (tor, h)
        assert rec["flags"] == P.Flag.RESULT and rec["num_contrib"] == 8 and rec["exp"] == 6
        assert rec["contributor"] == h - 1
    spine = StatsCounters(f["spine"].conn).job(0)
    assert spine["job_contributions"] == 2 and spine["job_results"] == 1
    for tor in ("tor1", "tor2"):
        s = StatsCounters(f[tor].conn).job(0)
        assert s["job_uplink"] == 1 and s["job_downlink"] == 1 and s["job_contributions"] == 2


def test_host_retransmission_recovers_through_the_tree(job):
    """After the round, a host of tor2 retransmits: tor2 holds the global result and answers it
    alone, without bothering the spine."""
    f = job
    vals = np.arange(4 * P.K).reshape(4, P.K)
    send_round(f, vals, slot=7, version=1)
    collect(f)
    f["tor2"].test_ports[2].send(contribution(1, 2, vals[3], job_id=JOB, slot=7, version=1,
                                              flags=P.Flag.CONTRIB | P.Flag.RETRANS))
    frames = f["tor2"].test_ports[2].recv(1, 3)
    assert frames
    assert np.array_equal(decode(frames[0])[1]["values"], vals.sum(axis=0).astype(np.int32))
    assert f["tor2"].test_ports[1].recv(1, 0.3) == []
    assert StatsCounters(f["spine"].conn).job(0)["job_result_retransmits"] == 0
    assert StatsCounters(f["tor2"].conn).job(0)["job_result_retransmits"] == 1


def test_rack_waiting_for_spine_resends_its_sum_up(job):
    """tor1's rack is complete but tor2's is not: a retransmission from a tor1 host makes tor1
    send its rack sum up again; the spine counts it as a duplicate, not twice."""
    f = job
    ones = np.ones(P.K, dtype=np.int64)
    for h in (1, 2):
        f["tor1"].test_ports[h].send(contribution(0, h, ones, job_id=JOB, slot=1))
    # Ports are served independently: the retransmission must follow the rack's completion.
    wait_for(lambda: StatsCounters(f["tor1"].conn).job(0)["job_uplink"] == 1)
    f["tor1"].test_ports[1].send(contribution(0, 1, ones, job_id=JOB, slot=1,
                                              flags=P.Flag.CONTRIB | P.Flag.RETRANS))
    f["tor2"].test_ports[1].send(contribution(1, 1, ones * 10, job_id=JOB, slot=1))
    assert f["tor1"].test_ports[1].recv(1, 0.5) == []
    f["tor2"].test_ports[2].send(contribution(1, 2, ones * 10, job_id=JOB, slot=1))
    for rec in collect(f).values():
        assert rec["values"].tolist() == [22] * P.K
    assert StatsCounters(f["tor1"].conn).job(0)["job_uplink"] == 2
    spine = StatsCounters(f["spine"].conn).job(0)
    assert spine["job_duplicates"] == 1 and spine["job_contributions"] == 2
