"""Live pool resizing, the agents' side: when the hosts move to the pool `passing-ctl job resize`
installed, and to which.

The controller installs the new pool beside the old one (the other FLAG_POOL) and raises the
job's `pool` in its parameters; the agents learn it by polling their parameter source. They
must then all change pools at the same call: a host that streamed a call into the other pool, or
with another window, would have its fragments summed with the wrong ones. So every call carries
a vote in one fragment of its own, after the tensor's:

    lane 0: 1 from every host (so the fragment is never all zeros: see SlotStreamer.calls_ready)
    lane 1: v = 1 from a host that knows the next pool (pool + 1, window W), else 0
    lanes 2 + 2k, 3 + 2k: v * d_k and v * d_k^2, d_k the k-th base-16 digit of W (k < 4)

and the hosts move after the call whose sums say that all n hosts are in, all n voted, and
for every digit n * sum(d^2) == sum(d)^2, which holds only if every host's digit is the same
(Cauchy-Schwarz): so all voted for the same window. Every host reads the same sums, so every
host decides alike; a round closed by a quorum holds fewer votes, and nobody moves. Digits keep
every lane's sum below 2**S for up to 1024 hosts, so the fixed point carries them exactly
(host_agent.fixed_point).

The session is derived from the one the hosts agreed on, the pool number and the window
(`pool_session`), in the first pool as after every move: hosts that hold different parameters
(a stale file two resizes old names a pool with the same FLAG_POOL) never share a session, so
their fragments are never summed together; a result of the old pool (a late resend's answer)
is never taken for one of the new pool; and the first call in the new pool waits for everyone
(StreamConfig.wait_first), so no new round completes while a host may still be finishing its
last call in the old one. The
controller frees the old pool once every host has contributed to the new one
(docs/protocol.md, "Live pool resizing").
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable

import numpy as np

from host_agent.stream import SlotStreamer, StreamConfig, Transport
from passing import protocol as P
from passing.contract import JobParams

_DIGITS = 4  # base-16 digits of a window: pools have at most 65535 slots
VOTE_LANES = 2 + 2 * _DIGITS


def vote_offset(n: int) -> int:
    """Where a call of `n` values puts its vote: the first lane of the fragment after them."""
    return -(-n // P.K) * P.K


def call_size(n: int) -> int:
    """Values a call of `n` streams through the switch, the vote included."""
    return vote_offset(n) + VOTE_LANES


def pool_session(session: int, pool: int, window: int) -> int:
    """The session of hosts that agreed on `session` and stream in pool number `pool` with
    `window` slots: the same on every host that holds the same parameters, non-zero, and
    unrelated to any other pool's or window's."""
    h = hashlib.sha256(session.to_bytes(8, "big") + pool.to_bytes(4, "big")
                       + window.to_bytes(4, "big") + b"passing/pool")
    return int.from_bytes(h.digest()[:8], "big") or 1


def _digits(window: int) -> list[int]:
    return [(window >> (4 * k)) & 0xF for k in range(_DIGITS)]


def _same_job(a: JobParams, b: JobParams) -> bool:
    """Parameters of the same job that a resize may have produced: only the window and the
    pool change."""
    return (a.job_id, a.mode, a.session_key, a.switch_udp_port, a.agent_udp_port, a.hosts,
            a.values_per_packet) == (b.job_id, b.mode, b.session_key, b.switch_udp_port,
                                     b.agent_udp_port, b.hosts, b.values_per_packet)


class PoolVote:
    """The leader's view of the job's pool: the one it streams in (`params`), the next one it
    learned of (polling `source` every `poll` seconds, in a thread), and the votes."""

    def __init__(self, params: JobParams, source: Callable[[], JobParams] | None = None,
                 poll: float = 2.0):
        self.params = params
        self.calls = 0
        self.moves: list[tuple[int, int, int]] = []  # (call, pool, window) of every move
        self._source = source
        self._next: JobParams | None = None
        self._voted: JobParams | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if source is not None and poll > 0:
            self._thread = threading.Thread(target=self._poll, args=(poll,), daemon=True,
                                            name=f"passing-pool-{params.job_id}")
            self._thread.start()

    def offer(self, params: JobParams) -> bool:
        """Take `params` as the next pool if it is the one after the current pool of this very
        job; whether it was taken."""
        if params.pool != self.params.pool + 1 or not _same_job(params, self.params):
            return False
        self._next = params
        return True

    def _poll(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                fresh = self._source()
            except Exception:  # noqa: BLE001 - an unreachable controller: keep the pool we have
                continue
            self.offer(fresh)

    def with_vote(self, flat: np.ndarray) -> np.ndarray:
        """`flat` (float64) followed by this host's vote, as the call streams it."""
        n = flat.size
        out = np.zeros(call_size(n), dtype=np.float64)
        out[:n] = flat
        nxt = self._next
        self._voted = nxt if nxt is not None and nxt.pool == self.params.pool + 1 else None
        lanes = out[vote_offset(n):]
        lanes[0] = 1.0
        if self._voted is not None:
            lanes[1] = 1.0
            for k, d in enumerate(_digits(self._voted.window)):
                lanes[2 + 2 * k], lanes[3 + 2 * k] = d, d * d
        return out

    def decide(self, sums: np.ndarray, counts: np.ndarray, complete: int,
               streams: int) -> JobParams | None:
        """After a call: the pool every host moves to now, from the call's vote lanes (`sums`,
        and the GPUs each holds, `counts`), or None to stay."""
        voted, self._voted = self._voted, None
        self.calls += 1
        lanes = [int(v) for v in np.rint(sums[:VOTE_LANES])]
        present, votes = lanes[0], lanes[1]
        if (voted is None or present != streams or votes != streams
                or np.any(counts[:VOTE_LANES] < complete)):
            return None
        for k, d in enumerate(_digits(voted.window)):
            s1, s2 = lanes[2 + 2 * k], lanes[3 + 2 * k]
            if votes * s2 != s1 * s1 or s1 != votes * d:
                return None
        self.params = voted
        if self._next is voted:
            self._next = None
        self.moves.append((self.calls, voted.pool, voted.window))
        return voted

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


class PooledStreamer:
    """A host's stream through whichever pool its job is in: the SlotStreamer of the current
    pool, every call carrying this host's vote, and the move to the next pool after the call
    whose votes say so. `cfg` is the stream's configuration in the first pool (its `pool` is
    taken from `params`)."""

    def __init__(self, cfg: StreamConfig, transport: Transport, params: JobParams,
                 source: Callable[[], JobParams] | None = None, poll: float = 2.0):
        self.streamer = SlotStreamer(dataclasses.replace(
            cfg, window=params.window, pool=params.pool & 1,
            session=pool_session(cfg.session, params.pool, params.window)), transport)
        self.vote = PoolVote(params, source, poll)
        self.last_counts = np.zeros(0, dtype=np.int64)

    @property
    def cfg(self) -> StreamConfig:
        return self.streamer.cfg

    def allreduce(self, flat: np.ndarray) -> np.ndarray:
        """SlotStreamer.allreduce of the 1-d `flat`, in the job's current pool; `last_counts`
        the GPUs each element's sum holds. A move happens after the call, never during it."""
        n, cfg = flat.size, self.streamer.cfg
        total = self.streamer.allreduce(self.vote.with_vote(flat))
        counts = self.streamer.last_counts
        votes = slice(vote_offset(n), None)
        moving = self.vote.decide(total[votes], counts[votes], cfg.complete, cfg.streams)
        self.last_counts = counts[:n]
        if moving is not None:
            self.streamer = SlotStreamer(dataclasses.replace(
                cfg, window=moving.window, pool=moving.pool & 1,
                session=pool_session(cfg.session, moving.pool, moving.window),
                wait_first=True),
                self.streamer.detach())
        return total[:n]

    def calls_ready(self, n: int) -> int:
        """SlotStreamer.calls_ready for calls of `n` values (and their votes)."""
        return self.streamer.calls_ready(call_size(n))

    def close(self) -> None:
        self.streamer.close()
        self.vote.close()
