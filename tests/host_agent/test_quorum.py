"""The agents' side of quorum completion (docs/protocol.md, "Rounds, quorum and late
contributions"): CLOSE after `patience`, a late host taking the results it missed, the
staleness bound, and a host whose values no longer fit the agreed scale abstaining. Counted,
never timed: the delays only make one host late."""

from __future__ import annotations

import itertools
import socket
import threading
import time

import numpy as np
import pytest

from host_agent import fixed_point as fx
from host_agent.session import new_session
from host_agent.stream import SlotStreamer, StreamConfig, _Call
from host_agent.transport import UdpTransport
from passing import protocol as P
from testbed.loopback import LoopbackSwitch, UdpLoopbackSwitch, random_tensors
from tests.host_agent.test_backend import free_port

HOSTS = 3


def streamers(switch: LoopbackSwitch, window: int, **cfg) -> list[SlotStreamer]:
    session = new_session()
    return [SlotStreamer(StreamConfig(switch.job_id, p - 1, window, HOSTS, session, **cfg),
                         switch.transport(p)) for p in range(1, HOSTS + 1)]


def run_calls(hosts: list[SlotStreamer], tensors, calls: int, late: dict[int, float]):
    """Every host makes `calls` calls in its own thread; host i sleeps late[i] seconds before
    each call (a straggler). Returns results[host][call] and counts[host][call]."""
    results = [[None] * calls for _ in hosts]
    counts = [[None] * calls for _ in hosts]
    errors = []

    def work(i):
        try:
            for c in range(calls):
                time.sleep(late.get(i, 0.0))
                results[i][c] = hosts[i].allreduce(tensors[i] * (c + 1))
                counts[i][c] = hosts[i].last_counts.copy()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(hosts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results, counts


def made_of(result: np.ndarray, counts: np.ndarray, sent: list[np.ndarray]) -> np.ndarray:
    """Per element: the result is, within the fixed-point bound, the sum of `count` of the
    hosts' values (some subset of that size: which one a quorum took is not fixed)."""
    t = [x.astype(np.float64) for x in sent]
    ok = np.zeros(result.shape, dtype=bool)
    for subset in itertools.chain.from_iterable(
            itertools.combinations(range(len(t)), k) for k in range(1, len(t) + 1)):
        near = np.abs(result - sum(t[i] for i in subset)) <= bound(sent)
        ok |= near & (counts == len(subset))
    return ok


def bound(tensors) -> np.ndarray:
    blocks = [fx.block_exponents(np.resize(t, (-(-t.size // P.K)) * P.K).reshape(-1, P.K))
              for t in tensors]
    exp = np.max(blocks, axis=0)
    return np.repeat(fx.error_bound(exp, HOSTS), P.K)[:tensors[0].size] * 4


def test_a_straggler_is_left_out_by_a_quorum_and_then_waited_for(tmp_path):
    """Quorum 2 of 3, patience 50 ms, staleness 1, host 3 starts each call 0.4 s late:
    call 1 closes rounds without it (their sums hold hosts 1 and 2 exactly, and the late host
    takes those same results); call 2 follows a short call, so it waits for everyone (full
    sums); call 3 closes without it again. Every host ends each call with the same values,
    and nothing is ever added twice."""
    sw = LoopbackSwitch(HOSTS, slots=8, quorum=2)
    hosts = streamers(sw, 8, patience=0.05, staleness=1)
    tensors = random_tensors(HOSTS, 20 * P.K, seed=3)
    results, counts = run_calls(hosts, tensors, 3, late={2: 0.4})
    for c, scale in enumerate((1, 2, 3)):
        for i in range(HOSTS):
            assert np.array_equal(results[i][c], results[0][c]), (i, c)
            assert np.array_equal(counts[i][c], counts[0][c]), (i, c)
        # A short sum holds two hosts' values, a full one all three; once the late host has
        # caught up (within a call) any two may be the ones a round closed with.
        n = counts[0][c]
        assert set(np.unique(n).tolist()) <= {2, 3}, c
        sent = [x * scale for x in tensors]  # what each host summed, as it computed it
        assert np.all(made_of(results[0][c], n, sent)), c
        if c == 1:
            assert np.all(n == 3)  # after a short call, everyone is waited for
        else:
            assert np.any(n == 2), c
    fast, late = hosts[0].stats, hosts[2].stats
    assert fast.closes > 0 and fast.short_calls == 2 and late.short_calls == 2
    assert late.taken_early > 0  # results of rounds it never sent, taken from the multicast
    assert hosts[0].short_streak == 1
    # An empty call after a short one leaves no counts of the earlier call behind.
    assert hosts[0].allreduce(np.zeros(0)).size == 0 and hosts[0].last_counts.size == 0


def test_without_patience_a_quorum_job_waits_for_everyone():
    sw = LoopbackSwitch(HOSTS, slots=8, quorum=2)
    hosts = streamers(sw, 8)
    tensors = random_tensors(HOSTS, 5 * P.K, seed=4)
    results, counts = run_calls(hosts, tensors, 1, late={1: 0.3})
    assert all(np.all(c[0] == HOSTS) for c in counts)
    assert np.all(np.abs(results[0][0] - sum(t.astype(np.float64) for t in tensors))
                  <= bound(tensors))
    assert all(h.stats.closes == 0 and h.stats.short_calls == 0 for h in hosts)


@pytest.mark.parametrize("agreed_below_own", [False, True])
def test_a_host_whose_values_do_not_fit_the_agreed_scale_abstains(agreed_below_own):
    """The agreed exponent of a fragment below this host's own (its proposal was left out by
    a quorum): it sends zeros that count for no GPU instead of values that would wrap."""
    blocks = np.full((2, P.K), 1000.0)
    local = fx.block_exponents(blocks)
    call = _Call(blocks, local, window=1, streams=HOSTS, tag=0)
    call.step[0] = 1  # fragment 0's value packet
    call.agreed[0] = local[0] - 3 if agreed_below_own else local[0]
    values, _, abstain = call.values_and_exponents(np.array([0]), np.array([0]))
    assert abstain.tolist() == [agreed_below_own]
    if agreed_below_own:
        assert not values.any()
    else:
        assert np.all(fx.dequantize(values, call.agreed[:1], call.s_bits) == 1000.0)


def test_a_host_late_by_more_results_than_its_socket_holds_takes_them_all():
    """Over real UDP: the late host's receive buffer holds about 100 results, and the others
    close all 608 rounds of a call before it even starts. A reader keeps them between calls,
    so it takes every one instead of losing the overflow (and failing with SwitchTimeout)."""
    sw = UdpLoopbackSwitch(HOSTS, agent_udp_port=free_port(socket.SOCK_DGRAM), slots=8,
                           quorum=2)
    try:
        params, session = sw.agent_params(), new_session()
        hosts = []
        for h in params.hosts:
            t = UdpTransport(h.host_ip, params.agent_udp_port, h.switch_ip,
                             params.switch_udp_port)
            if h.contributor_id == 2:
                t.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
            hosts.append(SlotStreamer(StreamConfig(params.job_id, h.contributor_id, 8, HOSTS,
                                                   session, patience=0.02, deadline=30), t))
        tensors = [np.full(600 * P.K, float(i + 1)) for i in range(HOSTS)]
        results: list = [None] * HOSTS
        errors: list = []

        def work(i):
            try:
                results[i] = hosts[i].allreduce(tensors[i])
            except Exception as e:  # reported below
                errors.append(e)

        fast = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
        for t in fast:
            t.start()
        for t in fast:
            t.join(60)
        assert not errors, errors
        work(2)  # only now, with every result of the call already sent its way
        assert not errors, errors
        assert all(np.array_equal(r, results[0]) for r in results)
        assert np.all(results[0] == 3.0)  # hosts 1 and 2 in every round
        rounds = 8 + 600  # each slot's exponent packet, then its 75 fragments
        assert hosts[2].stats.taken_early == rounds and hosts[2].stats.packets == 0
        for h in hosts:
            h.close()
    finally:
        sw.close()
