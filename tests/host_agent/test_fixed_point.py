"""Fixed point: the sum is within the true error bound (and a scale one bit short is not), no
overflow at the worst case, exact integers, bad input.

The bound is worked out here from first principles, not from the module's scale functions, so
that a bug in those cannot move the bound with it: H hosts, S = 30 - ceil(log2 H), E the
exponent of the block's largest magnitude over all hosts (peak < 2**E, np.frexp), each host
rounding to the nearest multiple of 2**(E - S): every element of the sum is off by at most
H/2 * 2**(E - S). Errors are compared as exact integers (units of 2**-FRAC), not as floats.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from host_agent import fixed_point as fx
from passing import protocol as P

finite32 = st.floats(-2.0**100, 2.0**100, allow_nan=False, allow_infinity=False, width=32)
HOSTS = (1, 2, 3, 8, 32)
FRAC = 200  # every float32, and every dequantized sum here, is a whole multiple of 2**-FRAC
MIN_E = -125  # the exp field's smallest nonzero value, 1, is E = 1 - 126: tinier blocks use it
F32_MAX = float(np.finfo(np.float32).max)


def s_bits(hosts: int) -> int:
    """S = 30 - ceil(log2 H), with the exact integer ceil(log2 H) = (H - 1).bit_length()."""
    return 30 - (hosts - 1).bit_length()


def simulate(contribs: list[np.ndarray]) -> np.ndarray:
    """What the switch and agents compute: per-block max exponent, quantize, int32 wrap sum."""
    blocks = [c.astype(np.float64).reshape(-1, P.K) for c in contribs]
    agreed = np.max([fx.block_exponents(b) for b in blocks], axis=0)
    s = fx.scale_bits(len(contribs))
    with np.errstate(over="ignore"):
        total = np.sum([fx.quantize(b, agreed, s) for b in blocks], axis=0, dtype=np.int32)
    return fx.dequantize(total, agreed, s).ravel()


def as_int(a) -> np.ndarray:
    """Float array -> exact Python ints in units of 2**-FRAC."""
    v = np.asarray(a, np.float64) * 2.0**FRAC
    assert np.all(np.isfinite(v)) and np.all(v == np.floor(v))
    return np.vectorize(int, otypes=[object])(v)


def errors_and_bounds(contribs: list[np.ndarray], got: np.ndarray):
    """Exact |got - sum| per element (F, K), the true bound H/2 * 2**(E - S) per block (F,),
    and the block's largest magnitude M per block (F,), all in units of 2**-FRAC."""
    hosts = len(contribs)
    s = s_bits(hosts)
    exact = np.sum([as_int(c).reshape(-1, P.K) for c in contribs], axis=0)
    err = np.abs(as_int(got).reshape(-1, P.K) - exact)
    peak = np.max([np.max(np.abs(c.astype(np.float64).reshape(-1, P.K)), axis=1)
                   for c in contribs], axis=0)
    _, e = np.frexp(peak)  # peak = m * 2**e, 0.5 <= m < 1
    big_e = np.maximum(e, MIN_E)
    bound = np.array([hosts * 2**(int(x) - s - 1 + FRAC) if p > 0 else 0
                      for x, p in zip(big_e, peak, strict=True)], dtype=object)
    return err, bound, as_int(peak)


def assert_within_true_bound(contribs: list[np.ndarray], got: np.ndarray) -> None:
    hosts = len(contribs)
    err, bound, peak = errors_and_bounds(contribs, got)
    over = [(f, max(err[f]), bound[f]) for f in range(len(bound)) if max(err[f]) > bound[f]]
    assert not over, f"{len(over)} block(s) beyond H/2 * 2**(E-S), first (block, err, bound) " \
                     f"in 2**-{FRAC}: {over[0]}"
    # The same, relative to the block's largest magnitude M where 2**(E-1) <= M (not for the
    # blocks below float32's smallest normal, scaled with E = -125): H * 2**(ceil(log2 H)-30) M.
    normal = as_int(2.0**-126)
    for f in range(len(bound)):
        if peak[f] >= normal:
            assert max(err[f]) * 2**30 <= hosts * 2**(hosts - 1).bit_length() * peak[f]


def worst_ratio(contribs: list[np.ndarray], got: np.ndarray) -> Fraction:
    """Largest error over the true bound, over every element of the blocks that aren't zero."""
    err, bound, _ = errors_and_bounds(contribs, got)
    return max(Fraction(max(err[f]), bound[f]) for f in range(len(bound)) if bound[f] > 0)


def f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(np.float64)


def block(kind: str, hosts: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One block of K float32 values per host (as float64)."""
    k = P.K
    s = s_bits(hosts)
    if kind == "random":  # same magnitude on every host
        u = rng.uniform(-30, 30)
        return [f32(rng.standard_normal(k) * 10.0**u) for _ in range(hosts)]
    if kind == "mixed":  # each host its own magnitude
        return [f32(rng.standard_normal(k) * 10.0**rng.uniform(-30, 30)) for _ in range(hosts)]
    if kind == "power_of_two":  # the peak is exactly 2**j, so M = 2**(E-1): the relative worst
        j = int(rng.integers(-100, 100))
        out = [f32(rng.uniform(-0.99, 0.99, k) * 2.0**j) for _ in range(hosts)]
        out[int(rng.integers(hosts))][int(rng.integers(k))] = rng.choice([-1, 1]) * 2.0**j
        return out
    if kind == "huge":  # next to float32's largest: E = 128
        out = [f32(rng.uniform(-1, 1, k) * F32_MAX) for _ in range(hosts)]
        out[0][0] = -F32_MAX
        return out
    if kind == "subnormal":  # below float32's smallest normal: E = -125 however small
        return [rng.integers(-2**10, 2**10, k) * 2.0**-149 for _ in range(hosts)]
    if kind == "smallest_normal":
        out = [rng.integers(-2**22, 2**22, k) * 2.0**-149 for _ in range(hosts)]
        out[-1][3] = 2.0**-126
        return out
    if kind == "zeros":
        return [np.zeros(k) for _ in range(hosts)]
    if kind == "zero_on_some":
        return [np.zeros(k) if h % 2 else f32(rng.standard_normal(k)) for h in range(hosts)]
    # Hand-made fractions of a unit 2**(E-S), the same sign per element on every host, so that
    # all H rounding errors add up. Host 0's first value, 0.75 * 2**E, sets E.
    big_e = int(rng.choice([-90, -3, 0, 1, 20, 100, 128]))
    frac = {"ties": 0.5, "seven_eighths": 0.875}[kind]
    sign = rng.choice([-1.0, 1.0], k)
    out = []
    for _ in range(hosts):
        n = 2 * rng.integers(0, 2**19, k)  # even: rint's ties go to n, all the same way
        out.append(sign * (n + frac) * 2.0**(big_e - s))
    out[0][0] = 0.75 * 2.0**big_e
    return out


KINDS = ("random", "mixed", "power_of_two", "huge", "subnormal", "smallest_normal", "zeros",
         "zero_on_some", "ties", "seven_eighths")


def dataset(hosts: int, seed: int, kinds=KINDS, per_kind: int = 3) -> list[np.ndarray]:
    """`hosts` float32 arrays of several blocks of every kind."""
    rng = np.random.default_rng(seed)
    blocks = [block(kind, hosts, rng) for kind in kinds for _ in range(per_kind)]
    contribs = [np.concatenate([b[h] for b in blocks]) for h in range(hosts)]
    out = [c.astype(np.float32) for c in contribs]
    for c, c32 in zip(contribs, out, strict=True):
        assert np.array_equal(c32.astype(np.float64), c)  # every value was made a float32
    return out


@pytest.mark.parametrize("hosts", HOSTS)
def test_sum_within_the_true_bound(hosts):
    for seed in range(3):
        contribs = dataset(hosts, seed)
        assert_within_true_bound(contribs, simulate(contribs))


@pytest.mark.parametrize("hosts", HOSTS)
def test_the_bound_is_reached_exactly(hosts):
    """Ties (n + 1/2 units, n even, same sign on every host) are off by exactly H/2 units: the
    bound cannot be any tighter, and errors are never below what rounding alone explains."""
    contribs = dataset(hosts, 7, kinds=("ties",))
    assert worst_ratio(contribs, simulate(contribs)) == 1


def _one_bit_short(monkeypatch, where: str) -> None:
    if where == "scale_bits":  # S - 1
        orig_s = fx.scale_bits
        monkeypatch.setattr(fx, "scale_bits", lambda streams: orig_s(streams) - 1)
    elif where == "shift":  # 2**(S - E - 1) in both quantize and dequantize
        orig_shift = fx._shift
        monkeypatch.setattr(fx, "_shift", lambda field, s: orig_shift(field, s) / 2)
    else:  # the exponent one too high
        orig_exp = fx.block_exponents
        monkeypatch.setattr(fx, "block_exponents",
                            lambda b: (lambda f: np.where(f > 0, f + 1, 0).astype(np.uint8))(
                                orig_exp(b)))


@pytest.mark.parametrize("where", ["scale_bits", "shift", "exponent"])
@pytest.mark.parametrize("hosts", HOSTS)
def test_one_bit_less_of_scale_breaks_the_bound(monkeypatch, hosts, where):
    """The data of test_sum_within_the_true_bound, quantized with one bit less of scale: values of
    n + 7/8 units (n even) then round off by 7/16 of the doubled unit each, 7H/8 units in all, so
    the check of that test fails. It catches a lost bit wherever it is lost."""
    contribs = dataset(hosts, 0)
    assert worst_ratio(contribs, simulate(contribs)) <= 1
    _one_bit_short(monkeypatch, where)
    got = simulate(contribs)
    assert worst_ratio(contribs, got) >= Fraction(7, 4)
    with pytest.raises(AssertionError, match="beyond H/2"):
        assert_within_true_bound(contribs, got)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 8), st.data())
def test_sum_within_the_true_bound_any_data(hosts, data):
    arrays = [data.draw(hnp.arrays(np.float32, 2 * P.K, elements=finite32)) for _ in range(hosts)]
    assert_within_true_bound(arrays, simulate(arrays))


def test_relative_bound_numbers():
    """H * 2**(ceil(log2 H) - 30) of the largest magnitude, as the docs give it."""
    rel = {h: Fraction(h * 2**(h - 1).bit_length(), 2**30) for h in (1, 2, 3, 8, 32)}
    assert rel == {1: Fraction(1, 2**30), 2: Fraction(1, 2**28), 3: Fraction(3, 2**28),
                   8: Fraction(1, 2**24), 32: Fraction(1, 2**20)}
    assert max(Fraction(h * 2**(h - 1).bit_length(), 2**30) for h in range(1, 9)) == rel[8]


def test_error_bound_helper_matches_the_true_bound():
    rng = np.random.default_rng(3)
    for hosts in HOSTS:
        fields = np.concatenate([[0, 1, 2, 126, 127, 254, fx.POISON],
                                 rng.integers(1, 255, 50)]).astype(np.uint8)
        got = fx.error_bound(fields, hosts)
        for f, b in zip(fields.tolist(), got.tolist(), strict=True):
            if f == 0:
                assert b == 0.0
            elif f == fx.POISON:
                assert b == np.inf
            else:
                assert Fraction(b) == Fraction(hosts, 2) * Fraction(2)**(f - 126 - s_bits(hosts))


def test_error_bound_helper_holds_on_the_data():
    for hosts in HOSTS:
        contribs = dataset(hosts, 5)
        blocks = [c.astype(np.float64).reshape(-1, P.K) for c in contribs]
        agreed = np.max([fx.block_exponents(b) for b in blocks], axis=0)
        exact = np.sum([as_int(b) for b in blocks], axis=0)
        err = np.abs(as_int(simulate(contribs)).reshape(-1, P.K) - exact)
        for e_row, b in zip(err, fx.error_bound(agreed, hosts).tolist(), strict=True):
            assert max(e_row) <= int(b * 2.0**FRAC)


def test_worst_case_does_not_overflow():
    """Every host sends the largest value of its block's exponent, all with the same sign."""
    for hosts in HOSTS + (7,):
        top = np.nextafter(np.float32(2.0**10), np.float32(0))  # just below 2**10
        arrays = [np.full(P.K, top, dtype=np.float32) for _ in range(hosts)]
        assert simulate(arrays).tolist() == [hosts * float(top)] * P.K
        assert simulate([-a for a in arrays]).tolist() == [-hosts * float(top)] * P.K
        # float64 within a quarter unit of 2**10 rounds up to the full scale, 2**S units, on
        # every host: H * 2**S = 2**30 at most
        near = 2.0**10 - 2.0**(10 - s_bits(hosts) - 2)
        full = [np.full(P.K, -near) for _ in range(hosts)]
        got = simulate(full)
        assert got.tolist() == [-hosts * 2.0**10] * P.K
        assert_within_true_bound(full, got)


@pytest.mark.parametrize("hosts", HOSTS)
def test_integers_come_back_exact(hosts):
    """Integers below 2**S / H on every host (float64, where float32 can't hold them) are exact;
    so is any integer below 2**S per host. One at 2**S + 1 is the first that need not be."""
    s = s_bits(hosts)
    rng = np.random.default_rng(hosts)
    lim = 2**s // hosts
    arrays = [rng.integers(-lim + 1, lim, size=3 * P.K).astype(np.float64) for _ in range(hosts)]
    arrays[0][:2] = [lim - 1, -(lim - 1)]
    assert np.array_equal(simulate(arrays), np.sum(arrays, axis=0))
    arrays = [rng.integers(-2**s + 1, 2**s, size=3 * P.K).astype(np.float64)
              for _ in range(hosts)]
    arrays[-1][:2] = [2**s - 1, -(2**s - 1)]
    assert np.array_equal(simulate(arrays), np.sum(arrays, axis=0))
    arrays = [np.zeros(P.K) for _ in range(hosts)]
    arrays[0][0] = 2**s + 1
    assert simulate(arrays)[0] != 2**s + 1
    f32 = [rng.integers(-1000, 1000, size=3 * P.K).astype(np.float32) for _ in range(hosts)]
    assert np.array_equal(simulate(f32), np.sum(f32, axis=0, dtype=np.float64))


def test_huge_block_next_to_tiny_block_keeps_both():
    a = np.concatenate([np.full(P.K, 3e20, np.float32), np.full(P.K, 2.5e-20, np.float32)])
    got = simulate([a, a])
    assert_within_true_bound([a, a], got)
    exact = 2 * a.astype(np.float64)
    assert got[0] == pytest.approx(exact[0], rel=2**-28)  # H=2: 2**-28 of the block's largest
    assert got[P.K] == pytest.approx(exact[P.K], rel=2**-28)


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
    for hosts in range(1, 1025):
        s = fx.scale_bits(hosts)
        assert s == s_bits(hosts)  # one bit less would still fit, but lose accuracy
        assert hosts * 2**s <= 2**30 < hosts * 2**(s + 1)
