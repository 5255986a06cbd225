"""The streamer's timers without sockets (host_agent.stream_timers): the round-trip estimate and
loss timer, the path's least round trip, the pace of results, the probe period and the pause
that gathers results."""

from __future__ import annotations

import numpy as np
import pytest

from host_agent import stream_timers
from host_agent.stream_timers import GATHER_IN_FLIGHT, GATHER_MIN_S, LinkTimers


def timers(**kw) -> LinkTimers:
    args = dict(rto=0.02, min_rto=0.005, max_rto=1.0, gather_max=0.005)
    args.update(kw)
    return LinkTimers(**args)


def test_the_loss_timer_follows_rfc_6298_within_its_bounds():
    t = timers()
    assert t.rto == 0.02 and t.srtt is None  # the configured timer until a sample
    t.sample(0.010)
    assert (t.srtt, t.rttvar) == (0.010, 0.005)
    assert t.rto == pytest.approx(0.030)  # srtt + 4 rttvar
    t.sample(0.002)
    assert t.rttvar == pytest.approx(0.75 * 0.005 + 0.25 * 0.008)
    assert t.srtt == pytest.approx(0.875 * 0.010 + 0.125 * 0.002)
    assert t.rto == pytest.approx(t.srtt + 4 * t.rttvar)
    for _ in range(50):
        t.sample(0.0001)
    assert t.rto == 0.005  # min_rto
    for _ in range(50):
        t.sample(10.0)
    assert t.rto == 1.0  # max_rto


def test_the_least_round_trip_skips_samples_taken_after_a_pause():
    t = timers()
    t.note_round_trips(0.004, 0.003)
    assert t.min_rtt == 0.003
    t.paused = True  # the results may have waited in the socket through the pause
    t.note_round_trips(0.002, 0.001)
    assert t.min_rtt == 0.003 and not t.paused
    assert t.srtt < 0.004  # ... but the timer still learns from them
    t.note_round_trips(0.002, 0.001)
    assert t.min_rtt == 0.001
    t.paused = True
    t.note_round_trips(None, None)  # nothing clean (Karn): no sample, the pause is over
    assert not t.paused and t.min_rtt == 0.001


def test_a_pace_needs_enough_results_over_enough_time():
    t = timers(min_rto=0.005)
    assert t.pace(16, 0.006) == pytest.approx(16 / 0.006)
    assert t.pace(15, 1.0) is None
    assert t.pace(100, 0.004) is None  # within min_rto: one burst
    t.min_rtt = 0.01
    assert t.pace(100, 0.015) is None  # within two round trips
    assert t.pace(100, 0.025) == pytest.approx(4000)


def test_the_probe_period_is_what_the_packets_in_flight_should_take():
    t = timers(rto=0.02, min_rto=0.005, max_rto=0.5)
    pending = np.arange(100) < 40
    assert t.probe_period(pending, None, answered=False) == 0.02  # nothing known yet
    t.rto = 0.03
    assert t.probe_period(pending, None, answered=True) == 0.03  # measured, above the initial
    t.min_rtt = 0.001
    # 40 in flight at 4,000 results/s: 10 ms beyond the round trip, twice that
    assert t.probe_period(pending, 4000.0, answered=True) == pytest.approx(2 * (0.001 + 0.01))
    t.rate = 4000.0  # the last call's pace stands in until this call's can be told
    assert t.probe_period(pending, None, answered=True) == pytest.approx(0.022)
    assert t.probe_period(pending, None, answered=False) == 0.03  # never under rto at first
    assert t.probe_period(np.arange(100) < 1, 1e6, answered=True) == 0.005  # min_rto
    assert t.probe_period(np.ones(100, dtype=bool), 10.0, answered=True) == 0.5  # max_rto
    assert t.probe_period(np.zeros(100, dtype=bool), 1e6, answered=True) == 0.005


@pytest.fixture
def clock(monkeypatch):
    now = [50.0]
    monkeypatch.setattr(stream_timers.time, "monotonic", lambda: now[0])
    return now


def test_a_pause_is_a_quarter_of_the_queueing_and_within_every_bound(clock):
    t = timers(gather_max=0.005)
    in_flight = np.ones(256, dtype=bool)
    assert t.gather_pause(in_flight, 1, 1000, 49.0, 60.0) is None  # no round trip yet
    t.min_rtt = 0.0
    # 1,000 results in 1 s: 256 in flight come back in 0.256 s; a quarter is over gather_max
    assert t.gather_pause(in_flight, 1, 1000, 49.0, 60.0) == (0.005, 50.0)
    pause, _ = t.gather_pause(in_flight, 1, 100_000, 49.0, 60.0)
    assert pause == pytest.approx(0.256 / 100 / 4)
    pause, _ = t.gather_pause(in_flight, 1, 10, 50.0 - 0.004, 60.0)
    assert pause == pytest.approx(0.001)  # a quarter of the call so far
    assert t.gather_pause(in_flight, 1, 1000, 49.0, 50.0003)[0] == pytest.approx(0.0003)
    assert t.gather_pause(in_flight, 1, 1000, 49.0, 50.0 + GATHER_MIN_S / 2) is None
    assert t.gather_pause(in_flight, 256 // 8, 1000, 49.0, 60.0) is None  # a batch came
    few = np.arange(256) < GATHER_IN_FLIGHT - 1
    assert t.gather_pause(few, 1, 1000, 49.0, 60.0) is None
    t.min_rtt = 0.256  # the window only fills the path: nothing queues
    assert t.gather_pause(in_flight, 1, 1000, 49.0 - 0.256, 60.0) is None
    assert timers(gather_max=0.0).gather_pause(in_flight, 1, 1000, 49.0, 60.0) is None
