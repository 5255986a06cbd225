"""A host's congestion window inside its job's pool (docs/protocol.md, "Congestion control"), and
the order in which slots held back by it go out. No I/O and no clock: the call loop
(host_agent.stream_loop) tells it what results, marks and losses came, and asks what to send.

The window is DCTCP's (RFC 8257) counted in packets: per window of results (about one round
trip) the fraction F of them that came marked updates alpha <- (1 - g) alpha + g F; a window
with marks shrinks by alpha / 2, one without grows by one packet; a loss halves it, at most once
per window of results. It starts at the pool (no slow start: the pool is what the job was given,
and a small call must not pay for ramping up), with alpha 0, and never leaves [MIN_WINDOW,
pool]. Every host of a job sees the same results with the same marks, so their windows move
alike."""

from __future__ import annotations

import heapq

import numpy as np

GAIN = 1 / 16  # DCTCP's g
MIN_WINDOW = 2


class CongestionWindow:
    """The window of a host with a pool of `limit` slots."""

    def __init__(self, limit: int, gain: float = GAIN):
        if limit < 1:
            raise ValueError(f"pool of {limit} slots: at least 1")
        self.limit = limit
        self.floor = min(MIN_WINDOW, limit)
        self.gain = gain
        self.cwnd = float(limit)
        # alpha starts at 0 (RFC 8257 allows either end): a stray mark, a burst's, costs a job
        # that fits its links a sliver of its window, not half, which at one packet per round
        # trip would take the rest of the call to win back; marks that persist raise it.
        self.alpha = 0.0
        self.cuts = 0
        self._acked = self._marked = 0
        self._lost = False  # a loss already cut the window in this window of results

    @property
    def allowed(self) -> int:
        """Packets that may be in flight now."""
        return max(self.floor, int(self.cwnd))

    def on_results(self, n: int, marked: int) -> None:
        """`n` awaited results came, `marked` of them with a switch's congestion mark."""
        self._acked += n
        self._marked += marked
        if self._acked < self.allowed:
            return
        frac = self._marked / self._acked
        self.alpha = (1 - self.gain) * self.alpha + self.gain * frac
        if self._marked:
            self._cut(self.cwnd * (1 - self.alpha / 2))
        elif not self._lost:
            self.cwnd = min(float(self.limit), self.cwnd + 1)
        self._acked = self._marked = 0
        self._lost = False

    def on_loss(self) -> None:
        """A packet was found lost (a later one answered first, or a timer ran out)."""
        if not self._lost:
            self._lost = True
            self._cut(self.cwnd / 2)

    def _cut(self, to: float) -> None:
        self.cwnd = max(float(self.floor), to)
        self.cuts += 1


class SendGate:
    """Slots whose next packet is ready, held while the window is full. A held slot goes out in
    packet order: its key is its step times the call's slots used plus the slot, the position
    of its next packet in the order every host would send the whole call in. The packet earlier
    than every one in flight always goes, window or not: the call's earliest unfinished packet
    is then on its way from every host, so hosts whose windows differ (one saw a loss) never
    each wait, window full, on packets the other holds back."""

    def __init__(self) -> None:
        self._held: list[tuple[int, int]] = []

    @property
    def holding(self) -> int:
        return len(self._held)

    def clear(self) -> None:
        self._held.clear()

    def admit(self, ready: np.ndarray, keys: np.ndarray, in_flight: int, allowed: int,
              earliest_in_flight: int | None) -> np.ndarray:
        """Of the held slots and `ready` (their keys `keys`), those to send now, given
        `in_flight` packets out, `allowed` by the window, and the key of the earliest in
        flight (None: none). With nothing held and room for all, `ready` as it is."""
        room = allowed - in_flight
        if not self._held and ready.size <= room:
            return ready
        for key, slot in zip(keys.tolist(), ready.tolist(), strict=True):
            heapq.heappush(self._held, (key, slot))
        out: list[int] = []
        held = self._held
        earliest = earliest_in_flight
        while held and (room > 0 or earliest is None or held[0][0] < earliest):
            key, slot = heapq.heappop(held)
            out.append(slot)
            room -= 1
            earliest = key if earliest is None else min(earliest, key)
        return np.asarray(out, dtype=np.int64)
