"""A host's stream through whichever pool its job is in (docs/protocol.md, "Live pool
resizing", "Jobs waiting for slots"): the SlotStreamer of the current pool, or the host
collective while the job waits for slots, every call carrying the host's vote
(host_agent.pool_move), and the change to newer parameters after the call whose votes say so."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from host_agent.host_collective import HostCollective, HostsSum
from host_agent.pool_move import Policy, PoolVote, call_size, pool_session, vote_offset
from host_agent.scratch import Scratch
from host_agent.stream import SlotStreamer
from host_agent.stream_api import StreamConfig, Transport, check_out, handed_out
from passing.contract import JobParams


class PooledStreamer:
    """A host's stream through whichever pool its job is in: the SlotStreamer of the current
    pool, every call carrying this host's vote, and the change to newer parameters (the next
    pool, a newer policy) after the call whose votes say so. `cfg` is the stream's
    configuration in the first pool (its `pool` is taken from `params`); `policy` gives the
    patience and staleness bound of the parameters it changes to (None: the ones in `cfg`
    stay, whatever the job's policy becomes)."""

    def __init__(self, cfg: StreamConfig, transport: Transport, params: JobParams,
                 source: Callable[[], JobParams] | None = None, poll: float = 2.0,
                 policy: Policy | None = None, hosts_sum: HostsSum | None = None):
        self.hosts_sum = hosts_sum
        self.host_calls = 0  # calls summed by the host collective (the job waiting for slots)
        self.streamer = self._stream(cfg, params, transport)
        self.vote = PoolVote(params, source, poll)
        self.policy = policy
        self._scratch = Scratch()  # a call's values with the vote
        self._counted: tuple[SlotStreamer, int] | None = None  # the last call's streamer, n

    def _stream(self, cfg: StreamConfig, params: JobParams, transport: Transport,
                **rules) -> SlotStreamer | HostCollective:
        """The stream of the pool `params` name: through the switch, or, with window 0 (the
        job waits for slots), the host collective (host_agent.host_collective)."""
        if params.window == 0:
            if self.hosts_sum is None:
                raise ValueError(
                    f"job {params.job_id} waits for switch slots (window 0 in its parameters): "
                    "its hosts sum with a host collective, which needs a group of the hosts' "
                    "leaders (PassingAllreduce's hosts_group), and none was given")
            return HostCollective(dataclasses.replace(cfg, window=0, pool=params.pool, **rules),
                                  transport, self.hosts_sum)
        return SlotStreamer(dataclasses.replace(
            cfg, window=params.window, pool=params.pool,
            session=pool_session(cfg.session, params.pool, params.window), **rules), transport)

    @property
    def on_switch(self) -> bool:
        """Whether the job's sums go through the switch now (else: the host collective)."""
        return isinstance(self.streamer, SlotStreamer)

    @property
    def last_counts(self) -> np.ndarray:
        """GPUs in each element of the last call's sum (made when asked for)."""
        if self._counted is None:
            return np.zeros(0, dtype=np.int64)
        streamer, n = self._counted
        return streamer.last_counts[:n]

    @property
    def cfg(self) -> StreamConfig:
        return self.streamer.cfg

    def allreduce(self, flat: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """SlotStreamer.allreduce of the 1-d `flat` (into `out` as there), in the job's current
        pool; `last_counts` the GPUs each element's sum holds. A change happens after the
        call, never during it."""
        check_out(out, flat.size)
        return handed_out(self.allreduce_view(flat), out)

    def allreduce_view(self, flat: np.ndarray) -> np.ndarray:
        """allreduce's sums in the streamer's memory (SlotStreamer.allreduce_view): the votes
        are read before the caller may change them."""
        n, cfg = flat.size, self.streamer.cfg
        before = self.vote.params
        size = call_size(n)
        voted = self.vote.with_vote(flat, self._scratch.get(
            "voted", (size,), np.float32 if flat.dtype == np.float32 else np.float64))
        total = self.streamer.allreduce_view(voted)
        self.host_calls += not self.on_switch
        start = vote_offset(n)
        moving = self.vote.decide(total[start:], self.streamer.counts_from(start), cfg.complete,
                                  cfg.streams)
        self._counted = (self.streamer, n)
        if moving is None:
            return total[:n]
        rules = self.policy(moving) if self.policy is not None else {}
        if moving.pool != before.pool:
            old = self.streamer
            # (the old streamer's memory, which `total` is, stays as long as the caller holds it)
            self.streamer = self._stream(cfg, moving, old.detach(), wait_first=True, **rules)
            # The host's counters go on across pools: a caller that holds them (passing-agent
            # reports them at the end) sees the whole run. So does what says whether a host
            # keeps coming late (every host moves after the same call, with the same).
            self.streamer.stats = old.stats
            self.streamer.late_starts = old.late_starts
        elif rules:
            self.streamer.set_policy(**rules)
        return total[:n]

    def calls_ready(self, n: int) -> int:
        """SlotStreamer.calls_ready for calls of `n` values (and their votes)."""
        return self.streamer.calls_ready(call_size(n))

    def close(self) -> None:
        self.streamer.close()
        self.vote.close()
