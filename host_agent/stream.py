"""One host's stream of fragments through the switch: the SwitchML window protocol.

The job's pool has W slots. Slot s carries, one after another: an exponent-only packet for
fragment s (values zero, `exp` = this host's exponent of fragment s), then fragment s quantized
with the agreed exponent and carrying the exponent of fragment s+W, then fragment s+W, and so on
(see host_agent/fixed_point.py). Each packet waits for its result before the slot's next packet
goes out; W slots are in flight at once. Every use of a slot flips its version (the SwitchML
shadow copy), also across calls, so the agent keeps the versions for the life of the job.

Loss: each slot has a retransmission timer with exponential backoff; a resend carries RETRANS and
brings the result whether the contribution or the result was lost. A switch that stops
answering ends in SwitchTimeout, not a hang. Results are matched on session, slot, version,
fragment and the call's tag, so neither a result of another session nor a late duplicate of an
earlier call is ever taken for a new result.

A streamer is one session (host_agent.session): the versions it keeps are in step with the other
hosts' only as long as every call completes everywhere. After a failed call (a timeout, a socket
error) they may not be, so the streamer refuses further calls with SessionBroken; the job goes on
with a new session, which the switch keeps apart from this one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from host_agent import fixed_point as fx
from passing import packet
from passing import protocol as P


class SwitchTimeout(TimeoutError):
    """The switch did not answer within the deadline, retransmissions included."""


class SessionBroken(RuntimeError):
    """An earlier call of this session failed: its slots may be out of step with the other
    hosts', so it cannot be used again. Start a new session."""


class Transport(Protocol):
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
    rto: float = 0.02  # retransmission timeout until round trips have been measured, seconds
    min_rto: float = 0.005
    max_rto: float = 1.0
    deadline: float = 10.0  # seconds without any progress before giving up


@dataclass
class StreamStats:
    packets: int = 0
    retransmissions: int = 0
    results: int = 0
    ignored: int = 0  # results that matched nothing pending (duplicates, stale)


@dataclass
class _Pending:
    """The packet a slot is waiting on."""

    frag: int
    version: int
    payload: bytes
    sent: float
    rto: float
    resent: bool = False


class _Call:
    """One allreduce's fragments and how far each slot has got through them."""

    def __init__(self, blocks: np.ndarray, local_exp: np.ndarray, window: int, streams: int,
                 tag: int):
        self.blocks, self.local_exp, self.tag = blocks, local_exp, tag
        self.nfrag = blocks.shape[0]
        # Slots the call uses: the window, or one per fragment of a shorter tensor. Slot s
        # carries fragments s, s + used, s + 2 * used, ...
        self.used = min(window, self.nfrag)
        self.s_bits = fx.scale_bits(streams)
        self.agreed = np.zeros(self.nfrag, dtype=np.uint8)
        self.out = np.zeros((self.nfrag, P.K), dtype=np.float64)
        # step[s]: 0 = exponent packet of fragment s, i >= 1 = fragment s + (i-1)*used
        self.step = np.zeros(self.used, dtype=np.int64)
        self.pending: dict[int, _Pending] = {}

    def fragments(self, slots: np.ndarray) -> np.ndarray:
        """The fragment each of `slots` is at (for an exponent packet, the one it announces)."""
        st = self.step[slots]
        return np.where(st == 0, slots, slots + (st - 1) * self.used)

    def values_and_exponents(self, slots: np.ndarray,
                             frag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The next packet of each slot: fragment `frag` quantized with its agreed exponent
        (zeros in an exponent packet, or once a host reported NaN/Inf), and the exponent it
        proposes: this host's of the fragment itself (exponent packet) or of the slot's next
        fragment (0 after the last)."""
        st = self.step[slots]
        data = (st > 0) & (self.agreed[frag] != fx.POISON)
        values = np.zeros((slots.size, P.K), dtype=np.int32)
        if data.any():
            values[data] = fx.quantize(self.blocks[frag[data]], self.agreed[frag[data]],
                                       self.s_bits)
        nxt = frag + self.used
        ahead = self.local_exp[np.minimum(nxt, self.nfrag - 1)]
        exp = np.where(st == 0, self.local_exp[slots], np.where(nxt < self.nfrag, ahead, 0))
        return values, exp

    def absorb(self, slots: np.ndarray, frags: np.ndarray, recs: np.ndarray) -> np.ndarray:
        """Take the results `recs` of `slots` (at fragments `frags`): an exponent packet's
        result is the fragment's agreed exponent, a value packet's the fragment's sum and the
        agreed exponent of the slot's next fragment. Returns the slots that have another
        fragment to send."""
        agreed, nfrag, used = self.agreed, self.nfrag, self.used
        first = self.step[slots] == 0
        agreed[frags[first]] = recs["exp"][first]
        rest = ~first
        data = rest & (agreed[frags] != fx.POISON)
        if data.any():
            self.out[frags[data]] = fx.dequantize(recs["values"][data], agreed[frags[data]],
                                                  self.s_bits)
        ahead = rest & (frags + used < nfrag)
        agreed[frags[ahead] + used] = recs["exp"][ahead]
        self.step[slots] += 1
        return slots[slots + (self.step[slots] - 1) * used < nfrag]


class SlotStreamer:
    def __init__(self, cfg: StreamConfig, transport: Transport):
        self.cfg = cfg
        self.transport = transport
        self.versions = np.zeros(cfg.window, dtype=np.uint8)
        self.calls = 0
        self.stats = StreamStats()
        # Round-trip estimate (TCP's, RFC 6298): the timer follows the switch's queueing delay,
        # so a slow switch (BMv2) is not flooded with resends that only make it slower.
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = cfg.rto
        self._backoff_at = float("-inf")
        self.broken: str | None = None  # why this session cannot be used any more
        if not 0 < cfg.session < 1 << 64:
            raise ValueError(f"session {cfg.session}: a non-zero 64-bit number "
                             "(host_agent.session.new_session)")

    def _sample_rtt(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(max(self.srtt + 4 * self.rttvar, self.cfg.min_rto), self.cfg.max_rto)

    def allreduce(self, x: np.ndarray) -> np.ndarray:
        """The element-wise sum of `x` over every host of the job, as float64. NaN or Inf on
        any host raises NonFiniteError on every host, after the stream (so that every host
        leaves the slots in the same state)."""
        flat = np.asarray(x).ravel()
        n = flat.size
        if n == 0:
            return np.zeros(0)
        nfrag = -(-n // P.K)
        blocks = np.zeros((nfrag, P.K), dtype=np.float64)
        local_error = None
        try:
            fx.check_finite(flat)
            blocks.ravel()[:n] = flat
            local_exp = fx.block_exponents(blocks)
        except (fx.NonFiniteError, ValueError) as e:
            local_error = e
            blocks[:] = 0
            local_exp = np.full(nfrag, fx.POISON, dtype=np.uint8)
        if self.broken is not None:
            raise SessionBroken(f"job {self.cfg.job_id}: session {self.cfg.session:#x} failed "
                                f"earlier ({self.broken}); start a new session")
        try:
            sums, agreed = self._run(blocks, local_exp)
        except BaseException as e:
            self.broken = f"{type(e).__name__}: {e}"
            raise
        if local_error is not None:
            raise fx.NonFiniteError(f"this host: {local_error}")
        if np.any(agreed == fx.POISON):
            raise fx.NonFiniteError(f"job {self.cfg.job_id}: another host had NaN/Inf (or a "
                                    "value beyond float32's range) in the same call")
        return sums.ravel()[:n]

    # -- the window ---------------------------------------------------------------------------
    def _run(self, blocks: np.ndarray, local_exp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every fragment of `blocks` through the switch: (sums, agreed exponents)."""
        call = _Call(blocks, local_exp, self.cfg.window, self.cfg.streams, self.calls % 256)
        self.calls += 1
        self._launch(call, np.arange(call.used, dtype=np.int64))
        last_progress = time.monotonic()
        while call.pending:
            wait = min(p.sent + p.rto for p in call.pending.values()) - time.monotonic()
            got_slots, got_frags, recs = self._collect(self.transport.recv(max(wait, 0.0)),
                                                       call.pending, call.tag)
            if got_slots:
                last_progress = time.monotonic()
                slots = np.array(got_slots, dtype=np.int64)
                self.versions[slots] ^= 1
                more = call.absorb(slots, np.array(got_frags, dtype=np.int64), recs)
                if more.size:
                    self._launch(call, more)
            now = time.monotonic()
            if call.pending and now - last_progress > self.cfg.deadline:
                raise self._timeout(call)
            self._resend_expired(call, now)
        return call.out, call.agreed

    def _launch(self, call: _Call, slots: np.ndarray) -> None:
        """Build the next packet of each of `slots` in one vectorized batch and send them."""
        cfg = self.cfg
        frag = call.fragments(slots)
        values, exp = call.values_and_exponents(slots, frag)
        versions = self.versions[slots]
        batch = packet.pack_batch(values, job_id=cfg.job_id, slot=slots,
                                  contributor=cfg.contributor, flags=int(P.Flag.CONTRIB),
                                  version=versions, frag=frag, num_contrib=cfg.local_gpus,
                                  exp=exp, tag=call.tag, session=cfg.session)
        now = time.monotonic()
        for i, row in enumerate(packet.payload_rows(batch)):
            payload = row.tobytes()
            self.transport.send(payload)
            call.pending[int(slots[i])] = _Pending(int(frag[i]), int(versions[i]), payload, now,
                                                   self.rto)
        self.stats.packets += slots.size

    def _resend_expired(self, call: _Call, now: float) -> None:
        """Resend, with RETRANS, every pending packet whose timer ran out, backing its timer
        off."""
        expired = False
        for p in call.pending.values():
            if now >= p.sent + p.rto:
                expired = True
                p.rto = min(p.rto * 2, self.cfg.max_rto)
                p.resent = True
                self.stats.retransmissions += 1
                self.transport.send(packet.with_flags(
                    p.payload, int(P.Flag.CONTRIB | P.Flag.RETRANS)))
                p.sent = now
                self.stats.packets += 1
        # RFC 6298 (5.5-5.7): a timeout also backs off the timer of packets sent later,
        # until a clean round trip is measured. Backing off only the packet that timed out
        # leaves new packets on the old timer; when the round trip has grown past it (a
        # queue filling on a slow link) every packet is resent, Karn's rule discards every
        # sample, and the timer never catches up. Once per timer period, not per packet.
        if expired and now - self._backoff_at >= self.rto:
            self.rto = min(self.rto * 2, self.cfg.max_rto)
            self._backoff_at = now

    def _timeout(self, call: _Call) -> SwitchTimeout:
        waiting = sorted(call.pending)[:5]
        return SwitchTimeout(
            f"job {self.cfg.job_id}: no result from the switch for {self.cfg.deadline:.1f}s "
            f"(slots {waiting} waiting, {self.stats.retransmissions} retransmissions): "
            "another host of the job stopped, restarted or is in another session, "
            "or the switch is down")

    def _collect(self, payloads: list[bytes], pending: dict[int, _Pending],
                 tag: int) -> tuple[list[int], list[int], np.ndarray]:
        """Slots, fragments and records of the payloads that are the awaited result of a slot
        (decoded in one batch); those slots leave `pending`. Anything else is ignored."""
        good = [p for p in payloads if len(p) == P.PAYLOAD_BYTES]
        self.stats.ignored += len(payloads) - len(good)
        if not good:
            return [], [], np.zeros(0, dtype=packet.PAYLOAD_DTYPE)
        recs = packet.unpack_batch(good, strict=False)
        ours = ((recs["job_id"] == self.cfg.job_id) & (recs["flags"] == int(P.Flag.RESULT))
                & (recs["tag"] == tag) & (recs["session"] == self.cfg.session))
        slots, frags, keep = [], [], []
        now = time.monotonic()
        for i, (ok, s, version, frag) in enumerate(zip(
                ours.tolist(), recs["slot"].tolist(), recs["version"].tolist(),
                recs["frag"].tolist(), strict=True)):
            p = pending.get(s)
            if not ok or p is None or p.version != version or p.frag != frag:
                self.stats.ignored += 1
                continue
            del pending[s]
            if not p.resent:  # Karn: a resent packet's round trip is ambiguous
                self._sample_rtt(now - p.sent)
            slots.append(s)
            frags.append(frag)
            keep.append(i)
        self.stats.results += len(keep)
        return slots, frags, recs[keep]
