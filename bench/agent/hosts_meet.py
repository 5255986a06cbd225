"""The hosts' leaders meet before each timed PASSING call, as every rank of the baselines meets
in a barrier of their world group: without it each host's timer starts at its own local
barrier, so the slowest host's time (the one the sweep reports) would also hold how long the
earliest host waited for the others to start, a skew of 10-20 ms at 64 KiB on a busy 2-core
machine that the baselines never pay.

The meeting's messages cross the same links as the call. The host that serves the store must
therefore leave last: its leader's first window goes out on the link that also carries the
store's answers to the other hosts, and an answer queued behind it (52 packets on BMv2's
2 Mbit/s links: 280 ms, past TCP's 200 ms retransmission timeout) started that host that late,
while the others' probe timers resent into the silence."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist


def hosts_meet(store: dist.Store, name: str, hosts: int, timeout: float,
               serving: bool = False) -> None:
    """Return once all `hosts` leaders have called this with the same `name` on `store` (the
    session rendezvous's, which lives for the whole command); the one `serving` the store
    returns only after every other host has passed. A host that never comes (its agent
    stopped, or restarted and was refused this run's session) is a HostsMissing at `timeout`
    that says so."""
    arrived, left = f"bench/{name}/arrived", f"bench/{name}/left"
    if store.add(arrived, 1) == hosts:
        store.set(f"bench/{name}/go", "1")  # (a set waits for no answer)
    else:
        _wait(store, f"bench/{name}/go", arrived, hosts, name, timeout)
    if serving:
        if hosts > 1:
            _wait(store, f"bench/{name}/gone", left, hosts - 1, name, timeout)
    elif store.add(left, 1) == hosts - 1:
        store.set(f"bench/{name}/gone", "1")


def _wait(store: dist.Store, key: str, counter: str, expected: int, name: str,
          timeout: float) -> None:
    try:
        store.wait([key], timedelta(seconds=timeout))
    except dist.DistStoreError as e:
        missing = expected - store.add(counter, 0)
        raise HostsMissing(
            f"{missing} of {expected} hosts did not come to {name} within {timeout:g} s: "
            "their agents stopped or were restarted (a restarted agent cannot rejoin a "
            "running job's session); start every host's agent again") from e


class HostsMissing(RuntimeError):
    """Some host's leader never reached a meeting: the job cannot go on without it."""
