"""All-reduce strategies over the same ranks, for comparing PASSING with the usual baselines.

Every strategy sums a tensor over every rank of every host, in place:

* `passing`: local reduce, the leader streams through the switch, local broadcast.
* `ring`: torch.distributed (gloo) all-reduce over every rank of every host.
* `hier-ring`: local reduce, all-reduce among the hosts' leaders, local broadcast (Horovod's
  hierarchical all-reduce).
* `ps`: a parameter server on the first host's leader: every other rank sends its tensor there
  (push), the server sums, and sends the sum back to each (pull).

Switch-only aggregation (every rank its own stream, SwitchML/ATP) is not here: the switch tells
contributors apart by ingress port, so ranks behind one port cannot be separate contributors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from host_agent import STRATEGIES
from host_agent.allreduce import PassingAllreduce

__all__ = ["STRATEGIES", "PassingAllreduce", "Ranks", "build"]


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


def build(strategy: str, ranks: Ranks, params: dict, host: str,
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
        passing = PassingAllreduce(params, host, local, **stream_options)
        return passing.allreduce

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
    world = sum(ranks.local_size)

    def ps(t: torch.Tensor) -> torch.Tensor:
        if ranks.rank == server:
            buf = torch.empty_like(t)
            for r in range(world):
                if r != server:
                    dist.recv(buf, src=r)
                    t += buf
            for r in range(world):
                if r != server:
                    dist.send(t, dst=r)
        else:
            dist.send(t, dst=server)
            dist.recv(t, src=server)
        return t
    return ps
