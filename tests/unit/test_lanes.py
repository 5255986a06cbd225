"""The lane-parallel (SWAR) sum used by the P4 program equals per-lane int32 addition, at this
process's K; the model's whole-row sum equals the P4's word-by-word sum."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from passing import lanes
from passing import protocol as P
from tests.lane_values import EDGES, k_values

lane_values = k_values()


@settings(max_examples=300, deadline=None)
@given(st.lists(lane_values, min_size=1, max_size=8))
def test_swar_sum_equals_numpy_int32_sum(contributions):
    arrs = [np.array(c, dtype=np.int32) for c in contributions]
    row = lanes.row_from_values(arrs[0])
    for a in arrs[1:]:
        row = lanes.swar_add(row, lanes.row_from_values(a))
    with np.errstate(over="ignore"):
        expected = np.sum(np.stack(arrs), axis=0, dtype=np.int32)
    assert np.array_equal(lanes.values_from_row(row), expected)
    assert 0 <= row < 2**lanes.ROW_BITS




@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_row_sum_equals_the_p4s_word_by_word_sum(seed):
    """The model adds a slot's K lanes at once; the P4 program adds each 2048-bit register word
    with its own expression. Both give the same words. (Lanes drawn by numpy, half of them
    edge values that carry out of a lane: hypothesis drawing K integers is slow.)"""
    rng = np.random.default_rng(seed)
    a, b = (np.where(rng.random(P.K) < 0.5, rng.choice(EDGES, P.K),
                     rng.integers(-(2**31), 2**31, P.K)) for _ in range(2))
    ra, rb = lanes.row_from_values(a), lanes.row_from_values(b)
    words = [lanes.swar_add_word(x, y)
             for x, y in zip(lanes.row_words(ra), lanes.row_words(rb), strict=True)]
    assert lanes.row_words(lanes.swar_add(ra, rb)) == words
    assert lanes.row_from_words(words) == lanes.swar_add(ra, rb)


def test_words_hold_64_values_each_in_wire_order():
    values = np.arange(P.K, dtype=np.int32)
    words = lanes.row_words(lanes.row_from_values(values))
    assert len(words) == P.VALUE_WORDS == P.K // 64
    for w, word in enumerate(words):
        assert 0 <= word < 2**P.WORD_BITS
        chunk = word.to_bytes(P.WORD_BITS // 8, "big")
        assert np.frombuffer(chunk, ">i4").tolist() == list(range(64 * w, 64 * w + 64))


def test_carry_never_crosses_a_lane():
    ones = np.full(P.K, -1, dtype=np.int32)  # 0xffffffff in every lane
    row = lanes.swar_add(lanes.row_from_values(ones), lanes.row_from_values(ones))
    assert lanes.values_from_row(row).tolist() == [-2] * P.K


def test_carry_never_crosses_a_word():
    """The last lane of each word (and the first of the next) overflowing leaves its neighbours
    alone."""
    a = np.zeros(P.K, dtype=np.int32)
    b = np.zeros(P.K, dtype=np.int32)
    for w in range(P.VALUE_WORDS):
        a[64 * w + 63], b[64 * w + 63] = -1, 1  # 0xffffffff + 1 = 0, a carry out of the word
        a[64 * w], b[64 * w] = 2**31 - 1, 1
    row = lanes.swar_add(lanes.row_from_values(a), lanes.row_from_values(b))
    out = lanes.values_from_row(row)
    for w in range(P.VALUE_WORDS):
        assert out[64 * w] == -(2**31) and out[64 * w + 63] == 0
    assert np.count_nonzero(out) == P.VALUE_WORDS


def test_overflow_wraps_per_lane():
    a = np.zeros(P.K, dtype=np.int32)
    a[0], a[-1] = 2**31 - 1, -(2**31)
    b = np.zeros(P.K, dtype=np.int32)
    b[0], b[-1] = 1, -1
    row = lanes.swar_add(lanes.row_from_values(a), lanes.row_from_values(b))
    out = lanes.values_from_row(row)
    assert out[0] == -(2**31) and out[-1] == 2**31 - 1 and not out[1:-1].any()
