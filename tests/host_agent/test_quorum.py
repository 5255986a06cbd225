"""The agents' side of quorum completion (docs/protocol.md, "Rounds, quorum and late
contributions"): CLOSE after `patience`, a late host taking the results it missed, the
staleness bound, and a host whose values no longer fit the agreed scale abstaining. Counted,
never timed: the delays only make one host late."""

from __future__ import annotations

import collections
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
from passing.packet import PAYLOAD_DTYPE as P_DTYPE
from testbed.loopback import LoopbackSwitch, UdpLoopbackSwitch, random_tensors
from tests.host_agent.test_backend import free_port
from tests.host_agent.threads import each_host

HOSTS = 3


_made: list[SlotStreamer] = []


@pytest.fixture(autouse=True)
def _close_streamers():
    """A quorum job's streamers read between calls; each test's are closed after it, so no
    reader of one test is still running in the next."""
    yield
    while _made:
        _made.pop().close()


def streamers(switch: LoopbackSwitch, window: int, **cfg) -> list[SlotStreamer]:
    session = new_session()
    made = [SlotStreamer(StreamConfig(switch.job_id, p - 1, window, HOSTS, session, **cfg),
                         switch.transport(p)) for p in range(1, HOSTS + 1)]
    _made.extend(made)
    return made


def run_calls(hosts: list[SlotStreamer], tensors, calls: int, late: dict[int, float]):
    """Every host makes `calls` calls in its own thread; host i sleeps late[i] seconds before
    each call (a straggler). Returns results[host][call] and counts[host][call]."""
    results = [[None] * calls for _ in hosts]
    counts = [[None] * calls for _ in hosts]

    def work(i):
        for c in range(calls):
            time.sleep(late.get(i, 0.0))
            results[i][c] = hosts[i].allreduce(tensors[i] * (c + 1))
            counts[i][c] = hosts[i].last_counts.copy()

    each_host(work, len(hosts))
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


def assert_alike_and_made_of(results, counts, tensors) -> None:
    """Call c of run_calls (every host's tensor times c + 1): every host ended with the same
    values, each element the sum of as many hosts' values as its count says."""
    for c in range(len(results[0])):
        assert all(np.array_equal(results[i][c], results[0][c]) for i in range(HOSTS)), c
        assert np.all(made_of(results[0][c], counts[0][c], [t * (c + 1) for t in tensors])), c


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
    # The counts of a tail of the sum (what a pool vote reads) are those of the whole sum's.
    whole = hosts[0].last_counts
    assert np.array_equal(whole, counts[0][2]) and np.any(whole == 2)
    for start in (0, 1, P.K - 1, P.K, 5 * P.K + 3, 20 * P.K - 1, 20 * P.K):
        assert np.array_equal(hosts[0].counts_from(start), whole[start:]), start
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


class SlowSwitch(LoopbackSwitch):
    """A switch that takes `gap` seconds per frame and serves its ports' queues in turn, as
    BMv2 does when a call's burst queues in front of its pipeline: the answers to a burst
    come one by one, steadily, the last long after the first."""

    def __init__(self, hosts: int, gap: float, **kw):
        super().__init__(hosts, **kw)
        self.gap = gap
        self.inbox: dict[int, collections.deque] = {p: collections.deque()
                                                    for p in range(1, hosts + 1)}
        self.ready = threading.Condition()
        self.stopped = False
        self.worker = threading.Thread(target=self._work, daemon=True)
        self.worker.start()

    def deliver(self, port: int, payload: bytes) -> None:
        with self.ready:
            self.inbox[port].append(payload)
            self.ready.notify()

    def _work(self) -> None:
        while True:
            with self.ready:
                self.ready.wait_for(lambda: self.stopped or any(self.inbox.values()))
                if self.stopped:
                    return
                turn = [(p, q.popleft()) for p, q in self.inbox.items() if q]
            for port, payload in turn:
                time.sleep(self.gap)
                super().deliver(port, payload)

    def close(self) -> None:
        with self.ready:
            self.stopped = True
            self.ready.notify()
        self.worker.join(10)


def test_a_busy_switch_is_not_taken_for_a_straggler():
    """Quorum 2 of 3, patience 100 ms, every fragment of a call in one round (16 slots), a
    switch that takes 5 ms a frame: each call's burst of 3 x 16 packets takes ~240 ms to get
    through, so most packets wait longer than the patience, yet a result comes every ~15 ms.
    No packet may ask for CLOSE then (it would only lengthen the queue, and could cut out a
    host whose packet the switch had not reached yet): every sum is full and exact, nothing
    is resent (the loss timer set long: this is about patience). A host that then sends
    nothing for 0.4 s is still left out."""
    sw = SlowSwitch(HOSTS, gap=0.005, slots=16, quorum=2)
    hosts = streamers(sw, 16, patience=0.1, staleness=5, rto=0.5)
    tensors = random_tensors(HOSTS, 16 * P.K, seed=8)
    try:
        results, counts = run_calls(hosts, tensors, 2, late={})
        for c in range(2):
            exact = sum(t.astype(np.float64) * (c + 1) for t in tensors)
            for i in range(HOSTS):
                assert np.all(counts[i][c] == HOSTS), (i, c)
                assert np.all(np.abs(results[i][c] - exact) <= bound(tensors) * (c + 1))
        for h in hosts:
            assert h.stats.closes == 0 and h.stats.short_calls == 0, h.stats
            assert h.stats.retransmissions == 0, h.stats
        results, counts = run_calls(hosts, tensors, 1, late={2: 0.4})
        assert np.any(counts[0][0] == 2) and hosts[0].stats.short_calls == 1
        assert all(np.array_equal(results[i][0], results[0][0]) for i in range(HOSTS))
        assert np.all(made_of(results[0][0], counts[0][0], tensors))
    finally:
        for h in hosts:
            h.close()
        sw.close()


def test_adaptive_patience_behind_a_busy_switch_learns_the_wait_at_a_calls_start():
    """Patience between 5 and 200 ms, the switch of the test above at 2 ms a frame. The gaps
    between one result and the next (~6 ms) are not what a late host must exceed: the wait
    at a call's start is (the hosts' skew, the first answers). Learned from the gaps, the
    patience would sink to its 5 ms floor and clean calls would ask for CLOSE again. A host
    then 100 ms late is still left out, in calls where rounds that waited for it alternate
    with rounds that closed without it."""
    sw = SlowSwitch(HOSTS, gap=0.002, slots=16, quorum=2)
    hosts = streamers(sw, 16, patience=0.2, patience_min=0.005, staleness=5, rto=0.5)
    tensors = random_tensors(HOSTS, 64 * P.K, seed=9)
    try:
        _, counts = run_calls(hosts, tensors, 6, late={})
        assert all(np.all(c == HOSTS) for per_host in counts for c in per_host)
        assert all(h.stats.closes == 0 for h in hosts), [h.stats for h in hosts]
        assert all(h.patience_now() > 2 * HOSTS * sw.gap for h in hosts), \
            [h.patience_now() for h in hosts]
        results, counts = run_calls(hosts, tensors, 3, late={2: 0.1})
        assert hosts[0].stats.short_calls > 0
        assert_alike_and_made_of(results, counts, tensors)
    finally:
        for h in hosts:
            h.close()
        sw.close()


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
        # Without the reader it could keep only what its buffer held (about 100). A result
        # the kernel still dropped while the machine was busy is asked for again, and
        # answered while its slot's version holds it (else the call would fail, not pass).
        assert hosts[2].stats.taken_early >= rounds - 8
        for h in hosts:
            h.close()
    finally:
        sw.close()


def test_a_host_behind_by_whole_calls_is_told_so_and_takes_them_without_sending():
    """Hosts 1 and 2 make three calls (quorum 2 of 3, staleness 5) while host 3 is away.
    Host 3 is then 3 calls behind for tensors of that size and for no other size; it makes
    those calls with zeros, sends nothing, and gets exactly the others' results and counts,
    call by call. Then it is behind by none, and in a fourth call it sends again."""
    sw = LoopbackSwitch(HOSTS, slots=8, quorum=2)
    hosts = streamers(sw, 8, patience=0.02, staleness=5)
    n = 20 * P.K + 7  # fragments span the window more than once, the last one partial
    tensors = random_tensors(HOSTS, n, seed=5)
    assert hosts[2].calls_ready(n) == 0
    results, counts = run_calls(hosts[:2], tensors[:2], 3, late={})
    deadline = time.monotonic() + 10
    while hosts[2].calls_ready(n) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # the reader takes the multicast in
    assert hosts[2].calls_ready(n) == 3
    assert hosts[2].calls_ready(n, most=2) == 2
    assert hosts[2].calls_ready(n + P.K) == 0  # a larger call has results still to come
    # Smaller calls are not prefixes of those: each slot's last result says more follows ...
    assert hosts[2].calls_ready(n - P.K) == 0
    assert hosts[2].calls_ready(n - 3) == 3  # (the same fragments: the same call)
    # ... and a call on fewer slots leaves the others' results of those slots unexplained.
    assert hosts[2].calls_ready(4 * P.K) == 0
    for c in range(3):
        taken = hosts[2].allreduce(np.zeros(n))
        assert np.array_equal(taken, results[0][c]), c
        assert np.array_equal(hosts[2].last_counts, counts[0][c]), c
        assert np.all(counts[0][c] == 2), c  # hosts 1 and 2, in every round
        sent = [t * (c + 1) for t in tensors]  # what hosts 1 and 2 summed in call c
        assert np.all(np.abs(taken - sent[0].astype(np.float64) - sent[1]) <= bound(sent)), c
    assert hosts[2].stats.packets == 0
    assert hosts[2].calls_ready(n) == 0
    # Host 3 is first this time: it computes and sends again.
    fourth, counts4 = run_calls(hosts, [t * 4 for t in tensors], 1, late={0: 0.3, 1: 0.3})
    assert all(np.array_equal(r[0], fourth[0][0]) for r in fourth)
    assert np.all(counts4[0][0] >= 2) and hosts[2].stats.packets > 0
    for h in hosts:
        h.close()


def test_a_host_behind_on_a_wide_window_finds_the_calls_on_the_slots_they_used():
    """With 256 slots a 201-fragment call uses 64 when it agrees first and 201 when it
    speculates, as the second does (passing.protocol.slots_used): the host that was away
    counts the others' calls on those slots, and takes them exactly."""
    sw = LoopbackSwitch(HOSTS, slots=256, quorum=2)
    hosts = streamers(sw, 256, patience=0.02, staleness=5)
    try:
        n = 200 * P.K + 7
        assert P.slots_used(256, -(-n // P.K)) == 64
        assert P.slots_used(256, -(-n // P.K), speculating=True) == 201
        tensors = random_tensors(HOSTS, n, seed=6)
        results, _ = run_calls(hosts[:2], tensors[:2], 2, late={})
        deadline = time.monotonic() + 20
        while hosts[2].calls_ready(n) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hosts[2].calls_ready(n) == 2
        for c in range(2):
            assert np.array_equal(hosts[2].allreduce(np.zeros(n)), results[0][c]), c
    finally:
        for h in hosts:
            h.close()


def test_a_larger_call_whose_extra_fragment_is_all_zeros_is_not_taken_for_a_smaller_one():
    """The others' call has one fragment more than host 3's next, and it is all zeros (a
    frozen layer's gradient, or the pool vote of a call that votes for nothing): the result
    before it in its slot must still say a fragment follows, or host 3 would take the larger
    call's results for its own call and fall a round behind in that slot."""
    sw = LoopbackSwitch(HOSTS, slots=8, quorum=2)
    hosts = streamers(sw, 8, patience=0.02, staleness=5)
    n = 20 * P.K + 7  # 21 fragments; the larger call's 22nd shares slot 5 with the 14th
    larger = [np.concatenate([t, np.zeros(P.K)]) for t in random_tensors(HOSTS, n, seed=8)]
    run_calls(hosts[:2], larger[:2], 1, late={})
    deadline = time.monotonic() + 10
    while hosts[2].calls_ready(n + P.K) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the reader takes the multicast in
    assert hosts[2].calls_ready(n + P.K) == 1
    assert hosts[2].calls_ready(n) == 0
    for h in hosts:
        h.close()


def test_adaptive_patience_learns_how_long_a_round_with_everyone_takes():
    """Patience between 50 ms and 3 s. Two calls with every host in time (every round full)
    teach the hosts how long a round takes, far less than 3 s here. In a third call host 3
    starts 1 s late: the others close rounds without it, which a fixed 3 s patience would
    not have done, and every host, the late one too, ends with the same results."""
    sw = LoopbackSwitch(HOSTS, slots=8, quorum=2)
    hosts = streamers(sw, 8, patience=3.0, patience_min=0.05, staleness=5)
    assert all(h.patience_now() == 3.0 for h in hosts)  # nothing learned yet: the bound
    tensors = random_tensors(HOSTS, 20 * P.K, seed=6)
    _, counts = run_calls(hosts, tensors, 2, late={})
    assert all(np.all(c == HOSTS) for per_host in counts for c in per_host)
    learned = [h.patience_now() for h in hosts]
    assert all(0.05 <= p < 1.0 for p in learned), learned
    results, counts = run_calls(hosts, tensors, 1, late={2: 1.0})
    for i in range(HOSTS):
        assert np.array_equal(results[i][0], results[0][0]), i
        assert np.array_equal(counts[i][0], counts[0][0]), i
    assert np.any(counts[0][0] == 2)
    assert np.all(made_of(results[0][0], counts[0][0], tensors))
    for h in hosts:
        h.close()


def test_a_host_late_by_less_than_the_patience_is_measured_and_waited_for_again():
    """Patience between 50 ms and 3 s, host 3 1 s late for each of two calls, nothing lost.
    The others wait for it in the first call (1 s is under 3 s) and learn from those rounds
    how long a round takes now, so the second call waits for it too: every sum of both calls
    holds every host. The probes the others send while they wait resend every packet they
    wait on (in turn, docs/protocol.md "Loss recovery"); such resends must not hide the wait
    from what adaptive patience measures, or the hosts would learn only fast rounds and cut
    host 3 out of the second call."""
    sw = LoopbackSwitch(HOSTS, slots=4, quorum=2)
    hosts = streamers(sw, 4, patience=3.0, patience_min=0.05, staleness=5)
    tensors = random_tensors(HOSTS, 4 * P.K, seed=6)
    try:
        results, counts = run_calls(hosts, tensors, 2, late={2: 1.0})
        assert all(np.all(c == HOSTS) for per_host in counts for c in per_host), \
            [[int(c.min()) for c in per_host] for per_host in counts]
        assert all(h.patience_now() >= 1.0 for h in hosts[:2]), \
            [h.patience_now() for h in hosts]
        assert all(h.stats.rotated > 0 for h in hosts[:2])  # the probes did go through them
        assert_alike_and_made_of(results, counts, tensors)
    finally:
        for h in hosts:
            h.close()


def test_a_round_after_one_that_waited_the_whole_patience_asks_to_close_at_once():
    """Host 3 never comes (quorum 2 of 3). A slot's round that waited the whole patience and
    closed without it is followed by one sent with CLOSE at once; the round after that one
    waits again, so a host only a little late is never cut from every later round."""
    sw = LoopbackSwitch(HOSTS, slots=4, quorum=2)
    hosts = streamers(sw, 4, patience=0.05, staleness=5)
    firsts: list[list[tuple[int, int, int]]] = [[], []]  # (slot, round, flags), first sends
    for i in (0, 1):
        send = hosts[i].transport.send

        def record(payload: bytes, i=i, send=send) -> None:
            rec = np.frombuffer(payload, dtype=P_DTYPE)[0]
            if not rec["flags"] & int(P.Flag.RETRANS):
                firsts[i].append((int(rec["slot"]), int(rec["round"]), int(rec["flags"])))
            send(payload)
        hosts[i].transport.send = record
    tensors = random_tensors(2, 20 * P.K, seed=7)  # 5 fragments per slot: 6 rounds each
    _, counts = run_calls(hosts[:2], tensors, 1, late={})
    assert np.all(counts[0][0] == 2) and np.all(counts[1][0] == 2)
    at_once = set()
    for i in (0, 1):
        seen = sorted(firsts[i])
        assert len(seen) == 4 * 6
        mine = {(s, r) for s, r, f in seen if f & int(P.Flag.CLOSE)}
        assert not any((s, r + 1) in mine for s, r in mine), mine  # never two in a row
        assert all(r > 0 for _, r in mine)  # a slot's first round always waits
        at_once |= mine
    assert at_once  # ... and some round after it did not
    for h in hosts:
        h.close()


def assert_agreed(results: list[np.ndarray], counts: list[np.ndarray], sent, where) -> None:
    """One call's result and counts on every host: the same on all, each element the sum of
    as many hosts' values (`sent`, what each host summed) as its count says."""
    for i in range(HOSTS):
        assert np.array_equal(results[i], results[0]), (where, i)
        assert np.array_equal(counts[i], counts[0]), (where, i)
    assert np.all(made_of(results[0], counts[0], sent)), where


def one_call(hosts: list[SlotStreamer], tensors, c: int, late: dict[int, float]):
    """Call c (every host's tensor times c + 1) on every host, host i late[i] seconds late,
    checked (assert_agreed); returns the counts."""
    sent = [t * (c + 1) for t in tensors]
    results, counts = run_calls(hosts, sent, 1, late=late)
    assert_agreed([r[0] for r in results], [n[0] for n in counts], sent, c)
    return counts[0][0]


def test_a_host_late_once_is_waited_for_again_in_the_next_call():
    """Quorum 2 of 3, patience 50 ms, staleness 8: host 3 is 0.4 s late for the second of four
    calls only (jitter, a busy machine). That call closes without it; the next is not eager
    (one late call is no evidence of a straggler), so it and the one after wait for everyone
    and hold all three hosts' values, on every host."""
    sw = LoopbackSwitch(HOSTS, slots=8, quorum=2)
    hosts = streamers(sw, 8, patience=0.05, staleness=8)
    tensors = random_tensors(HOSTS, 12 * P.K, seed=21)
    try:
        for c, late in enumerate(({}, {2: 0.4}, {}, {})):
            n = one_call(hosts, tensors, c, late)
            if c == 1:
                assert np.any(n == 2), "the late call closed without host 3"
            else:
                assert np.all(n == 3), f"call {c + 1} left someone out"
            assert not any(h.eager for h in hosts), c
        assert [h.stats.short_calls for h in hosts] == [1, 1, 1]
    finally:
        for h in hosts:
            h.close()


def test_a_host_late_for_one_step_of_several_calls_is_waited_for_in_the_next_step():
    """Quorum 2 of 3, patience 50 ms, staleness 8, steps of three calls (a model's buckets):
    host 3 starts the second of four steps 0.25 s late, so more than one of that step's calls
    may close without it. However many, it is one late step: no call after it is eager, and
    the two steps after hold everyone in every call, on every host."""
    sw = LoopbackSwitch(HOSTS, slots=8, quorum=2)
    hosts = streamers(sw, 8, patience=0.05, staleness=8)
    tensors = random_tensors(HOSTS, 4 * P.K, seed=23)
    calls = 3
    try:
        for step in range(4):
            late = 0.25 if step == 1 else 0.0
            results = [[None] * calls for _ in hosts]
            counts = [[None] * calls for _ in hosts]

            def work(i, step=step, late=late, results=results, counts=counts):
                if i == 2:
                    time.sleep(late)  # its whole step starts late, as after a slow backward
                for b in range(calls):
                    scale = 1 + step * calls + b
                    results[i][b] = hosts[i].allreduce(tensors[i] * scale)
                    counts[i][b] = hosts[i].last_counts.copy()

            each_host(work, HOSTS)
            for b in range(calls):
                scale = 1 + step * calls + b
                assert_agreed([r[b] for r in results], [n[b] for n in counts],
                              [t * scale for t in tensors], (step, b))
                if step == 1 and b == 0:
                    assert np.any(counts[0][b] == 2), "the late step's first call was short"
                if step >= 2:
                    assert np.all(counts[0][b] == 3), (step, b)
            assert not any(h.eager for h in hosts), step
    finally:
        for h in hosts:
            h.close()


def test_a_host_late_call_after_call_makes_the_calls_close_at_once():
    """Quorum 2 of 3, patience 50 ms, staleness 2, host 3 0.4 s late for every call. Calls
    1-2 wait the patience and close without it; call 3 waits for everyone (the bound). Call 4
    starts a second streak with host 3 late again: with that evidence call 5 asks for CLOSE in
    every packet when first sent (it waits no patience); call 6 waits for everyone again.
    Every host agrees on every sum and count."""
    sw = LoopbackSwitch(HOSTS, slots=8, quorum=2)
    hosts = streamers(sw, 8, patience=0.05, staleness=2)
    tensors = random_tensors(HOSTS, 12 * P.K, seed=22)
    try:
        for c in range(6):
            before = [h.stats.closes for h in hosts]
            eager = [h.eager for h in hosts]
            # (After call 5 they stay eager, but call 6 is the bound's: it waits all the same.)
            assert eager == [c in (4, 5)] * HOSTS, (c, eager)
            n = one_call(hosts, tensors, c, {2: 0.4})
            closes = [h.stats.closes - b for h, b in zip(hosts, before, strict=True)]
            if c in (2, 5):
                assert np.all(n == 3), f"call {c + 1} should have waited for everyone"
                assert closes == [0] * HOSTS, (c, closes)  # nobody asked to close a round
            else:
                assert np.any(n == 2), c
            if c == 4:  # every first send of the in-time hosts asked for CLOSE
                assert min(closes[:2]) >= 12, (c, closes)
        assert [h.stats.short_calls for h in hosts] == [4] * HOSTS
    finally:
        for h in hosts:
            h.close()
