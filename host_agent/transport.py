"""UDP transport of a host agent: datagrams to the switch's aggregation address, results on the
job's agent port.

The socket is connected to the switch's address and port, so the kernel delivers only datagrams
that come from there: a result sent by anyone else never reaches the agent (the switch, for its
part, drops anything that is not its own result on the way to an agent port; see
docs/protocol.md, "What PASSING protects against")."""

from __future__ import annotations

import errno
import select
import socket

from passing import protocol as P

# Sending into a full queue or through a firewall's drop loses the packet like a wire would, and
# so does an ICMP error from a switch address that is not up yet: the slot's timer resends it.
_LOST_ON_SEND = (errno.EPERM, errno.ENOBUFS, errno.EAGAIN, errno.ECONNREFUSED)


class UdpTransport:
    def __init__(self, host_ip: str, agent_port: int, switch_ip: str,
                 switch_port: int = P.PASSING_UDP_PORT):
        self.peer = (switch_ip, switch_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        try:
            self.sock.bind((host_ip, agent_port))
            self.sock.connect(self.peer)
        except OSError as e:
            self.sock.close()
            raise OSError(f"cannot receive on {host_ip}:{agent_port} from "
                          f"{switch_ip}:{switch_port}: {e.strerror}") from None
        self.sock.setblocking(False)
        self.dropped_on_send = 0

    def send(self, payload: bytes) -> None:
        try:
            self.sock.send(payload)
        except OSError as e:
            if e.errno not in _LOST_ON_SEND:
                raise
            self.dropped_on_send += 1

    def recv(self, timeout: float) -> list[bytes]:
        out = []
        if not select.select([self.sock], [], [], timeout)[0]:
            return out
        while True:
            try:
                out.append(self.sock.recv(65535))
            except (BlockingIOError, ConnectionRefusedError):
                # ConnectionRefused: an ICMP error for an earlier send, already counted lost.
                return out

    def close(self) -> None:
        self.sock.close()
