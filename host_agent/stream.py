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
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from host_agent import fixed_point as fx
from host_agent import window_c
from host_agent.scratch import Scratch
from passing import packet
from passing import protocol as P


class SwitchTimeout(TimeoutError):
    """The switch did not answer within the deadline, retransmissions included."""


class SessionBroken(RuntimeError):
    """An earlier call of this session failed: its slots may be out of step with the other
    hosts', so it cannot be used again. Start a new session."""


class Transport(Protocol):
    """What the streamer needs of a transport. One may also offer batch calls, which the
    streamer then uses: `send_rows(rows)` (each row of an (n, PAYLOAD_BYTES) uint8 array one
    datagram) and `recv_rows(timeout) -> (rows, datagrams of another size)`."""

    def send(self, payload: bytes) -> None: ...

    def recv(self, timeout: float) -> list[bytes]: ...


@dataclass(frozen=True)
class StreamConfig:
    job_id: int
    contributor: int  # this host's id at its ToR
    window: int  # W: the job's slots per switch, each with one packet in flight
    streams: int  # hosts of the job: contributions summed by the switches
    session: int  # the run's session number, the same on every host (host_agent.session)
    local_gpus: int = 1  # carried in num_contrib
    rto: float = 0.02  # probe timer until round trips have been measured, seconds
    min_rto: float = 0.005
    max_rto: float = 1.0  # the longest a doubling probe timer waits
    deadline: float = 10.0  # seconds without any progress before giving up
    # Quorum (docs/protocol.md, "Rounds, quorum and late contributions"): a packet still
    # unanswered `patience` seconds after it was first sent, when no awaited result of the
    # call has come for `patience` seconds either, is resent with CLOSE, so that the
    # switches may complete its round with the contributions they have (if the job's quorum
    # allows). Silence, not age: a busy switch (BMv2's queue) or a loss being recovered
    # keeps answering other packets, while a host that has not sent holds up every round it
    # is in. None: never; every round waits for everyone.
    patience: float | None = None
    # Adaptive patience: with a floor set, a round waits the silence rounds completed by every
    # host have been ending (per call its longest; mean plus four deviations, as the loss
    # timer is measured), kept between `patience_min` and `patience`: no longer than a
    # normal round's spread calls for, so a straggler costs little, and never so short that
    # ordinary jitter cuts a host out. None: `patience` itself, fixed.
    patience_min: float | None = None
    # ... except in a call that follows `staleness` calls in a row whose sums left some GPU
    # out: that call waits for everyone, so no host is left out more than `staleness` times
    # in a row. Every host sees the same results, so every host decides alike.
    staleness: int = 1
    # GPUs a complete sum holds (the hosts' num_contrib added up); 0: streams * local_gpus,
    # right only if every host has as many GPUs as this one.
    total_gpus: int = 0
    # The job's pool number (JobParams.pool): its low bit is the FLAG_POOL the packets carry,
    # and it mod 128 the epoch in their version (passing.protocol.pool_epoch).
    pool: int = 0
    # The first call waits for everyone, as after `staleness` short calls: after a live pool
    # move, no host may be left out of the new pool's first rounds, since one still finishing
    # its last call in the old pool could not keep the new pool's results that arrive
    # meanwhile (host_agent.pool_move).
    wait_first: bool = False
    # Gathering results (SlotStreamer._gather): after a pass of the window's loop that took
    # few results while many packets are in flight, wait up to this long for more, so that
    # each pass takes a batch. 0: never wait.
    gather_max: float = 0.005

    @property
    def complete(self) -> int:
        return self.total_gpus or self.streams * self.local_gpus


@dataclass
class StreamStats:
    packets: int = 0
    retransmissions: int = 0  # every resend: fast_retransmissions + probes + rotated + closes
    fast_retransmissions: int = 0  # packets found lost because a later one was answered
    probes: int = 0  # resends of the newest packet after a timer period without any result
    rotated: int = 0  # older packets those probes resent in turn (SlotStreamer._probe)
    results: int = 0
    ignored: int = 0  # results that matched nothing pending (duplicates, stale)
    closes: int = 0  # packets that asked for CLOSE: `patience` of silence, or after one that did
    short_calls: int = 0  # calls whose sums left some GPU out (a round closed without it)
    taken_early: int = 0  # results taken from those that came before this host sent
    abstained: int = 0  # packets sent without values: the agreed scale left them out
    speculated: int = 0  # fragments sent at a speculative scale (no exponent packet)
    spec_missed: int = 0  # ... whose speculation did not hold: sent again
    spec_declined: int = 0  # calls after which the next of that size agrees first instead
    passes: int = 0  # passes of the window's loop that took results
    gathers: int = 0  # ... after which it waited for more (SlotStreamer._gather)
    gathered_s: float = 0.0  # ... for this long in all


def check_out(out: np.ndarray | None, n: int) -> None:
    """ValueError unless `out` is None or can take a call's `n` sums (float64, one dimension):
    a float32 one would round them silently."""
    if out is not None and (out.dtype != np.float64 or out.shape != (n,)):
        raise ValueError(f"out must be {n} float64 values in one dimension, got {out.dtype} "
                         f"of shape {out.shape}")


def handed_out(sums: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Lent sums (allreduce_view) as allreduce returns them: copied into `out` (checked by
    check_out before the call) or into a new array."""
    if out is None:
        return sums.copy()
    out[:] = sums
    return out


class _Call:
    """One allreduce's fragments, how far each slot has got through them, and the packet each
    slot is waiting on (arrays indexed by slot, so a batch of results is matched in numpy)."""

    def __init__(self, blocks: np.ndarray, local_exp: np.ndarray, window: int, streams: int,
                 tag: int, predicted: np.ndarray | None = None, out: np.ndarray | None = None):
        """`out`: where the sums go, an array of blocks' shape (zeroed here; default new)."""
        self.blocks, self.local_exp, self.tag = blocks, local_exp, tag
        self.nfrag = blocks.shape[0]
        # Slot s carries fragments s, s + used, s + 2 * used, ...; a speculating call uses
        # every slot (no exponent packets to save).
        self.used = used = P.slots_used(window, self.nfrag, speculating=predicted is not None)
        self.s_bits = fx.scale_bits(streams)
        # The exp field each fragment's values were (or are to be) quantized with.
        self.agreed = np.zeros(self.nfrag, dtype=np.uint8)
        # Speculative scale (fx.predict) per fragment, or None: exponent packets first.
        self.predicted = predicted
        # The maximum of the hosts' own exponents of each fragment: the next call's prediction.
        self.proposed = np.zeros(self.nfrag, dtype=np.uint8)
        # Per slot: its packet resends a fragment whose speculation did not hold, at the
        # proposed maximum.
        self.redo = np.zeros(used, dtype=bool)
        self.missed = 0  # fragments sent again
        if out is None:
            out = np.empty(blocks.shape)
        out.fill(0)  # a fragment no sum is written to (POISON) reads 0
        self.out = out
        self.counts = np.zeros(self.nfrag, dtype=np.int64)  # GPUs each fragment's sum holds
        # step[s]: 0 = exponent packet of fragment s, i >= 1 = fragment s + (i-1)*used;
        # speculating, i = fragment s + i*used
        self.step = np.zeros(used, dtype=np.int64)
        # The packet each slot waits on. Sequence numbers order every transmission of this
        # streamer (first_seq: the packet's first, last_seq: its latest); see
        # SlotStreamer._resend_overtaken.
        self.pending = np.zeros(used, dtype=bool)
        self.p_frag = np.zeros(used, dtype=np.int64)
        self.p_round = np.zeros(used, dtype=np.uint32)
        self.first_seq = np.zeros(used, dtype=np.int64)
        self.last_seq = np.zeros(used, dtype=np.int64)
        self.sent = np.zeros(used, dtype=np.float64)  # time of the latest transmission
        self.first_sent = np.zeros(used, dtype=np.float64)  # ... and of the first
        self.close = np.zeros(used, dtype=bool)  # patience ran out: its resends carry CLOSE
        # The slot's packet waited the whole patience for the others (it asked for CLOSE then),
        # and, per slot, whether its next packet asks for CLOSE when first sent (see _send).
        self.waited = np.zeros(used, dtype=bool)
        self.close_next = np.zeros(used, dtype=bool)
        self.quorum = False  # this call may close rounds without everyone (patience applies)
        self.abstaining = np.zeros(used, dtype=bool)  # its packet abstains: it may not CLOSE
        self.eager = False  # ... and asks for CLOSE in every packet, at once (see _send)
        self.resent = np.zeros(used, dtype=bool)
        # ... resent other than in a probe's turn through the older packets: its round waited
        # for the others, or for a loss, or asked for CLOSE (what adaptive patience skips).
        self.retried = np.zeros(used, dtype=bool)
        self.probed = np.zeros(used, dtype=bool)  # the latest transmission was a probe
        # The first send of the older packet a probe resent last (SlotStreamer._probe); -1
        # after any result: a new silence starts with the oldest waiting packet.
        self.rotation = -1
        # Each slot's packet as sent (kept for a resend): the fields no packet of the call
        # changes are filled in once (SlotStreamer._header), the rest per send (_send).
        self.payloads = np.zeros(used, dtype=packet.PAYLOAD_DTYPE)
        # The compiled window's context for this call (host_agent.window_c), or None: numpy.
        self.ctx: np.ndarray | None = None

    def fragments(self, slots: np.ndarray) -> np.ndarray:
        """The fragment each of `slots` is at (for an exponent packet, the one it announces)."""
        st = self.step[slots]
        if self.predicted is not None:
            return slots + st * self.used
        return np.where(st == 0, slots, slots + (st - 1) * self.used)

    def speculating(self, slots: np.ndarray) -> np.ndarray:
        """Whether each of `slots`' next packet is at a speculative scale (not a resend of a
        fragment that missed)."""
        if self.predicted is None:
            return np.zeros(slots.size, dtype=bool)
        return ~self.redo[slots]

    def tags(self, slots: np.ndarray, frag: np.ndarray) -> np.ndarray:
        """The tag of each of `slots`' next packet: the call's, with TAG_LAST on the slot's
        last packet of the call (what tells a late host the others' call ended there)."""
        last = frag + self.used >= self.nfrag
        if self.predicted is None:
            last &= self.step[slots] > 0  # an exponent packet is followed by the values
        return np.where(last, self.tag | TAG_LAST, self.tag)

    def values_and_exponents(self, slots: np.ndarray, frag: np.ndarray
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The next packet of each slot: fragment `frag` quantized with its agreed exponent
        (zeros in an exponent packet, or once a host reported NaN/Inf), the exponent it
        proposes: this host's of the fragment itself (exponent packet) or of the slot's next
        fragment (0 after the last), and whether it abstains: its values do not fit the
        agreed scale (a round closed by a quorum left its proposal out), so it sends zeros
        that count for no GPU rather than values that would overflow the sum."""
        st = self.step[slots]
        own = self.local_exp[frag]
        if self.predicted is not None:
            # Speculating, each packet proposes its own fragment's exponent.
            scale = np.where(self.redo[slots], self.agreed[frag], self.predicted[frag])
            data = scale != fx.POISON
            # A host with NaN/Inf (its blocks zeroed, its proposal POISON) sends zeros for its
            # GPUs, as when agreeing first: the round's POISON fails the call everywhere, and
            # its counts say nothing of a GPU left out.
            abstain = data & (own > scale) & (own != fx.POISON)
        else:
            scale = self.agreed[frag]
            data = (st > 0) & (scale != fx.POISON)
            abstain = data & (own > scale)
        data &= ~abstain
        if data.all():  # (the usual batch: no mask to copy through)
            values = fx.quantize(self.blocks[frag], scale, self.s_bits)
        else:
            values = np.zeros((slots.size, P.K), dtype=np.int32)
            if data.any():
                values[data] = fx.quantize(self.blocks[frag[data]], scale[data], self.s_bits)
        if self.predicted is not None:
            return values, own, abstain
        nxt = frag + self.used
        ahead = self.local_exp[np.minimum(nxt, self.nfrag - 1)]
        exp = np.where(st == 0, self.local_exp[slots], np.where(nxt < self.nfrag, ahead, 0))
        return values, exp, abstain

    def absorb(self, slots: np.ndarray, frags: np.ndarray, recs: np.ndarray) -> np.ndarray:
        """Take the results `recs` of `slots` (at fragments `frags`): an exponent packet's
        result is the fragment's agreed exponent, a value packet's the fragment's sum and the
        agreed exponent of the slot's next fragment. Returns the slots that have another
        fragment to send."""
        if self.predicted is not None:
            return self._absorb_speculated(slots, frags, recs)
        agreed, nfrag, used = self.agreed, self.nfrag, self.used
        first = self.step[slots] == 0
        agreed[frags[first]] = recs["exp"][first]
        rest = ~first
        self.counts[frags[rest]] = recs["num_contrib"][rest]
        data = rest & (agreed[frags] != fx.POISON)
        if data.all():  # (the usual batch: no mask to copy through)
            self.out[frags] = fx.dequantize(recs["values"], agreed[frags], self.s_bits)
        elif data.any():
            self.out[frags[data]] = fx.dequantize(recs["values"][data], agreed[frags[data]],
                                                  self.s_bits)
        ahead = rest & (frags + used < nfrag)
        agreed[frags[ahead] + used] = recs["exp"][ahead]
        self.step[slots] += 1
        return slots[slots + (self.step[slots] - 1) * used < nfrag]

    def _absorb_speculated(self, slots: np.ndarray, frags: np.ndarray, recs: np.ndarray
                           ) -> np.ndarray:
        """absorb, speculating: a result whose proposed maximum the prediction covers (and
        not by more than SPEC_SLACK) is the fragment's sum; otherwise the slot sends the
        fragment again, quantized at that maximum, and that result is the sum."""
        agreed, most = self.agreed, recs["exp"]
        redo = self.redo[slots]
        predicted = self.predicted[frags]
        holds = ~redo & fx.speculation_holds(predicted, most)
        if holds.all():  # (the usual batch: every speculation held, no mask to copy through)
            self.proposed[frags] = most
            agreed[frags] = scale = np.where(most == fx.POISON, fx.POISON, predicted)
            self.counts[frags] = recs["num_contrib"]
            data = scale != fx.POISON
            if data.all():
                self.out[frags] = fx.dequantize(recs["values"], scale, self.s_bits)
            elif data.any():
                self.out[frags[data]] = fx.dequantize(recs["values"][data], scale[data],
                                                      self.s_bits)
            self.step[slots] += 1
            return slots[slots + self.step[slots] * self.used < self.nfrag]
        self.proposed[frags[~redo]] = most[~redo]
        agreed[frags[holds]] = np.where(most[holds] == fx.POISON, fx.POISON,
                                        self.predicted[frags[holds]])
        missed = ~redo & ~holds
        agreed[frags[missed]] = most[missed]
        done = ~missed
        self.counts[frags[done]] = recs["num_contrib"][done]
        data = done & (agreed[frags] != fx.POISON)
        if data.any():
            self.out[frags[data]] = fx.dequantize(recs["values"][data], agreed[frags[data]],
                                                  self.s_bits)
        self.redo[slots] = missed
        self.missed += int(missed.sum())
        self.step[slots[done]] += 1
        return slots[missed | (slots + self.step[slots] * self.used < self.nfrag)]

    def exponents(self) -> np.ndarray:
        """What the call's fragments proposed at most: the prediction of the next call of
        this size."""
        return self.proposed if self.predicted is not None else self.agreed


# A packet's tag: the call's number modulo TAG_CALLS, and TAG_LAST on its slot's last packet of
# the call.
TAG_CALLS = 128
TAG_LAST = 0x80
_TAG_CALL = TAG_LAST - 1
# The sessions' exponents kept for speculation: those of the last call of each of this many
# fragment counts (an all-reduce of every bucket of a model, each its own size).
_SCALES_KEPT = 64



def _prediction(kept: tuple[np.ndarray, bool] | None) -> np.ndarray | None:
    """The speculative scale of a call of a size kept in `SlotStreamer.scales`, or None:
    the call agrees on exponents first."""
    return fx.predict(kept[0]) if kept is not None and kept[1] else None


def _next_scales(kept: tuple[np.ndarray, bool] | None, exps: np.ndarray, window: int
                 ) -> tuple[np.ndarray, bool] | None:
    """What a call of n fragments that proposed `exps` leaves for the next call of n (`kept`:
    what the one before it left) on a `window`-slot pool: None after NaN/Inf (nothing to
    predict from), else its exponents and whether the next speculates. It does unless
    speculating on this call (from `kept`) would have missed as many fragments as a call of n
    that agrees first uses slots (P.slots_used), or more: each miss costs a packet, and
    agreeing first costs one per such slot. A gradient whose blocks' magnitudes jump from
    step to step is then summed as without speculation; every host decides alike (the
    exponents are the results')."""
    if np.any(exps == fx.POISON):
        return None
    if kept is None:
        return exps.copy(), True
    missed = np.count_nonzero(~fx.speculation_holds(fx.predict(kept[0]), exps))
    return exps.copy(), bool(missed < P.slots_used(window, exps.size))


# Results kept for rounds not sent yet: a whole large call's worth (4M values at K=64).
_EARLY_MAX = 1 << 16
_DRAIN_POLL = 0.005  # seconds the reader between calls waits for a datagram at a time
# SlotStreamer._gather: with at least _GATHER_IN_FLIGHT packets in flight, a pass that took
# fewer than an _GATHER_SHARE-th of them waits for more, at most a _GATHER_DRAIN-th of the
# time they spend in queues; never less than _GATHER_MIN_S (a shorter sleep overshoots by
# more than itself: the kernel's timer slack is 50 us).
_GATHER_IN_FLIGHT, _GATHER_SHARE, _GATHER_DRAIN, _GATHER_MIN_S = 32, 8, 4, 0.0002
# Results after a call's first that measure its pace (_pace): fewer may have come in one burst.
_RATE_RESULTS = 16
# A short call makes the next one eager (every packet asks for CLOSE when first sent) only when
# at least _EAGER_EVIDENCE of the last _EAGER_HISTORY streaks began with a host late for a call
# that waited the patience (SlotStreamer.late_starts).
_EAGER_HISTORY, _EAGER_EVIDENCE = 4, 2


def _median(a: np.ndarray) -> float:
    """np.median of a non-empty 1-d array, without its generic machinery (it runs on every
    batch of results)."""
    d = np.sort(a)
    n = d.size
    return float(d[n // 2]) if n % 2 else float((d[n // 2 - 1] + d[n // 2]) / 2)


def _first_of_each(idx: np.ndarray, key: np.ndarray) -> np.ndarray:
    """`idx` without the entries whose `key` an earlier entry has, in order (np.unique's
    first occurrences, without its generic machinery: it runs on every batch of results)."""
    if idx.size < 2:
        return idx
    order = np.argsort(key, kind="stable")
    ranked = key[order]
    repeat = np.zeros(idx.size, dtype=bool)
    repeat[order[1:]] = ranked[1:] == ranked[:-1]
    return idx[~repeat] if repeat.any() else idx


def _records(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Datagram rows as PASSING records, and each one's slot as an index."""
    recs = np.ascontiguousarray(rows).view(packet.PAYLOAD_DTYPE).ravel()
    return recs, recs["slot"].astype(np.int64)


class SlotStreamer:
    def __init__(self, cfg: StreamConfig, transport: Transport):
        self.cfg = cfg
        self.transport = transport
        self._scratch = Scratch()  # the blocks and sums of a call, kept for the next
        self.rounds = np.zeros(cfg.window, dtype=np.uint32)
        self.calls = 0
        # By fragment count, the exponents the session's last call of that many fragments
        # proposed and whether the next such call speculates (_next_scales; every host keeps
        # the same: they come from the results), least recently used first.
        self.scales: OrderedDict[int, tuple[np.ndarray, bool]] = OrderedDict()
        self.last_n: int | None = None  # values in this host's previous call
        self.stats = StreamStats()
        # Round-trip estimate (TCP's, RFC 6298): the probe timer follows the switch's queueing
        # delay.
        self.srtt: float | None = None
        self.rttvar = 0.0
        # The least round trip of a result taken without a pause before it (_gather): the
        # path's own, without queues.
        self.min_rtt: float | None = None
        # The last call's pace of results per second (_pace): how fast a new call's first
        # window should come back (_probe_period).
        self.rate: float | None = None
        self._paused = False  # the last receive followed a pause (its samples are late)
        self.rto = cfg.rto
        self._seq = 0  # numbers every transmission, in order (see _resend_overtaken)
        self.broken: str | None = None  # why this session cannot be used any more
        # Results of rounds this host has not sent yet, by (slot, round): the others closed
        # them without it, and the multicast brought them early (a late host takes them
        # instead of sending: the switch may have left those rounds behind).
        self.early: dict[tuple[int, int], np.void] = {}
        # Calls in a row whose sums left some GPU out.
        self.short_streak = cfg.staleness if cfg.wait_first else 0
        # The last call was short, and hosts were late at the start of enough streaks of
        # calls before it: the next closes its rounds as soon as the quorum is in.
        self.eager = False
        # Per streak, for the last _EAGER_HISTORY: whether the call that waited the patience
        # after a call with everyone (the first of a streak of short calls, or one more call
        # with everyone) was short. The evidence of a host that keeps coming late, as against
        # one late step, however many calls that step makes.
        self.late_starts: deque[bool] = deque(maxlen=_EAGER_HISTORY)
        # The longest silence per call that rounds completed by every host ended (mean, mean
        # deviation over calls): what adaptive patience follows.
        self.wait_avg: float | None = None
        self.wait_dev = 0.0
        # Between calls a host may be late (computing) while the others' results arrive: in
        # quorum mode a thread keeps reading them into `early`, so that no socket buffer
        # limits how late a host may be (docs/protocol.md, "Rounds, quorum and late
        # contributions"). A call holds `_io`; the thread reads only between calls.
        self._io = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = threading.Event()
        self._drain_stop = threading.Event()  # back to waiting for everyone (set_policy)
        self._drainer: threading.Thread | None = None
        # Checked before the reader thread starts, so that a bad configuration leaves nothing
        # running.
        if not 0 < cfg.window <= 1 << 16:
            raise ValueError(f"window {cfg.window}: 1..65536 slots (a packet's slot field is "
                             "16 bits)")
        if not 0 <= cfg.pool <= 0x7FFFFFFF:
            raise ValueError(f"pool {cfg.pool}: a pool number, 0..2^31-1 (JobParams.pool)")
        self._pool_flag = int(P.Flag.POOL) if cfg.pool & 1 else 0
        self._result_flags = int(P.Flag.RESULT) | self._pool_flag
        self._epoch_bits = P.version_of(cfg.pool, 0)
        if not 0 < cfg.session < 1 << 64:
            raise ValueError(f"session {cfg.session}: a non-zero 64-bit number "
                             "(host_agent.session.new_session)")
        # What every packet of this host's stream carries alike, checked once here rather than
        # per batch: the fields _send leaves as they are.
        self._header = self._fixed_header(cfg)
        if cfg.patience is not None:
            self._start_reading()
        # The compiled window (host_agent.window_c), or None: numpy for every call.
        self._compiled = window_c.load()
        self._counts = np.zeros(0, dtype=np.int64)  # GPUs in each fragment of the last sum
        self._counts_n = 0  # ... of its values
        self._last_counts: np.ndarray | None = None

    def _sample_rtt(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(max(self.srtt + 4 * self.rttvar, self.cfg.min_rto), self.cfg.max_rto)

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
        # float32 values stay float32 until quantized (per batch, in float64): half the memory
        # to fill and scan; anything else is kept as float64, exactly.
        blocks = self._scratch.get("blocks", (nfrag, P.K), np.float32
                                   if flat.dtype == np.float32 else np.float64)
        local_error = None
        try:
            fx.check_finite(flat)
            blocks.ravel()[:n] = flat
            blocks.ravel()[n:] = 0  # the last block's padding: the last call's values
            # An all-zero block proposes 0: a speculative sum whose maximum is 0 is exactly
            # zero, whatever its scale (fx.speculation_holds).
            local_exp = fx.block_exponents(blocks)
        except (fx.NonFiniteError, ValueError) as e:
            # The message, not the exception: its traceback holds this frame, and the cycle
            # would keep the caller's process groups (and their gloo threads) alive until a
            # garbage collection, possibly one at interpreter exit, where a gloo thread
            # releasing a tensor aborts the process.
            local_error = str(e)
            blocks[:] = 0
            local_exp = np.full(nfrag, fx.POISON, dtype=np.uint8)
        self.last_n = n
        if self.broken is not None:
            raise SessionBroken(f"job {self.cfg.job_id}: session {self.cfg.session:#x} failed "
                                f"earlier ({self.broken}); start a new session")
        try:
            with self._holding_io():
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
        with self._holding_io():
            # Tags repeat every TAG_CALLS calls: no further, or "a slot beyond the call holds
            # a result of the same call" could match a later one.
            return self._ready(nfrag, min(most, TAG_CALLS - 1))

    @contextlib.contextmanager
    def _holding_io(self) -> Iterator[None]:
        """Hold the socket and `early` against the reader thread, which lets go of `_io` once
        it sees this host is not idle (a lock alone would let it take `_io` back every poll)."""
        self._idle.clear()
        try:
            with self._io:
                yield
        finally:
            self._idle.set()

    def _ready(self, nfrag: int, most: int) -> int:
        rounds = [int(r) for r in self.rounds]
        kept = self.scales.get(nfrag)
        ready = 0
        while ready < most:
            tag = (self.calls + ready) % TAG_CALLS
            predicted = _prediction(kept)
            used = P.slots_used(self.cfg.window, nfrag, speculating=predicted is not None)
            for s in range(used, self.cfg.window):  # a larger call would use them too
                rec = self.early.get((s, rounds[s]))
                if rec is not None and int(rec["tag"]) & _TAG_CALL == tag:
                    return ready
            exps = np.zeros(nfrag, dtype=np.uint8)
            for s in range(used):
                walked = self._walk_slot(s, rounds[s], nfrag, used, tag, predicted, exps)
                if walked is None:
                    return ready
                rounds[s] = walked
            kept = _next_scales(kept, exps, self.cfg.window)
            ready += 1
        return ready

    def _walk_slot(self, s: int, round_: int, nfrag: int, used: int, tag: int,
                   predicted: np.ndarray | None, exps: np.ndarray) -> int | None:
        """The kept results of slot `s` from round `round_` on, as one call of `nfrag`
        fragments would use them (filling `exps` with what it proposed): the round after
        its last, or None if they do not make up such a call."""
        def take(frag: int) -> np.void | None:
            nonlocal round_
            rec = self.early.get((s, round_ & 0xFFFFFFFF))
            round_ += 1
            if rec is None or int(rec["tag"]) & _TAG_CALL != tag or int(rec["frag"]) != frag:
                return None
            return rec

        rec = None
        if predicted is None:
            rec = take(s)  # the exponent packet
            if rec is None:
                return None
            exps[s] = rec["exp"]
        for frag in range(s, nfrag, used):
            rec = take(frag)
            if rec is None:
                return None
            most = rec["exp"]
            if predicted is None:
                if frag + used < nfrag:
                    exps[frag + used] = most
                continue
            exps[frag] = most
            if not fx.speculation_holds(predicted[frag], most):
                rec = take(frag)  # sent again at the maximum
                if rec is None:
                    return None
        if not int(rec["tag"]) & TAG_LAST:
            return None  # the slot goes on: the others' call is larger
        return round_

    # -- the window ---------------------------------------------------------------------------
    def _run(self, blocks: np.ndarray, local_exp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every fragment of `blocks` through the switch: (sums, agreed exponents)."""
        call = _Call(blocks, local_exp, self.cfg.window, self.cfg.streams,
                     self.calls % TAG_CALLS, _prediction(self.scales.get(blocks.shape[0])),
                     out=self._scratch.get("sums", blocks.shape, np.float64))
        call.payloads[:] = self._header
        call.payloads["slot"] = np.arange(call.used)
        self.calls += 1
        forced = self.short_streak >= self.cfg.staleness
        after_complete = self.short_streak == 0
        # Someone was left out too often: this call waits for everyone.
        patience = None if forced else self.patience_now()
        call.quorum = patience is not None
        call.eager = call.quorum and self.eager
        # The compiled window copies the call's fields (quorum, eager) into its context: made
        # once they are final. Adaptive patience measures waits before absorbing
        # (_longest_wait): numpy then.
        if self._compiled is not None and self.cfg.patience_min is None:
            call.ctx = self._compiled.context(call, self)
        self._launch(call, np.arange(call.used, dtype=np.int64))
        # Loss recovery (docs/protocol.md, "Loss recovery"): `mark` is the newest first
        # transmission known to have been summed by every host; a packet last sent before it
        # and still unanswered was lost. Silence is answered by one probe per timer period.
        mark = -1
        last_progress = probe_ref = started = time.monotonic()
        probes = taken = 0
        results0 = self.stats.results
        longest: float | None = None  # the call's longest silence that every host made
        # The probe timer's period, set anew at each result, from the pace of results since
        # the call's first (first_at, after first_n of them).
        period = self._probe_period(call, None, answered=False)
        first_at: float | None = None
        first_n = 0
        while call.pending.any():
            wake = self._probe_due(probe_ref, probes, period)
            if patience is not None:
                waiting = call.pending & ~call.close & ~call.abstaining
                if waiting.any():
                    wake = min(wake, max(float(call.first_sent[waiting].min()),
                                         last_progress) + patience)
            if taken:
                self._gather(call, taken, self.stats.results - results0, started, wake)
            rows, other = self._receive(max(wake - time.monotonic(), 0.0))
            if call.ctx is not None:
                slots, newest, more = self._take(rows, other, call)
            else:
                slots, newest, more, wait = self._take_numpy(
                    rows, other, call, None if self.cfg.patience_min is None else
                    (forced, last_progress))
                if wait is not None:
                    longest = wait if longest is None else max(longest, wait)
            taken = slots.size
            now = time.monotonic()
            if slots.size:
                self.stats.passes += 1
                last_progress = probe_ref = now
                probes = 0
                call.rotation = -1
                mark = max(mark, newest)
                if more.size:
                    self._launch(call, more)
                self._resend_overtaken(call, mark, now)
                got = self.stats.results - results0
                if first_at is None:
                    first_at, first_n = now, got
                period = self._probe_period(call, self._pace(got - first_n, now - first_at),
                                            answered=True)
            if not call.pending.any():
                break
            if patience is not None and now - last_progress >= patience:
                self._close_overdue(call, now, patience)
            if now - last_progress > self.cfg.deadline:
                raise self._timeout(call)
            if now >= self._probe_due(probe_ref, probes, period):
                self._probe(call, now)
                probes = min(probes + 1, 30)
                probe_ref = now
        if first_at is not None:
            pace = self._pace(self.stats.results - results0 - first_n,
                              time.monotonic() - first_at)
            if pace is not None:
                self.rate = pace
        if longest is not None:
            self._learn_wait(longest)
        self._keep_scales(call)
        self._counts = call.counts
        short = bool(np.any(call.counts < self.cfg.complete))
        self.short_streak = self.short_streak + 1 if short else 0
        if call.quorum and after_complete:  # (an eager call never follows a complete one)
            self.late_starts.append(short)
        # A host late for one step (jitter, a busy machine), in however many calls, leaves
        # the calls after it waiting the patience again; only a host late at the start of
        # more streaks makes the next call close at once (docs/protocol.md, "Quorum"). Every
        # host reads the same counts, so all agree.
        self.eager = short and sum(self.late_starts) >= _EAGER_EVIDENCE
        self.stats.short_calls += short
        return call.out, call.agreed

    def _keep_scales(self, call: _Call) -> None:
        """Keep what the call proposed, for the next call of its size (_next_scales)."""
        if call.predicted is not None:
            self.stats.speculated += call.nfrag
            self.stats.spec_missed += call.missed
        kept = _next_scales(self.scales.pop(call.nfrag, None), call.exponents(), self.cfg.window)
        if kept is not None:
            self.stats.spec_declined += not kept[1]
            self.scales[call.nfrag] = kept
            while len(self.scales) > _SCALES_KEPT:
                self.scales.popitem(last=False)

    def _gather(self, call: _Call, taken: int, results: int, started: float,
                wake: float) -> None:
        """After a pass that took `taken` results (`results` in the call so far, which began
        at `started`): sleep while more arrive, if few came and many packets are in flight.
        A pass of the loop costs about the same 0.15 ms of numpy calls for one result as for
        a hundred; results come at the pace of the slowest link or switch, often a few at a
        time, and a pass per few results spends the host's CPU on that fixed cost (on a
        machine the switches share, theirs too). The pause must not leave a link idle, so it
        is taken only from time the packets in flight spend waiting in queues: by Little's
        law they come back in in_flight / rate seconds, of which the path's own round trip
        (min_rtt) is not queueing; a window that only fills the path (no queue) never
        waits. At most a quarter of that, a quarter of the call so far and `gather_max`, at
        least _GATHER_MIN_S, and never past `wake` (a probe or the patience). Loss is found
        by the order results come in, not by time, so a pause cannot make a packet look
        lost. With fewer than _GATHER_IN_FLIGHT packets in flight (a small call, or a call's
        last packets) every result is taken at once."""
        limit = self.cfg.gather_max
        if limit <= 0 or results <= 0 or self.min_rtt is None:
            return
        in_flight = int(np.count_nonzero(call.pending))
        if in_flight < _GATHER_IN_FLIGHT or taken * _GATHER_SHARE >= in_flight:
            return
        now = time.monotonic()
        elapsed = now - started
        # Results per second since the first could have come back.
        rate = results / max(elapsed - self.min_rtt, 1e-6)
        queued = in_flight / rate - self.min_rtt
        pause = min(min(queued, elapsed) / _GATHER_DRAIN, limit, wake - now)
        if pause < _GATHER_MIN_S:
            return
        time.sleep(pause)
        self.stats.gathers += 1
        self.stats.gathered_s += time.monotonic() - now
        self._paused = True

    def patience_now(self) -> float | None:
        """How long a packet waits in silence (no awaited result of the call) for the other
        hosts before it asks for CLOSE (None: always waits)."""
        cfg = self.cfg
        if cfg.patience is None or cfg.patience_min is None or self.wait_avg is None:
            return cfg.patience
        return min(max(self.wait_avg + 4 * self.wait_dev, cfg.patience_min), cfg.patience)

    def _longest_wait(self, call: _Call, slots: np.ndarray, recs: np.ndarray, now: float,
                      forced: bool, progress: float) -> float | None:
        """The slowest wait among results of rounds that every host made in time, sent once
        (Karn): a CLOSE is a resend, so rounds a quorum closed never count. A wait is what
        patience is compared with: the silence the result ended, since the later of the
        packet's first send and the result before (`progress`). None: nothing to measure.
        In a call that waited for everyone (the staleness bound), a slot's first round
        waited for the straggler to arrive and does not count either; its later rounds
        started together on every host and do. Without that, a host that is always late
        would leave nothing to measure and the patience at its upper bound."""
        # A probe's turn through the older packets resends every packet that waits long
        # enough (a late host's lateness included): such resends do not hide a wait.
        full = ~call.retried[slots] & (recs["num_contrib"].astype(np.int64)
                                       >= self.cfg.complete)
        if forced:
            full &= call.step[slots] > 0
        if not full.any():
            return None
        return now - max(float(np.min(call.first_sent[slots[full]])), progress)

    def _learn_wait(self, wait: float) -> None:
        """One sample per call, its longest silence: most silences of a call are the gaps
        between one result and the next, and learning from each would sink the patience to
        its floor, below the wait at a call's start (the hosts' skew, the first round trip),
        which is the one a late host must exceed."""
        if self.wait_avg is None:
            self.wait_avg, self.wait_dev = wait, wait / 2
        else:
            self.wait_dev = 0.75 * self.wait_dev + 0.25 * abs(self.wait_avg - wait)
            self.wait_avg = 0.875 * self.wait_avg + 0.125 * wait

    def _close_overdue(self, call: _Call, now: float, patience: float) -> None:
        """Packets that waited `patience` for the others: resent with CLOSE, once each (their
        later resends carry it too)."""
        due = np.flatnonzero(call.pending & ~call.close & ~call.abstaining
                             & (now - call.first_sent >= patience))
        if due.size:
            call.close[due] = call.waited[due] = True
            self._resend(call, due, now, probe=False)
            self.stats.closes += due.size

    def _probe_due(self, since: float, probes: int, period: float) -> float:
        """When silence since `since` calls for a probe: `period`, doubled per probe sent."""
        return since + min(period * (1 << probes), self.cfg.max_rto)

    def _pace(self, results: int, span: float) -> float | None:
        """Results per second, from `results` that came within `span` seconds after a call's
        first; None when too few to tell a pace from a burst: fewer than _RATE_RESULTS, or
        within min_rto (or two round trips)."""
        if results < _RATE_RESULTS or span < max(self.cfg.min_rto, 2 * (self.min_rtt or 0.0)):
            return None
        return results / span

    def _probe_period(self, call: _Call, pace: float | None, answered: bool) -> float:
        """How long silence after a result (or the call's start, before any: not `answered`)
        may last before it calls for a probe: the time the packets still in flight should
        take now. By Little's law they come back in in_flight / rate seconds beyond the
        path's own round trip (min_rtt), at this call's `pace` of results (since its first;
        _pace) or, before it can be told, the last call's: twice that, at least min_rto.
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
            return max(self.rto, self.cfg.rto)
        in_flight = max(int(np.count_nonzero(call.pending)), 1)
        period = 2 * ((self.min_rtt or 0.0) + in_flight / rate)
        if not answered:
            period = max(period, self.rto)
        return min(max(period, self.cfg.min_rto), self.cfg.max_rto)

    def _next_seq(self, n: int) -> np.ndarray:
        seq = np.arange(self._seq, self._seq + n, dtype=np.int64)
        self._seq += n
        return seq

    def _launch(self, call: _Call, slots: np.ndarray) -> None:
        """Send the next packet of each of `slots`, except where its result came early (the
        others closed that round without this host): such a slot takes the result as if
        answered and goes on to its next packet, in turn."""
        if not self.early:  # (the usual case: no dictionary look-up per slot)
            self._send(call, slots)
            return
        while slots.size:
            hits = []
            for s in slots.tolist():
                rec = self.early.pop((s, int(self.rounds[s])), None)
                if rec is not None and int(rec["tag"]) & _TAG_CALL == call.tag \
                        and int(rec["frag"]) == int(call.fragments(np.array([s]))[0]):
                    hits.append((s, rec))
            if not hits:
                self._send(call, slots)
                return
            taken = np.array([s for s, _ in hits], dtype=np.int64)
            self._send(call, np.setdiff1d(slots, taken))
            recs = np.array([rec for _, rec in hits], dtype=packet.PAYLOAD_DTYPE)
            self.rounds[taken] += np.uint32(1)
            self.stats.taken_early += taken.size
            slots = call.absorb(taken, recs["frag"].astype(np.int64), recs)

    def _send(self, call: _Call, slots: np.ndarray) -> None:
        """Build the next packet of each of `slots` in one vectorized batch and send them."""
        if not slots.size:
            return
        if call.ctx is not None:
            abstained, closes = self._compiled.send(call.ctx, slots, self._seq)
            self._seq += slots.size
            self.stats.abstained += abstained
            self.stats.closes += closes
            self._transmit(packet.payload_rows(call.payloads[slots]))
            call.sent[slots] = call.first_sent[slots] = time.monotonic()
            self.stats.packets += slots.size
            return
        cfg = self.cfg
        frag = call.fragments(slots)
        values, exp, abstain = call.values_and_exponents(slots, frag)
        self.stats.abstained += int(abstain.sum())
        rounds = self.rounds[slots]
        # A slot whose previous round waited the whole patience and closed without some host
        # asks for CLOSE at once: that host is late for this round too, unless it catches up
        # before the quorum is in. Only once: the round after waits again, so a host that was
        # only a little late (jitter) is not cut from every later round of the call. In an
        # eager call (one after a short call, when hosts were late at the start of other
        # streaks too: see _run), every packet asks at once (docs/protocol.md, "Rounds,
        # quorum and late contributions"), until a call completes with everyone: at the
        # latest the one the staleness bound makes wait.
        # Never from a packet that abstains: the switch counts it towards the quorum, and a
        # round it closed would hold one host fewer than the quorum promises. Except at a
        # speculative scale: counted, its proposal (above the prediction) makes the round
        # miss, so no sum of it stands, and the fragment goes again at a scale it fits.
        holds_back = abstain & ~call.speculating(slots)
        close = (call.close_next[slots] | call.eager) & call.quorum & ~holds_back
        call.abstaining[slots] = holds_back
        # The slots' packets, their fixed fields as the call began (job, slot, contributor,
        # session), the rest set here; every value fits its field by construction (rounds
        # are uint32, fragments fewer than 2**32 (allreduce), exponents uint8).
        batch = call.payloads[slots]
        batch["flags"] = np.where(close, int(P.Flag.CONTRIB | P.Flag.CLOSE),
                                  int(P.Flag.CONTRIB)) | self._pool_flag
        batch["version"] = self._epoch_bits | (rounds & 1)
        batch["round"] = rounds
        batch["frag"] = frag
        batch["num_contrib"] = np.where(abstain, 0, cfg.local_gpus)
        batch["exp"] = exp
        batch["tag"] = call.tags(slots, frag)
        batch["values"] = values
        call.payloads[slots] = batch  # kept for a resend
        seq = self._next_seq(slots.size)
        call.pending[slots] = True
        call.p_frag[slots] = frag
        call.p_round[slots] = rounds
        call.first_seq[slots] = seq
        call.last_seq[slots] = seq
        call.resent[slots] = call.retried[slots] = False
        call.probed[slots] = False
        call.close[slots] = close
        call.waited[slots] = False
        self.stats.closes += int(close.sum())
        self._transmit(packet.payload_rows(batch))
        call.sent[slots] = call.first_sent[slots] = time.monotonic()
        self.stats.packets += slots.size

    def _transmit(self, rows: np.ndarray) -> None:
        """Each row one datagram, in order: in one batch where the transport takes batches."""
        send_rows = getattr(self.transport, "send_rows", None)
        if send_rows is not None:
            send_rows(rows)
        else:
            for row in rows:
                self.transport.send(row.tobytes())

    @staticmethod
    def _fixed_header(cfg: StreamConfig) -> np.void:
        """One payload record with the fields every packet of `cfg`'s stream carries alike
        (values zero); ValueError if one does not fit its field."""
        try:
            return packet.pack_batch(np.zeros((1, P.K), dtype=np.int32), pool=cfg.pool,
                                     job_id=cfg.job_id, contributor=cfg.contributor,
                                     num_contrib=cfg.local_gpus, session=cfg.session)[0]
        except packet.ProtocolError as e:
            raise ValueError(f"stream config: {e} (job_id goes in the job_id field, "
                             "contributor in contributor, local_gpus in num_contrib)") from None

    def _resend(self, call: _Call, slots: np.ndarray, now: float, probe: bool,
                rotated: bool = False) -> None:
        """Send the packets `slots` wait on again, marked RETRANS (and CLOSE once their
        patience ran out); `rotated`: in a probe's turn through the older packets."""
        flags = int(P.Flag.CONTRIB | P.Flag.RETRANS) | self._pool_flag
        batch = call.payloads[slots]
        batch["flags"] = np.where(call.close[slots], flags | int(P.Flag.CLOSE), flags)
        self._transmit(packet.payload_rows(batch))
        call.last_seq[slots] = self._next_seq(slots.size)
        call.sent[slots] = now
        call.resent[slots] = True
        if not rotated:
            call.retried[slots] = True
        call.probed[slots] = probe
        self.stats.retransmissions += slots.size
        self.stats.packets += slots.size

    def _resend_overtaken(self, call: _Call, mark: int, now: float) -> None:
        """Fast recovery: every host sends a call's packets in the same order, and links and
        switches keep each port's order, so a slot completes only after every slot sent before
        it. A packet whose latest transmission precedes `mark` and that is still unanswered
        was therefore lost (its contribution, another host's, or its result): resend it now,
        not after a timer."""
        lost = np.flatnonzero(call.pending & (call.last_seq < mark))
        if lost.size:
            self._resend(call, lost, now, probe=False)
            self.stats.fast_retransmissions += lost.size

    def _probe(self, call: _Call, now: float) -> None:
        """No result for a timer period: resend the newest packet, and the next few older
        ones in turn. The newest's answer, once it comes, settles every older packet
        (_resend_overtaken).

        The older ones are needed because after two losses each host's newest packet may be
        waiting for another host (one that lost the result of an older round of that slot, or
        its own contribution to it), while what that host lost is an older packet its own
        probe of the newest never resends. So each probe also resends the oldest waiting
        packets not yet resent in this silence, an eighth of those waiting (at least one):
        within eight silent periods every packet a host waits on has been resent once, and
        the turn starts again. A host that is merely slow costs the others 1 + W/8 packets per
        (doubling) period, not the whole window each time. The older packets' answers count
        as ordinary ones (not `probed`): an old packet's result may come back while newer ones
        still wait for a slow host, which are not lost."""
        waiting = np.flatnonzero(call.pending)
        order = waiting[np.argsort(call.first_seq[waiting])]
        newest, older = order[-1], order[:-1]
        self._resend(call, np.array([newest]), now, probe=True)
        self.stats.probes += 1
        if not older.size:
            return
        turn = older[call.first_seq[older] > call.rotation]
        if not turn.size:
            turn = older  # every older packet was resent once in this silence: again
        share = -(-waiting.size // 8)
        turn = turn[:share]
        self._resend(call, turn, now, probe=False, rotated=True)
        self.stats.rotated += turn.size
        call.rotation = int(call.first_seq[turn[-1]])

    def _timeout(self, call: _Call) -> SwitchTimeout:
        waiting = np.flatnonzero(call.pending)[:5].tolist()
        return SwitchTimeout(
            f"job {self.cfg.job_id}: no result from the switch for {self.cfg.deadline:.1f}s "
            f"(slots {waiting} waiting, {self.stats.retransmissions} retransmissions): "
            "another host of the job stopped, restarted or is in another session, "
            "or the switch is down")

    def _receive(self, timeout: float) -> tuple[np.ndarray, int]:
        """Datagrams of the payload size as (n, PAYLOAD_BYTES) rows, and how many others."""
        recv_rows = getattr(self.transport, "recv_rows", None)
        if recv_rows is not None:
            return recv_rows(timeout)
        return packet.rows_of(self.transport.recv(timeout))

    def _start_reading(self) -> None:
        self._drainer = threading.Thread(target=self._drain, daemon=True,
                                         name=f"passing-drain-{self.cfg.job_id}")
        self._drainer.start()

    def set_policy(self, patience: float | None, patience_min: float | None,
                   staleness: int) -> None:
        """Between calls: close rounds with this patience and staleness bound from the next
        call on (a live `passing-ctl job set`, which every host applies after the same call:
        host_agent.pool_move). The count of short calls in a row is kept, so the bound holds
        across the change; so is what adaptive patience has measured."""
        self.cfg = dataclasses.replace(self.cfg, patience=patience, patience_min=patience_min,
                                       staleness=staleness)
        if patience is None and self._drainer is not None:
            # Nobody can close a round without this host now: nothing arrives between calls,
            # and the reader would only compete with every call for the socket.
            self._drain_stop.set()
            self._drainer.join(5)
            self._drainer = None
        elif patience is not None and self._drainer is None and not self._stop.is_set():
            self._drain_stop.clear()
            self._start_reading()

    def detach(self) -> Transport:
        """Stop reading between calls and hand the transport over, open (to the streamer of
        the pool the host moves to); this streamer cannot be used afterwards."""
        self._stop_reading()
        self.broken = "its host moved to another pool"
        return self.transport

    def _stop_reading(self) -> None:
        self._stop.set()
        if self._drainer is not None:
            self._drainer.join(5)

    def close(self) -> None:
        """Stop reading between calls and close the transport (if it can be closed)."""
        self._stop_reading()
        close = getattr(self.transport, "close", None)
        if close is not None:
            close()

    def _drain(self) -> None:
        """Between calls: results that arrive are kept in `early` (the others may be closing
        rounds without this host), not left to overflow the socket's buffer."""
        while not self._stop.is_set() and not self._drain_stop.is_set():
            if not self._idle.wait(0.1):
                continue
            with self._io:
                if self._stop.is_set() or not self._idle.is_set():
                    continue
                try:
                    rows, other = self._receive(_DRAIN_POLL)
                except (OSError, ValueError):  # the transport was closed under us
                    return
                self.stats.ignored += other
                if len(rows):
                    recs, slot = _records(rows)
                    kept = self._keep_early(recs, slot, self._ours(recs, slot), None)
                    self.stats.ignored += len(rows) - kept
            time.sleep(0)  # a call waiting for `_io` gets it now

    def _ours(self, recs: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Which records are results of this job's session, on a slot of its window."""
        return ((recs["job_id"] == self.cfg.job_id) & (recs["flags"] == self._result_flags)
                & (recs["session"] == self.cfg.session) & (slot < self.cfg.window))

    def _keep_early(self, recs: np.ndarray, slot: np.ndarray, unmatched: np.ndarray,
                    call: _Call | None, taken: np.ndarray | None = None) -> int:
        """Keep the results of rounds this host has not sent yet (see `early`), of this call
        (None: between calls) or a later one, among those `unmatched` marks (_ours, less
        those the call took); how many were kept. `taken`: slots whose results of the same
        batch the compiled window has already taken (_take), judged as before."""
        rest = np.flatnonzero(unmatched)
        if not rest.size or len(self.early) >= _EARLY_MAX:
            return 0
        s = slot[rest]
        pending = np.zeros(self.cfg.window, dtype=bool)
        rounds = self.rounds
        if call is not None:
            pending[:call.used] = call.pending
        if taken is not None and taken.size:
            pending[taken] = True
            rounds = rounds.copy()
            rounds[taken] -= np.uint32(1)
        ahead = (recs["round"][rest].astype(np.uint32) - rounds[s]).astype(np.uint32)
        rest = rest[(ahead < 1 << 31) & ((ahead > 0) | ~pending[s])]
        for i in rest.tolist():
            self.early[int(slot[i]), int(recs["round"][i])] = recs[i].copy()
        return rest.size

    def _take_numpy(self, rows: np.ndarray, other: int, call: _Call,
                    measure: tuple[bool, float] | None = None
                    ) -> tuple[np.ndarray, int, np.ndarray, float | None]:
        """The awaited results among `rows` taken: matched (_collect), each slot's next
        packet told whether to ask for CLOSE, its round counted, and absorbed into the call.
        (slots taken, in order of arrival; newest, as _collect's; the slots with another packet
        to send; the longest wait among them, if `measure` is (forced, last progress):
        _longest_wait, before absorbing.)"""
        slots, frags, recs, newest = self._collect(rows, other, call)
        if not slots.size:
            return slots, newest, slots, None
        call.close_next[slots] = call.waited[slots] & (
            recs["num_contrib"].astype(np.int64) < self.cfg.complete)
        wait = None if measure is None else self._longest_wait(
            call, slots, recs, time.monotonic(), *measure)
        self.rounds[slots] += np.uint32(1)  # wraps at 2**32, as the switch reads it
        return slots, newest, call.absorb(slots, frags, recs), wait

    def _take(self, rows: np.ndarray, other: int, call: _Call
              ) -> tuple[np.ndarray, int, np.ndarray]:
        """_take_numpy in one compiled batch (host_agent.window_c), for a call with a
        context; the same results, state and statistics."""
        self.stats.ignored += other
        if not len(rows):
            empty = np.zeros(0, dtype=np.int64)
            return empty, -1, empty
        t = self._compiled.take(call.ctx, rows, time.monotonic())
        stashed = 0
        unmatched = t.unmatched
        if unmatched.any():
            recs, slot = _records(rows)
            stashed = self._keep_early(recs, slot, unmatched, call, taken=t.slots)
        self.stats.ignored += len(rows) - t.slots.size - stashed
        if not t.slots.size:
            return t.slots, -1, t.more
        call.missed += t.missed
        self._note_round_trips(t.rtt_median, t.rtt_min)
        self.stats.results += t.slots.size
        return t.slots, t.newest, t.more

    def _note_round_trips(self, median: float | None, least: float | None) -> None:
        """A batch of results' clean round trips (Karn), by their median and least (None:
        none clean): the timer's estimate, and the path's least unless a pause came first."""
        if median is not None:
            self._sample_rtt(median)
            if not self._paused:  # (after a pause a result may have waited up to its length)
                self.min_rtt = least if self.min_rtt is None else min(self.min_rtt, least)
        self._paused = False

    def _collect(self, rows: np.ndarray, other: int, call: _Call
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
        recs, slot = _records(rows)
        ours = self._ours(recs, slot)
        cand = np.flatnonzero(ours & ((recs["tag"] & _TAG_CALL) == call.tag)
                              & (slot < call.used))
        s = slot[cand]
        cand = cand[call.pending[s] & (call.p_frag[s] == recs["frag"][cand])
                    & (call.p_round[s] == recs["round"][cand])]
        # A slot's result may arrive twice in one batch (a resend's answer): take the first.
        keep = _first_of_each(cand, slot[cand])
        ours[keep] = False
        stashed = self._keep_early(recs, slot, ours, call)
        self.stats.ignored += len(rows) - keep.size - stashed
        if not keep.size:
            return none
        slots = slot[keep]
        now = time.monotonic()
        clean = ~call.resent[slots]  # Karn: a resent packet's round trip is ambiguous
        rtts = now - call.sent[slots[clean]]
        self._note_round_trips(_median(rtts) if rtts.size else None,
                               float(rtts.min()) if rtts.size else None)
        # A probe's answer comes after every older packet's would: its own transmission
        # counts. Any other answer may be the first transmission's, so only that counts.
        newest = int(np.max(np.where(call.probed[slots], call.last_seq[slots],
                                     call.first_seq[slots])))
        call.pending[slots] = False
        self.stats.results += keep.size
        return slots, recs["frag"][keep].astype(np.int64), recs[keep], newest
