"""The benchmark's checker (passing_agent.check): the exact sum it compares every call with, the
error bound that decides "correct", and the rank's memo of the last sum, which must never answer
for another seed, size or job shape."""

from __future__ import annotations

import numpy as np
import pytest

from host_agent import fixed_point as fx
from passing import protocol as P
from passing.contract import HostParams, JobParams
from passing_agent import check


def _params(gpus: tuple[int, ...]) -> JobParams:
    hosts = tuple(HostParams(f"h{i}", f"10.0.{i}.1", "10.0.0.254", "02:00:00:00:00:01", i, g)
                  for i, g in enumerate(gpus))
    return JobParams(1, "passing", "00" * 16, 40000, 40001, 8, hosts)


def _tensors(gpus: tuple[int, ...], seed: int, n: int) -> list[list[np.ndarray]]:
    return [[check.rank_tensor(seed, h, g, n).astype(np.float64) for g in range(count)]
            for h, count in enumerate(gpus)]


def _passing_result(gpus: tuple[int, ...], seed: int, n: int) -> np.ndarray:
    """What a correct `passing` call returns: float32 local sums, quantized per block with the
    exponent the switch agrees on, summed as int32, dequantized, rounded to float32."""
    local = [np.sum([t.astype(np.float32) for t in host], axis=0, dtype=np.float32)
             for host in _tensors(gpus, seed, n)]
    pad = -n % P.K
    blocks = [np.pad(x, (0, pad)).reshape(-1, P.K) for x in local]
    agreed = np.max([fx.block_exponents(b) for b in blocks], axis=0)
    s = fx.scale_bits(len(gpus))
    ints = np.sum([fx.quantize(b, agreed, s).astype(np.int64) for b in blocks], axis=0)
    return fx.dequantize(ints, agreed, s).astype(np.float32).ravel()[:n]


# Memo hits and misses in turn: each answer is checked against the sums computed here.
SEQUENCE = [((2, 2, 2, 2), 7, 1000), ((2, 2, 2, 2), 7, 1000), ((1, 3, 2), 7, 1000),
            ((2, 2, 2, 2), 7, 1001), ((2, 2, 2, 2), 8, 1001), ((2, 2, 2, 2), 7, 1000)]


@pytest.mark.parametrize("strategy", ["passing", "ina", "ring", "ps"])
def test_every_answer_is_the_exact_sum_of_that_call(strategy):
    for gpus, seed, n in SEQUENCE:
        total, tol, count = check.expected_sum(_params(gpus), seed, n, strategy)
        tensors = [t for host in _tensors(gpus, seed, n) for t in host]
        want = np.zeros(n)
        for t in tensors:
            want += t
        assert count == sum(gpus) and total.shape == (n,)
        np.testing.assert_array_equal(total, want)
        assert np.all(tol > 0)


def test_a_correct_fixed_point_sum_passes_and_a_missing_contribution_fails():
    gpus, seed, n = (2, 2, 2, 2), 3, 5 * P.K + 17  # a short last block too
    total, tol, _ = check.expected_sum(_params(gpus), seed, n, "passing")
    got = _passing_result(gpus, seed, n).astype(np.float64)
    assert np.all(np.abs(got - total) <= tol)
    # One rank's values missing from one block: every element of that block is wrong.
    dropped = got.copy()
    dropped[P.K:2 * P.K] -= check.rank_tensor(seed, 2, 1, n)[P.K:2 * P.K]
    assert np.count_nonzero(np.abs(dropped - total) > tol) == P.K


def test_the_bound_is_a_few_float32_roundings_not_a_loose_one():
    """A bound loose enough to pass a sum at half precision would hide real errors."""
    gpus, seed, n = (2, 2, 2, 2), 4, 4 * P.K
    for strategy in ("passing", "ina", "ring"):
        total, tol, _ = check.expected_sum(_params(gpus), seed, n, strategy)
        magnitude = np.sum([np.abs(t) for h in _tensors(gpus, seed, n) for t in h], axis=0)
        assert np.max(tol / magnitude) < 2 ** -18, strategy
        assert np.median(np.abs(total - total.astype(np.float16)) / tol) > 1, strategy


def test_the_shared_sum_cannot_be_changed_by_a_caller():
    total, _, _ = check.expected_sum(_params((2, 2)), 5, 300, "ring")
    with pytest.raises(ValueError):
        total[0] = 0.0
    again, _, _ = check.expected_sum(_params((2, 2)), 5, 300, "passing")
    assert again is total  # the memo answered, with the untouched values
    np.testing.assert_array_equal(
        again, np.sum([t for h in _tensors((2, 2), 5, 300) for t in h], axis=0))


def _reference_tolerance(gpus: tuple[int, ...], seed: int, n: int, strategy: str) -> np.ndarray:
    """The bound as docs/benchmarks.md states it, computed here from the tensors themselves:
    float32 roundings of partial sums, plus the fixed point's bound over the streams the switch
    sums (one per host for passing, one per rank for ina) raised by one bit for the float32
    local sum and SPEC_SLACK bits for a speculative scale."""
    tensors = _tensors(gpus, seed, n)
    flat = [t for host in tensors for t in host]
    tol = len(flat) * 2.0 ** -24 * np.sum(np.abs(flat), axis=0) \
        + 2.0 ** -24 * np.abs(np.sum(flat, axis=0))
    streams = {"passing": [np.sum(h, axis=0) for h in tensors], "ina": flat}.get(strategy)
    if streams:
        pad = -n % P.K
        peaks = np.max([np.abs(np.pad(x, (0, pad))).reshape(-1, P.K).max(axis=1)
                        for x in streams], axis=0)
        per_block = fx.error_bound(fx.block_exponents(peaks.reshape(-1, 1)), len(streams))
        tol = tol + np.repeat(2 ** (1 + fx.SPEC_SLACK) * per_block, P.K)[:n]
    return tol


def test_each_strategy_gets_its_own_bound_whether_the_memo_answers_or_not():
    # ina's streams are the ranks, passing's the hosts: with one GPU on a host and three on
    # another, the two bounds differ, and a memo mixing them up would show.
    for gpus, seed, n in [((1, 3, 2), 9, 3 * P.K + 5), ((1, 3, 2), 9, 3 * P.K + 5),
                          ((2, 2, 2, 2), 9, 3 * P.K + 5)]:
        for strategy in ("passing", "ina", "ring", "passing"):
            _, tol, _ = check.expected_sum(_params(gpus), seed, n, strategy)
            np.testing.assert_allclose(tol, _reference_tolerance(gpus, seed, n, strategy),
                                       rtol=1e-12, err_msg=f"{gpus} {strategy}")


def test_forget_drops_the_kept_sums():
    first, _, _ = check.expected_sum(_params((2, 2)), 6, 300, "ring")
    check.forget()
    again, _, _ = check.expected_sum(_params((2, 2)), 6, 300, "ring")
    assert again is not first
    np.testing.assert_array_equal(again, first)


def test_answers_count_every_wrong_element_of_every_call_nan_included():
    """A rank checks each call in arrays kept across calls: a wrong call followed by a right
    one still counts the first's wrong elements, each call's largest error is its own, and
    NaN or Inf (never within a bound) is wrong."""
    gpus, seed, n = (2, 2), 6, 3 * P.K + 5
    total, tol, _ = check.expected_sum(_params(gpus), seed, n, "passing")
    answers = check.Answers(total, tol)
    right = _passing_result(gpus, seed, n)
    off = right.copy()
    off[[0, 7]] += np.float32(1.0)
    nan = right.copy()
    nan[3], nan[9] = np.nan, np.inf
    for answer in (off, right, nan, right):
        answers.check(answer)
    assert answers.wrong == 4
    assert answers.errors[0] >= 0.99 and answers.errors[1] <= np.max(tol)
    assert answers.errors[3] == answers.errors[1]
    assert answers.excess[0] > 1 >= answers.excess[1]
    np.testing.assert_array_equal(total, check.expected_sum(_params(gpus), seed, n,
                                                            "passing")[0])
