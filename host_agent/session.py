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
TCPStore on the first host). On the store, every host writes a fresh nonce per round and the
session is a keyed hash of all of them; each host's n-th arrival joins round n, so a host whose
agent restarted while the others still run waits for a round they never join and gets a clear
error at the timeout, never the running session's number (see `agree_by_store`).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

import torch
import torch.distributed as dist

from host_agent.listener import wait_for_listener
from passing.contract import JobParams


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
    # NCCL moves CUDA tensors only (a local group of GPUs); gloo CPU ones.
    nccl = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    t = torch.tensor([_to_signed(value)], dtype=torch.int64, device=device)
    dist.broadcast(t, src=dist.get_global_rank(group, 0) if group is not None else 0,
                   group=group)
    return int(t.item()) & ((1 << 64) - 1)


def derive_session(key: bytes, job_id: int, rnd: int, nonces: list[str]) -> int:
    """The session of one rendezvous round: a hash of every host's fresh nonce (so it is new
    as long as any one host's nonce is), keyed with the job's secret (so that nobody without
    the job's parameters can compute it, even after reading the nonces off the store)."""
    h = hashlib.sha256(key + f"/passing/job{job_id}/round{rnd}/".encode())
    for n in nonces:
        h.update(bytes.fromhex(n))
    return int.from_bytes(h.digest()[:8], "big") or 1


def agree_by_store(store: dist.Store, job_id: int, host_index: int, parties: int,
                   timeout: float, key: bytes = b"") -> int:
    """The session of the `parties` hosts of job `job_id` that meet on `store`, each calling
    this once per run with its own index.

    Each host counts its own arrivals: its n-th arrival joins round n, which completes when
    every host has written its nonce for that round. So a host whose agent restarts while the
    others still run (its second arrival) waits for a round the others never join, however
    often it restarts, and fails at the timeout. The session is derived from all the round's
    nonces, each host checking that its own is among them as it wrote it: a party on the
    network that writes keys of its own can make the rendezvous fail, never make the hosts
    adopt a session it chose or one they used before."""
    if not 0 <= host_index < parties:
        raise ValueError(f"host index {host_index} outside 0..{parties - 1}")
    prefix = f"passing/job{job_id}"
    rnd = store.add(f"{prefix}/host{host_index}/arrivals", 1) - 1
    mine = secrets.token_bytes(16).hex()
    store.set(f"{prefix}/round{rnd}/host{host_index}", mine)
    keys = [f"{prefix}/round{rnd}/host{i}" for i in range(parties)]
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except (RuntimeError, dist.DistStoreError) as e:
        late = (" (this host already took part in a round of this run: has its agent restarted "
                "while the others still run?)") if rnd > 0 else ""
        raise RendezvousError(f"the other hosts did not join within {timeout:.0f}s{late}: "
                              f"{e}") from None
    nonces = [store.get(k).decode() for k in keys]
    if nonces[host_index] != mine or len(set(nonces)) != parties:
        raise RendezvousError(f"job {job_id}: the session rendezvous was tampered with (round "
                              f"{rnd}: this host's nonce was overwritten or repeated)")
    return derive_session(key, job_id, rnd, nonces)


def reach_rendezvous(host: str, port: int, timeout: float, what: str) -> None:
    """Return once the first host serves `what` at host:port, so that a TCPStore client
    connects at once (host_agent.listener); RendezvousError once `timeout` has passed."""
    if not wait_for_listener(host, port, timeout):
        raise RendezvousError(f"cannot reach {what} at {host}:{port}: nothing accepted a "
                              f"connection there within {timeout:g}s (is the first host's "
                              f"agent running?)")


def agree_by_tcp(host: str, port: int, job_id: int, host_index: int, parties: int,
                 timeout: float, key: bytes = b"") -> tuple[int, dist.TCPStore]:
    """`agree_by_store` on a TCPStore served by one of the parties at host:port. Keep the store
    for as long as the session runs: on the serving party, dropping it stops the server while
    the others may still be reading the session (and later arrivals must find it to be told
    that their round never starts)."""
    is_server = host_index == 0
    if not is_server:
        reach_rendezvous(host, port, timeout, "the session rendezvous")
    try:
        store = dist.TCPStore(host, port, is_master=is_server, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout))
    except (RuntimeError, dist.DistNetworkError) as e:
        role = "serve" if is_server else "reach"
        raise RendezvousError(f"cannot {role} the session rendezvous at {host}:{port}: "
                              f"{e}") from None
    return agree_by_store(store, job_id, host_index, parties, timeout, key), store


def job_session(params: JobParams, group: dist.ProcessGroup | None,
                session: int | None) -> int:
    """The run's session: `session` if the caller agreed on one with the other hosts, else one
    agreed over the default process group, which must then span every host of the job (a
    collective: every rank of it calls this)."""
    if session is not None:
        return session
    if len(params.hosts) > 1 and dist.get_world_size() <= dist.get_world_size(group):
        raise ValueError(
            f"job {params.job_id} has {len(params.hosts)} hosts but the default process "
            "group holds only this host's ranks, so the hosts cannot agree on a session: pass "
            "session= (e.g. host_agent.session.agree_by_tcp between the hosts' leaders)")
    return agree_in_group(None)
