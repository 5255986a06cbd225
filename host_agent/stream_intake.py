"""A streamer's results in: a batch of datagrams decoded, the awaited results among them matched
(host_agent.stream_window) and absorbed into the call, the rest of this session's kept early
(host_agent.stream_early), anything else counted as ignored. One batch takes a few numpy
operations, or one call into host_agent/window.c for a call with a context."""

from __future__ import annotations

import time

import numpy as np

from host_agent.stream_api import StreamConfig, StreamStats
from host_agent.stream_call import Call
from host_agent.stream_early import EarlyResults
from host_agent.stream_quorum import QuorumPolicy
from host_agent.stream_timers import LinkTimers
from host_agent.stream_window import match, settle
from host_agent.window_c import CompiledWindow
from passing import packet
from passing import protocol as P

MARK = int(P.Flag.CONGESTED)
UNMARKED = 0xFF ^ MARK  # a result's flags, its congestion mark aside


def records(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Datagram rows as PASSING records, and each one's slot as an index."""
    recs = np.ascontiguousarray(rows).view(packet.PAYLOAD_DTYPE).ravel()
    return recs, recs["slot"].astype(np.int64)


def median(a: np.ndarray) -> float:
    """np.median of a non-empty 1-d array, without its generic machinery (it runs on every
    batch of results)."""
    d = np.sort(a)
    n = d.size
    return float(d[n // 2]) if n % 2 else float((d[n // 2 - 1] + d[n // 2]) / 2)


class Intake:
    """Takes `cfg`'s results into calls: at the rounds of `rounds` (the session's array,
    counted on here), keeping results early in `early`, round trips in `timers`, waits for
    adaptive patience by `QuorumPolicy.longest_wait`; `compiled` takes those of a call with a
    context (Call.ctx)."""

    def __init__(self, cfg: StreamConfig, rounds: np.ndarray, early: EarlyResults,
                 timers: LinkTimers, compiled: CompiledWindow | None, stats: StreamStats):
        self.job_id, self.session, self.window = cfg.job_id, cfg.session, cfg.window
        self.complete = cfg.complete
        self.result_flags = int(P.Flag.RESULT) | (int(P.Flag.POOL) if cfg.pool & 1 else 0)
        self.rounds, self.early, self.timers = rounds, early, timers
        self.compiled, self.stats = compiled, stats

    def ours(self, recs: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Which records are results of this job's session, on a slot of its window."""
        return ((recs["job_id"] == self.job_id)
                & ((recs["flags"] & UNMARKED) == self.result_flags)
                & (recs["session"] == self.session) & (slot < self.window))

    def keep_idle(self, rows: np.ndarray, other: int) -> None:
        """Datagrams read between calls (`other`: how many of another size): this session's
        results kept early, the rest ignored."""
        self.stats.ignored += other
        if len(rows):
            recs, slot = records(rows)
            kept = self.early.keep(recs, slot, self.ours(recs, slot), None)
            self.stats.ignored += len(rows) - kept

    def take_numpy(self, rows: np.ndarray, other: int, call: Call,
                   measure: tuple[bool, float] | None = None
                   ) -> tuple[np.ndarray, int, np.ndarray, float | None]:
        """The awaited results among `rows` taken: matched (collect), each slot's next
        packet told whether to ask for CLOSE, its round counted, and absorbed into the call.
        (slots taken, in order of arrival; newest, as collect's; the slots with another packet
        to send; the longest wait among them, if `measure` is (forced, last progress):
        QuorumPolicy.longest_wait, before absorbing.)"""
        slots, frags, recs, newest = self.collect(rows, other, call)
        if not slots.size:
            return slots, newest, slots, None
        call.close_next[slots] = call.waited[slots] & (
            recs["num_contrib"].astype(np.int64) < self.complete)
        wait = None if measure is None else QuorumPolicy.longest_wait(
            call, slots, recs, time.monotonic(), *measure, self.complete)
        self.rounds[slots] += np.uint32(1)  # wraps at 2**32, as the switch reads it
        return slots, newest, call.absorb(slots, frags, recs), wait

    def take(self, rows: np.ndarray, other: int, call: Call
             ) -> tuple[np.ndarray, int, np.ndarray]:
        """take_numpy in one compiled batch (host_agent.window_c), for a call with a
        context; the same results, state and statistics."""
        self.stats.ignored += other
        if not len(rows):
            empty = np.zeros(0, dtype=np.int64)
            return empty, -1, empty
        t = self.compiled.take(call.ctx, rows, time.monotonic())
        stashed = 0
        unmatched = t.unmatched
        if unmatched.any():
            recs, slot = records(rows)
            stashed = self.early.keep(recs, slot, unmatched, call, taken=t.slots)
        self.stats.ignored += len(rows) - t.slots.size - stashed
        if not t.slots.size:
            return t.slots, -1, t.more
        call.missed += t.missed
        self.stats.marks += t.marked
        self.timers.note_round_trips(t.rtt_median, t.rtt_min)
        self.stats.results += t.slots.size
        return t.slots, t.newest, t.more

    def collect(self, rows: np.ndarray, other: int, call: Call
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """The payloads that are the awaited result of a slot, decoded and matched in one
        batch: (slots, fragments, records, newest), in order of arrival; those slots stop
        waiting. `newest` is the latest transmission the results prove every host's packets
        up to were summed (-1 if none). Anything else is counted as ignored."""
        none = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                np.zeros(0, dtype=packet.PAYLOAD_DTYPE), -1)
        self.stats.ignored += other
        if not len(rows):
            return none
        recs, slot = records(rows)
        ours = self.ours(recs, slot)
        keep = match(call, recs, slot, ours)
        ours[keep] = False
        stashed = self.early.keep(recs, slot, ours, call)
        self.stats.ignored += len(rows) - keep.size - stashed
        if not keep.size:
            return none
        slots = slot[keep]
        now = time.monotonic()
        clean = ~call.resent[slots]  # Karn: a resent packet's round trip is ambiguous
        rtts = now - call.sent[slots[clean]]
        self.timers.note_round_trips(median(rtts) if rtts.size else None,
                                     float(rtts.min()) if rtts.size else None)
        newest = settle(call, slots)
        self.stats.results += keep.size
        self.stats.marks += int(np.count_nonzero(recs["flags"][keep] & MARK))
        return slots, recs["frag"][keep].astype(np.int64), recs[keep], newest
