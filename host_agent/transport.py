"""UDP transport of a host agent: datagrams to the switch's aggregation address, results on the
job's agent port.

The socket is connected to the switch's address and port, so the kernel delivers only datagrams
that come from there: a result sent by anyone else never reaches the agent (the switch, for its
part, drops anything that is not its own result on the way to an agent port; see
docs/protocol.md, "What PASSING protects against")."""

from __future__ import annotations

import errno
import os
import select
import socket
import warnings

import numpy as np

from passing import mmsg, packet
from passing import protocol as P

# Sending into a full queue or through a firewall's drop loses the packet like a wire would, and
# so does an ICMP error from a switch address that is not up yet: the slot's timer resends it.
_LOST_ON_SEND = (errno.EPERM, errno.ENOBUFS, errno.EAGAIN, errno.ECONNREFUSED)
# UDP segmentation (passing.mmsg.send_rows): up to this many datagrams per message unless told
# otherwise (PASSING_UDP_SEGMENTS, or `segments`); 1 sends one message per datagram. On a real
# NIC the segments leave at line rate whatever their number. On an emulated link (an htb class
# on a veth) a message is dequeued whole, so its datagrams arrive together, up to segments - 1
# frame times earlier than paced ones: segments_for_link keeps that within about a
# millisecond of the link's time, the burst Linux's TCP gives its own segmentation at a rate
# (tcp_tso_autosize), which the TCP baselines on the same links already have.
SEGMENTS_ENV = "PASSING_UDP_SEGMENTS"
DEFAULT_SEGMENTS = 8
MAX_SEGMENTS = 64  # the kernel's UDP_MAX_SEGMENTS
_FRAME_OVERHEAD = 42  # Ethernet, IPv4 and UDP headers around each datagram
# What a kernel that cannot segment on this route answers a segmented message with (before
# about Linux 6.11: a device without checksum offload, as the Mininet hosts' are). One too old
# to know UDP_SEGMENT at all (before 4.18) is found when the socket is made (_can_segment).
_NO_SEGMENTATION = (errno.EINVAL, errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP)


def _can_segment(sock: socket.socket) -> bool:
    """Whether the kernel knows UDP_SEGMENT at all. Before Linux 4.18 it ignores the control
    message instead of refusing it, and a message would leave as one fragmented datagram."""
    try:
        sock.getsockopt(mmsg.SOL_UDP, mmsg.UDP_SEGMENT)
    except OSError:
        return False
    return True


def segments_for_link(mbps: float, payload_bytes: int = P.PAYLOAD_BYTES) -> int:
    """Datagrams per message on a link shaped to `mbps` Mbit/s (0: unshaped): as many frames
    as the link carries in a millisecond, at least 1 (DEFAULT_SEGMENTS unshaped)."""
    if mbps <= 0:
        return DEFAULT_SEGMENTS
    per_ms = mbps * 1e6 / 8 / 1000
    return max(1, min(MAX_SEGMENTS, int(per_ms // (payload_bytes + _FRAME_OVERHEAD))))


def default_segments() -> int:
    """PASSING_UDP_SEGMENTS when set (a whole number from 1 to 64), else DEFAULT_SEGMENTS."""
    raw = os.environ.get(SEGMENTS_ENV, "").strip()
    if not raw:
        return DEFAULT_SEGMENTS
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_SEGMENTS:
        raise ValueError(f"{SEGMENTS_ENV}={raw!r}: datagrams per message, from 1 (one each) "
                         f"to {MAX_SEGMENTS}")
    return n


IP_MTU = 14  # <linux/in.h>: a connected socket's path MTU
# The packet's IPv4 size: what every link to the switch must carry whole.
_PACKET_IP_BYTES = P.IPV4_PACKET_BYTES
# recvmmsg slot: a payload at every K (8,220 bytes at K=2048); a longer datagram comes back
# marked cut (mmsg.Receiver) and is counted as another size.
RECEIVE_SLOT = max(2048, P.PAYLOAD_BYTES)


def _check_path_mtu(sock: socket.socket, switch_ip: str) -> None:
    """Refuse a route whose MTU cannot carry one aggregation packet: the kernel would
    fragment every packet, and a switch drops fragments as malformed, so the job would only
    time out (PASSING_K=2048 needs jumbo frames: docs/protocol.md, "Choosing K")."""
    try:
        mtu = sock.getsockopt(socket.IPPROTO_IP, IP_MTU)
    except OSError:
        return  # not Linux, or no route yet: the switch's counters will say
    if mtu < _PACKET_IP_BYTES:
        sock.close()
        raise OSError(f"the route to {switch_ip} has an MTU of {mtu} bytes, and one aggregation "
                      f"packet is {_PACKET_IP_BYTES} (K={P.K}): set the links' MTU to "
                      f"{P.LINK_MTU} or use a K whose packets fit (PASSING_K)")


class UdpTransport:
    def __init__(self, host_ip: str, agent_port: int, switch_ip: str,
                 switch_port: int = P.PASSING_UDP_PORT, batched: bool = True,
                 segments: int | None = None):
        # Datagrams per message (see SEGMENTS_ENV); 1 after the kernel refused segmentation.
        self.segments = segments if segments is not None else default_segments()
        if not 1 <= self.segments <= MAX_SEGMENTS:
            raise ValueError(f"segments: from 1 to {MAX_SEGMENTS}, not {self.segments}")
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
        _check_path_mtu(self.sock, switch_ip)
        self.sock.setblocking(False)
        self.dropped_on_send = 0
        self._batched = batched and mmsg.available()
        self._receiver = mmsg.Receiver(slot=RECEIVE_SLOT) if self._batched else None
        if self.segments > 1 and not (self._batched and _can_segment(self.sock)):
            self.segments = 1

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
            seg = self.segments
            sent, err = mmsg.send_rows(self.sock, rows[i:], seg)
            i += sent
            if err:
                if seg > 1 and err in _NO_SEGMENTATION:
                    # This kernel or route cannot (before about Linux 6.11, a device without
                    # checksum offload): one datagram per row from now on, said once.
                    self.segments = 1
                    warnings.warn(f"UDP segmentation refused ({errno.errorcode.get(err, err)}): "
                                  "the agent sends one datagram per packet", RuntimeWarning,
                                  stacklevel=2)
                    continue
                if err not in _LOST_ON_SEND:
                    raise OSError(err, f"sendmmsg: {errno.errorcode.get(err, err)}")
                lost = min(mmsg.per_message(seg, rows.shape[1]), len(rows) - i)
                self.dropped_on_send += lost  # this message's datagrams are lost; the rest go
                i += lost

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
