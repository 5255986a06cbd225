"""Work arrays kept from one all-reduce to the next.

A fresh array of megabytes is mapped anew by the allocator, and its first write takes a page
fault every page or two: on the 2-core VMs `make bench` was measured on, 50-90 us each, so a
4 MiB call's leader spent 15-50 ms of CPU on them before its first packet (the vote, the
blocks) and as much again on its sums, while the other hosts' first packets waited for its
own. A Scratch hands the same memory out again instead.
"""

from __future__ import annotations

import math

import numpy as np

# Arrays larger than this are made afresh for each call and not kept: one huge call must not
# pin its memory for the life of the job.
KEEP_LIMIT = 64 << 20


class Scratch:
    """Named work arrays, each handed out again to the next request of its name that fits.
    What one holds is whatever its last user left: the user writes every element it reads.

    Usage::

        scratch = Scratch()
        blocks = scratch.get("blocks", (nfrag, K), np.float32)   # the same memory next call
    """

    def __init__(self, limit: int = KEEP_LIMIT):
        self.limit = limit
        self._kept: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """A C-contiguous array of `shape` and `dtype`, its contents undefined."""
        dtype = np.dtype(dtype)
        size = math.prod(shape)
        if size * dtype.itemsize > self.limit:
            return np.empty(shape, dtype)
        kept = self._kept.get(name)
        if kept is None or kept.dtype != dtype or kept.size < size:
            kept = self._kept[name] = np.empty(size, dtype)
        return kept[:size].reshape(shape)
