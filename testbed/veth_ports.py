"""Veth pairs and the test's end of a switch port: a raw AF_PACKET socket on the far end of a
switch's veth pair, which sends frames into the switch and receives what it sends out."""

from __future__ import annotations

import random
import select
import socket
import subprocess
import time

from passing import protocol as P

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4

# Below Linux's ephemeral range (32768-60999): a port picked there can be taken by any client
# connection's local end between the pick and the switch's bind, which made a switch's P4Runtime
# server fail to come up once in a few hundred starts.
_PORT_RANGE = (20000, 32000)


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, outside the ephemeral range."""
    for _ in range(1000):
        port = random.randrange(*_PORT_RANGE)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {_PORT_RANGE}")


def run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_veth(a: str, b: str) -> None:
    run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
    for ifname in (a, b):
        # No IPv6 autoconfiguration chatter on test links.
        with open(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6", "w") as f:
            f.write("1")
        # Jumbo frames where K's packet needs them (passing.protocol.LINK_MTU).
        run(["ip", "link", "set", ifname, "mtu", str(P.LINK_MTU), "up"])
        # With segmentation offloads on (a veth's default) libpcap sizes BMv2's capture ring
        # for 64 KiB frames: it holds about 32 per port, and a burst beyond that is lost before
        # the pipeline sees it (as in Mininet: topologies.mininet_nodes, _no_offload).
        run(["ethtool", "-K", ifname, "tso", "off", "gso", "off", "gro", "off"])


def delete_link(ifname: str) -> None:
    subprocess.run(["ip", "link", "del", ifname], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


class TestPort:
    """The test's end of one switch port."""

    def __init__(self, ifname: str):
        self.ifname = ifname
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((ifname, 0))
        self.sock.setblocking(False)

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def drain(self) -> None:
        while self.recv_nowait() is not None:
            pass

    def recv_nowait(self) -> bytes | None:
        while True:
            try:
                data, addr = self.sock.recvfrom(65535)
            except BlockingIOError:
                return None
            if addr[2] != PACKET_OUTGOING:
                return data

    def recv(self, count: int, timeout: float = 2.0) -> list[bytes]:
        """Up to `count` frames that arrive within `timeout`."""
        out: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            frame = self.recv_nowait()
            if frame is not None:
                out.append(frame)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                break
            select.select([self.sock], [], [], left)
        return out

    def close(self) -> None:
        self.sock.close()
