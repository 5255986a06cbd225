"""What one `passing-agent` command does on its host: the command line's options, as the
ranks receive them."""

from __future__ import annotations

from dataclasses import dataclass

from host_agent.stream import StreamConfig
from passing_agent.workloads import train_budget_s

IDLE_GRACE_S = 10.0  # how long ranks may take to tear a command down after the leader reported


@dataclass(frozen=True)
class RunOptions:
    """What one passing-agent run does on its host (the command line's options)."""

    size: int = 1 << 20  # float32 values per tensor
    iters: int = 3
    warmup: int = 1  # untimed calls before the timed ones (checked all the same)
    seed: int = 0
    rto: float = 0.05
    timeout: float = 10.0
    min_rto: float = StreamConfig.min_rto
    gather_max: float = StreamConfig.gather_max  # (0: no gathering)
    strategy: str = "passing"
    ifname: str | None = None
    udp_segments: int = 0  # passing and ina: datagrams per message (0: the transport's default)
    rendezvous_port: int | None = None  # None: 29500 + job id
    rendezvous_timeout: float = 60.0
    train_steps: int = 0  # > 0: train an MLP on the digits instead of timed all-reduces
    global_batch: int = 0  # 0: 8 x ranks
    model: str = "digits-mlp"  # with train_steps: which MLP (passing_agent.workloads.MODELS)
    eval_every: int = 0  # with train_steps: test accuracy every this many steps (0: at the end)
    # Where the leader re-reads the job's parameters to learn of a live resize: this file, or
    # (None) the environment's source; every pool_poll seconds (0: never).
    params_file: str | None = None
    pool_poll: float = 2.0


def command_budget_s(opts: RunOptions) -> float:
    """How long the local ranks may take to report on one command before the agent gives up
    on them: every call's deadline, the rendezvous, start-up and training."""
    return (opts.timeout * (opts.iters + opts.warmup + 1) + opts.rendezvous_timeout + 120
            + train_budget_s(opts.model, opts.train_steps))
