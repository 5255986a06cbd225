"""One host's stream of fragments through the switch: the SwitchML window protocol.

The job's pool has W slots; a call of n fragments uses u = passing.protocol.slots_used(W, n) of
them. Slot s carries, one after another: an exponent-only packet for fragment s (values zero,
`exp` = this host's exponent of fragment s), then fragment s quantized with the agreed exponent
and carrying the exponent of fragment s+u, then fragment s+u, and so on (see
host_agent/fixed_point.py). A call of a size the session summed before speculates instead
(docs/protocol.md, "Speculative scale") on u = slots_used(W, n, speculating=True) = min(W, n)
slots: slot s carries fragments s, s+u, ... each once, quantized one bit above the largest
exponent the hosts proposed for it in the last such call, and each again at the hosts' maximum
where that did not fit. Each packet waits for its result
before the slot's next packet goes out; u slots are in flight at once. Every use of a slot
is the slot's next round (0, 1, 2, ...; the SwitchML shadow-copy version is its low bit), also
across calls, so the agent keeps the rounds for the life of the session; every host counts
the same rounds.

Loss (docs/protocol.md, "Loss recovery"): a packet still unanswered when a packet sent after it
has been answered was lost, and is resent at once; a timer period without any result sends a
probe (the newest packet, and an eighth of the older ones in turn), doubling the period each
time. Waiting for a slow host or a busy switch is never taken for the loss of the whole window.
A resend carries RETRANS and brings the result whether the contribution or the result was lost.
A switch that stops answering ends in SwitchTimeout, not a hang. Results are matched on
session, slot, round, fragment and the call's tag, so neither a result of another session nor
a late duplicate of an earlier call is ever taken for a new result.

A streamer is one session (host_agent.session): the rounds it keeps are in step with the other
hosts' only as long as every call completes everywhere. After a failed call (a timeout, a socket
error) they may not be, so the streamer refuses further calls with SessionBroken; the job goes on
with a new session, which the switch keeps apart from this one.

The parts, one job each: stream_call (a call's state and its packets' contents), stream_window
(which results are awaited, what was lost, what to probe or close: no I/O), stream_timers (round
trips, the probe timer, pace, gathering), stream_quorum (patience, staleness, eagerness),
stream_sender (packets out), stream_intake (results in), stream_early and stream_catch_up
(results that came before this host sent), stream_scales (speculation's memory), stream_reader
(the transport's receives and the reader between calls) and stream_loop (one call, pass by pass);
stream_api holds what callers see (re-exported here). This module is the session that wires
them together.
"""

from __future__ import annotations

import dataclasses
import time  # noqa: F401 (tests set the parts' clock as host_agent.stream.time.monotonic)

import numpy as np

from host_agent import fixed_point as fx
from host_agent import window_c
from host_agent.congestion import CongestionWindow
from host_agent.scratch import Scratch
from host_agent.stream_api import (
    SessionBroken,
    StreamConfig,
    StreamStats,
    SwitchTimeout,
    Transport,
    check_config,
    check_out,
    handed_out,
)
from host_agent.stream_call import TAG_CALLS, TAG_LAST, Call, as_blocks
from host_agent.stream_catch_up import calls_ready
from host_agent.stream_early import EarlyResults
from host_agent.stream_intake import Intake
from host_agent.stream_loop import CallLoop
from host_agent.stream_quorum import QuorumPolicy
from host_agent.stream_reader import Reader
from host_agent.stream_scales import ScaleMemory
from host_agent.stream_sender import Sender
from host_agent.stream_timers import GATHER_IN_FLIGHT, LinkTimers
from passing import protocol as P

__all__ = ["SessionBroken", "SlotStreamer", "StreamConfig", "StreamStats", "SwitchTimeout",
           "TAG_CALLS", "TAG_LAST", "Transport", "check_out", "handed_out"]

# Names the tests knew before the streamer was taken apart.
_Call = Call
_GATHER_IN_FLIGHT = GATHER_IN_FLIGHT


def _part(part: str, name: str) -> property:
    """One of the parts' attributes, read and written through the streamer."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value))


class SlotStreamer:
    """One host's session through the switch: `allreduce` of one tensor at a time."""

    def __init__(self, cfg: StreamConfig, transport: Transport):
        # Checked before the reader thread starts, so that a bad configuration leaves nothing
        # running.
        check_config(cfg)
        self.cfg = cfg
        self.transport = transport
        self._scratch = Scratch()  # the blocks and sums of a call, kept for the next
        self.rounds = np.zeros(cfg.window, dtype=np.uint32)
        self.calls = 0
        self.last_n: int | None = None  # values in this host's previous call
        self.broken: str | None = None  # why this session cannot be used any more
        self._stats = StreamStats()
        # The compiled window (host_agent.window_c), or None: numpy for every call.
        self._compiled = window_c.load()
        self._sender = Sender(cfg, transport, self.rounds, self._compiled, self._stats)
        self._timers = LinkTimers(cfg.rto, cfg.min_rto, cfg.max_rto, cfg.gather_max)
        self._quorum = QuorumPolicy(cfg)
        self._speculation = ScaleMemory(cfg.window)
        self._early = EarlyResults(self.rounds, cfg.window)
        self._intake = Intake(cfg, self.rounds, self._early, self._timers, self._compiled,
                              self._stats)
        self._reader = Reader(transport, f"passing-drain-{cfg.job_id}", self._intake.keep_idle)
        self._loop = CallLoop(self._sender, self._intake, self._reader, self._timers,
                              self._early, self.rounds, self._stats,
                              CongestionWindow(cfg.window))
        # By fragment count, what the session's last call of that many fragments proposed
        # (host_agent.stream_scales), and the results of rounds this host has not sent yet,
        # by (slot, round) (host_agent.stream_early).
        self.scales = self._speculation.scales
        self.early = self._early.kept
        # What host_agent.window_c's context and the tests read by these names.
        self._header, self._pool_flag = self._sender.header, self._sender.pool_flag
        self._epoch_bits, self._result_flags = self._sender.epoch_bits, self._intake.result_flags
        self._send, self._resend = self._sender.send, self._sender.resend
        self._take, self._take_numpy = self._intake.take, self._intake.take_numpy
        self._gather, self._pace = self._loop.gather, self._timers.pace
        if cfg.patience is not None:
            self._reader.drain(True)
        self._counts = np.zeros(0, dtype=np.int64)  # GPUs in each fragment of the last sum
        self._counts_n = 0  # ... of its values
        self._last_counts: np.ndarray | None = None

    # The parts' state under the names callers and tests know (a pool move carries
    # late_starts over; the tests set the round trips, the streak and the sequence).
    srtt = _part("_timers", "srtt")
    rttvar = _part("_timers", "rttvar")
    rto = _part("_timers", "rto")
    min_rtt = _part("_timers", "min_rtt")
    rate = _part("_timers", "rate")
    _paused = _part("_timers", "paused")
    short_streak = _part("_quorum", "short_streak")
    eager = _part("_quorum", "eager")
    late_starts = _part("_quorum", "late_starts")
    wait_avg = _part("_quorum", "wait_avg")
    wait_dev = _part("_quorum", "wait_dev")
    _seq = _part("_sender", "seq")

    @property
    def stats(self) -> StreamStats:
        return self._stats

    @stats.setter
    def stats(self, stats: StreamStats) -> None:
        """Count on into `stats` (a pool move carries a session's counters over)."""
        self._stats = self._sender.stats = self._intake.stats = self._loop.stats = stats

    def _probe_period(self, call: Call, pace: float | None, answered: bool) -> float:
        return self._timers.probe_period(call.pending, pace, answered)

    def allreduce(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The element-wise sum of `x` over every host of the job, as float64: in `out` (x.size
        float64 elements; a caller that passes the same one every call spares a fresh array's
        page faults) or a new array. NaN or Inf on any host raises NonFiniteError on every
        host, after the stream (so that every host leaves the slots in the same state)."""
        check_out(out, np.asarray(x).size)
        return handed_out(self.allreduce_view(x), out)

    def allreduce_view(self, x: np.ndarray) -> np.ndarray:
        """allreduce's sums without a copy: x.size float64 values in the streamer's own memory,
        which its next call overwrites. The caller may change them in place (a quorum's
        scaling, a division) and round them into its own tensor once: a 16 MiB call's copies
        through fresh arrays cost the leader up to a second of page faults on a loaded
        2-core machine (docs/benchmarks.md)."""
        flat = np.asarray(x).ravel()
        n = flat.size
        if n == 0:
            self._counts, self._counts_n, self._last_counts = np.zeros(0, dtype=np.int64), 0, None
            return np.zeros(0)
        nfrag = -(-n // P.K)
        if nfrag >= 1 << 32:
            raise ValueError(f"{n} values: more fragments than a packet's 32-bit frag field "
                             "numbers; split the tensor")
        blocks, local_exp, local_error = as_blocks(flat, nfrag, self._scratch)
        self.last_n = n
        if self.broken is not None:
            raise SessionBroken(f"job {self.cfg.job_id}: session {self.cfg.session:#x} failed "
                                f"earlier ({self.broken}); start a new session")
        try:
            with self._reader.holding():
                sums, agreed = self._run(blocks, local_exp)
        except BaseException as e:
            self.broken = f"{type(e).__name__}: {e}"
            raise
        self._counts_n, self._last_counts = n, None
        if local_error is not None and (self.cfg.patience is None
                                        or np.any(agreed == fx.POISON)):
            raise fx.NonFiniteError(f"this host: {local_error}")
        # Else every round closed without this host (a quorum): its NaN/Inf reached no sum,
        # the other hosts got finite results and stepped, so it takes the same ones.
        if np.any(agreed == fx.POISON):
            raise fx.NonFiniteError(f"job {self.cfg.job_id}: another host had NaN/Inf (or a "
                                    "value beyond float32's range) in the same call")
        return sums.ravel()[:n]

    @property
    def last_counts(self) -> np.ndarray:
        """GPUs in each element of the last sum. Made when first asked for: a bulk-synchronous
        caller rarely needs it, and spreading the counts over every element costs a large
        call tens of milliseconds."""
        if self._last_counts is None:
            self._last_counts = self.counts_from(0)
        return self._last_counts

    def counts_from(self, start: int) -> np.ndarray:
        """last_counts[start:], without spreading the counts over the elements before."""
        first = start // P.K
        return np.repeat(self._counts[first:], P.K)[start - first * P.K:self._counts_n - first
                                                    * P.K]

    def calls_ready(self, n: int, most: int = TAG_CALLS - 1) -> int:
        """How many of this host's next all-reduces of `n` values the switch has already
        completed without it: the others closed those rounds (a quorum) and every result of
        each such call is kept in `early`. A host that is that far behind can take them
        without computing the gradients it would have sent (backup-worker SGD lets a
        late worker start at the current step); `most` caps the count. Results come in
        between calls (the reader thread), so a later question may get a larger answer.

        Results do not say how large the others' call was, so a call of another size must
        not pass for one of `n`: 0 if this host's previous call had another size (a loop
        whose calls differ in size skips nothing), and a call counts only if each slot's
        last result is tagged as its slot's last packet of the call (TAG_LAST) and no slot
        beyond the call's holds a result of the same call. The walk follows what this host
        would send: exponent packets first or a speculative scale, and a fragment sent
        again where a speculation did not hold, decided from the kept results as each
        host decides from the results it reads."""
        if n <= 0 or self.cfg.patience is None or self.last_n not in (None, n):
            return 0
        nfrag = -(-n // P.K)
        with self._reader.holding():
            # Tags repeat every TAG_CALLS calls: no further, or "a slot beyond the call holds
            # a result of the same call" could match a later one.
            return calls_ready(self.early, self.rounds, self.scales, self.calls, nfrag,
                               min(most, TAG_CALLS - 1), self.cfg.window)

    def patience_now(self) -> float | None:
        """How long a packet waits in silence (no awaited result of the call) for the other
        hosts before it asks for CLOSE (None: always waits)."""
        return self._quorum.patience_now(self.cfg)

    def set_policy(self, patience: float | None, patience_min: float | None,
                   staleness: int) -> None:
        """Between calls: close rounds with this patience and staleness bound from the next
        call on (a live `passing-ctl job set`, which every host applies after the same call:
        host_agent.pool_move). The count of short calls in a row is kept, so the bound holds
        across the change; so is what adaptive patience has measured."""
        self.cfg = dataclasses.replace(self.cfg, patience=patience, patience_min=patience_min,
                                       staleness=staleness)
        # Nobody can close a round without this host when patience is None: nothing arrives
        # between calls then.
        self._reader.drain(patience is not None)

    def detach(self) -> Transport:
        """Stop reading between calls and hand the transport over, open (to the streamer of
        the pool the host moves to); this streamer cannot be used afterwards."""
        self._reader.stop()
        self.broken = "its host moved to another pool"
        return self.transport

    def close(self) -> None:
        """Stop reading between calls and close the transport (if it can be closed)."""
        self._reader.stop()
        close = getattr(self.transport, "close", None)
        if close is not None:
            close()

    def _run(self, blocks: np.ndarray, local_exp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every fragment of `blocks` through the switch: (sums, agreed exponents)."""
        cfg = self.cfg
        call = Call(blocks, local_exp, cfg.window, cfg.streams, self.calls % TAG_CALLS,
                    self._speculation.prediction(blocks.shape[0]),
                    out=self._scratch.get("sums", blocks.shape, np.float64))
        call.payloads[:] = self._header
        call.payloads["slot"] = np.arange(call.used)
        self.calls += 1
        patience, forced, after_complete = self._quorum.start(cfg)
        call.quorum = patience is not None
        call.eager = call.quorum and self._quorum.eager
        # The compiled window copies the call's fields (quorum, eager) into its context: made
        # once they are final. Adaptive patience measures waits before absorbing
        # (QuorumPolicy.longest_wait): numpy then.
        if self._compiled is not None and cfg.patience_min is None:
            call.ctx = self._compiled.context(call, self)
        longest = self._loop.run(call, cfg, patience, forced)
        if longest is not None:
            self._quorum.learn_wait(longest)
        self._speculation.keep(call, self.stats)
        self._counts = call.counts
        self.stats.short_calls += self._quorum.finish(call.counts, cfg.complete, call.quorum,
                                                      after_complete)
        return call.out, call.agreed
