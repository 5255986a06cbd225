"""The window protocol against the real pipeline (software model, in-process) with loss."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pytest

from host_agent import fixed_point as fx
from host_agent.fixed_point import NonFiniteError
from host_agent.session import new_session
from host_agent.stream import SlotStreamer, StreamConfig, SwitchTimeout
from passing import protocol as P
from passing.protocol import slots_used
from testbed.loopback import LoopbackSwitch, random_tensors


def run_hosts(switch: LoopbackSwitch, tensors, calls: int = 1, window: int = 16,
              session: int | None = None, wrap=lambda port, transport: transport, **cfg):
    """Every host's calls in threads; `wrap(port, transport)` may interpose on a host's I/O."""
    hosts = len(tensors)
    session = session or new_session()
    streamers = [SlotStreamer(StreamConfig(switch.job_id, p - 1, window, hosts, session, **cfg),
                              wrap(p, switch.transport(p))) for p in range(1, hosts + 1)]
    results = [[None] * calls for _ in range(hosts)]
    errors = []

    def work(i):
        try:
            for c in range(calls):
                results[i][c] = streamers[i].allreduce(tensors[i] * (c + 1))
        except Exception as e:  # reported by the test below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results, streamers


def fixed_point_bound(tensors, speculated: bool = False) -> np.ndarray:
    """Per element, the most the switch's fixed point may be off for these host tensors
    (host_agent.fixed_point: H/2 units of the block's agreed scale), for a call that
    `speculated` (its scale up to SPEC_SLACK bits above the hosts' maximum) or not."""
    n = tensors[0].size
    nfrag = -(-n // P.K)
    padded = np.zeros((len(tensors), nfrag * P.K))
    padded[:, :n] = np.abs(np.asarray(tensors, dtype=np.float64))
    peaks = padded.reshape(len(tensors), nfrag, P.K).max(axis=(0, 2))
    bound = fx.error_bound(fx.block_exponents(peaks.reshape(-1, 1)), len(tensors))
    return np.repeat(bound * 2.0 ** (fx.SPEC_SLACK if speculated else 0), P.K)[:n]


def check(results, tensors, first_speculated: bool = False):
    """Every call on every host, the first included, within the fixed-point bound: the
    first call of a size agrees on exponents, every later one speculates."""
    for per_host in results:
        for c, got in enumerate(per_host):
            scaled = [t * (c + 1) for t in tensors]
            exact = np.sum([t.astype(np.float64) for t in scaled], axis=0)
            assert got.shape == exact.shape
            bound = fixed_point_bound(scaled, speculated=c > 0 or first_speculated)
            assert np.all(np.abs(got - exact) <= bound), f"call {c}"


@pytest.mark.parametrize("hosts,n", [(2, 1), (2, 1000), (4, 5 * P.K), (3, 16 * P.K * 3 + 7)])
def test_allreduce_without_loss(hosts, n):
    tensors = random_tensors(hosts, n, seed=n)
    switch = LoopbackSwitch(hosts)
    # A timer far above the in-process round trip: without loss nothing is resent.
    results, streamers = run_hosts(switch, tensors, calls=2, rto=2.0, min_rto=2.0)
    check(results, tensors)
    assert all(s.stats.retransmissions == 0 for s in streamers)


@pytest.mark.parametrize("loss", [0.01, 0.05])
def test_allreduce_recovers_from_loss(loss):
    tensors = random_tensors(4, 40 * P.K, seed=7)
    switch = LoopbackSwitch(4, loss=loss, seed=3)
    results, streamers = run_hosts(switch, tensors, calls=3, rto=0.005)
    check(results, tensors)
    assert switch.dropped > 0
    assert sum(s.stats.retransmissions for s in streamers) > 0


def test_window_larger_than_the_tensor_and_reused_across_calls():
    tensors = random_tensors(2, 3 * P.K, seed=2)
    switch = LoopbackSwitch(2, slots=64)
    results, _ = run_hosts(switch, tensors, calls=5, window=64)
    check(results, tensors)


def test_windows_of_up_to_64_slots_use_as_many_slots_as_before():
    for window in (1, 8, 16, 64):
        for nfrag in (1, 3, 64, 65, 1000, 5000):
            assert slots_used(window, nfrag) == min(window, nfrag)


@pytest.mark.parametrize("nfrag, used", [(40, 40), (200, 64), (2048, 128), (8192, 256)])
def test_a_wide_window_uses_only_the_slots_the_call_needs(nfrag, used):
    """Each slot's first packet carries only an exponent: a 256-slot window uses a slot per 16
    fragments (at least 64), and every host uses the same slots. The second call of the size
    speculates, sends no exponent packets, and uses the whole window (up to one slot per
    fragment)."""
    assert slots_used(256, nfrag) == used
    assert slots_used(256, nfrag, speculating=True) == min(256, nfrag)
    if nfrag > 2048:
        return  # the rule alone: the call itself would take long through the Python pipeline
    seen: dict[int, list[set[int]]] = {1: [set(), set()], 2: [set(), set()]}

    class Spy:
        def __init__(self, port, inner):
            self.port, self.inner = port, inner

        def send(self, payload):
            call = payload[19] & 0x7F  # the tag: the call's number
            seen[self.port][call].add(int.from_bytes(payload[2:4], "big"))  # the slot
            self.inner.send(payload)

        def recv(self, timeout):
            return self.inner.recv(timeout)

    tensors = random_tensors(2, nfrag * P.K - 7, seed=nfrag)
    switch = LoopbackSwitch(2, slots=256)
    results, _ = run_hosts(switch, tensors, calls=2, window=256, wrap=Spy)
    check(results, tensors)
    assert seen[1] == seen[2] == [set(range(used)), set(range(min(256, nfrag)))]


def test_calls_of_other_sizes_share_a_wide_window_and_every_host_counts_the_same_rounds():
    """One session, calls of 200, 1,100, 40 and 200 fragments on 256 slots: each uses its own
    number of slots (64, 69, 40, and 200 for the second call of 200, which speculates), so the
    slots' rounds advance unevenly, the same on every host; every sum is right."""
    sizes = [200, 1100, 40, 200]
    switch = LoopbackSwitch(2, slots=256)
    session = new_session()
    streamers = [SlotStreamer(StreamConfig(switch.job_id, p - 1, 256, 2, session),
                              switch.transport(p)) for p in (1, 2)]
    tensors = [random_tensors(2, nfrag * P.K - 3, seed=nfrag) for nfrag in sizes]
    results: list[list] = [[], []]

    def work(i):
        for t in tensors:
            results[i].append(streamers[i].allreduce(t[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for c, t in enumerate(tensors):
        check([[results[0][c]], [results[1][c]]], t, first_speculated=c == 3)
    assert np.array_equal(streamers[0].rounds, streamers[1].rounds)
    # slot 0 took part in every call (5 + 17 + 2 rounds: an exponent packet each, then its
    # fragments; the second call of 200 fragments speculates on 200 slots, with the same
    # values: 1), slot 68 in the 1,100-fragment one (1 + 15) and the last, slot 69 and
    # slot 199 only in the last, slot 200 in none.
    assert list(streamers[0].rounds[[0, 68, 69, 199, 200]]) == [25, 17, 1, 1, 0]
    assert streamers[0].stats.speculated == 200 and streamers[0].stats.spec_missed == 0


def test_switch_that_never_answers_times_out():
    class Silent:
        def send(self, payload):
            pass

        def recv(self, timeout):
            return []

    s = SlotStreamer(StreamConfig(1, 0, 4, 2, new_session(), rto=0.01, deadline=0.3), Silent())
    with pytest.raises(SwitchTimeout, match="no result from the switch"):
        s.allreduce(np.ones(10))
    assert s.stats.retransmissions > 3


def test_integer_tensors_exact_through_the_switch():
    tensors = [np.arange(300, dtype=np.float32) * (i + 1) for i in range(3)]
    switch = LoopbackSwitch(3)
    results, _ = run_hosts(switch, tensors)
    exact = np.sum(tensors, axis=0, dtype=np.float64)
    assert all(np.array_equal(r[0], exact) for r in results)


def test_float32_values_give_the_same_sums_as_the_same_values_in_float64():
    """The local stage hands the streamer its float32 sum as it is (no float64 copy of a large
    tensor): every call's result, the exponent round and the speculating one, must be the
    one the same values give in float64, bit for bit."""
    rng = np.random.default_rng(7)
    tensors = [(rng.standard_normal(5 * P.K + 3) * 10.0 ** rng.integers(-3, 4, 5 * P.K + 3))
               .astype(np.float32) for _ in range(3)]
    as32, _ = run_hosts(LoopbackSwitch(3), tensors, calls=2)
    as64, _ = run_hosts(LoopbackSwitch(3), [t.astype(np.float64) for t in tensors], calls=2)
    for host32, host64 in zip(as32, as64, strict=True):
        for got, want in zip(host32, host64, strict=True):
            assert got.dtype == want.dtype == np.float64
            assert np.array_equal(got, want)
    check(as32, tensors)


def test_calls_reusing_the_streamers_memory_each_get_their_own_sum():
    """The streamer keeps a call's blocks and sums for the next (host_agent.scratch). A call
    of large values, then a smaller one of small values: the first's values must not linger
    in the second's last block's padding (they would set its exponent, and the small sums
    would round away); a result returned earlier must not change under a later call; a
    caller's `out` gets the sum; an `out` that would round it is refused; a caller that
    changes the sums allreduce_view lends it changes no later call's."""
    big = [np.full(3 * P.K + 5, 1e6, np.float32) * (i + 1) for i in range(2)]
    small = [(np.arange(P.K + 1, dtype=np.float32) + 1) * np.float32(1e-3 * (i + 1))
             for i in range(2)]
    switch = LoopbackSwitch(2)
    session = new_session()
    streamers = [SlotStreamer(StreamConfig(switch.job_id, p - 1, 16, 2, session),
                              switch.transport(p)) for p in (1, 2)]
    outs = [np.full(P.K + 1, np.nan) for _ in streamers]
    got: list[list[np.ndarray]] = [[], []]
    kept: list[np.ndarray] = [None, None]
    errors = []

    def host(i: int) -> None:
        try:
            got[i].append(streamers[i].allreduce(big[i]))
            kept[i] = got[i][0].copy()
            got[i].append(streamers[i].allreduce(small[i]))
            got[i].append(streamers[i].allreduce(small[i], out=outs[i]))
            view = streamers[i].allreduce_view(small[i])
            got[i].append(view.copy())
            view[:] = np.nan  # a caller scaling the sums in place
            got[i].append(streamers[i].allreduce(small[i]))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=host, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for i in range(2):
        first, second, third, lent, after = got[i]
        assert np.array_equal(first, kept[i]), "a later call changed an earlier result"
        assert np.all(np.abs(first - np.sum(big, axis=0, dtype=np.float64))
                      <= fixed_point_bound(big))
        exact = np.sum(small, axis=0, dtype=np.float64)
        assert np.all(np.abs(second - exact) <= fixed_point_bound(small))
        assert third is outs[i]
        assert np.all(np.abs(third - exact) <= fixed_point_bound(small, speculated=True))
        assert lent.shape == exact.shape and lent.dtype == np.float64
        assert np.all(np.abs(lent - exact) <= fixed_point_bound(small, speculated=True))
        assert np.array_equal(after, lent), "a change to lent sums reached the next call"
        with pytest.raises(ValueError, match="out must be"):
            streamers[i].allreduce(small[i], out=np.zeros(P.K + 1, np.float32))


def test_a_failed_call_leaves_no_reference_cycle():
    """A call that raises NonFiniteError keeps no exception (with its traceback's frames) in a
    cycle: the streamer, and the process groups of whatever called it, are freed with their
    last reference, not at some later garbage collection. torch's gloo threads freed at
    interpreter exit can abort a finished run."""
    gc.disable()  # only reference counting frees: a cycle would show
    try:
        streamer = SlotStreamer(StreamConfig(1, 0, 16, 1, new_session()),
                                LoopbackSwitch(1).transport(1))
        bad = np.ones(300, np.float32)
        bad[7] = np.nan
        with pytest.raises(NonFiniteError, match="this host"):
            streamer.allreduce(bad)
        freed = weakref.ref(streamer)
        del streamer
        assert freed() is None
    finally:
        gc.enable()


def test_nan_on_one_host_fails_the_call_on_every_host_then_the_job_goes_on():
    switch = LoopbackSwitch(3)
    session = new_session()
    streamers = [SlotStreamer(StreamConfig(1, p - 1, 16, 3, session, rto=2.0, min_rto=2.0),
                              switch.transport(p))
                 for p in (1, 2, 3)]
    good = [np.ones(200, np.float32) * (i + 1) for i in range(3)]
    bad = [g.copy() for g in good]
    bad[1][150] = np.inf
    outcome = [None] * 3

    def work(i):
        try:
            streamers[i].allreduce(bad[i])
            outcome[i] = "returned"
        except NonFiniteError as e:
            outcome[i] = str(e)
        outcome[i] = (outcome[i], streamers[i].allreduce(good[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert "this host" in outcome[1][0] and "first at flat index 150" in outcome[1][0]
    assert all("another host had NaN/Inf" in outcome[i][0] for i in (0, 2))
    assert all(np.array_equal(o[1], np.full(200, 6.0)) for o in outcome)


def test_a_policy_change_between_calls_starts_and_stops_the_reader_and_keeps_the_streak():
    """SlotStreamer.set_policy (a live `job set`): patience from none to some starts the
    thread that keeps results arriving between calls, back to none stops it; the count of
    short calls in a row is kept, so the staleness bound holds across the change."""
    class Quiet:
        def send(self, payload):
            pass

        def recv(self, timeout):
            time.sleep(min(timeout, 0.01))
            return []

    def readers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "passing-drain-41"]

    s = SlotStreamer(StreamConfig(41, 0, 4, 2, new_session(), rto=0.01, deadline=0.3), Quiet())
    assert readers() == []
    s.short_streak = 3
    s.set_policy(0.05, 0.01, 2)
    assert (s.cfg.patience, s.cfg.patience_min, s.cfg.staleness) == (0.05, 0.01, 2)
    [reader] = readers()
    assert s.short_streak == 3
    s.set_policy(0.1, None, 5)  # another patience: the same reader goes on
    assert readers() == [reader] and s.cfg.patience_min is None
    s.set_policy(None, None, 1)
    assert not reader.is_alive() and readers() == []
    s.set_policy(0.05, None, 1)
    [again] = readers()
    s.close()
    again.join(5)
    assert readers() == []


class _Silent:
    def send(self, payload: bytes) -> None:
        pass

    def recv(self, timeout: float) -> list[bytes]:
        time.sleep(timeout)
        return []


@pytest.mark.parametrize("bad,says", [(dict(contributor=300), "contributor"),
                                      (dict(window=70000), "window"), (dict(window=0), "window"),
                                      (dict(job_id=1 << 16), "job_id"),
                                      (dict(local_gpus=1 << 16), "local_gpus"),
                                      (dict(pool=-1), "pool"), (dict(session=0), "session")])
def test_a_config_that_does_not_fit_the_packet_is_refused_before_anything_runs(bad, says):
    """A field a packet cannot carry (a 70000-slot window would number slot 65537 as slot 1)
    is a clear error when the streamer is made, and no reader thread is left behind."""
    fields = dict(job_id=1, contributor=0, window=8, streams=2, session=5, patience=0.1)
    fields.update(bad)
    before = set(threading.enumerate())
    with pytest.raises(ValueError, match=says):
        SlotStreamer(StreamConfig(**fields), _Silent())
    started = [t.name for t in threading.enumerate() if t not in before]
    assert not [name for name in started if name.startswith("passing-drain")], started
