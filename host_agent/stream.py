"""One host's stream of fragments through the switch: the SwitchML window protocol.

The job's pool has W slots. Slot s carries, one after another: an exponent-only packet for
fragment s (values zero, `exp` = this host's exponent of fragment s), then fragment s quantized
with the agreed exponent and carrying the exponent of fragment s+W, then fragment s+W, and so on
(see host_agent/fixed_point.py). Each packet waits for its result before the slot's next packet
goes out; W slots are in flight at once. Every use of a slot flips its version (the SwitchML
shadow copy), also across calls, so the agent keeps the versions for the life of the job.

Loss: each slot has a retransmission timer with exponential backoff; a resend carries RETRANS and
brings the result whether the contribution or the result was lost. A switch that stops
answering ends in SwitchTimeout, not a hang. Results are matched on slot, version, fragment and
the call's tag, so a late duplicate of an earlier call is never taken for a new result.
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


class Transport(Protocol):
    def send(self, payload: bytes) -> None: ...

    def recv(self, timeout: float) -> list[bytes]: ...


@dataclass(frozen=True)
class StreamConfig:
    job_id: int
    contributor: int  # this host's id at its ToR
    slots: int  # the job's window W
    streams: int  # hosts of the job: contributions summed by the switches
    local_gpus: int = 1  # carried in num_contrib
    rto: float = 0.02  # first retransmission timeout, seconds
    max_rto: float = 0.5
    deadline: float = 10.0  # seconds without any progress before giving up


@dataclass
class StreamStats:
    packets: int = 0
    retransmissions: int = 0
    results: int = 0
    ignored: int = 0  # results that matched nothing pending (duplicates, stale)


class SlotStreamer:
    def __init__(self, cfg: StreamConfig, transport: Transport):
        self.cfg = cfg
        self.transport = transport
        self.versions = np.zeros(cfg.slots, dtype=np.uint8)
        self.calls = 0
        self.stats = StreamStats()

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
        sums, agreed = self._run(blocks, local_exp)
        if local_error is not None:
            raise fx.NonFiniteError(f"this host: {local_error}")
        if np.any(agreed == fx.POISON):
            raise fx.NonFiniteError(f"job {self.cfg.job_id}: another host had NaN/Inf (or a "
                                    "value beyond float32's range) in the same call")
        return sums.ravel()[:n]

    # -- the window ---------------------------------------------------------------------------
    def _run(self, blocks: np.ndarray, local_exp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.cfg
        nfrag = blocks.shape[0]
        window = min(cfg.slots, nfrag)
        s_bits = fx.scale_bits(cfg.streams)
        agreed = np.zeros(nfrag, dtype=np.uint8)
        out = np.zeros((nfrag, P.K), dtype=np.float64)
        tag = self.calls % 256
        self.calls += 1
        zeros = np.zeros(P.K, dtype=np.int32)

        # step[s]: 0 = exponent packet of fragment s, i >= 1 = fragment s + (i-1)*window
        step = [0] * window
        pending: dict[int, dict] = {}

        def packet_for(s: int) -> dict:
            i = step[s]
            if i == 0:
                frag, values, exp = s, zeros, int(local_exp[s])
            else:
                frag = s + (i - 1) * window
                values = zeros if agreed[frag] == fx.POISON else \
                    fx.quantize(blocks[frag:frag + 1], agreed[frag:frag + 1], s_bits)[0]
                nxt = frag + window
                exp = int(local_exp[nxt]) if nxt < nfrag else 0
            version = int(self.versions[s])
            fields = dict(job_id=cfg.job_id, slot=s, contributor=cfg.contributor, version=version,
                          frag=frag, num_contrib=cfg.local_gpus, exp=exp, tag=tag)
            return {"fields": fields, "values": values, "frag": frag, "version": version,
                    "rto": cfg.rto, "sent": 0.0}

        def send(s: int, retrans: bool = False) -> None:
            p = pending[s]
            flags = P.Flag.CONTRIB | (P.Flag.RETRANS if retrans else 0)
            self.transport.send(packet.pack(p["values"], flags=int(flags), **p["fields"]))
            p["sent"] = time.monotonic()
            self.stats.packets += 1

        for s in range(window):
            pending[s] = packet_for(s)
            send(s)
        last_progress = time.monotonic()
        while pending:
            now = time.monotonic()
            wait = min(p["sent"] + p["rto"] for p in pending.values()) - now
            for payload in self.transport.recv(max(wait, 0.0)):
                matched = self._match(payload, pending, tag)
                if matched is None:
                    continue
                s, rec = matched
                p = pending.pop(s)
                self.versions[s] ^= 1
                self.stats.results += 1
                last_progress = time.monotonic()
                if step[s] == 0:
                    agreed[s] = rec["exp"]
                else:
                    f = p["frag"]
                    if agreed[f] != fx.POISON:
                        out[f] = fx.dequantize(rec["values"].reshape(1, P.K),
                                               agreed[f:f + 1], s_bits)[0]
                    if f + window < nfrag:
                        agreed[f + window] = rec["exp"]
                step[s] += 1
                if s + (step[s] - 1) * window < nfrag:
                    pending[s] = packet_for(s)
                    send(s)
            now = time.monotonic()
            if pending and now - last_progress > cfg.deadline:
                slots = sorted(pending)[:5]
                raise SwitchTimeout(
                    f"job {cfg.job_id}: no result from the switch for {cfg.deadline:.1f}s "
                    f"(slots {slots} waiting, {self.stats.retransmissions} retransmissions)")
            for s, p in pending.items():
                if now >= p["sent"] + p["rto"]:
                    p["rto"] = min(p["rto"] * 2, cfg.max_rto)
                    self.stats.retransmissions += 1
                    send(s, retrans=True)
        return out, agreed

    def _match(self, payload: bytes, pending: dict[int, dict],
               tag: int) -> tuple[int, np.void] | None:
        try:
            rec = packet.unpack(payload)
        except packet.ProtocolError:
            self.stats.ignored += 1
            return None
        s = int(rec["slot"])
        p = pending.get(s)
        if (p is None or rec["job_id"] != self.cfg.job_id or rec["flags"] != P.Flag.RESULT
                or rec["version"] != p["version"] or rec["frag"] != p["frag"]
                or rec["tag"] != tag):
            self.stats.ignored += 1
            return None
        return s, rec
