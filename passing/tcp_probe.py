"""Is anything accepting TCP connections at an address? For waiting on a server that is starting.

A connection to a port nobody listens on can succeed with no server at all: when the kernel
picks that very port as the connection's own source (Linux takes source ports from
32768-60999, where the testbed's switches take theirs: testbed.veth_ports.free_tcp_port), the
socket meets itself (TCP simultaneous open). Taken for a server, it also holds the port, so the
real server then fails to bind it (seen once among 36 model switches starting on 52001-52036).
"""

from __future__ import annotations

import socket


def is_self_connected(sock: socket.socket) -> bool:
    """Whether a connected socket's two ends are the same address: it met itself."""
    return sock.getsockname() == sock.getpeername()


def accepts(host: str, port: int, timeout: float | None = None) -> bool:
    """True when a server accepts a TCP connection at host:port now (the connection is closed
    at once); False when none does, or the connection met itself."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            return not is_self_connected(s)
    except OSError:
        return False
