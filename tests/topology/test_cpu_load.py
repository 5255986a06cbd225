"""topologies.cpu_load: the machine's CPUs during a run's timed calls, read from /proc/stat."""

from __future__ import annotations

import os
import threading
import time

import pytest

from topologies.cpu_load import CpuSampler, call_windows, read_ticks


def test_busy_share_is_taken_between_the_samples_around_each_window():
    """Ticks that grow by a known amount per sample: the share is the busy ticks over all
    ticks between the last sample at or before each window's start and the first at or
    after its end, summed over the windows; a window past the samples adds nothing."""
    sampler = CpuSampler()
    # samples at t = 0..9; busy grows 1 per step before t = 5, 3 after; total 4 per step
    sampler._times = [float(t) for t in range(10)]
    busy = [min(t, 5) + 3 * max(t - 5, 0) for t in range(10)]
    sampler._ticks = [(b, 4 * t) for t, b in zip(range(10), busy, strict=True)]
    assert sampler.busy_during([(1.0, 3.0)]) == pytest.approx(2 / 8)
    assert sampler.busy_during([(6.5, 8.5)]) == pytest.approx(9 / 12)  # samples 6 and 9
    assert sampler.busy_during([(1.0, 3.0), (6.5, 8.5)]) == pytest.approx(11 / 20)
    assert sampler.busy_during([(8.5, 12.0)]) is None
    assert sampler.busy_during([]) is None


def test_a_busy_thread_shows_in_the_share():
    """A thread spinning through a window keeps at least one CPU busy: the share over it is
    at least about one CPU's worth (more when the machine has other work)."""
    cpus = os.cpu_count() or 1
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    with CpuSampler(period_s=0.01) as sampler:
        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.05)
        start = time.perf_counter()
        time.sleep(0.5)
        end = time.perf_counter()
        stop.set()
        t.join()
    share = sampler.busy_during([(start, end)])
    assert share is not None and 0.7 / cpus <= share <= 1.0


def test_read_ticks_counts_steal_as_busy_and_idle_and_iowait_as_idle(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  10 1 5 100 4 2 3 7 6 0\ncpu0 ...\n")
    assert read_ticks(str(stat)) == (10 + 1 + 5 + 2 + 3 + 7, 132)


def test_call_windows_span_every_host_and_need_them_all():
    reports = [{"spans": [(1.0, 2.0), (3.0, 4.5)]}, {"spans": [(1.2, 2.4), (2.9, 4.0)]}]
    assert call_windows(reports) == [(1.0, 2.4), (2.9, 4.5)]
    assert call_windows([{"spans": [(1.0, 2.0)]}, {}]) == []
    assert call_windows([]) == []
