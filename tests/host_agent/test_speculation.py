"""Speculative scale (docs/protocol.md, "Speculative scale"): a call of a size the session
summed before sends each fragment once, quantized at the exponent the last such call agreed
plus one, proposing its own exponent beside it; where the switch's maximum shows the
prediction too low (the values might have wrapped) or too high (more than SPEC_SLACK bits of
precision lost), the fragment is sent again at that maximum. Counted, never timed."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from host_agent import fixed_point as fx
from host_agent.pool_move import pool_session
from host_agent.session import new_session
from host_agent.stream import SlotStreamer, StreamConfig
from passing import protocol as P
from testbed.loopback import LoopbackSwitch, random_tensors
from tests.host_agent.test_quorum import made_of, run_calls
from tests.host_agent.threads import each_host


class Counting:
    """A host's transport that counts the packets it sends, resends (RETRANS) aside: those
    depend on the threads' timing."""

    def __init__(self, inner):
        self.inner, self.sent = inner, 0

    def send(self, payload):
        self.sent += not payload[5] & P.Flag.RETRANS
        self.inner.send(payload)

    def recv(self, timeout):
        return self.inner.recv(timeout)


def hosts_of(switch: LoopbackSwitch, count: int, window: int = 8, **cfg):
    session = new_session()
    return [SlotStreamer(StreamConfig(switch.job_id, p - 1, window, count, session, **cfg),
                         Counting(switch.transport(p))) for p in range(1, count + 1)]


def each_call(hosts, calls):
    """calls[c][i]: host i's tensor in call c, every host in its own thread, call after call.
    Returns results[c][i] and the packets each host sent in each call, [c][i]."""
    results = [[None] * len(hosts) for _ in calls]
    packets = [[0] * len(hosts) for _ in calls]

    def work(i):
        for c, tensors in enumerate(calls):
            before = hosts[i].transport.sent
            results[c][i] = hosts[i].allreduce(tensors[i])
            packets[c][i] = hosts[i].transport.sent - before

    each_host(work, len(hosts))
    return results, packets


def tight_bound(tensors, slack: int = 0) -> np.ndarray:
    """The fixed point's bound per element for these host tensors, at the hosts' maximum
    exponent plus `slack` bits."""
    n = tensors[0].size
    nfrag = -(-n // P.K)
    padded = np.zeros((len(tensors), nfrag * P.K))
    padded[:, :n] = np.abs(np.asarray(tensors, dtype=np.float64))
    exp = fx.block_exponents(padded.reshape(len(tensors), nfrag, P.K).max(axis=0))
    return np.repeat(fx.error_bound(exp, len(tensors)) * 2.0 ** slack, P.K)[:n]


def exact(tensors) -> np.ndarray:
    return np.sum([t.astype(np.float64) for t in tensors], axis=0)


def test_the_rules_edges():
    pred = fx.predict(np.array([0, 1, 130, 253, 254], dtype=np.uint8))
    assert pred.tolist() == [1, 2, 131, 254, 254]  # never POISON
    most = np.array([0, 2, 128, 129, 131, 132, fx.POISON])
    holds = fx.speculation_holds(np.full(7, 131, dtype=np.uint8), most.astype(np.uint8))
    assert holds.tolist() == [True, False, False, True, True, False, True]


def test_a_repeated_call_sends_each_fragment_once_and_every_sum_is_right():
    """Calls of one size whose magnitudes drift by less than a power of two: the first
    sends an exponent packet per slot, every later one a packet per fragment; each sum is
    within the bound of its scale (SPEC_SLACK bits at most above the hosts' maximum)."""
    sw = LoopbackSwitch(3, slots=8)
    hosts = hosts_of(sw, 3)
    nfrag = 20
    base = random_tensors(3, nfrag * P.K - 5, seed=11)
    calls = [[t * f for t in base] for f in (1.0, 1.3, 0.8, 1.1)]
    results, packets = each_call(hosts, calls)
    for c, tensors in enumerate(calls):
        for i in range(3):
            assert np.all(np.abs(results[c][i] - exact(tensors))
                          <= tight_bound(tensors, fx.SPEC_SLACK if c else 0)), (c, i)
        assert results[c][0].tobytes() == results[c][1].tobytes() == results[c][2].tobytes()
    assert [p[0] for p in packets] == [nfrag + 8, nfrag, nfrag, nfrag]
    assert all(h.stats.speculated == 3 * nfrag and h.stats.spec_missed == 0 for h in hosts)
    assert all(np.array_equal(h.rounds, hosts[0].rounds) for h in hosts)


@pytest.mark.parametrize("factor", [2.0 ** 12, 2.0 ** -12])
def test_a_prediction_that_does_not_hold_is_sent_again_at_the_hosts_maximum(factor):
    """One host's fragment 5 grows 4096-fold (its values would wrap at the predicted scale:
    it abstains, and its proposal shows the others the prediction too low), or every host's
    shrinks 4096-fold (the prediction would give up 12 bits). Either way fragment 5 is sent
    again at the hosts' maximum, so its sum is within the bound of the exact scale; the
    other fragments hold."""
    sw = LoopbackSwitch(2, slots=8)
    hosts = hosts_of(sw, 2)
    base = random_tensors(2, 12 * P.K, seed=12)
    second = [t.copy() for t in base]
    frag5 = slice(5 * P.K, 6 * P.K)
    for i in ((0,) if factor > 1 else (0, 1)):
        second[i][frag5] *= factor
    results, packets = each_call(hosts, [base, second])
    for i in range(2):
        got, want = results[1][i], exact(second)
        assert np.all(np.abs(got[frag5] - want[frag5]) <= tight_bound(second)[frag5])
        assert np.all(np.abs(got - want) <= tight_bound(second, fx.SPEC_SLACK))
    assert packets == [[20, 20], [13, 13]]  # 12 fragments on 8 slots; then 12 and 1 again
    assert all(h.stats.speculated == 12 and h.stats.spec_missed == 1 for h in hosts)
    assert hosts[0].stats.abstained == (1 if factor > 1 else 0)


def test_nan_while_speculating_fails_the_call_everywhere_and_the_next_agrees_first():
    """NaN on one host in a speculating call: its proposal is POISON, every host raises, no
    fragment is sent again, and its GPUs still count (as when agreeing first); the next
    call of that size agrees on exponents first (nothing
    to predict from) and sums right."""
    sw = LoopbackSwitch(2, slots=8)
    hosts = hosts_of(sw, 2)
    base = random_tensors(2, 6 * P.K, seed=13)
    each_call(hosts, [base])
    bad = [base[0].copy(), base[1]]
    bad[0][3] = np.nan
    raised = []

    def work(i):
        try:
            hosts[i].allreduce(bad[i])
        except fx.NonFiniteError as e:
            raised.append((i, e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(i for i, _ in raised) == [0, 1]
    assert all(h.stats.spec_missed == 0 for h in hosts)
    # The NaN host sent zeros for its GPUs, not an abstention: no GPU counts as left out, so
    # a quorum job's next call would not close rounds early (StreamStats.short_calls).
    assert all(h.stats.abstained == 0 and h.stats.short_calls == 0 and not h.eager
               for h in hosts)
    assert all(6 not in h.scales for h in hosts)
    results, packets = each_call(hosts, [base])
    assert [p[0] for p in packets] == [12]  # exponent packets again
    for i in range(2):
        assert np.all(np.abs(results[0][i] - exact(base)) <= tight_bound(base))


def test_a_host_behind_takes_calls_whose_speculation_missed():
    """Quorum 2 of 3, host 3 away: hosts 1 and 2 make three calls of one size, the second
    with one fragment grown 4096-fold (sent again). Host 3's walk through the kept results
    follows the same packets (exponent packets, then speculation, then the resent fragment),
    finds the three calls, and takes each exactly."""
    sw = LoopbackSwitch(3, slots=8, quorum=2)
    hosts = hosts_of(sw, 3, patience=0.02, staleness=5)
    try:
        n = 20 * P.K + 7
        base = random_tensors(3, n, seed=14)
        grown = [t.copy() for t in base]
        grown[0][7 * P.K:8 * P.K] *= 2.0 ** 12
        calls = [base[:2], grown[:2], base[:2]]
        results, _ = each_call(hosts[:2], calls)
        assert hosts[0].stats.spec_missed >= 1
        deadline = time.monotonic() + 10
        while hosts[2].calls_ready(n) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hosts[2].calls_ready(n) == 3
        assert hosts[2].calls_ready(n + P.K) == 0 and hosts[2].calls_ready(n - P.K) == 0
        for c in range(3):
            assert np.array_equal(hosts[2].allreduce(np.zeros(n)), results[c][0]), c
        assert hosts[2].transport.sent == 0
        assert hosts[2].calls_ready(n) == 0
        assert np.array_equal(hosts[2].scales[21][0], hosts[0].scales[21][0])
        # In step: all three hosts' next call (it speculates; after short calls, a quorum
        # may close it) sums the values of as many hosts as its counts say.
        fourth, counts = run_calls(hosts, base, 1, late={})
        assert all(np.array_equal(r[0], fourth[0][0]) for r in fourth)
        assert np.all(made_of(fourth[0][0], counts[0][0], base))
    finally:
        for h in hosts:
            h.close()


def test_the_speculation_rule_is_part_of_the_pool_session():
    """Agents of another rule would read the same packets differently (an exponent packet
    for values): they never share a session with these."""
    import hashlib

    session = 0x1234
    # Before speculation, and speculation on the slots an agreeing call uses: other rounds.
    for rule in (b"slots 64/16", b"slots 64/16 speculate 1/2, zero holds, fewer misses than "
                                 b"slots"):
        old = hashlib.sha256(session.to_bytes(8, "big") + (0).to_bytes(4, "big")
                             + (8).to_bytes(4, "big") + b"passing/pool" + rule).digest()
        assert pool_session(session, 0, 8) != (int.from_bytes(old[:8], "big") or 1), rule


def test_a_block_that_turns_to_zeros_stands_and_one_that_wakes_up_is_sent_again():
    """A ReLU unit's gradient block: all zeros on every host in call 2 (the maximum is 0:
    the sum is exactly zero, at any scale), then back to ordinary values in call 3 (far
    above the prediction from zeros: sent again at the hosts' maximum)."""
    sw = LoopbackSwitch(2, slots=8)
    hosts = hosts_of(sw, 2)
    base = random_tensors(2, 6 * P.K, seed=15)
    dead = [t.copy() for t in base]
    for t in dead:
        t[2 * P.K:3 * P.K] = 0.0
    results, packets = each_call(hosts, [base, dead, base])
    assert packets == [[12, 12], [6, 6], [7, 7]]
    for c, sent in enumerate([base, dead, base]):
        for i in range(2):
            assert np.all(np.abs(results[c][i] - exact(sent))
                          <= tight_bound(sent, fx.SPEC_SLACK if c else 0)), (c, i)
    assert not results[1][0][2 * P.K:3 * P.K].any()
    assert all(h.stats.spec_missed == 1 for h in hosts)


# (fragments, window): on 8 slots an agreeing and a speculating call use the same 8; on 256,
# 200 fragments use 64 slots when agreeing (one per 16 fragments, at least 64) and 200 when
# speculating (the whole window), so the two modes' slots and rounds differ.
MODES = [(16, 8), (200, 256)]


@pytest.mark.parametrize("nfrag,window", MODES)
def test_a_gradient_whose_blocks_jump_agrees_first_until_they_settle(nfrag, window):
    """Call 2 scales every block by 2**10: all fragments miss (at least as many as an agreeing
    call's slots), so call 3 agrees first (an exponent packet per slot) though it repeats call
    2's values; from those (nothing would have missed) call 4 speculates again."""
    agreeing = P.slots_used(window, nfrag)
    sw = LoopbackSwitch(2, slots=window)
    hosts = hosts_of(sw, 2, window=window)
    base = random_tensors(2, nfrag * P.K, seed=16)
    jumped = [t * 2.0 ** 10 for t in base]
    calls = [base, jumped, jumped, jumped]
    results, packets = each_call(hosts, calls)
    assert [p[0] for p in packets] == [nfrag + agreeing, 2 * nfrag, nfrag + agreeing, nfrag]
    assert all(h.stats.spec_missed == nfrag and h.stats.spec_declined == 1 for h in hosts)
    assert all(h.stats.speculated == 2 * nfrag for h in hosts)
    for c, sent in enumerate(calls):
        for i in range(2):
            assert np.all(np.abs(results[c][i] - exact(sent))
                          <= tight_bound(sent, fx.SPEC_SLACK if c in (1, 3) else 0)), (c, i)


@pytest.mark.parametrize("nfrag,window", MODES)
def test_a_host_behind_follows_the_others_from_speculation_to_agreeing_and_back(nfrag, window):
    """The same four calls as above with host 3 away (quorum 2 of 3): its walk through the
    kept results follows every change of mode (and of the slots each mode uses), finds the
    four calls, and takes them."""
    sw = LoopbackSwitch(3, slots=window, quorum=2)
    hosts = hosts_of(sw, 3, window=window, patience=0.02, staleness=5)
    try:
        n = nfrag * P.K
        base = random_tensors(3, n, seed=17)
        jumped = [t * 2.0 ** 10 for t in base]
        results, _ = each_call(hosts[:2], [base[:2], jumped[:2], jumped[:2], jumped[:2]])
        assert hosts[0].stats.spec_declined == 1
        deadline = time.monotonic() + 10
        while hosts[2].calls_ready(n) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hosts[2].calls_ready(n) == 4
        for c in range(4):
            assert np.array_equal(hosts[2].allreduce(np.zeros(n)), results[c][0]), c
        assert hosts[2].transport.sent == 0
        assert hosts[2].scales[nfrag][1] and np.array_equal(hosts[2].scales[nfrag][0],
                                                            hosts[0].scales[nfrag][0])
        assert np.array_equal(hosts[2].rounds, hosts[0].rounds)
    finally:
        for h in hosts:
            h.close()
