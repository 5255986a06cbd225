"""What a streamer's callers deal in (host_agent.stream): its configuration, its counters, the
errors a call may raise, the transport it is given, and how lent sums are handed out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


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
    # Gathering results (host_agent.stream_timers.gather_pause): after a pass of the window's
    # loop that took few results while many packets are in flight, wait up to this long for
    # more, so that each pass takes a batch. 0: never wait.
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
    rotated: int = 0  # older packets those probes resent in turn (stream_window.probe_turn)
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
    gathers: int = 0  # ... after which it waited for more (stream_timers.gather_pause)
    gathered_s: float = 0.0  # ... for this long in all
    marks: int = 0  # results taken that carried a switch's congestion mark (FLAG_CONGESTED)
    window_cuts: int = 0  # times the congestion window shrank (marks, or a loss)
    window: int = 0  # the congestion window after the last call: packets in flight at most


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


def check_config(cfg: StreamConfig) -> None:
    """ValueError for a window, pool or session no packet could carry: checked before a
    streamer starts anything (its reader thread)."""
    if not 0 < cfg.window <= 1 << 16:
        raise ValueError(f"window {cfg.window}: 1..65536 slots (a packet's slot field is "
                         "16 bits)")
    if not 0 <= cfg.pool <= 0x7FFFFFFF:
        raise ValueError(f"pool {cfg.pool}: a pool number, 0..2^31-1 (JobParams.pool)")
    if not 0 < cfg.session < 1 << 64:
        raise ValueError(f"session {cfg.session}: a non-zero 64-bit number "
                         "(host_agent.session.new_session)")
