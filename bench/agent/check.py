"""The random-tensor checker of passing-agent: every local rank fills its tensor from
(seed, host, rank), so every host can compute the exact global sum with numpy, and the largest
error a correct strategy may make, and check what came back."""

from __future__ import annotations

import numpy as np

from passing import protocol as P
from passing.contract import JobParams

# float32's unit roundoff: the relative error of one rounding to float32.
_U32 = 2.0 ** -24


def rank_tensor(seed: int, host_index: int, rank: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, host_index, rank]).standard_normal(n).astype(np.float32)


def expected_sum(params: JobParams, seed: int, n: int,
                 strategy: str = "passing") -> tuple[np.ndarray, np.ndarray, int]:
    """(exact float64 sum over every rank of every host, the largest error per element a
    correct `strategy` may make, contributors).

    The bound adds what each stage may lose: float32 sums of partial results (the local reduce
    of `passing`, every step of the baselines), the fixed point of the switch strategies
    (host_agent.fixed_point.error_bound, with one bit of margin because the float32 local sum
    may round across a power of two and so raise a block's exponent), and the final rounding
    of the float64 result to float32. Losing more than that is a wrong sum."""
    from host_agent import fixed_point as fx

    total = np.zeros(n)
    magnitude = np.zeros(n)  # sum of |x| over every rank: bounds any partial sum
    stream_blocks = []  # per stream, per block of K: its largest magnitude
    count = 0
    nfrag = -(-n // P.K)
    for idx, name in enumerate(params.host_names):
        host_sum = np.zeros(n)
        for g in range(params.host(name).local_gpus):
            t = rank_tensor(seed, idx, g, n).astype(np.float64)
            total += t
            magnitude += np.abs(t)
            host_sum += t
            count += 1
            if strategy == "ina":
                stream_blocks.append(_block_peaks(t, nfrag))
        if strategy == "passing":
            stream_blocks.append(_block_peaks(host_sum, nfrag))
    tol = count * _U32 * magnitude + _U32 * np.abs(total)
    if stream_blocks:
        peaks = np.max(stream_blocks, axis=0)
        # One bit of margin doubles the bound (bumping the exp field instead would wrap the
        # largest exponent into POISON, an infinite bound).
        per_block = 2 * fx.error_bound(fx.block_exponents(peaks.reshape(-1, 1)),
                                       len(stream_blocks))
        tol += np.repeat(per_block, P.K)[:n]
    return total, tol, count


def _block_peaks(x: np.ndarray, nfrag: int) -> np.ndarray:
    blocks = np.zeros(nfrag * P.K)
    blocks[:x.size] = np.abs(x)
    return blocks.reshape(nfrag, P.K).max(axis=1)
