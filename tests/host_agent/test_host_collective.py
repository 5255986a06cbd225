"""The host collective of a job waiting for switch slots (host_agent.host_collective), alone:
hosts in threads, their leaders' sum a barrier that adds every host's array, as gloo's ring
hands every rank the same sum."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from host_agent.fixed_point import NonFiniteError
from host_agent.host_collective import HostCollective
from host_agent.stream_api import StreamConfig
from tests.host_agent.threads import each_host


class Ring:
    """Every host's array replaced by the sum of all of them, once all have called."""

    def __init__(self, hosts: int):
        self.arrays: list[np.ndarray] = []
        self.barrier = threading.Barrier(hosts, action=self._sum)
        self.lock = threading.Lock()

    def _sum(self) -> None:
        total = np.sum(self.arrays, axis=0)
        for a in self.arrays:
            a[:] = total
        self.arrays.clear()

    def __call__(self, values: np.ndarray) -> None:
        with self.lock:
            self.arrays.append(values)
        self.barrier.wait(10)


class Closed:
    def __init__(self):
        self.closed = False

    def close(self) -> None:
        self.closed = True


def collectives(n: int) -> tuple[list[HostCollective], list[Closed]]:
    ring = Ring(n)
    transports = [Closed() for _ in range(n)]
    cfg = StreamConfig(1, 0, 0, n, 1, local_gpus=2)
    return [HostCollective(cfg, t, ring) for t in transports], transports


def on_every_host(hosts, values) -> list:
    """Each host's answer (or the error it raised) to one call with its `values`."""
    out: list = [None] * len(hosts)

    def run(i: int) -> None:
        try:
            out[i] = hosts[i].allreduce(values[i])
        except NonFiniteError as e:
            out[i] = e
    each_host(run, len(hosts), timeout=20)
    return out


def test_every_host_gets_the_sum_and_every_gpu_counts():
    hosts, _ = collectives(3)
    values = [np.arange(1000, dtype=np.float32) * (i + 1) for i in range(3)]
    out = on_every_host(hosts, values)
    for got in out:
        assert np.array_equal(got, np.arange(1000) * 6.0)
    assert all(h.calls == 1 and h.calls_ready(1000) == 0 for h in hosts)
    assert np.array_equal(hosts[0].counts_from(990), np.full(10, 6))  # 3 hosts x 2 GPUs


def test_nan_on_one_host_raises_on_every_host():
    hosts, _ = collectives(2)
    bad = np.ones(10)
    bad[3] = np.nan
    out = on_every_host(hosts, [bad, np.ones(10)])
    assert all(isinstance(e, NonFiniteError) for e in out), out


def test_the_transport_is_handed_on_open_and_closed_only_by_close():
    [host], [transport] = collectives(1)
    assert host.detach() is transport and not transport.closed
    with pytest.raises(RuntimeError, match="moved onto the switch"):
        host.allreduce(np.ones(3))
    host.close()
    assert transport.closed
