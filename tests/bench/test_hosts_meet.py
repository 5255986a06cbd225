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


class _SlowToLeave:
    """A store whose non-serving hosts take 50 ms to report that they passed (their `left`
    add), as a host far across the fabric would."""

    def __init__(self, store):
        self.store = store
        self.reported: list[float] = []

    def add(self, key: str, n: int) -> int:
        if key.endswith("/left") and n:
            time.sleep(0.05)
            value = self.store.add(key, n)
            self.reported.append(time.monotonic())
            return value
        return self.store.add(key, n)

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def wait(self, keys, timeout) -> None:
        self.store.wait(keys, timeout)


def test_the_host_serving_the_store_passes_only_after_every_other_host():
    """Its first window would go out on the link that carries the store's answers to the
    others: it must not start before they have theirs."""
    store, hosts, calls = _SlowToLeave(dist.HashStore()), 3, 3
    served_at: list[float] = []

    def host(index: int) -> None:
        for call in range(calls):
            hosts_meet(store, f"call{call}", hosts, 10.0, serving=index == 0)
            if index == 0:
                served_at.append(time.monotonic())

    threads = [threading.Thread(target=host, args=(i,)) for i in range(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(served_at) == calls and len(store.reported) == (hosts - 1) * calls
    for call in range(calls):
        others = store.reported[(hosts - 1) * call:(hosts - 1) * (call + 1)]
        assert served_at[call] >= max(others), call
