"""A streamer's packets out (docs/protocol.md, "PASSING header"): each slot's next packet built
from the call (in one numpy batch, or by host_agent/window.c), the packet a slot waits on sent
again, and every transmission numbered in order (the numbers loss recovery reads:
host_agent.stream_window)."""

from __future__ import annotations

import time

import numpy as np

from host_agent.stream_api import StreamConfig, StreamStats, Transport
from host_agent.stream_call import Call
from host_agent.window_c import CompiledWindow
from passing import packet
from passing import protocol as P


class Sender:
    """Builds and sends one host's packets of `cfg`'s stream over `transport`, at the rounds
    of `rounds` (the session's array, shared with the rest of the streamer); `compiled`
    builds those of a call with a context (Call.ctx)."""

    def __init__(self, cfg: StreamConfig, transport: Transport, rounds: np.ndarray,
                 compiled: CompiledWindow | None, stats: StreamStats):
        self.transport, self.rounds, self.compiled, self.stats = transport, rounds, compiled, stats
        self.local_gpus = cfg.local_gpus
        self.pool_flag = int(P.Flag.POOL) if cfg.pool & 1 else 0
        self.epoch_bits = P.version_of(cfg.pool, 0)
        # What every packet of this host's stream carries alike, checked once here rather than
        # per batch: the fields `send` leaves as they are.
        self.header = self.fixed_header(cfg)
        self.seq = 0  # numbers every transmission, in order (see Recovery.overtaken)

    def next_seq(self, n: int) -> np.ndarray:
        seq = np.arange(self.seq, self.seq + n, dtype=np.int64)
        self.seq += n
        return seq

    def send(self, call: Call, slots: np.ndarray) -> None:
        """Build the next packet of each of `slots` in one vectorized batch and send them."""
        if not slots.size:
            return
        if call.ctx is not None:
            abstained, closes = self.compiled.send(call.ctx, slots, self.seq)
            self.seq += slots.size
            self.stats.abstained += abstained
            self.stats.closes += closes
            self.transmit(packet.payload_rows(call.payloads[slots]))
            call.sent[slots] = call.first_sent[slots] = time.monotonic()
            self.stats.packets += slots.size
            return
        frag = call.fragments(slots)
        values, exp, abstain = call.values_and_exponents(slots, frag)
        self.stats.abstained += int(abstain.sum())
        rounds = self.rounds[slots]
        # A slot whose previous round waited the whole patience and closed without some host
        # asks for CLOSE at once: that host is late for this round too, unless it catches up
        # before the quorum is in. Only once: the round after waits again, so a host that was
        # only a little late (jitter) is not cut from every later round of the call. In an
        # eager call (one after a short call, when hosts were late at the start of other
        # streaks too: host_agent.stream_quorum), every packet asks at once (docs/protocol.md,
        # "Rounds, quorum and late contributions"), until a call completes with everyone: at
        # the latest the one the staleness bound makes wait.
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
                                  int(P.Flag.CONTRIB)) | self.pool_flag
        batch["version"] = self.epoch_bits | (rounds & 1)
        batch["round"] = rounds
        batch["frag"] = frag
        batch["num_contrib"] = np.where(abstain, 0, self.local_gpus)
        batch["exp"] = exp
        batch["tag"] = call.tags(slots, frag)
        batch["values"] = values
        call.payloads[slots] = batch  # kept for a resend
        seq = self.next_seq(slots.size)
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
        self.transmit(packet.payload_rows(batch))
        call.sent[slots] = call.first_sent[slots] = time.monotonic()
        self.stats.packets += slots.size

    def transmit(self, rows: np.ndarray) -> None:
        """Each row one datagram, in order: in one batch where the transport takes batches."""
        send_rows = getattr(self.transport, "send_rows", None)
        if send_rows is not None:
            send_rows(rows)
        else:
            for row in rows:
                self.transport.send(row.tobytes())

    @staticmethod
    def fixed_header(cfg: StreamConfig) -> np.void:
        """One payload record with the fields every packet of `cfg`'s stream carries alike
        (values zero); ValueError if one does not fit its field."""
        try:
            return packet.pack_batch(np.zeros((1, P.K), dtype=np.int32), pool=cfg.pool,
                                     job_id=cfg.job_id, contributor=cfg.contributor,
                                     num_contrib=cfg.local_gpus, session=cfg.session)[0]
        except packet.ProtocolError as e:
            raise ValueError(f"stream config: {e} (job_id goes in the job_id field, "
                             "contributor in contributor, local_gpus in num_contrib)") from None

    def resend(self, call: Call, slots: np.ndarray, now: float, probe: bool,
               rotated: bool = False) -> None:
        """Send the packets `slots` wait on again, marked RETRANS (and CLOSE once their
        patience ran out); `rotated`: in a probe's turn through the older packets."""
        flags = int(P.Flag.CONTRIB | P.Flag.RETRANS) | self.pool_flag
        batch = call.payloads[slots]
        batch["flags"] = np.where(call.close[slots], flags | int(P.Flag.CLOSE), flags)
        self.transmit(packet.payload_rows(batch))
        call.last_seq[slots] = self.next_seq(slots.size)
        call.sent[slots] = now
        call.resent[slots] = True
        if not rotated:
            call.retried[slots] = True
        call.probed[slots] = probe
        self.stats.retransmissions += slots.size
        self.stats.packets += slots.size
