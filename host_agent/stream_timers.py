"""How long a streamer waits, from what it measured of the path: the round-trip estimate and the
loss timer (RFC 6298), the path's least round trip, the pace of results, the probe period that
follows from them, and the pause that gathers results into batches. Numbers in, numbers out: no
sockets, no packets (docs/host_agent.md, "Loss" and "Gathering")."""

from __future__ import annotations

import time

import numpy as np

# Results after a call's first that measure its pace (LinkTimers.pace): fewer may have come in
# one burst.
RATE_RESULTS = 16
# gather_pause: with at least GATHER_IN_FLIGHT packets in flight, a pass that took fewer than a
# GATHER_SHARE-th of them waits for more, at most a GATHER_DRAIN-th of the time they spend in
# queues; never less than GATHER_MIN_S (a shorter sleep overshoots by more than itself: the
# kernel's timer slack is 50 us).
GATHER_IN_FLIGHT, GATHER_SHARE, GATHER_DRAIN, GATHER_MIN_S = 32, 8, 4, 0.0002


class LinkTimers:
    """One session's measurements of its path and the waits they call for. `rto`: the probe
    timer until round trips have been measured; `min_rto`, `max_rto`: its bounds; `gather_max`:
    the longest pause for results (0: none)."""

    def __init__(self, rto: float, min_rto: float, max_rto: float, gather_max: float):
        self.initial_rto, self.min_rto, self.max_rto = rto, min_rto, max_rto
        self.gather_max = gather_max
        # Round-trip estimate (TCP's, RFC 6298): the probe timer follows the switch's queueing
        # delay.
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = rto
        # The least round trip of a result taken without a pause before it (gather_pause): the
        # path's own, without queues.
        self.min_rtt: float | None = None
        # The last call's pace of results per second (pace): how fast a new call's first
        # window should come back (probe_period).
        self.rate: float | None = None
        self.paused = False  # the last receive followed a pause (its samples are late)

    def sample(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(max(self.srtt + 4 * self.rttvar, self.min_rto), self.max_rto)

    def note_round_trips(self, median: float | None, least: float | None) -> None:
        """A batch of results' clean round trips (Karn), by their median and least (None:
        none clean): the timer's estimate, and the path's least unless a pause came first."""
        if median is not None:
            self.sample(median)
            if not self.paused:  # (after a pause a result may have waited up to its length)
                self.min_rtt = least if self.min_rtt is None else min(self.min_rtt, least)
        self.paused = False

    def pace(self, results: int, span: float) -> float | None:
        """Results per second, from `results` that came within `span` seconds after a call's
        first; None when too few to tell a pace from a burst: fewer than RATE_RESULTS, or
        within min_rto (or two round trips)."""
        if results < RATE_RESULTS or span < max(self.min_rto, 2 * (self.min_rtt or 0.0)):
            return None
        return results / span

    def probe_period(self, pending: np.ndarray, pace: float | None, answered: bool) -> float:
        """How long silence after a result (or the call's start, before any: not `answered`)
        may last before it calls for a probe, with `pending` the packets still in flight: the
        time they should take now. By Little's law they come back in in_flight / rate seconds
        beyond the path's own round trip (min_rtt), at this call's `pace` of results (since its
        first; pace) or, before it can be told, the last call's: twice that, at least min_rto.
        A round-trip estimate alone is wrong both ways. At a call's tail the queues have
        drained, and a lost last packet waited out a timer sized for full queues (43-70 ms
        on leafspine as shipped, where a packet into empty queues comes back in 0.2-0.3
        ms), a lost probe twice that. And the gap between results is no round trip: on
        BMv2's 2 Mbit/s links results come one per 5.4 ms, while a first result that htb's
        burst let through came back in 0.16 ms; a timer from that round trip (5 ms) probed
        after nearly every result, and each probe's resends slowed the link further (67 s
        for a 4.8 s call). The pace is counted from the call's first result, not its start:
        a wait for a late host before it is no slowness (counted, it stretched the period to
        max_rto in the calls after). Before a call's first result, never under the measured
        timer either: the whole window waits in queues. With no rate known yet (a session's
        first call), the measured timer, at least the configured initial one."""
        rate = pace if pace is not None else self.rate
        if rate is None:
            return max(self.rto, self.initial_rto)
        in_flight = max(int(np.count_nonzero(pending)), 1)
        period = 2 * ((self.min_rtt or 0.0) + in_flight / rate)
        if not answered:
            period = max(period, self.rto)
        return min(max(period, self.min_rto), self.max_rto)

    def gather_pause(self, pending: np.ndarray, taken: int, results: int, started: float,
                     wake: float) -> tuple[float, float] | None:
        """After a pass that took `taken` results (`results` in the call so far, which began
        at `started`), with `pending` the packets in flight: how long to sleep while more
        arrive, and the time it was decided (None: take the next at once). A pass of the loop
        costs about the same 0.15 ms of numpy calls for one result as for a hundred; results
        come at the pace of the slowest link or switch, often a few at a time, and a pass per
        few results spends the host's CPU on that fixed cost (on a machine the switches share,
        theirs too). The pause must not leave a link idle, so it is taken only from time the
        packets in flight spend waiting in queues: by Little's law they come back in
        in_flight / rate seconds, of which the path's own round trip (min_rtt) is not
        queueing; a window that only fills the path (no queue) never waits. At most a quarter
        of that, a quarter of the call so far and `gather_max`, at least GATHER_MIN_S, and
        never past `wake` (a probe or the patience). Loss is found by the order results come
        in, not by time, so a pause cannot make a packet look lost. With fewer than
        GATHER_IN_FLIGHT packets in flight (a small call, or a call's last packets) every
        result is taken at once."""
        limit = self.gather_max
        if limit <= 0 or results <= 0 or self.min_rtt is None:
            return None
        in_flight = int(np.count_nonzero(pending))
        if in_flight < GATHER_IN_FLIGHT or taken * GATHER_SHARE >= in_flight:
            return None
        now = time.monotonic()
        elapsed = now - started
        # Results per second since the first could have come back.
        rate = results / max(elapsed - self.min_rtt, 1e-6)
        queued = in_flight / rate - self.min_rtt
        pause = min(min(queued, elapsed) / GATHER_DRAIN, limit, wake - now)
        if pause < GATHER_MIN_S:
            return None
        return pause, now
