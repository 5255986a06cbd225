"""The hosts' leaders meet before each timed PASSING call, as every rank of the baselines meets
in a barrier of their world group: without it each host's timer starts at its own local
barrier, so the slowest host's time (the one the sweep reports) would also hold how long the
earliest host waited for the others to start, a skew of 10-20 ms at 64 KiB on a busy 2-core
machine that the baselines never pay."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist


def hosts_meet(store: dist.Store, name: str, hosts: int, timeout: float) -> None:
    """Return once all `hosts` leaders have called this with the same `name` on `store` (the
    session rendezvous's, which lives for the whole command). The last to arrive opens the
    gate the others wait on; a host that never comes is a RuntimeError at `timeout`."""
    if store.add(f"bench/{name}/arrived", 1) == hosts:
        store.set(f"bench/{name}/go", "1")
    store.wait([f"bench/{name}/go"], timedelta(seconds=timeout))
