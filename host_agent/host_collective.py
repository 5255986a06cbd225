"""A host's stream while its job waits for switch slots: the same calls as a SlotStreamer's,
summed by a collective among the hosts' leaders instead of the switch.

`passing-ctl job create` gives a `passing` job that its switches cannot hold now no pool, and
its agents window 0 (docs/controller.md, "Jobs waiting for slots"). The hosts still train: each
still reduces its GPUs onto its leader (the in-host stage), and the leaders sum their hosts'
tensors with a collective of their own (gloo's ring all-reduce in float64 over the hosts'
network, i.e. hier-ring), every call carrying the pool vote (host_agent.pool_move) as a
switch call does. When the controller gives the job pools, every leader sums the same votes,
and all move onto the switch after the same call.

Why the result is the same on every host: a ring all-reduce reduces each chunk once, along
the ring, and hands that one sum to every rank, so every leader gets the same bits; the votes
are small integers, exact in float64 whatever the order. NaN or Inf on any host makes the sum
non-finite on every host alike, which raises NonFiniteError everywhere, as the switch path
does, and nobody reads the votes of that call.

There are no rounds to close: every call waits for every host (a quorum, patience and the
staleness bound apply on the switch only; calls_ready is always 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from host_agent.fixed_point import NonFiniteError
from host_agent.scratch import Scratch
from host_agent.stream_api import StreamConfig, StreamStats, Transport, check_out, handed_out

# Sums a float64 array over every host's leader, in place: the same array on each afterwards.
HostsSum = Callable[[np.ndarray], None]


class HostCollective:
    """SlotStreamer's interface (what PooledStreamer and the agents use of it) over `hosts_sum`.
    `transport` is kept, unused, for the stream of the pool the host moves to."""

    def __init__(self, cfg: StreamConfig, transport: Transport, hosts_sum: HostsSum):
        self.cfg = cfg
        self.transport = transport
        self.hosts_sum = hosts_sum
        self.stats = StreamStats()
        self.late_starts = 0
        self.wait_avg: float | None = None
        self.calls = 0  # calls summed this way
        self.broken: str | None = None
        self._scratch = Scratch()
        self._n = 0

    def allreduce(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        check_out(out, np.asarray(x).size)
        return handed_out(self.allreduce_view(x), out)

    def allreduce_view(self, x: np.ndarray) -> np.ndarray:
        """The sum of `x` over every host, as float64 in this object's memory (overwritten by
        the next call). NonFiniteError on every host when any host's values hold NaN or Inf."""
        if self.broken is not None:
            raise RuntimeError(f"this host collective cannot be used: {self.broken}")
        flat = np.asarray(x).ravel()
        sums = self._scratch.get("sums", (flat.size,), np.float64)
        sums[:] = flat
        self.hosts_sum(sums)
        self.calls += 1
        self._n = flat.size
        # Judged on the sum, which every host holds alike, never on this host's own values.
        if not np.isfinite(sums).all():
            raise NonFiniteError("NaN or Inf in the sum over the hosts (the job sums with a "
                                 "host collective while it waits for switch slots)")
        return sums

    def counts_from(self, start: int) -> np.ndarray:
        """GPUs in each element of the last sum from `start` on: every GPU of the job."""
        return np.full(max(self._n - start, 0), self.cfg.complete, dtype=np.int64)

    @property
    def last_counts(self) -> np.ndarray:
        return self.counts_from(0)

    def calls_ready(self, n: int, most: int = 0) -> int:
        """No call completes without this host."""
        return 0

    def patience_now(self) -> float | None:
        return None

    def set_policy(self, patience: float | None, patience_min: float | None,
                   staleness: int) -> None:
        """Kept for the switch: the stream of the pool the host moves to starts with it."""
        self.cfg = dataclasses.replace(self.cfg, patience=patience, patience_min=patience_min,
                                       staleness=staleness)

    def detach(self) -> Transport:
        """Hand the transport over, open; this object cannot be used afterwards."""
        self.broken = "its host moved onto the switch"
        return self.transport

    def close(self) -> None:
        close = getattr(self.transport, "close", None)
        if close is not None:
            close()
