"""Raw-socket ports: frames in from each interface, through the pipeline, out of the egress
interfaces. One thread, epoll over all ports, draining each ready socket in a batch."""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading

from switch_model.pipeline import Pipeline

log = logging.getLogger("switch_model.ports")
ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_AUXDATA = 8
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
BATCH = 64
# struct tpacket_auxdata: the kernel strips a VLAN tag off the frame into here (BMv2's libpcap
# puts it back; so must the model, or a tagged frame would look untagged to its pipeline).
_AUXDATA = struct.Struct("=IIIHHHH")
_AUX_SPACE = socket.CMSG_SPACE(_AUXDATA.size)
TP_STATUS_VLAN_VALID = 0x10
TP_STATUS_VLAN_TPID_VALID = 0x40


def with_vlan_tag(frame: bytes, ancillary: list[tuple[int, int, bytes]]) -> bytes:
    """The frame as it was on the wire: its VLAN tag, if the kernel stripped one, put back."""
    for level, kind, data in ancillary:
        if level == SOL_PACKET and kind == PACKET_AUXDATA and len(data) >= _AUXDATA.size:
            status, _, _, _, _, tci, tpid = _AUXDATA.unpack_from(data)
            if status & TP_STATUS_VLAN_VALID:
                tpid = tpid if status & TP_STATUS_VLAN_TPID_VALID else 0x8100
                return frame[:12] + struct.pack("!HH", tpid, tci) + frame[12:]
    return frame


class Ports:
    def __init__(self, interfaces: dict[int, str]):
        self.socks: dict[int, socket.socket] = {}
        self.filter_outgoing = False
        try:
            for port, ifname in interfaces.items():
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                try:
                    # The switch's own transmissions must not come back in as input.
                    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
                except OSError:
                    self.filter_outgoing = True
                s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
                s.bind((ifname, 0))
                s.setblocking(False)
                self.socks[port] = s
        except OSError:
            self.close()
            raise
        self.tx_errors = 0

    def send(self, port: int, frame: bytes) -> None:
        sock = self.socks.get(port)
        if sock is None:
            return  # no such port: dropped, as BMv2 drops packets to absent ports
        try:
            sock.send(frame)
        except OSError:
            self.tx_errors += 1

    def run(self, pipeline: Pipeline, stop: threading.Event) -> None:
        ep = select.epoll()
        by_fd = {s.fileno(): (port, s) for port, s in self.socks.items()}
        for fd in by_fd:
            ep.register(fd, select.EPOLLIN)
        process, send = pipeline.process, self.send
        try:
            while not stop.is_set():
                for fd, _ in ep.poll(0.2):
                    port, sock = by_fd[fd]
                    for _ in range(BATCH):
                        try:
                            frame, anc, _, addr = sock.recvmsg(65535, _AUX_SPACE)
                        except BlockingIOError:
                            break
                        if self.filter_outgoing and addr[2] == PACKET_OUTGOING:
                            continue
                        if anc:
                            frame = with_vlan_tag(frame, anc)
                        for egress, out in process(port, frame):
                            send(egress, out)
        finally:
            ep.close()

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        self.socks.clear()
