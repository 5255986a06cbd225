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

import numpy as np

from passing import mmsg, packet
from passing import protocol as P

# Sending into a full queue or through a firewall's drop loses the packet like a wire would, and
# so does an ICMP error from a switch address that is not up yet: the slot's timer resends it.
_LOST_ON_SEND = (errno.EPERM, errno.ENOBUFS, errno.EAGAIN, errno.ECONNREFUSED)


class UdpTransport:
    def __init__(self, host_ip: str, agent_port: int, switch_ip: str,
                 switch_port: int = P.PASSING_UDP_PORT, batched: bool = True):
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
        self._batched = batched and mmsg.available()
        self._receiver = mmsg.Receiver() if self._batched else None

    def send(self, payload: bytes) -> None:
        try:
            self.sock.send(payload)
        except OSError as e:
            if e.errno not in _LOST_ON_SEND:
                raise
            self.dropped_on_send += 1

    def send_rows(self, rows: np.ndarray) -> None:
        """Each row of an (n, bytes) uint8 array as one datagram, in as few system calls as the
        kernel allows (sendmmsg)."""
        if not self._batched:
            for row in rows:
                self.send(row.tobytes())
            return
        i = 0
        while i < len(rows):
            sent, err = mmsg.send_rows(self.sock, rows[i:])
            i += sent
            if err:
                if err not in _LOST_ON_SEND:
                    raise OSError(err, f"sendmmsg: {errno.errorcode.get(err, err)}")
                self.dropped_on_send += 1  # this datagram is lost; the rest still go
                i += 1

    def recv_rows(self, timeout: float) -> tuple[np.ndarray, int]:
        """Waiting up to `timeout` for the first, the aggregation payloads that have arrived, as
        an (n, PAYLOAD_BYTES) uint8 array, and how many datagrams of any other size came with
        them (dropped here)."""
        if not self._batched:
            return packet.rows_of(self.recv(timeout))
        if not select.select([self.sock], [], [], timeout)[0]:
            return np.zeros((0, P.PAYLOAD_BYTES), dtype=np.uint8), 0
        chunks, other = [], 0
        while True:
            try:
                buf, lengths = self._receiver.receive(self.sock)
            except ConnectionRefusedError:
                break  # an ICMP error for an earlier send, already counted lost
            if not len(lengths):
                break
            ok = lengths == P.PAYLOAD_BYTES
            other += int(len(lengths) - ok.sum())
            chunks.append(buf[ok, :P.PAYLOAD_BYTES].copy())
            if len(lengths) < self._receiver.batch:
                break
        if not chunks:
            return np.zeros((0, P.PAYLOAD_BYTES), dtype=np.uint8), other
        return np.concatenate(chunks) if len(chunks) > 1 else chunks[0], other

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
