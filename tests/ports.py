"""Free local ports for tests that serve something on loopback."""

from __future__ import annotations

import socket


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 that nothing was bound to a moment ago (TCP by default)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
