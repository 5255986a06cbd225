"""A hypothesis strategy for one packet's K int32 values at any K: drawn from a seed (K=2048
lists drawn value by value overrun hypothesis's example size), with int32's edge values
(0, +-1, the extremes: where a lane-parallel sum would carry into its neighbour) at a drawn
share of the lanes."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from passing import protocol as P

EDGES = np.array([0, 1, -1, 2**31 - 1, -(2**31)], dtype=np.int64)


def _values(seed: int, edge_share: float) -> list[int]:
    rng = np.random.default_rng(seed)
    vals = rng.integers(-(2**31), 2**31, size=P.K, dtype=np.int64)
    at = rng.random(P.K) < edge_share
    vals[at] = rng.choice(EDGES, size=int(at.sum()))
    return vals.tolist()


def k_values() -> st.SearchStrategy[list[int]]:
    return st.builds(_values, st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.1, 0.5, 1.0]))
