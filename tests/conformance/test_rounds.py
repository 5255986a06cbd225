"""Rounds, quorum completion and late contributions (docs/protocol.md, "Rounds, quorum and late
contributions"), on one switch and on a two-level tree."""

from __future__ import annotations

import time

import numpy as np
import pytest

from controller.counters import StatsCounters
from passing import protocol as P
from testbed.entries import Uplink, contribution, decode, install_job

DEV = 0
CLOSE = int(P.Flag.CONTRIB | P.Flag.RETRANS | P.Flag.CLOSE)


def values(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-(2**20), 2**20, size=(n, P.K), dtype=np.int64)


def wrapped(total: np.ndarray) -> np.ndarray:
    return total.astype(np.int64).astype(np.uint32).view(np.int32)


def results(sw, ports, timeout=3.0) -> dict[int, np.void]:
    """One frame from each port, decoded: {port: its PASSING record}."""
    out = {}
    for p in ports:
        frames = sw.test_ports[p].recv(1, timeout)
        assert frames, f"no result on port {p}"
        out[p] = decode(frames[0])[1]
    return out


def silent(sw, ports, wait=0.4) -> None:
    for p in ports:
        assert sw.test_ports[p].recv(1, wait) == [], f"unexpected packet on port {p}"


def counted(sw, name: str, n: int, stat_idx: int = 0, timeout: float = 5.0) -> None:
    """Wait until the switch counted `n` of the job's `name`: frames from different ports may
    be taken in either order, so a test that needs one before another waits for it."""
    deadline = time.monotonic() + timeout
    while StatsCounters(sw.conn).job(stat_idx)[name] < n:
        assert time.monotonic() < deadline, f"{name} never reached {n}"
        time.sleep(0.05)


def test_a_delayed_contribution_is_never_added_to_a_later_round(star):
    """A copy of round 0's contribution delivered after rounds 1 and 2 began: answered with
    round 0's own result while its version still holds round 0, refused (STALE_ROUND) once
    round 2 took the version over; round 2's sum never holds it (SwitchML's bitmap rule
    would have started round 2 with it)."""
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=5, members={1: 0, 2: 1}, pool_size=4)
    rounds = [values(r, 2) for r in range(3)]
    for r in (0, 1):
        for i, p in enumerate((1, 2)):
            sw.test_ports[p].send(contribution(DEV, p, rounds[r][i], job_id=5, slot=0, round=r,
                                               frag=r))
        for rec in results(sw, [1, 2]).values():
            assert (rec["round"], rec["version"], rec["frag"]) == (r, r % 2, r)
            assert np.array_equal(rec["values"], wrapped(rounds[r].sum(axis=0)))
    delayed = contribution(DEV, 2, rounds[0][1], job_id=5, slot=0, round=0, frag=0)
    sw.test_ports[2].send(delayed)
    rec = results(sw, [2])[2]
    assert rec["round"] == 0 and rec["flags"] == P.Flag.RESULT
    assert np.array_equal(rec["values"], wrapped(rounds[0].sum(axis=0)))
    silent(sw, [1])
    sw.test_ports[1].send(contribution(DEV, 1, rounds[2][0], job_id=5, slot=0, round=2, frag=2))
    counted(sw, "job_contributions", 5)
    sw.test_ports[2].send(delayed)
    silent(sw, [1, 2])
    sw.test_ports[2].send(contribution(DEV, 2, rounds[2][1], job_id=5, slot=0, round=2, frag=2))
    for rec in results(sw, [1, 2]).values():
        assert rec["round"] == 2 and rec["frag"] == 2
        assert np.array_equal(rec["values"], wrapped(rounds[2].sum(axis=0)))
    stats = StatsCounters(sw.conn)
    job = stats.job(0)
    assert job["drops_stale_round"] == 1 and job["job_results"] == 3
    assert job["job_result_retransmits"] == 1 and job["job_late"] == 1
    assert stats.late(0) == {1: 1}


def test_a_round_closed_by_a_quorum_and_its_late_contribution(star):
    """fan_in 3, quorum 2: two contributions wait for the third until one host asks to close;
    the result holds those two (num_contrib says so) and reaches every member; the third,
    late, gets the same result back and is never added; the next round, with everyone in
    time, is the full sum without any CLOSE."""
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=6, members={1: 0, 2: 1, 3: 2}, pool_size=4, quorum=2)
    vals = values(7, 3)
    for i, p in enumerate((1, 2)):
        sw.test_ports[p].send(contribution(DEV, p, vals[i], job_id=6, slot=1, round=0,
                                           num_contrib=2, exp=10 + i))
    counted(sw, "job_contributions", 2)
    silent(sw, [1, 2, 3])
    sw.test_ports[1].send(contribution(DEV, 1, vals[0], job_id=6, slot=1, round=0, flags=CLOSE,
                                       num_contrib=2, exp=10))
    two = wrapped(vals[:2].sum(axis=0))
    for p, rec in results(sw, [1, 2, 3]).items():
        assert rec["flags"] == P.Flag.RESULT and rec["round"] == 0
        assert rec["num_contrib"] == 4 and rec["exp"] == 11 and rec["contributor"] == p - 1
        assert np.array_equal(rec["values"], two)
    for _ in range(2):  # late, and its resend: answered, never added
        sw.test_ports[3].send(contribution(DEV, 3, vals[2], job_id=6, slot=1, round=0,
                                           num_contrib=2, exp=50))
        rec = results(sw, [3])[3]
        assert rec["num_contrib"] == 4 and rec["exp"] == 11
        assert np.array_equal(rec["values"], two)
        silent(sw, [1, 2])
    nxt = values(8, 3)
    for i, p in enumerate((1, 2, 3)):
        sw.test_ports[p].send(contribution(DEV, p, nxt[i], job_id=6, slot=1, round=1))
    for rec in results(sw, [1, 2, 3]).values():
        assert rec["round"] == 1 and rec["num_contrib"] == 3
        assert np.array_equal(rec["values"], wrapped(nxt.sum(axis=0)))
    stats = StatsCounters(sw.conn)
    job = stats.job(0)
    assert job["job_results"] == 2 and job["job_quorum_rounds"] == 1
    assert job["job_late"] == 2 and job["job_contributions"] == 5
    assert stats.late(0) == {2: 2}


@pytest.mark.parametrize("first_send", [False, True])
@pytest.mark.parametrize("quorum", [0, 2])
def test_close_completes_nothing_below_the_quorum(star, quorum, first_send):
    """CLOSE with fewer contributions than the quorum is a plain duplicate; under BSP
    (quorum = fan_in, what 0 installs) it never completes a round: the last contribution
    does. The contribution that reaches the quorum may ask for CLOSE in a resend or in its
    first transmission (what an agent sends after a round that waited its whole patience)."""
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=9, members={1: 0, 2: 1, 3: 2}, pool_size=2, quorum=quorum)
    vals = values(11, 3)
    sw.test_ports[1].send(contribution(DEV, 1, vals[0], job_id=9, slot=0, round=4))
    sw.test_ports[1].send(contribution(DEV, 1, vals[0], job_id=9, slot=0, round=4, flags=CLOSE))
    counted(sw, "job_duplicates", 1)
    silent(sw, [1, 2, 3])
    second = int(P.Flag.CONTRIB | P.Flag.CLOSE) if first_send else CLOSE
    sw.test_ports[2].send(contribution(DEV, 2, vals[1], job_id=9, slot=0, round=4,
                                       flags=second))
    if quorum:  # the second contribution reaches the quorum and closes
        expected, ports = vals[:2], [1, 2, 3]
    else:
        silent(sw, [1, 2, 3])
        sw.test_ports[3].send(contribution(DEV, 3, vals[2], job_id=9, slot=0, round=4))
        expected, ports = vals, [1, 2, 3]
    for rec in results(sw, ports).values():
        assert rec["round"] == 4 and rec["num_contrib"] == len(expected)
        assert np.array_equal(rec["values"], wrapped(expected.sum(axis=0)))
    job = StatsCounters(sw.conn).job(0)
    assert job["job_quorum_rounds"] == (1 if quorum else 0)
    assert job["job_duplicates"] == 1  # the first CLOSE; the second carried a new contribution


@pytest.fixture
def quorum_tree(two_level):
    """One job over both racks, quorum 1 of 2 at each ToR and at the spine."""
    f = two_level
    for tor, dev in (("tor1", 0), ("tor2", 1)):
        install_job(f[tor].conn, dev, 31, members={1: 0, 2: 1}, pool_size=4, quorum=1,
                    uplink=Uplink(port=3, contributor=dev, spine_dev=2))
    install_job(f["spine"].conn, 2, 31, members={}, member_switches={1: 0, 2: 1}, pool_size=4,
                quorum=1)
    return f


def test_close_goes_up_and_the_result_reaches_racks_that_never_contributed(quorum_tree):
    """One host of rack 1 closes: its ToR sends its sum up carrying CLOSE, the spine closes
    with that rack alone, and both racks' hosts get the result, also rack 2, whose ToR had no
    round open; rack 2's host, late, then gets the same result back from its ToR."""
    f = quorum_tree
    vals = values(21, 2)
    tor1, tor2 = f["tor1"], f["tor2"]
    tor1.test_ports[1].send(contribution(0, 1, vals[0], job_id=31, slot=3, round=0,
                                         num_contrib=2))
    for tor in (tor1, tor2):
        silent(tor, [1, 2])
    tor1.test_ports[1].send(contribution(0, 1, vals[0], job_id=31, slot=3, round=0,
                                         num_contrib=2, flags=CLOSE))
    for tor in (tor1, tor2):
        for p, rec in results(tor, [1, 2]).items():
            assert rec["flags"] == P.Flag.RESULT and rec["round"] == 0 and rec["level"] == 1
            assert rec["num_contrib"] == 2 and rec["contributor"] == p - 1
            assert np.array_equal(rec["values"], wrapped(vals[0]))
    tor2.test_ports[2].send(contribution(1, 2, vals[1], job_id=31, slot=3, round=0,
                                         num_contrib=2))
    rec = results(tor2, [2])[2]
    assert rec["num_contrib"] == 2 and np.array_equal(rec["values"], wrapped(vals[0]))
    silent(tor2, [1])
    spine = StatsCounters(f["spine"].conn)
    assert spine.job(0)["job_quorum_rounds"] == 1 and spine.job(0)["job_results"] == 1
    t1, t2 = StatsCounters(tor1.conn).job(0), StatsCounters(tor2.conn).job(0)
    assert t1["job_quorum_rounds"] == 1 and t1["job_downlink"] == 1
    assert t2["job_downlink"] == 1 and t2["job_late"] == 1
    assert StatsCounters(tor2.conn).late(0) == {1: 1}


# A switch configured as a ToR whose uplink is test port 4: the test plays the spine.
UP = 4


def spine_result(vals, *, round: int, session: int | None = None, num_contrib: int = 4,
                 slot: int = 0) -> bytes:
    """A RESULT as the spine sends it down to this ToR (on the uplink port)."""
    extra = {} if session is None else {"session": session}
    return contribution(DEV, UP, vals, job_id=40, slot=slot, round=round, contributor=0,
                        flags=int(P.Flag.RESULT), num_contrib=num_contrib, exp=7, level=1,
                        **extra)


@pytest.fixture
def tor(star):
    sw = star["s1"]
    install_job(sw.conn, DEV, 40, members={1: 0, 2: 1}, pool_size=4,
                uplink=Uplink(port=UP, contributor=0, spine_dev=2))
    return sw


def rack_round(sw, vals, rnd: int, **kw) -> np.void:
    """Both hosts contribute to round `rnd`; the rack sum that goes up."""
    for i, p in enumerate((1, 2)):
        sw.test_ports[p].send(contribution(DEV, p, vals[i], job_id=40, slot=0, round=rnd, **kw))
    up = results(sw, [UP])[UP]
    assert up["flags"] == P.Flag.CONTRIB and up["round"] == rnd and up["level"] == 1
    return up


def test_a_spine_result_for_a_round_left_behind_is_refused(tor):
    sw = tor
    for rnd in (0, 1):
        rack_round(sw, values(rnd, 2), rnd)
        sw.test_ports[UP].send(spine_result(values(50 + rnd, 1)[0], round=rnd))
        for rec in results(sw, [1, 2]).values():
            assert rec["round"] == rnd
            assert np.array_equal(rec["values"], wrapped(values(50 + rnd, 1)[0]))
    rack_round(sw, values(2, 2), 2)
    sw.test_ports[UP].send(spine_result(values(99, 1)[0], round=0))  # a copy of round 0's
    silent(sw, [1, 2])
    sw.test_ports[UP].send(spine_result(values(52, 1)[0], round=2))
    for rec in results(sw, [1, 2]).values():
        assert rec["round"] == 2 and np.array_equal(rec["values"], wrapped(values(52, 1)[0]))
    job = StatsCounters(sw.conn).job(0)
    assert job["drops_stale_result"] == 1 and job["job_downlink"] == 3


def test_a_result_of_another_session_never_takes_over_an_open_round(tor):
    """A delayed result of an old session meets a round of the new one in progress: refused,
    and the new round goes on with every contribution it had."""
    sw = tor
    vals = values(3, 2)
    sw.test_ports[1].send(contribution(DEV, 1, vals[0], job_id=40, slot=0, round=0))
    counted(sw, "job_contributions", 1)
    silent(sw, [UP])
    sw.test_ports[UP].send(spine_result(values(9, 1)[0], round=0, session=0x0123))
    silent(sw, [1, 2])
    sw.test_ports[2].send(contribution(DEV, 2, vals[1], job_id=40, slot=0, round=0))
    up = results(sw, [UP])[UP]
    assert np.array_equal(up["values"], wrapped(vals.sum(axis=0)))
    assert StatsCounters(sw.conn).job(0)["drops_stale_result"] == 1


def test_a_result_for_a_round_this_rack_never_sent_reaches_its_hosts(tor):
    """With a quorum the spine may close a round without this rack: its result is delivered
    to every host of the rack, and a host's contribution to that round, late, gets it back
    and is never sent up."""
    sw = tor
    res = values(12, 1)[0]
    sw.test_ports[UP].send(spine_result(res, round=3, num_contrib=6))
    for p, rec in results(sw, [1, 2]).items():
        assert rec["round"] == 3 and rec["num_contrib"] == 6 and rec["contributor"] == p - 1
        assert np.array_equal(rec["values"], wrapped(res))
    sw.test_ports[2].send(contribution(DEV, 2, values(13, 1)[0], job_id=40, slot=0, round=3))
    rec = results(sw, [2])[2]
    assert rec["round"] == 3 and np.array_equal(rec["values"], wrapped(res))
    silent(sw, [1, UP])
    assert StatsCounters(sw.conn).late(0) == {1: 1}


def test_a_late_host_at_a_rack_waiting_for_the_spine_is_dropped_then_served(tor):
    """Quorum 1 at the ToR: host 1 closes, the rack sum goes up; host 2's contribution, late
    while the spine has not answered, is dropped (LATE); the spine's result then reaches both
    hosts, and host 2's resend gets it back (LATE_RESULT)."""
    sw = tor
    install_job(sw.conn, DEV, 41, members={3: 0, 5: 1}, pool_size=4, pool_base=8, stat_idx=1,
                quorum=1, uplink=Uplink(port=UP, contributor=0, spine_dev=2))
    vals = values(30, 2)
    sw.test_ports[3].send(contribution(DEV, 3, vals[0], job_id=41, slot=1, round=0, contributor=0))
    silent(sw, [UP])
    sw.test_ports[3].send(contribution(DEV, 3, vals[0], job_id=41, slot=1, round=0, contributor=0,
                                         flags=CLOSE))
    up = results(sw, [UP])[UP]
    assert up["flags"] == P.Flag.CONTRIB | P.Flag.CLOSE  # the hosts' CLOSE goes up
    assert np.array_equal(up["values"], wrapped(vals[0]))
    sw.test_ports[5].send(contribution(DEV, 5, vals[1], job_id=41, slot=1, round=0, contributor=1))
    silent(sw, [3, 5, UP])
    sw.test_ports[3].send(contribution(DEV, 3, vals[0], job_id=41, slot=1, round=0, contributor=0,
                                         flags=CLOSE))
    up = results(sw, [UP])[UP]  # a resend up, still with CLOSE
    assert up["flags"] == P.Flag.CONTRIB | P.Flag.RETRANS | P.Flag.CLOSE
    res = values(31, 1)[0]
    sw.test_ports[UP].send(contribution(DEV, UP, res, job_id=41, slot=1, round=0, contributor=0,
                                        flags=int(P.Flag.RESULT), num_contrib=1, level=1))
    for rec in results(sw, [3, 5]).values():
        assert np.array_equal(rec["values"], wrapped(res))
    sw.test_ports[5].send(contribution(DEV, 5, vals[1], job_id=41, slot=1, round=0, contributor=1))
    assert np.array_equal(results(sw, [5])[5]["values"], wrapped(res))
    stats = StatsCounters(sw.conn)
    job = stats.job(1)
    assert job["job_quorum_rounds"] == 1 and job["job_late"] == 2
    assert job["job_uplink"] == 2 and job["job_downlink"] == 1
    assert stats.late(1) == {1: 2}
