"""How busy this machine's CPUs were during a run's timed calls.

The analytical model's host bound counts the agents' and switches' packets at rates measured
alone; it leaves out the kernel, which on a Mininet fabric carries every frame through veth
pairs and htb shaping (at 100 Mbit/s, half of the machine's CPU time during a PASSING call is
the kernel's). How busy the busiest host link was says when a run was far from its links;
how busy the CPUs were says when a run that looks link-bound had no CPU to spare.

Mininet's hosts share the machine's clock and its /proc/stat, so the calls' spans (each
rank's perf_counter at the start and the end of each timed call) can be laid over samples
taken here.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable

# Fields of /proc/stat's "cpu" line that are time the CPUs had nothing to run.
_IDLE_FIELDS = (3, 4)  # idle, iowait
# A sample every this many seconds: the kernel counts in ticks of 10 ms per CPU anyway.
PERIOD_S = 0.02
# At or above this share of the CPUs busy during the calls, a run had no CPU to spare:
# whatever its links' load, this machine may have set its time.
SATURATED_FROM = 0.9


def read_ticks(path: str = "/proc/stat") -> tuple[int, int]:
    """(busy, total) ticks of all CPUs since boot. Steal counts as busy: a CPU the hypervisor
    took was not this machine's to use."""
    with open(path) as f:
        fields = [int(v) for v in f.readline().split()[1:9]]  # to steal; guests are in user
    idle = sum(fields[i] for i in _IDLE_FIELDS)
    total = sum(fields)
    return total - idle, total


class CpuSampler:
    """/proc/stat sampled in a thread while a run goes on.

    Usage::

        with CpuSampler() as cpu:
            res = pnet.allreduce(...)
        share = cpu.busy_during(call_windows(res.values()))   # None: too few samples
    """

    def __init__(self, period_s: float = PERIOD_S, read=read_ticks):
        self.period_s = period_s
        self._read = read
        self._times: list[float] = []
        self._ticks: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def _sample(self) -> None:
        try:
            ticks = self._read()
        except (OSError, ValueError):
            return  # no /proc/stat: nothing to say
        self._times.append(time.perf_counter())
        self._ticks.append(ticks)

    def busy_during(self, windows: Iterable[tuple[float, float]]) -> float | None:
        """The share of the CPUs busy over `windows` (perf_counter start, end), each widened
        to the samples around it; None when no window lies within the samples."""
        busy = total = 0
        for start, end in windows:
            i = bisect.bisect_right(self._times, start) - 1
            j = bisect.bisect_left(self._times, end)
            if i < 0 or j >= len(self._times) or j <= i:
                continue
            busy += self._ticks[j][0] - self._ticks[i][0]
            total += self._ticks[j][1] - self._ticks[i][1]
        return busy / total if total > 0 else None


def call_windows(reports: Iterable[dict]) -> list[tuple[float, float]]:
    """Each timed call's window over every host: from the first host's start to the last
    host's end (the hosts' reports' `spans`, in the same order on every host)."""
    spans = [r.get("spans") or [] for r in reports]
    if not spans or not all(spans):
        return []
    return [(min(s[k][0] for s in spans), max(s[k][1] for s in spans))
            for k in range(min(len(s) for s in spans))]
