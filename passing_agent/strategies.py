"""All-reduce strategies over the same ranks, for comparing PASSING with the usual baselines.

Every strategy sums a tensor over every rank of every host, in place:

* `passing`: local reduce, the leader streams through the switch, local broadcast.
* `ring`: torch.distributed (gloo) all-reduce over every rank of every host.
* `hier-ring`: local reduce, all-reduce among the hosts' leaders, local broadcast (Horovod's
  hierarchical all-reduce).
* `ps`: a parameter server on the first host's leader: every other rank sends its tensor there
  (push), the server sums, and sends the sum back to each (pull), chunk by chunk, pipelined.
* `ina`: switch-only in-network aggregation (SwitchML/ATP): no local step, every rank streams
  its own tensor through the switch as a contributor of its own. Needs a job created in mode
  `ina` (the switch admits a range of contributor ids per port and answers each rank).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from host_agent.allreduce import PassingAllreduce
from host_agent.pool_move import pool_session
from host_agent.session import agree_in_group
from host_agent.stream import SlotStreamer, StreamConfig, Transport
from host_agent.tensor_sums import stream_tensor
from host_agent.transport import UdpTransport
from passing.contract import JobParams
from passing_agent import STRATEGIES

__all__ = ["STRATEGIES", "InaAllreduce", "PassingAllreduce", "Ranks", "build"]

# The parameter server's pipelining unit: about 1/PS_CHUNKS of the tensor, within bounds. The
# server's link idles in one direction while the first chunk's pushes arrive and in the other
# while the last one's pulls leave, so a call costs about (1 + 1/chunks) times its transfers;
# one 256 KiB chunk for every tensor made a 256 KiB call take twice as long as it must.
PS_CHUNKS = 16
PS_CHUNK_MIN_BYTES = 4 << 10  # below this, per-chunk overhead outweighs the overlap
PS_CHUNK_MAX_BYTES = 256 << 10
# Chunks a worker may push ahead of the sums it has back. Unbounded, the workers' flows drift
# apart (TCP shares the server's link only roughly), the server waits for the slowest one's
# chunk c before it can send chunk c back, and the pulls bunch up at the end. Measured on
# leafspine (A/B, 2026-12-02): 1 MiB 1.12x faster as shipped and 1.07x at 20 Mbit/s, 64 KiB
# level; a window of 2 made 64 KiB 1.13x slower (round trips, not the link, then bound it).
PS_WINDOW = 4


def ps_chunk_bytes(nbytes: int) -> int:
    """Bytes per chunk of a `nbytes` tensor in the parameter server's pipeline."""
    return max(PS_CHUNK_MIN_BYTES, min(PS_CHUNK_MAX_BYTES, -(-nbytes // PS_CHUNKS)))


@dataclass
class Ranks:
    """Where this process sits: hosts x local ranks, numbered host-major."""

    host_index: int
    local_rank: int
    local_size: list[int]  # local ranks per host, in host order

    @property
    def rank(self) -> int:
        return sum(self.local_size[:self.host_index]) + self.local_rank

    def host_ranks(self, host_index: int) -> list[int]:
        start = sum(self.local_size[:host_index])
        return list(range(start, start + self.local_size[host_index]))

    @property
    def leaders(self) -> list[int]:
        return [self.host_ranks(h)[0] for h in range(len(self.local_size))]


class InaAllreduce:
    """Switch-only INA for one rank: it streams its own tensor as contributor
    (the host's first id + local rank) and receives on agent_port + local rank."""

    def __init__(self, params: JobParams, host: str, local_rank: int,
                 transport: Transport | None = None, *, session: int | None = None,
                 udp_segments: int | None = None, **stream_options):
        """session: the run's session, the same for every rank of every host; by default
        agreed over the default process group (every rank of every host, constructing this
        together); udp_segments: as PassingAllreduce's."""
        if params.mode != "ina":
            raise ValueError(f"job {params.job_id} is a {params.mode} job; "
                             "the ina strategy needs a job created with mode ina")
        h = params.host(host)
        if not 0 <= local_rank < h.local_gpus:
            raise ValueError(f"local rank {local_rank} but {host} has {h.local_gpus}")
        if transport is None:
            transport = UdpTransport(h.host_ip, params.agent_udp_ports(host)[local_rank],
                                     h.switch_ip, params.switch_udp_port,
                                     segments=udp_segments)
        agreed = session if session is not None else agree_in_group(None)
        # The job's current pool, under a session tied to it (host_agent.pool_move): a rank
        # holding another pool's parameters never shares a session with these.
        cfg = StreamConfig(params.job_id, params.contributor_ids(host)[local_rank],
                           params.window, params.streams,
                           pool_session(agreed, params.pool, params.window), local_gpus=1,
                           pool=params.pool, **stream_options)
        self.streamer = SlotStreamer(cfg, transport)

    def allreduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return stream_tensor(self.streamer, tensor)


def build(strategy: str, ranks: Ranks, params: JobParams, host: str,
          **stream_options) -> Callable[[torch.Tensor], torch.Tensor]:
    """The all-reduce function of `strategy` for this rank. The global process group must be
    initialised (every rank of every host). All ranks must call build() in the same order:
    it creates process groups."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (have: {', '.join(STRATEGIES)})")
    local_groups = [dist.new_group(ranks.host_ranks(h)) for h in range(len(ranks.local_size))]
    leaders_group = dist.new_group(ranks.leaders)
    local = local_groups[ranks.host_index]
    leader = ranks.host_ranks(ranks.host_index)[0]

    if strategy == "passing":
        # The leaders' group also sums while the job waits for switch slots (window 0).
        passing = PassingAllreduce(params, host, local, hosts_group=leaders_group,
                                   **stream_options)
        return passing.allreduce

    if strategy == "ina":
        return InaAllreduce(params, host, ranks.local_rank, **stream_options).allreduce

    if strategy == "ring":
        def ring(t: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(t)
            return t
        return ring

    if strategy == "hier-ring":
        def hier_ring(t: torch.Tensor) -> torch.Tensor:
            dist.reduce(t, dst=leader, group=local)
            if ranks.rank == leader:
                dist.all_reduce(t, group=leaders_group)
            dist.broadcast(t, src=leader, group=local)
            return t
        return hier_ring

    server = ranks.leaders[0]
    others = [r for r in range(sum(ranks.local_size)) if r != server]

    def ps(t: torch.Tensor) -> torch.Tensor:
        # Chunked and pipelined, as a real parameter server streams: the server sums chunk c
        # and sends it back while the pushes of later chunks still arrive, so pushes and pulls
        # share the server's link in both directions instead of taking turns; each worker
        # keeps at most PS_WINDOW chunks in flight.
        flat = t.view(-1)
        chunk = ps_chunk_bytes(flat.numel() * flat.element_size())
        chunks = flat.split(max(1, chunk // flat.element_size()))
        if ranks.rank == server:
            bufs = {(c, r): torch.empty_like(ch) for c, ch in enumerate(chunks) for r in others}
            pushes = {k: dist.irecv(buf, src=k[1], tag=k[0]) for k, buf in bufs.items()}
            pulls = []
            for c, ch in enumerate(chunks):
                for r in others:  # in rank order: the same sum on every run
                    pushes[c, r].wait()
                    ch += bufs[c, r]
                pulls += [dist.isend(ch, dst=r, tag=c) for r in others]
            for w in pulls:
                w.wait()
            return t
        result = torch.empty_like(flat)
        outs = result.split(chunks[0].numel())
        pushes, pulls = [], []
        for c, ch in enumerate(chunks):
            if c >= PS_WINDOW:
                pulls[c - PS_WINDOW].wait()
            pushes.append(dist.isend(ch, dst=server, tag=c))
            pulls.append(dist.irecv(outs[c], src=server, tag=c))
        # A gloo receive waited on twice waits for a second message that never comes: only
        # the pulls the window did not wait on yet.
        for w in pushes + pulls[max(0, len(chunks) - PS_WINDOW):]:
            w.wait()
        flat.copy_(result)
        return t
    return ps
