"""The compiled window (host_agent/window.c) against the numpy one it replaces, batch by batch.

Two streamers in the same random state, one on each path, build the same slots' next packets
and take the same batch of results (awaited ones, duplicates, stale and future rounds, other
calls, sessions, jobs, flags and slots, in random order): every byte sent, every array of the
call, the streamer's rounds, results kept early, round-trip estimates and statistics must be
the same after every batch. Then whole calls through the loopback switch, with loss, on both
paths: the same sums, bit for bit.
"""

from __future__ import annotations

import copy
import os
import threading

import numpy as np
import pytest

from host_agent import fixed_point as fx
from host_agent import stream as stream_mod
from host_agent import window_c
from host_agent.session import new_session
from host_agent.stream import SlotStreamer, StreamConfig, _Call
from passing import packet
from passing import protocol as P
from testbed.loopback import LoopbackSwitch, random_tensors

COMPILED = window_c.load()
_WHY_NONE = (f"{window_c.PATH_ENV}=python: the numpy window runs alone"
             if os.environ.get(window_c.PATH_ENV) == "python" else
             "the compiled window could not be built (no C compiler?); the numpy window runs alone")
pytestmark = pytest.mark.skipif(COMPILED is None, reason=_WHY_NONE)

# Every array of a call the window reads or writes.
CALL_ARRAYS = ("agreed", "proposed", "redo", "out", "counts", "step", "pending", "p_frag",
               "p_round", "first_seq", "last_seq", "sent", "first_sent", "close", "waited",
               "close_next", "abstaining", "resent", "retried", "probed", "payloads")
STATS = ("packets", "results", "ignored", "closes", "abstained")


class Recorder:
    """A transport that keeps every datagram sent, in order."""

    def __init__(self):
        self.sent: list[bytes] = []

    def send(self, payload: bytes) -> None:
        self.sent.append(payload)

    def send_rows(self, rows: np.ndarray) -> None:
        self.sent.extend(bytes(r) for r in rows)

    def recv(self, timeout: float) -> list[bytes]:
        return []


@pytest.fixture
def clock(monkeypatch):
    """time.monotonic of the stream module, moved on by hand: round trips come out alike."""
    now = [1000.0]
    monkeypatch.setattr(stream_mod.time, "monotonic", lambda: now[0])
    return now


def random_state(rng: np.random.Generator, clock) -> tuple:
    """Two streamers (numpy, compiled) in one random state, with a call each."""
    hosts = int(rng.integers(1, 9))
    window = int(rng.choice([1, 3, 16, 64, 300]))
    pool = int(rng.integers(0, 300))
    cfg = StreamConfig(job_id=int(rng.integers(1, 1 << 16)), contributor=int(rng.integers(32)),
                       window=window, streams=hosts, session=new_session(),
                       local_gpus=int(rng.integers(1, 5)), pool=pool,
                       total_gpus=int(rng.integers(0, 12)))
    n = int(rng.integers(1, 40 * P.K))
    nfrag = -(-n // P.K)
    dtype = np.float32 if rng.random() < 0.5 else np.float64
    scale = 2.0 ** rng.integers(-130, 120, size=(nfrag, 1))
    blocks = (rng.standard_normal((nfrag, P.K)) * scale).astype(dtype)
    blocks[rng.random(nfrag) < 0.1] = 0  # all-zero blocks propose 0
    blocks = np.where(np.isfinite(blocks), blocks, 0).astype(dtype)
    local_exp = fx.block_exponents(blocks)
    if rng.random() < 0.1:  # a host with NaN/Inf: its blocks zeroed, each proposing POISON
        blocks[:] = 0
        local_exp[:] = fx.POISON
    predicted = None
    if rng.random() < 0.5:
        predicted = np.clip(local_exp.astype(np.int64) + rng.integers(-3, 4, nfrag), 0,
                            fx.POISON - 1).astype(np.uint8)
    call = _Call(blocks, local_exp, window, hosts, int(rng.integers(0, 128)), predicted)
    used, nfr = call.used, call.nfrag
    # Each slot somewhere along its fragments (never past its last).
    per_slot = [len(range(s, nfr, used)) + (0 if predicted is not None else 1)
                for s in range(used)]
    call.step[:] = [rng.integers(0, k) for k in per_slot]
    agreed = local_exp.astype(np.int64) + rng.integers(-1, 3, nfr)
    call.agreed[:] = np.clip(agreed, 0, fx.POISON)
    call.agreed[rng.random(nfr) < 0.05] = fx.POISON
    call.redo[:] = rng.random(used) < 0.2 if predicted is not None else False
    call.close_next[:] = rng.random(used) < 0.3
    call.waited[:] = rng.random(used) < 0.3
    call.quorum = bool(rng.random() < 0.5)
    call.eager = bool(rng.random() < 0.3)
    pair = []
    for _ in range(2):
        streamer = SlotStreamer(cfg, Recorder())
        streamer.rounds[:] = rng.integers(0, 1 << 32, window, dtype=np.uint64) \
            if rng.random() < 0.3 else np.arange(window) % 5
        pair.append(streamer)
    pair[1].rounds[:] = pair[0].rounds
    pair[1]._seq = pair[0]._seq = int(rng.integers(0, 1000))
    calls = [call, copy.deepcopy(call)]
    for c, s in zip(calls, pair, strict=True):
        c.payloads[:] = s._header
        c.payloads["slot"] = np.arange(used)
    calls[1].ctx = COMPILED.context(calls[1], pair[1])
    return pair, calls


def same_state(pair, calls) -> None:
    for name in CALL_ARRAYS:
        a, b = getattr(calls[0], name), getattr(calls[1], name)
        assert a.tobytes() == b.tobytes(), f"call.{name} differs"
    assert calls[0].missed == calls[1].missed
    assert pair[0].rounds.tobytes() == pair[1].rounds.tobytes()
    assert pair[0]._seq == pair[1]._seq
    assert pair[0].transport.sent == pair[1].transport.sent
    for name in STATS:
        assert getattr(pair[0].stats, name) == getattr(pair[1].stats, name), name
    assert (pair[0].srtt, pair[0].rttvar, pair[0].rto, pair[0].min_rtt) == \
        (pair[1].srtt, pair[1].rttvar, pair[1].rto, pair[1].min_rtt)
    assert pair[0]._paused == pair[1]._paused
    assert {k: v.tobytes() for k, v in pair[0].early.items()} == \
        {k: v.tobytes() for k, v in pair[1].early.items()}


def results_for(rng: np.random.Generator, streamer: SlotStreamer, call: _Call) -> np.ndarray:
    """A batch of datagrams for `call`: the awaited result of some waiting slots, and near
    misses of every kind, in random order."""
    cfg = streamer.cfg
    recs = []
    waiting = np.flatnonzero(call.pending)
    for s in waiting[rng.random(waiting.size) < 0.7]:
        exp = call.agreed[call.p_frag[s]] if rng.random() < 0.5 else rng.integers(0, 256)
        tag = call.tag | (0x80 if rng.random() < 0.3 else 0)
        rec = dict(slot=s, frag=call.p_frag[s], round=call.p_round[s], exp=exp, tag=tag,
                   num_contrib=rng.integers(0, 12))
        recs.append(rec)
        kind = rng.integers(0, 12)
        if kind == 0:
            recs.append(dict(rec))  # the same result twice (a resend's answer)
        elif kind == 1:
            recs.append(dict(rec, round=(int(rec["round"]) + 1) % (1 << 32)))  # a later round
        elif kind == 2:
            recs.append(dict(rec, round=(int(rec["round"]) - 1) % (1 << 32)))  # a stale one
        elif kind == 3:
            recs.append(dict(rec, frag=int(rec["frag"]) + 1))
        elif kind == 4:
            recs.append(dict(rec, tag=(call.tag + 1) % 128))  # another call's
        elif kind == 5:
            recs.append(dict(rec, job_id=(cfg.job_id % 65535) + 1))
        elif kind == 6:
            recs.append(dict(rec, session=cfg.session ^ 1))
        elif kind == 7:
            recs.append(dict(rec, flags=int(P.Flag.CONTRIB) | streamer._pool_flag))
        elif kind == 8:
            recs.append(dict(rec, flags=streamer._result_flags ^ int(P.Flag.POOL)))
        elif kind == 9:
            recs.append(dict(rec, slot=call.used + int(rng.integers(0, 3))))  # beyond the call
        elif kind == 10:
            recs.append(dict(rec, slot=cfg.window + int(rng.integers(0, 3))))
    if not recs:
        return np.zeros((0, P.PAYLOAD_BYTES), dtype=np.uint8)
    rng.shuffle(recs)
    batch = np.zeros(len(recs), dtype=packet.PAYLOAD_DTYPE)
    batch["values"] = rng.integers(-(1 << 31), 1 << 31, (len(recs), P.K), dtype=np.int64)
    defaults = dict(job_id=cfg.job_id, flags=streamer._result_flags, session=cfg.session,
                    version=0)
    for i, rec in enumerate(recs):
        for name, value in {**defaults, **rec}.items():
            batch[name][i] = int(value) % (1 << (8 * batch.dtype.fields[name][0].itemsize))
    return packet.payload_rows(batch).copy()


@pytest.mark.parametrize("seed", range(60))
def test_compiled_window_sends_and_takes_what_numpy_does(seed, clock):
    rng = np.random.default_rng(seed)
    pair, calls = random_state(rng, clock)
    rounds = 0
    for _ in range(6):
        # Send the next packet of some slots not waiting (a batch in the loop's order).
        idle = np.flatnonzero(~calls[0].pending)
        more_of = [s for s in idle if calls[0].fragments(np.array([s]))[0] < calls[0].nfrag]
        slots = rng.permutation(np.array(more_of, dtype=np.int64))[:int(rng.integers(0, 40))]
        for streamer, call in zip(pair, calls, strict=True):
            streamer._send(call, slots.copy())
        same_state(pair, calls)
        clock[0] += float(rng.random() * 0.01)
        # Some waiting packets resent (a probe, fast recovery, or after the patience, which
        # marks them waited), alike on both: their round trips no longer count (Karn), a
        # probe's answer counts its own transmission, a waited one's tells the next to CLOSE.
        waiting = np.flatnonzero(calls[0].pending)
        again = waiting[rng.random(waiting.size) < 0.3]
        probe, waited = bool(rng.random() < 0.5), rng.random(again.size) < 0.5
        for streamer, call in zip(pair, calls, strict=True):
            call.waited[again[waited]] = call.close[again[waited]] = True
            streamer._resend(call, again, clock[0], probe=probe)
        rows = results_for(rng, pair[0], calls[0])
        pair[0]._paused = pair[1]._paused = bool(rng.random() < 0.2)
        got = pair[0]._take_numpy(rows.copy(), 2, calls[0])[:3]
        want = pair[1]._take(rows.copy(), 2, calls[1])
        assert got[0].tolist() == want[0].tolist()
        assert got[1] == want[1]
        assert got[2].tolist() == want[2].tolist()
        same_state(pair, calls)
        rounds += got[0].size
    assert rounds  # the batches took results, not only near misses


@pytest.mark.parametrize("which", ["beyond the call", "negative", "past its last fragment"])
def test_a_slot_with_no_next_packet_is_refused_before_anything_is_written(which, clock):
    """The window's C trusts no slot index it is given: one that is not of the call, or whose
    slot has sent its last fragment, raises, and no array of the call, no byte and no count
    has changed (nothing read or written past the call's arrays)."""
    for seed in range(200):
        rng = np.random.default_rng(seed)
        pair, calls = random_state(rng, clock)
        call, streamer = calls[1], pair[1]
        idle = np.flatnonzero(~call.pending)
        good = [s for s in idle if call.fragments(np.array([s]))[0] < call.nfrag]
        if which == "past its last fragment":
            # the last fragment sent: the step after it
            done = [s for s in good if call.fragments(np.array([s]))[0] + call.used
                    >= call.nfrag]
            if not done:
                continue
            bad = done[0]
            call.step[bad] += 1
            calls[0].step[bad] += 1
            good = [s for s in good if s != bad]
        else:
            bad = call.used + 2 if which == "beyond the call" else -1
        if not good:
            continue
        slots = np.array(good[:3] + [bad], dtype=np.int64)
        before = {name: getattr(call, name).tobytes() for name in CALL_ARRAYS}
        seq, packets = streamer._seq, streamer.stats.packets
        with pytest.raises(RuntimeError, match="no next packet"):
            streamer._send(call, slots)
        assert {name: getattr(call, name).tobytes() for name in CALL_ARRAYS} == before
        assert (streamer._seq, streamer.stats.packets) == (seq, packets)
        assert streamer.transport.sent == []
        return
    pytest.fail("no random state had such a slot")


@pytest.mark.parametrize("loss", [0.0, 0.05])
def test_whole_calls_give_the_same_sums_on_both_paths(loss, monkeypatch):
    """Four hosts, calls that agree first and calls that speculate (the same size again),
    through the loopback switch: the compiled window's sums are the numpy window's, bit for
    bit, and both within the fixed point's bound of the exact sum."""
    tensors = random_tensors(4, 9 * P.K + 5, seed=3)
    sums = {}
    for path in ("python", "compiled"):
        monkeypatch.setenv(window_c.PATH_ENV, path)
        switch = LoopbackSwitch(4, slots=8, loss=loss, seed=1)
        session = new_session()
        streamers = [SlotStreamer(StreamConfig(switch.job_id, p - 1, 8, 4, session),
                                  switch.transport(p)) for p in range(1, 5)]
        assert all((s._compiled is None) == (path == "python") for s in streamers)
        out = [[None] * 3 for _ in range(4)]

        def work(i, streamers=streamers, out=out):
            for c in range(3):
                out[i][c] = streamers[i].allreduce(tensors[i] * (c + 1))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(r is not None for row in out for r in row), "a host did not finish"
        sums[path] = out
        exact = np.sum(np.asarray(tensors, dtype=np.float64), axis=0)
        for c in range(3):
            for i in range(4):
                np.testing.assert_allclose(out[i][c], exact * (c + 1), rtol=0, atol=1e-4)
    for c in range(3):
        for i in range(4):
            assert sums["python"][i][c].tobytes() == sums["compiled"][i][c].tobytes()
