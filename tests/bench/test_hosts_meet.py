"""The leaders' meeting before each timed PASSING call (bench.agent.hosts_meet): nobody's
timer may start before every host is there, every call meets anew, and a host that never comes
is an error, not a hang."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from bench.agent.hosts_meet import HostsMissing, hosts_meet


def test_no_host_passes_before_the_last_arrives_in_any_call():
    store, hosts, calls = dist.HashStore(), 3, 4
    arrived: dict[tuple[int, int], float] = {}
    passed: dict[tuple[int, int], float] = {}

    def host(index: int) -> None:
        for call in range(calls):
            time.sleep(0.02 * index)  # host 2 the last to arrive at every call
            arrived[index, call] = time.monotonic()
            hosts_meet(store, f"call{call}", hosts, 10.0)
            passed[index, call] = time.monotonic()

    threads = [threading.Thread(target=host, args=(i,)) for i in range(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(passed) == hosts * calls
    for call in range(calls):
        last = max(arrived[i, call] for i in range(hosts))
        assert all(passed[i, call] >= last for i in range(hosts)), call


def test_a_host_that_never_comes_is_an_error_at_the_timeout():
    store = dist.HashStore()
    t0 = time.monotonic()
    with pytest.raises(HostsMissing, match="1 of 2 hosts did not come to call0 within 0.3 s"):
        hosts_meet(store, "call0", 2, 0.3)
    assert time.monotonic() - t0 < 5.0
