"""The agent's gathering of results (host_agent.stream, SlotStreamer._gather): a pass that took
few results while many packets are in flight waits for more, within its bounds, and changes
nothing of what the call computes or sends."""

from __future__ import annotations

import threading
import time

import numpy as np

from host_agent import stream as stream_mod
from host_agent.session import new_session
from host_agent.stream import SlotStreamer, StreamConfig, _Call
from passing import protocol as P
from testbed.loopback import LoopbackSwitch, random_tensors
from tests.host_agent.test_stream import check, run_hosts


class Paced:
    """A host's transport whose results come out no faster than `rate` per second, in the
    order the switch sent them: a bottleneck link in front of the host."""

    def __init__(self, inner, rate: float):
        self.inner, self.gap = inner, 1.0 / rate
        self.held: list[tuple[float, bytes]] = []
        self.next_out = 0.0
        self.lock = threading.Lock()

    def send(self, payload: bytes) -> None:
        self.inner.send(payload)

    def recv(self, timeout: float) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            with self.lock:
                for payload in self.inner.recv(0.0):
                    self.next_out = max(self.next_out, now) + self.gap
                    self.held.append((self.next_out, payload))
                due = [p for t, p in self.held if t <= now]
                self.held = [(t, p) for t, p in self.held if t > now]
            if due or now >= deadline:
                return due
            time.sleep(min(self.gap, max(deadline - now, 0.0)))


def test_results_that_trickle_in_are_taken_in_batches_and_every_sum_is_right():
    """256 slots in flight, results at 4,000 a second per host: each pass would take two or
    three. Gathering takes them many at a time; every result of both calls (the first agreeing
    on exponents, the second speculating) is right, and nothing is resent: results come in
    order, and a pause never makes a packet look lost."""
    tensors = random_tensors(2, 1024 * P.K, seed=11)
    switch = LoopbackSwitch(2, slots=256)
    results, streamers = run_hosts(switch, tensors, calls=2, window=256, rto=2.0,
                                   min_rto=2.0, wrap=lambda port, t: Paced(t, 4000.0))
    check(results, tensors)
    for s in streamers:
        st = s.stats
        assert st.retransmissions == 0, st
        assert st.gathers > 0 and st.gathered_s > 0, st
        # 1,024 results a call (and the first call's 64 exponent packets): without gathering
        # a pass takes two or three of them here (about 800 passes), with it about ten.
        assert st.passes * 4 <= st.results, st


def test_losses_are_found_and_recovered_while_results_are_gathered():
    """1% of the packets and results lost, results trickling in: the order rule still finds
    every loss (the pauses change when a host launches, not the order), and every sum of
    three calls is right."""
    tensors = random_tensors(3, 600 * P.K, seed=13)
    switch = LoopbackSwitch(3, slots=256, loss=0.01, seed=5)
    results, streamers = run_hosts(switch, tensors, calls=3, window=256, rto=0.05,
                                   wrap=lambda port, t: Paced(t, 4000.0))
    check(results, tensors)
    assert switch.dropped > 0
    assert sum(s.stats.fast_retransmissions for s in streamers) > 0
    assert all(s.stats.gathers > 0 for s in streamers)


def test_without_gathering_a_call_never_waits():
    tensors = random_tensors(2, 300 * P.K, seed=12)
    switch = LoopbackSwitch(2, slots=256)
    results, streamers = run_hosts(switch, tensors, calls=2, window=256, gather_max=0.0,
                                   wrap=lambda port, t: Paced(t, 4000.0))
    check(results, tensors)
    assert all(s.stats.gathers == 0 and s.stats.passes > 0 for s in streamers)


def test_with_few_packets_in_flight_every_result_is_taken_at_once():
    """A window of 16 slots (or a call of fewer fragments than the gathering's threshold)
    never waits, however slowly results come: its packets in flight could not keep a link
    busy through a pause."""
    for window, frags in ((16, 200), (256, stream_mod._GATHER_IN_FLIGHT - 1)):
        tensors = random_tensors(2, frags * P.K, seed=frags)
        switch = LoopbackSwitch(2, slots=window)
        results, streamers = run_hosts(switch, tensors, calls=2, window=window,
                                       wrap=lambda port, t: Paced(t, 2000.0))
        check(results, tensors)
        assert all(s.stats.gathers == 0 for s in streamers), window


def test_a_pause_stays_within_its_bounds(monkeypatch):
    """What one pause may be: at most a quarter of the time the packets in flight spend in
    queues (their return time at the call's rate, less the path's own round trip), a quarter
    of the call so far and gather_max, never past the next probe or patience deadline, and
    none shorter than 0.2 ms; none after a pass that took an eighth of them or more, none
    with fewer than 32 in flight, none before a round trip has been measured."""
    asked: list[float] = []
    monkeypatch.setattr(stream_mod.time, "sleep", asked.append)
    switch = LoopbackSwitch(1, slots=256)
    streamer = SlotStreamer(StreamConfig(1, 0, 256, 1, new_session(), gather_max=0.005),
                            switch.transport(1))
    # A speculating call: it uses every slot of the window.
    call = _Call(np.zeros((256, P.K)), np.zeros(256, dtype=np.uint8), 256, 1, 0,
                 predicted=np.zeros(256, dtype=np.uint8))
    assert call.used == 256
    call.pending[:] = True
    now = time.monotonic()
    streamer._gather(call, 1, 1000, now - 1.0, now + 10.0)
    assert asked == []  # no round trip measured yet
    streamer.min_rtt = 0.0
    # 1,000 results in 1 s: the 256 in flight come back in 0.256 s; a quarter of that is
    # 64 ms, above gather_max.
    streamer._gather(call, 1, 1000, now - 1.0, now + 10.0)
    assert asked == [0.005]
    # 10 results in 4 ms: the rate says 102 ms, a quarter of the call so far 1 ms.
    streamer._gather(call, 1, 10, now - 0.004, now + 10.0)
    assert 0.001 <= asked[-1] <= 0.00105
    # 100,000 results a second: the 256 in flight take 2.56 ms, a quarter of that 0.64 ms.
    streamer._gather(call, 1, 100_000, now - 1.0, now + 10.0)
    assert 0.00064 <= asked[-1] <= 0.00065
    # The path's own round trip is not queueing: 1,000 results in the 1 s after the first
    # could come back (a round trip of 0.252 s), so 0.256 s for the 256 in flight, all but
    # 4 ms of it the path's.
    streamer.min_rtt = 0.252
    streamer._gather(call, 1, 1000, now - 1.252, now + 10.0)
    assert 0.00099 <= asked[-1] <= 0.00101
    # A probe due in 0.5 ms.
    streamer.min_rtt = 0.0
    streamer._gather(call, 1, 1000, now - 1.0, time.monotonic() + 0.0005)
    assert 0.0002 <= asked[-1] <= 0.0005
    n = len(asked)
    streamer._gather(call, 1, 1000, now - 1.0, time.monotonic() + 0.0001)  # too short a pause
    streamer._gather(call, 1, 1000, now - 1.0, time.monotonic() - 0.001)  # already due
    streamer._gather(call, 256 // 8, 1000, now - 1.0, now + 10.0)  # a batch: no pause
    streamer.min_rtt = 0.256  # a window that only fills the path: nothing queued
    streamer._gather(call, 1, 1000, now - 1.256, now + 10.0)
    streamer.min_rtt = 0.0
    call.pending[stream_mod._GATHER_IN_FLIGHT - 1:] = False
    streamer._gather(call, 1, 1000, now - 1.0, now + 10.0)  # too few in flight
    assert len(asked) == n
    assert streamer.stats.gathers == n
    streamer.close()
