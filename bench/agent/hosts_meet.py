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
    gate the others wait on; a host that never comes (its agent stopped, or restarted and was
    refused this run's session) is a HostsMissing at `timeout` that says so."""
    arrived = f"bench/{name}/arrived"
    if store.add(arrived, 1) == hosts:
        store.set(f"bench/{name}/go", "1")
    try:
        store.wait([f"bench/{name}/go"], timedelta(seconds=timeout))
    except dist.DistStoreError as e:
        here = store.add(arrived, 0)
        raise HostsMissing(
            f"{hosts - here} of {hosts} hosts did not come to {name} within {timeout:g} s: "
            "their agents stopped or were restarted (a restarted agent cannot rejoin a "
            "running job's session); start every host's agent again") from e


class HostsMissing(RuntimeError):
    """Some host's leader never reached a meeting: the job cannot go on without it."""
