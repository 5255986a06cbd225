"""Speculation's memory (host_agent.stream_scales) and the count of whole calls a late host
finds among results kept early (host_agent.stream_catch_up), on made-up results."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from host_agent import fixed_point as fx
from host_agent.stream_api import StreamStats
from host_agent.stream_call import TAG_LAST, Call
from host_agent.stream_catch_up import calls_ready
from host_agent.stream_scales import SCALES_KEPT, ScaleMemory, next_scales
from passing import packet
from passing import protocol as P

WINDOW, NFRAG = 4, 10
EXPS = np.array([120, 121, 122, 123, 124, 125, 126, 127, 128, 129], dtype=np.uint8)


def rec(frag: int, exp: int, tag: int) -> np.void:
    r = np.zeros(1, dtype=packet.PAYLOAD_DTYPE)[0]
    r["frag"], r["exp"], r["tag"] = frag, exp, tag
    return r


def kept_call(early: dict, rounds: list[int], tag: int, predicted: np.ndarray | None,
              exps: np.ndarray = EXPS) -> None:
    """The results of one whole call of NFRAG fragments as the others made it, kept early from
    each slot's round in `rounds` on (advanced past them)."""
    used = P.slots_used(WINDOW, NFRAG, speculating=predicted is not None)
    for s in range(used):
        if predicted is None:  # the exponent packet: its result is the fragment's maximum
            early[s, rounds[s]] = rec(s, exps[s], tag)
            rounds[s] += 1
        frags = list(range(s, NFRAG, used))
        for i, frag in enumerate(frags):
            last = TAG_LAST if i == len(frags) - 1 else 0
            ahead = exps[frag + used] if predicted is None and frag + used < NFRAG else 0
            exp = exps[frag] if predicted is not None else ahead
            early[s, rounds[s]] = rec(frag, exp, tag | last)
            rounds[s] += 1


def test_whole_calls_count_agreeing_first_then_speculating():
    early: dict = {}
    rounds = [0] * WINDOW
    kept_call(early, rounds, tag=0, predicted=None)
    kept_call(early, rounds, tag=1, predicted=fx.predict(EXPS))  # the next speculates
    assert calls_ready(early, np.zeros(WINDOW, np.uint32), {}, 0, NFRAG, 127, WINDOW) == 2
    assert calls_ready(early, np.zeros(WINDOW, np.uint32), {}, 0, NFRAG, 1, WINDOW) == 1
    # This host made other calls than these results' (other tags): none is its next.
    assert calls_ready(early, np.zeros(WINDOW, np.uint32), {}, 5, NFRAG, 127, WINDOW) == 0


def test_a_call_with_a_result_missing_or_of_another_size_is_not_ready():
    early: dict = {}
    kept_call(early, [0] * WINDOW, tag=0, predicted=None)
    fewer = dict(early)
    del fewer[1, 2]
    assert calls_ready(fewer, np.zeros(WINDOW, np.uint32), {}, 0, NFRAG, 127, WINDOW) == 0
    # The others' call was larger: the slot's last result here is not tagged as its last.
    larger = dict(early)
    last = max(r for s, r in early if s == 0)
    larger[0, last] = rec(int(early[0, last]["frag"]), 0, 0)
    assert calls_ready(larger, np.zeros(WINDOW, np.uint32), {}, 0, NFRAG, 127, WINDOW) == 0
    # A call of 3 fragments uses 3 slots; the 4th holds a result of the same call: the
    # others' call was larger.
    small = {(s, 0): rec(s, 0, 0) for s in range(3)}
    small.update({(s, 1): rec(s, 0, TAG_LAST) for s in range(3)})
    assert calls_ready(small, np.zeros(WINDOW, np.uint32), {}, 0, 3, 127, WINDOW) == 1
    small[3, 0] = rec(3, 0, 0)
    assert calls_ready(small, np.zeros(WINDOW, np.uint32), {}, 0, 3, 127, WINDOW) == 0


def test_a_speculation_that_missed_is_walked_as_the_fragment_sent_again():
    scales = {NFRAG: (EXPS, True)}
    predicted = fx.predict(EXPS)
    early: dict = {}
    rounds = [0] * WINDOW
    kept_call(early, rounds, tag=0, predicted=predicted)
    assert calls_ready(early, np.zeros(WINDOW, np.uint32), scales, 0, NFRAG, 127, WINDOW) == 1
    # Fragment 1's maximum came back above the prediction: the others sent it again.
    missed = {k: v.copy() for k, v in early.items()}
    missed[1, 0]["exp"] = int(predicted[1]) + 1
    assert calls_ready(missed, np.zeros(WINDOW, np.uint32), scales, 0, NFRAG, 127,
                       WINDOW) == 0
    again = {}
    for (s, r), v in missed.items():
        again[s, r + (s == 1 and r > 0)] = v  # slot 1's rounds after the miss move up one
    again[1, 1] = rec(1, int(predicted[1]) + 1, 0)
    assert calls_ready(again, np.zeros(WINDOW, np.uint32), scales, 0, NFRAG, 127, WINDOW) == 1


def test_the_next_call_speculates_unless_this_one_would_have_missed_too_often():
    assert next_scales(None, EXPS, WINDOW)[1]
    poisoned = EXPS.copy()
    poisoned[3] = fx.POISON
    assert next_scales((EXPS, True), poisoned, WINDOW) is None  # nothing to predict from
    assert next_scales((EXPS, True), EXPS, WINDOW)[1]
    jumped = (EXPS + 5).astype(np.uint8)  # every fragment would have missed
    assert not next_scales((EXPS, True), jumped, WINDOW)[1]


def test_the_memory_keeps_the_most_recent_sizes_and_counts_speculation():
    memory = ScaleMemory(WINDOW)
    stats = StreamStats()
    for nfrag in range(1, SCALES_KEPT + 2):
        call = Call(np.zeros((nfrag, P.K)), np.full(nfrag, 100, dtype=np.uint8), WINDOW, 2, 0)
        call.agreed[:] = 100
        memory.keep(call, stats)
    assert 1 not in memory.scales and len(memory.scales) == SCALES_KEPT
    assert isinstance(memory.scales, OrderedDict)
    predicted = memory.prediction(5)
    assert predicted is not None and (predicted == fx.predict(np.full(5, 100))).all()
    assert memory.prediction(1) is None  # forgotten: that size agrees first again
    call = Call(np.zeros((5, P.K)), np.zeros(5, dtype=np.uint8), WINDOW, 2, 0, predicted)
    call.proposed[:] = 100
    call.missed = 2
    memory.keep(call, stats)
    assert (stats.speculated, stats.spec_missed) == (5, 2)
    assert list(memory.scales)[-1] == 5  # most recently used last
