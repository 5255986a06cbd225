"""The staleness bound on every target (docs/protocol.md, "Rounds, quorum and late
contributions"): real agents (host_agent.stream) on the switch's test ports, one of three hosts
late for every call. Calls may close with a quorum without it, but never `staleness` calls in a
row: the call after waits for everyone, which the switch honours by closing no round whose
packets do not ask for it. Every host gets the same sums, and every sum is exact."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from host_agent.stream import SlotStreamer, StreamConfig
from passing import protocol as P
from testbed.entries import SESSION, PortTransport, install_job

DEV, JOB = 0, 12
CALLS = 8
N = 2 * P.K + 50  # three fragments: rounds of one call close apart


def tensor(call: int, host: int) -> np.ndarray:
    """Integer values, summed exactly by the fixed point: a missing or extra host shows."""
    return np.random.default_rng(100 * call + host).integers(-999, 999, N).astype(np.float64)


@pytest.mark.parametrize("staleness", [1, 2])
def test_a_late_host_is_left_out_at_most_staleness_calls_in_a_row(star, staleness):
    sw = star["s1"]
    install_job(sw.conn, DEV, job_id=JOB, members={1: 0, 2: 1, 3: 2}, pool_size=4, quorum=2)
    agents = [SlotStreamer(StreamConfig(JOB, p - 1, 4, 3, SESSION, rto=0.05, deadline=10,
                                        patience=0.05, staleness=staleness),
                           PortTransport(sw.test_ports[p], DEV, p)) for p in (1, 2, 3)]
    got: list[list[tuple[np.ndarray, np.ndarray]]] = [[], [], []]
    errors: list[str] = []

    def host(i: int) -> None:
        try:
            for c in range(CALLS):
                if i == 2:
                    time.sleep(0.4)  # the straggler: late for every call
                sums = agents[i].allreduce(tensor(c, i))
                got[i].append((sums, agents[i].last_counts.copy()))
        except Exception as e:  # reported below
            errors.append(f"host {i + 1}: {e!r}")

    threads = [threading.Thread(target=host, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for a in agents:
        a.close()
    assert errors == []
    short_streak, shorts = 0, 0
    for c in range(CALLS):
        sums, counts = got[0][c]
        for i in (1, 2):  # every host took the same sums, the late one included
            assert np.array_equal(got[i][c][0], sums) and np.array_equal(got[i][c][1], counts)
        x = [tensor(c, h) for h in range(3)]
        full = counts == 3
        assert np.array_equal(sums[full], (x[0] + x[1] + x[2])[full]), f"call {c}"
        # A round closed without someone holds exactly two hosts' values.
        pairs = [x[0] + x[1], x[0] + x[2], x[1] + x[2]]
        assert np.all(counts[~full] == 2)
        assert all(any(np.array_equal(sums[k], p[k]) for p in pairs)
                   for k in np.flatnonzero(~full)), f"call {c}"
        short = bool(np.any(~full))
        shorts += short
        short_streak = short_streak + 1 if short else 0
        assert short_streak <= staleness, f"call {c}: {short_streak} short calls in a row"
    assert shorts >= 2, "the late host was never left out: the bound was not exercised"
