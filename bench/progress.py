"""The progress line of a long benchmark: `[run i/N, 3m05s, ~12m left]` before each result."""

from __future__ import annotations

import time


class Progress:
    """`[run i/N, 3m05s, ~12m left]` before each result line: the estimate is the mean time
    of the runs so far times the runs left (runs differ in length: it is a guide)."""

    def __init__(self, total: int, clock=time.monotonic):
        self.total, self.done, self.clock = total, 0, clock
        self.start = clock()

    def step(self) -> str:
        self.done += 1
        elapsed = self.clock() - self.start
        left = elapsed / self.done * (self.total - self.done)
        return f"[run {self.done}/{self.total}, {_mmss(elapsed)}, ~{_mmss(left)} left]"


def _mmss(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s"
