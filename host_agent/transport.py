"""UDP transport of a host agent: datagrams to the switch's aggregation address, results on the
job's agent port."""

from __future__ import annotations

import errno
import select
import socket

from passing import protocol as P


class UdpTransport:
    def __init__(self, host_ip: str, agent_port: int, switch_ip: str,
                 switch_port: int = P.PASSING_UDP_PORT):
        self.peer = (switch_ip, switch_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        try:
            self.sock.bind((host_ip, agent_port))
        except OSError as e:
            self.sock.close()
            raise OSError(f"cannot receive on {host_ip}:{agent_port}: {e.strerror}") from None
        self.sock.setblocking(False)
        self.dropped_on_send = 0

    def send(self, payload: bytes) -> None:
        try:
            self.sock.sendto(payload, self.peer)
        except OSError as e:
            # A packet dropped on the way out (full queue, a firewall's drop): lost like on a
            # wire, and the slot's timer resends it. Anything else is a real error.
            if e.errno not in (errno.EPERM, errno.ENOBUFS, errno.EAGAIN):
                raise
            self.dropped_on_send += 1

    def recv(self, timeout: float) -> list[bytes]:
        out = []
        if not select.select([self.sock], [], [], timeout)[0]:
            return out
        while True:
            try:
                out.append(self.sock.recv(65535))
            except BlockingIOError:
                return out

    def close(self) -> None:
        self.sock.close()
