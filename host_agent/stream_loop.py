"""One call through the window, start to end: its first packets launched, then, pass by pass,
results received and taken, each answered slot's next packet launched, lost packets resent,
silence probed, packets past their patience closed, and a switch that stops answering turned
into SwitchTimeout. The decisions are host_agent.stream_window's and stream_timers'; this loop
only puts them in order with the I/O."""

from __future__ import annotations

import time

import numpy as np

from host_agent.congestion import CongestionWindow, SendGate
from host_agent.stream_api import StreamConfig, StreamStats, SwitchTimeout
from host_agent.stream_call import Call
from host_agent.stream_early import EarlyResults
from host_agent.stream_intake import Intake
from host_agent.stream_reader import Reader
from host_agent.stream_sender import Sender
from host_agent.stream_timers import LinkTimers
from host_agent.stream_window import Recovery, overdue, probe_turn

NOTHING = np.zeros(0, dtype=np.int64)


class CallLoop:
    """Runs calls with one streamer's parts; `rounds` is the session's array."""

    def __init__(self, sender: Sender, intake: Intake, reader: Reader, timers: LinkTimers,
                 early: EarlyResults, rounds: np.ndarray, stats: StreamStats,
                 window: CongestionWindow):
        self.sender, self.intake, self.reader, self.timers = sender, intake, reader, timers
        self.early, self.rounds, self.stats = early, rounds, stats
        self.window, self.gate = window, SendGate()

    def admit(self, call: Call, ready: np.ndarray) -> None:
        """Launch what the congestion window lets out of the held slots and `ready`."""
        pending = call.pending
        in_flight = int(np.count_nonzero(pending))
        allowed = self.window.allowed
        if not self.gate.holding and in_flight + ready.size <= allowed:
            if ready.size:
                self.launch(call, ready)
            return
        keys = call.step[ready] * call.used + ready
        earliest = None
        if in_flight:
            waiting = np.flatnonzero(pending)
            earliest = int((call.step[waiting] * call.used + waiting).min())
        go = self.gate.admit(ready, keys, in_flight, allowed, earliest)
        if go.size:
            self.launch(call, go)

    def run(self, call: Call, cfg: StreamConfig, patience: float | None, forced: bool
            ) -> float | None:
        """Every fragment of `call` through the switch, closing rounds without everyone after
        `patience` of silence (None: never); `forced`: the staleness bound made it wait for
        everyone. Returns the call's longest silence that every host made (measured under
        adaptive patience, cfg.patience_min), or None."""
        stats, timers, sender, intake = self.stats, self.timers, self.sender, self.intake
        receive = self.reader.receive
        measuring = cfg.patience_min is not None
        self.gate.clear()
        self.admit(call, np.arange(call.used, dtype=np.int64))
        window, gate = self.window, self.gate
        started = time.monotonic()
        rec = Recovery(started, timers.max_rto)
        taken = 0
        results0 = stats.results
        longest: float | None = None
        # The probe timer's period, set anew at each result, from the pace of results since
        # the call's first (first_at, after first_n of them).
        period = timers.probe_period(call.pending, None, answered=False)
        first_at: float | None = None
        first_n = 0
        while call.pending.any() or gate.holding:
            wake = rec.wake(call, period, patience)
            if taken:
                self.gather(call, taken, stats.results - results0, started, wake)
            rows, other = receive(max(wake - time.monotonic(), 0.0))
            marks0 = stats.marks
            if call.ctx is not None:
                slots, newest, more = intake.take(rows, other, call)
            else:
                slots, newest, more, wait = intake.take_numpy(
                    rows, other, call, (forced, rec.last_progress) if measuring else None)
                if wait is not None:
                    longest = wait if longest is None else max(longest, wait)
            taken = slots.size
            now = time.monotonic()
            if slots.size:
                stats.passes += 1
                rec.answered(call, now, newest)
                window.on_results(slots.size, stats.marks - marks0)
                self.admit(call, more)
                lost = rec.overtaken(call)
                if lost.size:
                    window.on_loss()
                    sender.resend(call, lost, now, probe=False)
                    stats.fast_retransmissions += lost.size
                got = stats.results - results0
                if first_at is None:
                    first_at, first_n = now, got
                period = timers.probe_period(call.pending, timers.pace(got - first_n,
                                                                       now - first_at),
                                             answered=True)
            if not call.pending.any():
                if gate.holding:
                    self.admit(call, NOTHING)
                    continue
                break
            if patience is not None and now - rec.last_progress >= patience:
                due = overdue(call, now, patience)
                if due.size:
                    sender.resend(call, due, now, probe=False)
                    stats.closes += due.size
            if now - rec.last_progress > cfg.deadline:
                raise self._timeout(call, cfg)
            if now >= rec.probe_due(period):
                newest_slot, turn = probe_turn(call)
                window.on_loss()
                sender.resend(call, newest_slot, now, probe=True)
                stats.probes += 1
                if turn.size:
                    sender.resend(call, turn, now, probe=False, rotated=True)
                    stats.rotated += turn.size
                rec.probed(now)
        stats.window_cuts, stats.window = window.cuts, window.allowed
        if first_at is not None:
            pace = timers.pace(stats.results - results0 - first_n, time.monotonic() - first_at)
            if pace is not None:
                timers.rate = pace
        return longest

    def launch(self, call: Call, slots: np.ndarray) -> None:
        """Send the next packet of each of `slots`, except where its result came early (the
        others closed that round without this host): such a slot takes the result as if
        answered and goes on to its next packet, in turn."""
        if not self.early.kept:  # (the usual case: no dictionary look-up per slot)
            self.sender.send(call, slots)
            return
        while slots.size:
            hits = self.early.pop_hits(call, slots)
            if hits is None:
                self.sender.send(call, slots)
                return
            taken, recs = hits
            self.sender.send(call, np.setdiff1d(slots, taken))
            self.rounds[taken] += np.uint32(1)
            self.stats.taken_early += taken.size
            slots = call.absorb(taken, recs["frag"].astype(np.int64), recs)

    def gather(self, call: Call, taken: int, results: int, started: float,
               wake: float) -> None:
        """After a pass that took `taken` results (`results` in the call so far, which began
        at `started`): sleep while more arrive, as long as LinkTimers.gather_pause says."""
        due = self.timers.gather_pause(call.pending, taken, results, started, wake)
        if due is None:
            return
        pause, now = due
        time.sleep(pause)
        self.stats.gathers += 1
        self.stats.gathered_s += time.monotonic() - now
        self.timers.paused = True

    def _timeout(self, call: Call, cfg: StreamConfig) -> SwitchTimeout:
        waiting = np.flatnonzero(call.pending)[:5].tolist()
        return SwitchTimeout(
            f"job {cfg.job_id}: no result from the switch for {cfg.deadline:.1f}s "
            f"(slots {waiting} waiting, {self.stats.retransmissions} retransmissions): "
            "another host of the job stopped, restarted or is in another session, "
            "or the switch is down")
