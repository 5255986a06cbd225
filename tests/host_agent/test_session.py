"""The session rendezvous on a store (host_agent.session): every host of a run gets the same
new session; a host whose agent restarts while the others run gets none; a party on the network
writing into the store can make it fail, never make the hosts adopt a session it chose."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch.distributed as dist

from host_agent.listener import wait_for_listener
from host_agent.session import RendezvousError, agree_by_store, agree_by_tcp, derive_session
from tests.ports import free_port

JOB, KEY = 7, bytes.fromhex("00112233445566778899aabbccddeeff")


def meet(store, indices: list[int], parties: int, timeout: float = 5.0) -> list:
    """agree_by_store for each host index at once; a session or the error, per index."""
    out: list = [None] * len(indices)

    def one(i: int) -> None:
        try:
            out[i] = agree_by_store(store, JOB, indices[i], parties, timeout, KEY)
        except RendezvousError as e:
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(indices))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_every_host_gets_one_new_session_per_run():
    first = meet(dist.HashStore(), [0, 1, 2], 3)
    assert len(set(first)) == 1 and isinstance(first[0], int) and first[0] != 0
    second = meet(dist.HashStore(), [0, 1, 2], 3)  # the next run: a new store, a new session
    assert len(set(second)) == 1 and second[0] != first[0]


def test_a_restarted_host_gets_no_session_however_often_it_restarts():
    store = dist.HashStore()
    assert len(set(meet(store, [0, 1], 2))) == 1
    for _ in range(3):  # host 1's agent restarts again and again while host 0's runs on
        (late,) = meet(store, [1], 2, timeout=0.5)
        assert isinstance(late, RendezvousError)
        assert "already took part in a round of this run" in str(late)


def test_other_jobs_on_the_same_store_do_not_mix():
    store = dist.HashStore()
    ours = meet(store, [0, 1], 2)
    theirs = [agree_by_store(store, JOB + 1000, 0, 1, 5.0, KEY)]
    assert len(set(ours)) == 1 and theirs[0] not in ours


def test_a_writer_on_the_store_cannot_choose_or_replay_the_session():
    store = dist.HashStore()
    old = meet(store, [0, 1], 2)[0]
    # An attacker who read round 0 replays its nonces into round 1 before the hosts arrive
    # there (after a restart of every agent on the same store, say), and adds host 1's.
    nonces = [store.get(f"passing/job{JOB}/round0/host{i}").decode() for i in range(2)]
    store.set(f"passing/job{JOB}/round1/host1", nonces[1])
    (host0,) = meet(store, [0], 2, timeout=1.0)
    # Host 0 wrote a fresh nonce of its own: the session differs from every earlier one.
    assert host0 != old and host0 == derive_session(KEY, JOB, 1, [
        store.get(f"passing/job{JOB}/round1/host0").decode(), nonces[1]])
    # And a host whose own nonce is overwritten refuses the round.
    store2 = dist.HashStore()

    def overwrite_then_complete() -> None:
        store2.wait([f"passing/job{JOB}/round0/host0"])
        store2.set(f"passing/job{JOB}/round0/host0", "cd" * 16)
        store2.set(f"passing/job{JOB}/round0/host1", "ab" * 16)

    t = threading.Thread(target=overwrite_then_complete)
    t.start()
    (victim,) = meet(store2, [0], 2, timeout=5.0)
    t.join(5)
    assert isinstance(victim, RendezvousError) and "tampered" in str(victim)


def test_without_the_key_the_session_cannot_be_computed_from_the_nonces():
    nonces = ["01" * 16, "02" * 16]
    assert derive_session(KEY, JOB, 0, nonces) != derive_session(b"", JOB, 0, nonces)


def test_host_index_is_checked():
    with pytest.raises(ValueError, match="host index 2 outside 0..1"):
        agree_by_store(dist.HashStore(), JOB, 2, 2, 1.0)


def test_hosts_that_ask_before_the_first_host_serves_still_meet_it():
    """The other leaders usually reach the rendezvous a moment before the first host serves
    it: they wait for it (host_agent.listener) and all get the one session."""
    port = free_port()
    out: dict = {}
    # Every store, the server's above all, lives until every host is done, as agents keep
    # theirs for the whole run; a barrier on the store itself would race the server's teardown
    # with the last host's read of it.
    stores: list = []

    def one(index: int) -> None:
        if index == 0:
            time.sleep(0.2)  # the first host late
        try:
            session, store = agree_by_tcp("127.0.0.1", port, JOB, index, 3, 10.0, KEY)
            stores.append(store)
            out[index] = session
        except (RendezvousError, RuntimeError) as e:
            out[index] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in (1, 2, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stores.clear()
    assert set(out) == {0, 1, 2}
    assert len(set(out.values())) == 1 and isinstance(out[0], int) and out[0] != 0, out


def test_a_first_host_that_never_serves_is_a_clear_error_at_the_timeout():
    port = free_port()
    with pytest.raises(RendezvousError, match=rf"cannot reach the session rendezvous at "
                       rf"127.0.0.1:{port}: nothing accepted a connection there within 0.3s"):
        agree_by_tcp("127.0.0.1", port, JOB, 1, 3, 0.3, KEY)


def test_waiting_for_a_listener_ends_at_its_timeout_when_none_comes():
    port = free_port()
    assert wait_for_listener("127.0.0.1", port, 0.2) is False
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert wait_for_listener("127.0.0.1", port, 0.2) is True
