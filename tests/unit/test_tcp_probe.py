"""Waiting for a server to listen (passing.tcp_probe): a real listener is found, a port nobody
listens on is not, and a socket that met itself (what a probe of an unbound port in the
ephemeral range can get) is told apart from a server."""

from __future__ import annotations

import socket

from passing.tcp_probe import accepts, is_self_connected


def test_a_listening_server_is_found_and_a_closed_port_is_not():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert not accepts("127.0.0.1", port, timeout=1.0)  # bound, not listening
        server.listen()
        assert accepts("127.0.0.1", port, timeout=1.0)
        with socket.create_connection(("127.0.0.1", port)) as client:
            assert not is_self_connected(client)


def test_a_socket_that_met_itself_is_no_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        # Connecting to its own address: TCP simultaneous open with itself succeeds on Linux,
        # with no listener anywhere; a probe whose source port happens to be its target's gets
        # exactly this.
        s.connect(s.getsockname())
        assert is_self_connected(s)
