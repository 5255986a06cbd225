"""Waiting for a rendezvous server to listen before a TCPStore client connects to it.

A torch TCPStore client whose first connect is refused retries only about half a second later,
and later still after that (measured with torch 2.13: 0.49 s when the server came up 50 ms
late, 0.75 s at 200 ms). The hosts of a run start at nearly the same moment, so the first host
is often a few milliseconds late: every `make bench` run paid that half second, about 40 s of
a sweep. Polling with plain connects every few milliseconds costs nothing in comparison.
"""

from __future__ import annotations

import time

from passing.tcp_probe import accepts

POLL_S = 0.005


def wait_for_listener(host: str, port: int, timeout: float) -> bool:
    """True as soon as something accepts TCP connections at host:port; False once `timeout`
    seconds have passed without (the caller says what did not come:
    host_agent.session.reach_rendezvous)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if accepts(host, port, timeout=min(left, 1.0)):
            return True
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
