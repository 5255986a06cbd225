"""The random-tensor checker of passing-agent: every local rank fills its tensor from
(seed, host, rank), so every host can compute the exact global sum with numpy, and the largest
error a correct strategy may make, and check what came back."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from passing import protocol as P
from passing.contract import JobParams

# float32's unit roundoff: the relative error of one rounding to float32.
_U32 = 2.0 ** -24


def rank_tensor(seed: int, host_index: int, rank: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, host_index, rank]).standard_normal(n).astype(np.float32)


@dataclass(frozen=True)
class _Sums:
    """What every strategy's check of one (seed, size, job shape) needs: computing it costs
    seconds per rank at 4M values (every rank's tensor drawn again), and a sweep checks five
    strategies in a row at each size, so a rank keeps the last one (`_sums`)."""

    total: np.ndarray  # exact float64 sum over every rank of every host
    magnitude: np.ndarray  # sum of |x| over every rank: bounds any partial sum
    count: int  # contributors
    host_peaks: np.ndarray  # (hosts, blocks): largest |x| per block of K of each host's sum
    rank_peaks: np.ndarray  # (ranks, blocks): the same of each rank's own tensor


_last: tuple[tuple, _Sums] | None = None


def _shape(params: JobParams) -> tuple[int, ...]:
    """What the tensors depend on besides seed and size: each host's index and GPU count."""
    return tuple(params.host(name).local_gpus for name in params.host_names)


def _sums(params: JobParams, seed: int, n: int) -> _Sums:
    global _last
    key = (seed, n, P.K, _shape(params))
    if _last is not None and _last[0] == key:
        return _last[1]
    _last = None  # a failed computation must not leave the older entry behind a new key
    total, magnitude = np.zeros(n), np.zeros(n)
    host_sum, t = np.empty(n), np.empty(n)
    host_peaks, rank_peaks = [], []
    for idx, gpus in enumerate(_shape(params)):
        host_sum.fill(0.0)
        for g in range(gpus):
            t[:] = rank_tensor(seed, idx, g, n)
            total += t
            host_sum += t
            rank_peaks.append(_block_peaks(t))
            magnitude += np.abs(t, out=t)
        host_peaks.append(_block_peaks(host_sum))
    sums = _Sums(total, magnitude, len(rank_peaks), np.array(host_peaks), np.array(rank_peaks))
    for a in (sums.total, sums.magnitude, sums.host_peaks, sums.rank_peaks):
        a.flags.writeable = False  # shared by every later check of the same key
    _last = (key, sums)
    return sums


def forget() -> None:
    """Drop the kept sums (a rank about to train needs the memory, not them)."""
    global _last
    _last = None


def expected_sum(params: JobParams, seed: int, n: int,
                 strategy: str = "passing") -> tuple[np.ndarray, np.ndarray, int]:
    """(exact float64 sum over every rank of every host (read-only), the largest error per
    element a correct `strategy` may make, contributors).

    The bound adds what each stage may lose: float32 sums of partial results (the local reduce
    of `passing`, every step of the baselines), the fixed point of the switch strategies
    (host_agent.fixed_point.error_bound, with one bit of margin because the float32 local sum
    may round across a power of two and so raise a block's exponent, and SPEC_SLACK more
    because a call that repeats a size may keep a speculative scale up to that many bits above
    the hosts' maximum: docs/protocol.md, "Speculative scale"), and the final rounding
    of the float64 result to float32. Losing more than that is a wrong sum."""
    from host_agent import fixed_point as fx

    s = _sums(params, seed, n)
    tol = s.count * _U32 * s.magnitude + _U32 * np.abs(s.total)
    # passing sums one stream per host in the switch, ina one per rank; the others none.
    streams = {"passing": s.host_peaks, "ina": s.rank_peaks}.get(strategy)
    if streams is not None:
        peaks = streams.max(axis=0)
        # Each bit of margin doubles the bound (bumping the exp field instead would wrap the
        # largest exponent into POISON, an infinite bound).
        margin = 2.0 ** (1 + fx.SPEC_SLACK)
        per_block = margin * fx.error_bound(fx.block_exponents(peaks.reshape(-1, 1)),
                                            len(streams))
        tol += np.repeat(per_block, P.K)[:n]
    return s.total, tol, s.count


def _block_peaks(x: np.ndarray) -> np.ndarray:
    """Largest |x| per block of K values (the last block may be short)."""
    full = x.size // P.K * P.K
    body = x[:full].reshape(-1, P.K)
    peaks = np.maximum(body.max(axis=1), -body.min(axis=1))
    if full < x.size:
        peaks = np.append(peaks, np.abs(x[full:]).max())
    return peaks


class Answers:
    """Each call's answer against the exact sum, in work arrays kept across calls: a rank
    checks every call, and fresh arrays of the tensor's size would cost it page faults each
    time (the check of a 4 MiB call took a tenth of this 2-core machine's CPU, beside the
    calls of the hosts still streaming). Call `check` after every call, warm-ups included.

    Usage::

        answers = Answers(*expected_sum(params, seed, n, strategy)[:2])
        answers.check(tensor.numpy())      # then answers.errors, .excess, .wrong
    """

    def __init__(self, exact: np.ndarray, tol: np.ndarray):
        self.exact, self.tol = exact, tol
        self._err = np.empty(exact.shape, np.float64)
        self._within = np.empty(exact.shape, bool)
        self.errors: list[float] = []  # each call's largest |answer - exact|
        self.excess: list[float] = []  # ... and its largest |answer - exact| / tol
        self.wrong = 0  # elements beyond their bound, over every call

    def check(self, answer: np.ndarray) -> None:
        err = self._err
        np.subtract(answer.reshape(-1), self.exact, out=err)  # in float64, cast per buffer
        np.abs(err, out=err)
        self.errors.append(float(err.max()))
        # Within the bound, not "over it": NaN is neither, and must count as wrong.
        np.less_equal(err, self.tol, out=self._within)
        self.wrong += err.size - int(np.count_nonzero(self._within))
        np.divide(err, self.tol, out=err)
        self.excess.append(float(err.max()))
