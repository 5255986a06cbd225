"""The lane-parallel (SWAR) sum used by the P4 program equals per-lane int32 addition."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from passing import lanes
from passing import protocol as P

lane_values = st.lists(st.integers(-(2**31), 2**31 - 1), min_size=P.K, max_size=P.K)


@settings(max_examples=300, deadline=None)
@given(st.lists(lane_values, min_size=1, max_size=8))
def test_swar_sum_equals_numpy_int32_sum(contributions):
    arrs = [np.array(c, dtype=np.int32) for c in contributions]
    word = lanes.word_from_values(arrs[0])
    for a in arrs[1:]:
        word = lanes.swar_add(word, lanes.word_from_values(a))
    with np.errstate(over="ignore"):
        expected = np.sum(np.stack(arrs), axis=0, dtype=np.int32)
    assert np.array_equal(lanes.values_from_word(word), expected)
    assert 0 <= word < 2**lanes.WORD_BITS


def test_carry_never_crosses_a_lane():
    ones = np.full(P.K, -1, dtype=np.int32)  # 0xffffffff in every lane
    word = lanes.swar_add(lanes.word_from_values(ones), lanes.word_from_values(ones))
    assert lanes.values_from_word(word).tolist() == [-2] * P.K


def test_overflow_wraps_per_lane():
    a = np.zeros(P.K, dtype=np.int32)
    a[0], a[-1] = 2**31 - 1, -(2**31)
    b = np.zeros(P.K, dtype=np.int32)
    b[0], b[-1] = 1, -1
    word = lanes.swar_add(lanes.word_from_values(a), lanes.word_from_values(b))
    out = lanes.values_from_word(word)
    assert out[0] == -(2**31) and out[-1] == 2**31 - 1 and not out[1:-1].any()
