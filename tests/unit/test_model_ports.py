"""The software switch's ports: every frame reaches the pipeline as it was on the wire (a VLAN
tag the kernel stripped put back, a 64 KiB frame whole) and in order, and whatever the
pipeline makes leaves by the right port in order; batched (recvmmsg/sendmmsg) and one system
call per frame alike."""

from __future__ import annotations

import os
import struct
import threading
import time

import pytest

from passing import mmsg
from switch_model.ports import Ports
from testbed.fabric import TestPort as PortEnd
from testbed.fabric import delete_link, make_veth, run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="veth interfaces need root")

BIG_MTU = 60000  # a veth carries it, as it carries TCP's segmentation super-frames


class Echo:
    """A pipeline that keeps what it was given and sends each frame, marked, out of the
    other port (a frame from port 1 also goes out of port 1 again when it asks for it)."""

    def __init__(self):
        self.seen: list[tuple[int, bytes]] = []

    def process(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        self.seen.append((port, frame))
        out = [(3 - port, b"\x02" * 6 + frame[6:])]
        if frame[-1] == 0xEE:
            out.append((port, b"\x02" * 6 + frame[6:-1] + b"\xef"))
        return out


def frame_of(i: int, size: int, vlan: int | None = None, last: int = 0) -> bytes:
    head = b"\x02\x00\x00\x00\x00\x01" + b"\x02\x00\x00\x00\x00\x02"
    if vlan is not None:
        head += struct.pack("!HH", 0x8100, vlan)
    body = struct.pack("!HI", 0x88B5, i)  # an experimental EtherType: nothing answers it
    return head + body + bytes((i + j) & 0xFF for j in range(size - len(head) - len(body) - 1)) \
        + bytes([last])


@pytest.fixture
def links():
    tag = f"pm{os.getpid() % 10000:04d}"
    names = [(f"{tag}s{p}", f"{tag}t{p}") for p in (1, 2)]
    made = []
    try:
        for s, t in names:
            make_veth(s, t)
            made.append(s)
            for ifname in (s, t):
                run(["ip", "link", "set", ifname, "mtu", str(BIG_MTU)])
        yield {1: names[0][0], 2: names[1][0]}, [PortEnd(t) for _, t in names]
    finally:
        for s in made:
            delete_link(s)


@pytest.mark.parametrize("batched", [True, False] if mmsg.available() else [False])
def test_frames_reach_the_pipeline_as_sent_and_leave_in_order(links, batched):
    interfaces, (t1, t2) = links
    ports = Ports(interfaces)
    ports._batched = batched
    pipe, stop = Echo(), threading.Event()
    th = threading.Thread(target=ports.run, args=(pipe, stop), daemon=True)
    th.start()
    try:
        sent = []
        for i in range(300):
            if i % 7 == 3:
                f = frame_of(i, 200, vlan=(i % 4000) + 1)
            elif i % 50 == 10:
                f = frame_of(i, 59000)
            else:
                f = frame_of(i, 1090, last=0xEE if i % 11 == 0 else 0)
            sent.append(f)
            t1.send(f)
            if i % 64 == 0:
                time.sleep(0.01)  # several batches, not one
        # Two frames answer every 11th on port 1 (its extra copy) and every frame on port 2.
        want2 = [b"\x02" * 6 + f[6:] for f in sent]
        got2 = t2.recv(len(want2), timeout=10)
        back = [b"\x02" * 6 + f[6:-1] + b"\xef" for f in sent if f[-1] == 0xEE]
        got1 = t1.recv(len(back), timeout=5)
    finally:
        stop.set()
        th.join(5)
        ports.close()
        t1.close()
        t2.close()
    assert [p for p, _ in pipe.seen] == [1] * len(sent)
    assert [f for _, f in pipe.seen] == sent  # VLAN tags put back, the 59 KB frames whole
    # The test's socket gets tagged frames with their tag stripped, as the switch got them.
    strip = [f[:12] + f[16:] if f[12:14] == b"\x81\x00" else f for f in want2]
    assert got2 == strip
    assert got1 == back
    assert ports.tx_errors == 0 and ports.rx_truncated == 0
