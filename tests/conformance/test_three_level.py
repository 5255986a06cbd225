"""Trees deeper than two levels, and ToRs with several uplinks: the switches' per-job role is
generic (members below, an uplink above, root or not), so a spine between the ToRs and a core
sums its ToRs and sends one contribution up, and a ToR sends up through whichever of its
uplinks its job was given."""

from __future__ import annotations

import time

import numpy as np
import pytest

from controller.counters import StatsCounters
from passing import protocol as P
from testbed.entries import Uplink, contribution, decode, install_job, results_at

TOR1, TOR2, TOR3, SPINE1, SPINE2, CORE = range(6)
RACKS = (("tor1", TOR1), ("tor2", TOR2), ("tor3", TOR3))
JOB = 33


def install_three_levels(f, core_quorum: int = 0) -> None:
    """Job JOB over both hosts of every rack: tor1, tor2 -> spine1; tor3 -> spine2; both
    spines -> the core, the root (a CLOSE completes a round there with `core_quorum`)."""
    for tor, dev, parent, cid in (("tor1", TOR1, SPINE1, 0), ("tor2", TOR2, SPINE1, 1),
                                  ("tor3", TOR3, SPINE2, 0)):
        install_job(f[tor].conn, dev, JOB, members={1: 0, 2: 1}, pool_size=8,
                    uplink=Uplink(port=3, contributor=cid, spine_dev=parent))
    install_job(f["spine1"].conn, SPINE1, JOB, members={}, member_switches={1: TOR1, 2: TOR2},
                pool_size=8, uplink=Uplink(port=3, contributor=0, spine_dev=CORE))
    install_job(f["spine2"].conn, SPINE2, JOB, members={}, member_switches={1: TOR3},
                pool_size=8, uplink=Uplink(port=2, contributor=1, spine_dev=CORE))
    install_job(f["core"].conn, CORE, JOB, members={}, member_switches={1: SPINE1, 2: SPINE2},
                pool_size=8, quorum=core_quorum)


@pytest.fixture
def job(three_level):
    install_three_levels(three_level)
    return three_level


def counters(f, switch: str) -> dict:
    return StatsCounters(f[switch].conn).job(0)


def wait_for(condition, timeout=3.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def send(f, rack: str, dev: int, host: int, values, slot=2, **kw) -> None:
    f[rack].test_ports[host].send(contribution(dev, host, values, job_id=JOB, slot=slot,
                                               num_contrib=2, **kw))


def collect(f, racks=RACKS, timeout=3.0) -> dict:
    return results_at(f, [rack for rack, _ in racks], timeout=timeout)


def test_every_host_gets_the_sum_of_all_six_through_the_core(job):
    f = job
    vals = np.random.default_rng(33).integers(-(2**24), 2**24, size=(6, P.K))
    for r, (rack, dev) in enumerate(RACKS):
        for h in (1, 2):
            send(f, rack, dev, h, vals[2 * r + h - 1], exp=10 * r + h)
    expected = vals.sum(axis=0).astype(np.int32)
    for (rack, h), rec in collect(f).items():
        assert np.array_equal(rec["values"], expected), (rack, h)
        assert rec["flags"] == P.Flag.RESULT and rec["contributor"] == h - 1
        assert rec["num_contrib"] == 12 and rec["exp"] == 22, (rack, h)
    core = counters(f, "core")
    assert core["job_contributions"] == 2 and core["job_results"] == 1
    for spine, fan_in in (("spine1", 2), ("spine2", 1)):
        s = counters(f, spine)
        assert (s["job_contributions"], s["job_uplink"], s["job_downlink"]) == (fan_in, 1, 1)
    for rack, _ in RACKS:
        s = counters(f, rack)
        assert (s["job_contributions"], s["job_uplink"], s["job_downlink"]) == (2, 1, 1)


def test_a_sum_waiting_at_the_core_is_resent_up_through_both_levels(job):
    """Racks 1 and 2 are complete, so spine1's sum waits at the core for spine2's. A
    retransmission from a tor1 host makes tor1 resend its rack sum, and spine1 (closed, no
    result yet) its own: the core counts it as a duplicate, not twice."""
    f = job
    ones = np.ones(P.K, dtype=np.int64)
    for rack, dev in RACKS[:2]:
        for h in (1, 2):
            send(f, rack, dev, h, ones * (dev + 1), slot=1)
    wait_for(lambda: counters(f, "core")["job_contributions"] == 1)
    send(f, "tor1", TOR1, 1, ones, slot=1, flags=P.Flag.CONTRIB | P.Flag.RETRANS)
    wait_for(lambda: counters(f, "core")["job_duplicates"] == 1)
    assert f["tor1"].test_ports[1].recv(1, 0.3) == []
    for h in (1, 2):
        send(f, "tor3", TOR3, h, ones * 10, slot=1)
    for rec in collect(f).values():
        assert rec["values"].tolist() == [2 + 4 + 20] * P.K
    assert counters(f, "tor1")["job_uplink"] == 2 and counters(f, "spine1")["job_uplink"] == 2
    core = counters(f, "core")
    assert core["job_contributions"] == 2 and core["job_duplicates"] == 1


def test_a_close_completes_the_round_at_the_core_with_its_quorum(three_level):
    """Quorum 1 at level 2: a host's CLOSE travels up through its ToR and spine (both closed,
    waiting) and the core completes the round with spine1's sum alone; tor3's hosts, which
    never sent, get that result too, through spine2."""
    f = three_level
    install_three_levels(f, core_quorum=1)
    vals = np.random.default_rng(34).integers(-(2**20), 2**20, size=(4, P.K))
    for r, (rack, dev) in enumerate(RACKS[:2]):
        for h in (1, 2):
            send(f, rack, dev, h, vals[2 * r + h - 1], slot=5)
    wait_for(lambda: counters(f, "core")["job_contributions"] == 1)
    assert f["tor3"].test_ports[1].recv(1, 0.3) == []
    send(f, "tor2", TOR2, 2, vals[3], slot=5,
         flags=P.Flag.CONTRIB | P.Flag.RETRANS | P.Flag.CLOSE)
    expected = vals.sum(axis=0).astype(np.int32)
    for (rack, h), rec in collect(f).items():
        assert np.array_equal(rec["values"], expected), (rack, h)
        assert rec["num_contrib"] == 8, (rack, h)
    core = counters(f, "core")
    assert core["job_quorum_rounds"] == 1 and core["job_results"] == 1
    assert counters(f, "spine2")["job_downlink"] == 1
    assert counters(f, "spine2")["job_contributions"] == 0


def test_racks_under_two_spines_aggregate_at_the_spine_their_job_was_given(fabric_of):
    """Both ToRs link to both spines: job A goes up port 3 to spine1, job B up port 4 to
    spine2; each job's hosts get its own sum, and each spine sees only its job."""
    f = fabric_of("two_spines")
    for job_id, port, spine, dev, base, idx in ((41, 3, "spine1", 2, 0, 0),
                                                (42, 4, "spine2", 3, 16, 1)):
        for tor, tdev in (("tor1", 0), ("tor2", 1)):
            install_job(f[tor].conn, tdev, job_id, members={1: 0, 2: 1}, pool_base=base,
                        pool_size=8, stat_idx=idx, guard=job_id == 41,
                        uplink=Uplink(port=port, contributor=tdev, spine_dev=dev))
        install_job(f[spine].conn, dev, job_id, members={}, member_switches={1: 0, 2: 1},
                    pool_size=8, stat_idx=idx, guard=job_id == 41)
    rng = np.random.default_rng(41)
    vals = {job_id: rng.integers(-(2**20), 2**20, size=(4, P.K)) for job_id in (41, 42)}
    for job_id, v in vals.items():
        for t, tor in enumerate(("tor1", "tor2")):
            for h in (1, 2):
                f[tor].test_ports[h].send(contribution(t, h, v[2 * t + h - 1], job_id=job_id,
                                                       slot=3))
    for tor in ("tor1", "tor2"):
        for h in (1, 2):
            frames = f[tor].test_ports[h].recv(2, 3)
            got = {int(rec["job_id"]): rec["values"] for rec in (decode(x)[1] for x in frames)}
            assert set(got) == {41, 42}, (tor, h)
            for job_id, v in vals.items():
                assert np.array_equal(got[job_id], v.sum(axis=0).astype(np.int32)), (tor, h)
    for spine, idx in (("spine1", 0), ("spine2", 1)):
        stats = StatsCounters(f[spine].conn)
        assert stats.job(idx)["job_contributions"] == 2 and stats.job(idx)["job_results"] == 1
        assert stats.job(1 - idx)["job_contributions"] == 0, spine
    for tor in ("tor1", "tor2"):
        stats = StatsCounters(f[tor].conn)
        assert stats.job(0)["job_uplink"] == stats.job(1)["job_uplink"] == 1
