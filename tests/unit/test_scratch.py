"""host_agent.scratch: a call's work arrays are the last call's memory again, never too small,
and a huge one is not kept."""

from __future__ import annotations

import numpy as np

from host_agent.scratch import Scratch


def test_the_same_request_gets_the_same_memory_and_a_larger_one_new_memory():
    s = Scratch()
    a = s.get("blocks", (4, 8), np.float32)
    assert a.shape == (4, 8) and a.dtype == np.float32 and a.flags.c_contiguous
    a[:] = 7
    b = s.get("blocks", (4, 8), np.float32)
    assert np.shares_memory(a, b) and np.all(b == 7)
    smaller = s.get("blocks", (2, 8), np.float32)
    assert np.shares_memory(a, smaller) and smaller.shape == (2, 8)
    larger = s.get("blocks", (5, 8), np.float32)
    assert not np.shares_memory(a, larger) and larger.shape == (5, 8)
    other_type = s.get("blocks", (5, 8), np.float64)
    assert other_type.dtype == np.float64 and not np.shares_memory(larger, other_type)
    assert not np.shares_memory(other_type, s.get("sums", (5, 8), np.float64))


def test_an_array_over_the_limit_is_made_afresh_each_time():
    s = Scratch(limit=1024)
    kept = s.get("x", (128,), np.float64)  # 1024 bytes: kept
    assert np.shares_memory(kept, s.get("x", (128,), np.float64))
    big = s.get("x", (129,), np.float64)
    assert big.shape == (129,) and not np.shares_memory(big, s.get("x", (129,), np.float64))
    assert np.shares_memory(kept, s.get("x", (100,), np.float64)), "the kept one stays"
