"""Agent sessions: the number every host of one run puts in its packets.

The switch keeps a slot's sums for one session only: a contribution of another session finds the
slot empty and takes it over, and results carry the session they were summed in (see
docs/protocol.md, "Sessions"). So a run can never be handed sums left in the switch by an
earlier run, provided that

* every host of a run uses the same session, and
* no two runs use the same one: the number is drawn at random (64 bits, never 0, which is what a
  freshly started switch holds) when the run starts, and never taken from a file or a flag that
  a restarted process could read again.

The hosts agree on the number through a rendezvous they already have: a process group that spans
them (`agree_in_group`), or a key-value store (`agree_by_store`, what `passing-agent` uses with a
TCPStore on the first host). The store rendezvous counts arrivals in rounds of `parties`: a
process that arrives after its round was complete (one host's agent restarted alone while the
others still run) waits for a new round that the others never join, and gets a clear error at
the timeout instead of the running session's number.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

import torch
import torch.distributed as dist

_ARRIVALS = "passing/session/arrivals"


class RendezvousError(RuntimeError):
    """The hosts of the job did not all meet to start a session."""


def new_session() -> int:
    """A fresh random session number: 64 bits, never 0."""
    while True:
        s = secrets.randbits(64)
        if s:
            return s


def _to_signed(s: int) -> int:
    return s - (1 << 64) if s >= 1 << 63 else s


def agree_in_group(group: dist.ProcessGroup | None = None, proposal: int | None = None) -> int:
    """The session rank 0 of `group` proposes (a new one unless given), on every rank of it.
    A collective: every rank of the group must call it."""
    value = proposal if proposal is not None else new_session()
    # int64 travels through every backend; the session is an unsigned 64-bit number.
    t = torch.tensor([_to_signed(value)], dtype=torch.int64)
    dist.broadcast(t, src=dist.get_global_rank(group, 0) if group is not None else 0,
                   group=group)
    return int(t.item()) & ((1 << 64) - 1)


def agree_by_store(store: dist.Store, parties: int, timeout: float) -> int:
    """A session shared by the next `parties` processes that call this on `store`."""
    if parties < 1:
        raise ValueError("at least one party")
    arrival = store.add(_ARRIVALS, 1)  # 1, 2, ...: this process's place in line
    rnd = (arrival - 1) // parties
    key = f"passing/session/{rnd}"
    if arrival % parties == 0:  # the last of its round publishes the round's session
        store.set(key, str(new_session()))
    try:
        store.wait([key], timedelta(seconds=timeout))
    except (RuntimeError, dist.DistStoreError) as e:
        late = " (a round of this job already started without this process: has one host's " \
               "agent restarted while the others still run?)" if rnd > 0 else ""
        raise RendezvousError(f"the other hosts did not join within {timeout:.0f}s{late}: "
                              f"{e}") from None
    return int(store.get(key))


def agree_by_tcp(host: str, port: int, is_server: bool, parties: int,
                 timeout: float) -> tuple[int, dist.TCPStore]:
    """`agree_by_store` on a TCPStore served by one of the parties at host:port. Keep the store
    for as long as the session runs: on the serving party, dropping it stops the server while
    the others may still be reading the session (and later arrivals must find it to be told
    that their round never starts)."""
    try:
        store = dist.TCPStore(host, port, is_master=is_server, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout))
    except (RuntimeError, dist.DistNetworkError) as e:
        role = "serve" if is_server else "reach"
        raise RendezvousError(f"cannot {role} the session rendezvous at {host}:{port}: "
                              f"{e}") from None
    return agree_by_store(store, parties, timeout), store
