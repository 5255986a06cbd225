"""Floats to the switch's 32-bit fixed point and back, with a scale per block of K values.

Each host proposes, per fragment (block), the exponent e of its largest magnitude (|x| < 2**e);
the switch returns the maximum E over all hosts (header field `exp`, see docs/protocol.md). The
largest field value, POISON, says a host had NaN or Inf: since the switch keeps the maximum,
every host learns it and refuses the sum, instead of the others waiting for that host. With
H hosts streaming into the switch, every host scales the block by 2**(S - E) where
S = 30 - ceil(log2 H): each quantized value is then at most 2**S in magnitude and the sum of H of
them at most 2**30, so the int32 sum can never overflow, whatever the data.

Error bound, per block: each host rounds to the nearest multiple of 2**(E - S), an error of at
most half of that, so each element of the sum is off by at most H/2 * 2**(E - S) (`error_bound`),
and rint's ties make that exact worst case reachable. Relative to the block's largest magnitude
M over all hosts (2**(E - 1) <= M < 2**E) that is at most H * 2**(ceil(log2 H) - 30) * M:
2**-30 for H = 1, 2**-28 for H = 2, 3 * 2**-28 for H = 3, 2**-24 for H = 8 (so at most 2**-24
for any H <= 8), 2**-20 for H = 32. (Blocks below float32's smallest normal, 2**-126, are
scaled as if E = -125, so for them only the absolute bound H * 2**(-126 - S) holds.)
In a call that agrees first, integers below 2**S / H come back exact, since the scale is then
a power of two >= 1 (in fact any integer of magnitude below 2**S on every host does).

A call that speculates (SPEC_HEADROOM, below) may keep a scale up to SPEC_SLACK bits above E:
its bound is that of E + SPEC_SLACK, 4x the above (2**-22 of M for H <= 8), and only integers
of magnitude below 2**(S - SPEC_SLACK) on every host are sure to come back exact (for H >= 2
that includes every one below 2**(S - 1) / H).
"""

from __future__ import annotations

import math

import numpy as np

EXP_BIAS = 126  # exp field = e + EXP_BIAS; 0 means "the block is all zeros"
POISON = 255  # a host had NaN/Inf: the switch's max spreads it to every host of the job
_MIN_E, _MAX_E = 1 - EXP_BIAS, POISON - 1 - EXP_BIAS  # float32's range: e up to 128


class NonFiniteError(ValueError):
    """NaN or Inf in a tensor to be summed: there is no correct fixed-point sum of those."""


def scale_bits(streams: int) -> int:
    """S for `streams` contributions summed in the switch (one per host)."""
    if streams < 1:
        raise ValueError("at least one stream")
    return 30 - math.ceil(math.log2(streams))


def check_finite(x: np.ndarray) -> None:
    if not np.all(np.isfinite(x)):
        bad = np.flatnonzero(~np.isfinite(x.ravel()))
        raise NonFiniteError(f"{bad.size} NaN/Inf value(s) in the tensor, first at flat index "
                             f"{bad[0]}: refusing to sum")


def block_exponents(blocks: np.ndarray) -> np.ndarray:
    """Exp field per row of an (F, K) float array: e + EXP_BIAS with max|row| < 2**e, or 0 for
    an all-zero row."""
    # max|x| as the larger of max and -min: no temporary array of |x| (a large call's blocks
    # are tens of MB, and each new one costs page faults).
    peak = np.maximum(blocks.max(axis=1), -blocks.min(axis=1)).astype(np.float64)
    _, e = np.frexp(peak)  # peak = m * 2**e with 0.5 <= m < 1, so peak < 2**e
    if np.any(e > _MAX_E):
        raise ValueError(f"magnitude {peak.max():g} beyond the float32 range the format covers")
    field = np.clip(e.astype(np.int64) + EXP_BIAS, 1, POISON - 1)
    return np.where(peak > 0, field, 0).astype(np.uint8)


# Speculative scale (docs/protocol.md, "Speculative scale"): a call of a size the session summed
# before quantizes each fragment at the largest exponent the hosts proposed for it in the last
# such call plus SPEC_HEADROOM,
# in one round, each host proposing its own exponent beside the values. The sum holds when the
# switch's maximum of those proposals is at most the predicted exponent (nothing wrapped) and at
# most SPEC_SLACK below it (at most that many bits of precision given up); otherwise the
# fragment is sent again at the maximum, as without speculation.
SPEC_HEADROOM = 1
SPEC_SLACK = 2


def predict(last: np.ndarray) -> np.ndarray:
    """The speculative exp field per fragment from the exponents the last call proposed (all
    below POISON; 0: an all-zero block): SPEC_HEADROOM above, never POISON."""
    return np.minimum(last.astype(np.int64) + SPEC_HEADROOM, POISON - 1).astype(np.uint8)


def speculation_holds(predicted: np.ndarray, proposed: np.ndarray) -> np.ndarray:
    """Per fragment (arrays, or one fragment's numpy scalars): whether a sum quantized at
    `predicted` stands, given the maximum `proposed` exponent the switch returned with it.
    POISON stands: there is no sum to redo. So does 0: every host summed an all-zero block,
    so the sum is exactly zero at any scale."""
    pred = predicted.astype(np.int64)
    most = proposed.astype(np.int64)
    return (most == POISON) | (most == 0) | ((most <= pred) & (most + SPEC_SLACK >= pred))


def _shift(exp_field: np.ndarray, s: int) -> np.ndarray:
    """2**(S - E) per row; all-zero blocks (field 0) use the smallest exponent."""
    e = np.where(exp_field > 0, exp_field.astype(np.int64) - EXP_BIAS, _MIN_E)
    return np.ldexp(1.0, (s - e)).reshape(-1, 1)


def quantize(blocks: np.ndarray, exp_field: np.ndarray, s: int) -> np.ndarray:
    """(F, K) floats -> int32 with the agreed exponents (exp_field >= each row's own)."""
    q = np.rint(blocks.astype(np.float64) * _shift(exp_field, s))
    return q.astype(np.int32)


def dequantize(sums: np.ndarray, exp_field: np.ndarray, s: int) -> np.ndarray:
    """int32 sums -> float64, undoing the block scale."""
    # Times 2**-(S - E), not divided by 2**(S - E): the same, exactly (powers of two), and
    # cheaper per element.
    return sums.astype(np.float64) * (1.0 / _shift(exp_field, s))


def error_bound(exp_field: np.ndarray, streams: int) -> np.ndarray:
    """Largest error per element of the dequantized sum of `streams` contributions, per block:
    H/2 * 2**(E - S) for the agreed exp field; 0 for an all-zero block (field 0), inf for a
    poisoned one (there is no sum)."""
    field = np.asarray(exp_field).astype(np.int64)
    e = np.where((field > 0) & (field < POISON), field - EXP_BIAS, 0)
    bound = np.ldexp(streams / 2, e - scale_bits(streams))
    return np.where(field == 0, 0.0, np.where(field == POISON, np.inf, bound))
