"""Fixed point: round trips, overflow safety at the worst case, exact integers, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from host_agent import fixed_point as fx
from passing import protocol as P

finite32 = st.floats(-2.0**100, 2.0**100, allow_nan=False, allow_infinity=False, width=32)


def simulate(contribs: list[np.ndarray]) -> np.ndarray:
    """What the switch and agents compute: per-block max exponent, quantize, int32 wrap sum."""
    blocks = [c.astype(np.float64).reshape(-1, P.K) for c in contribs]
    agreed = np.max([fx.block_exponents(b) for b in blocks], axis=0)
    s = fx.scale_bits(len(contribs))
    with np.errstate(over="ignore"):
        total = np.sum([fx.quantize(b, agreed, s) for b in blocks], axis=0, dtype=np.int32)
    return fx.dequantize(total, agreed, s).ravel()


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 8), st.data())
def test_sum_within_tolerance_of_float64(hosts, data):
    arrays = [data.draw(hnp.arrays(np.float32, 2 * P.K, elements=finite32)) for _ in range(hosts)]
    got = simulate(arrays)
    exact = np.sum([a.astype(np.float64) for a in arrays], axis=0)
    largest = max(float(np.max(np.abs(a))) for a in arrays)
    assert np.all(np.abs(got - exact) <= 1e-5 * largest * hosts + 1e-300)


def test_worst_case_does_not_overflow():
    """Every host sends the largest value of its block's exponent, all with the same sign."""
    for hosts in (1, 2, 3, 7, 8, 32):
        top = np.nextafter(np.float32(2.0**10), np.float32(0))  # just below 2**10
        arrays = [np.full(P.K, top, dtype=np.float32) for _ in range(hosts)]
        got = simulate(arrays)
        assert np.allclose(got, hosts * float(top), rtol=1e-7)
        got = simulate([-a for a in arrays])
        assert np.allclose(got, -hosts * float(top), rtol=1e-7)


def test_integers_come_back_exact():
    rng = np.random.default_rng(1)
    arrays = [rng.integers(-1000, 1000, size=3 * P.K).astype(np.float32) for _ in range(4)]
    assert np.array_equal(simulate(arrays), np.sum(arrays, axis=0, dtype=np.float64))


def test_huge_block_next_to_tiny_block_keeps_both():
    a = np.concatenate([np.full(P.K, 3e20, np.float32), np.full(P.K, 2.5e-20, np.float32)])
    got = simulate([a, a])
    assert got[0] == pytest.approx(6e20, rel=1e-7)
    assert got[P.K] == pytest.approx(5e-20, rel=1e-7)


def test_zeros_and_mixed_zero_blocks():
    z = np.zeros(2 * P.K, np.float32)
    one = np.concatenate([np.zeros(P.K), np.ones(P.K)]).astype(np.float32)
    assert not simulate([z, z]).any()
    assert simulate([z, one]).tolist() == one.tolist()
    assert fx.block_exponents(z.reshape(2, P.K)).tolist() == [0, 0]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_refused(bad):
    x = np.ones(100, np.float32)
    x[37] = bad
    with pytest.raises(fx.NonFiniteError, match="first at flat index 37"):
        fx.check_finite(x)


def test_scale_bits_leave_headroom_for_every_stream():
    for hosts in range(1, 65):
        s = fx.scale_bits(hosts)
        assert hosts * 2**s <= 2**30
