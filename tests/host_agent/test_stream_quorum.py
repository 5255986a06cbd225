"""Quorum decisions without sockets or clocks (host_agent.stream_quorum): the patience a round
waits, learned from the waits of complete rounds, the staleness bound that makes a call wait for
everyone, and the evidence that makes the next call close at once."""

from __future__ import annotations

import numpy as np
import pytest

from host_agent.stream_api import StreamConfig
from host_agent.stream_call import Call
from host_agent.stream_quorum import EAGER_EVIDENCE, QuorumPolicy
from passing import packet
from passing import protocol as P


def cfg(**kw) -> StreamConfig:
    return StreamConfig(job_id=1, contributor=0, window=8, streams=3, session=1, **kw)


def test_patience_is_fixed_without_a_floor_and_none_without_a_quorum():
    q = QuorumPolicy(cfg())
    assert q.patience_now(cfg()) is None
    q.learn_wait(0.001)
    assert q.patience_now(cfg(patience=0.2)) == 0.2


def test_adaptive_patience_follows_the_waits_between_its_bounds():
    c = cfg(patience=0.5, patience_min=0.01)
    q = QuorumPolicy(c)
    assert q.patience_now(c) == 0.5  # nothing learned: the bound
    q.learn_wait(0.02)
    assert q.patience_now(c) == pytest.approx(0.02 + 4 * 0.01)  # mean plus four deviations
    for _ in range(60):  # rounds keep ending after 1 ms of silence: down to the floor
        q.learn_wait(0.001)
    assert q.patience_now(c) == 0.01
    grown = []
    for _ in range(5):  # then 80 ms: it grows call by call
        q.learn_wait(0.08)
        grown.append(q.patience_now(c))
    assert grown == sorted(grown) and grown[0] < grown[-1]
    for _ in range(60):
        q.learn_wait(2.0)
    assert q.patience_now(c) == 0.5  # never over the configured patience
    q.learn_wait(0.001)  # one short call moves it down a little, not to the floor at once
    assert 0.01 < q.patience_now(c) <= 0.5


def test_the_staleness_bound_makes_a_call_wait_for_everyone():
    c = cfg(patience=0.1, staleness=2)
    q = QuorumPolicy(c)
    short = np.array([3, 2, 3])
    assert q.start(c) == (0.1, False, True)
    assert q.finish(short, 3, quorum=True, after_complete=True)
    assert q.start(c) == (0.1, False, False)
    q.finish(short, 3, quorum=True, after_complete=False)
    assert q.short_streak == 2
    assert q.start(c) == (None, True, False)  # two short calls in a row: everyone
    assert not q.finish(np.array([3, 3, 3]), 3, quorum=False, after_complete=False)
    assert q.short_streak == 0 and q.start(c) == (0.1, False, True)
    first = QuorumPolicy(cfg(patience=0.1, staleness=2, wait_first=True))
    assert first.start(c)[0] is None  # after a pool move: everyone first


def test_only_hosts_late_at_the_start_of_several_streaks_make_calls_eager():
    c = cfg(patience=0.1, staleness=9)
    q = QuorumPolicy(c)
    short, full = np.array([2, 3]), np.array([3, 3])
    # One host late for a step of many calls: one late start, never eager.
    q.finish(short, 3, quorum=True, after_complete=True)
    for _ in range(5):
        q.finish(short, 3, quorum=True, after_complete=False)
        assert not q.eager
    q.finish(full, 3, quorum=True, after_complete=False)
    assert not q.eager
    # Late again at the start of the next streak: the evidence is there.
    assert EAGER_EVIDENCE == 2
    q.finish(short, 3, quorum=True, after_complete=True)
    assert q.eager and list(q.late_starts) == [True, True]
    q.finish(full, 3, quorum=True, after_complete=False)
    assert not q.eager  # a call with everyone ends it
    q.finish(full, 3, quorum=True, after_complete=True)  # on time: evidence against
    q.finish(full, 3, quorum=True, after_complete=True)
    q.finish(full, 3, quorum=True, after_complete=True)
    q.finish(short, 3, quorum=True, after_complete=True)
    assert not q.eager and list(q.late_starts) == [False, False, False, True]


def test_the_longest_wait_counts_only_complete_rounds_sent_once():
    call = Call(np.zeros((8, P.K)), np.zeros(8, dtype=np.uint8), 8, 3, 0,
                predicted=np.zeros(8, dtype=np.uint8))
    call.first_sent[:] = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]
    call.step[:] = [0, 1, 1, 1, 1, 1, 1, 1]
    slots = np.array([0, 1, 2, 3])
    recs = np.zeros(4, dtype=packet.PAYLOAD_DTYPE)
    recs["num_contrib"] = [3, 3, 2, 3]  # slot 2's round closed without a host
    call.retried[3] = True  # slot 3's was resent (a loss, or CLOSE): its wait is not clean
    wait = QuorumPolicy.longest_wait
    assert wait(call, slots, recs, 2.0, False, 0.5, 3) == pytest.approx(1.0)  # slot 0's
    # In a call that waited for everyone, a slot's first round waited for the straggler.
    assert wait(call, slots, recs, 2.0, True, 0.5, 3) == pytest.approx(0.9)
    # Silence counts from the last result where that came after the first send.
    assert wait(call, slots, recs, 2.0, False, 1.6, 3) == pytest.approx(0.4)
    assert wait(call, slots[2:], recs[2:], 2.0, False, 0.5, 3) is None
