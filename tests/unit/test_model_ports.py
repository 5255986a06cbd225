"""The software switch's ports: every frame reaches the pipeline as it was on the wire (a VLAN
tag the kernel stripped put back, a 64 KiB frame whole) and in order, and whatever the
pipeline makes leaves by the right port in order; batched (recvmmsg/sendmmsg) and one system
call per frame alike."""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from controller import installer
from passing import mmsg
from passing import protocol as P
from passing.pipeline_files import load_p4info
from switch_model.fastpath_tables import MAX_COPIES
from switch_model.p4runtime_server import P4RuntimeService
from switch_model.pipeline import Pipeline
from switch_model.ports import Ports
from switch_model.state import Action
from testbed.entries import contribution, job_entries
from testbed.loopback import InProcessConnection
from testbed.veth_ports import TestPort as PortEnd
from testbed.veth_ports import delete_link, make_veth, run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="veth interfaces need root")

BIG_MTU = 60000  # a veth carries it, as it carries TCP's segmentation super-frames


class Echo:
    """A pipeline that keeps what it was given and sends each frame, marked, out of the
    other port (a frame from port 1 also goes out of port 1 again when it asks for it)."""

    def __init__(self, compiled: bool = False):
        self.seen: list[tuple[int, bytes]] = []
        # The compiled port loop (fastpath*.c) receives and sends; a multicast group wider
        # than it copies makes it hand every frame back to this pipeline's process, between
        # C's receive and send (as any table it cannot take does).
        self.fast = None
        if compiled:
            real = Pipeline.from_p4info(load_p4info())
            assert real.use_compiled()
            real.state.mcast_write("INSERT", 1, [(p, 0) for p in range(MAX_COPIES + 1)])
            self.state, self.fast = real.state, real.fast

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


@contextlib.contextmanager
def _running(interfaces: dict[int, str], pipe, ends, batched: bool = True) -> Iterator[Ports]:
    """The switch's port loop on `interfaces` with `pipe`, in a thread; stopped, and the
    switch's and the test's ends closed, however the test leaves."""
    ports, stop = Ports(interfaces), threading.Event()
    ports._batched = batched
    th = threading.Thread(target=ports.run, args=(pipe, stop), daemon=True)
    th.start()
    try:
        yield ports
    finally:
        stop.set()
        th.join(5)
        ports.close()
        for end in ends:
            end.close()


@pytest.mark.parametrize("loop", ["compiled", "batched", "single"] if mmsg.available()
                         else ["single"])
def test_frames_reach_the_pipeline_as_sent_and_leave_in_order(links, loop):
    interfaces, (t1, t2) = links
    pipe = Echo(compiled=loop == "compiled")
    with _running(interfaces, pipe, (t1, t2), batched=loop != "single") as ports:
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
    assert [p for p, _ in pipe.seen] == [1] * len(sent)
    assert [f for _, f in pipe.seen] == sent  # VLAN tags put back, the 59 KB frames whole
    # The test's socket gets tagged frames with their tag stripped, as the switch got them.
    strip = [f[:12] + f[16:] if f[12:14] == b"\x81\x00" else f for f in want2]
    assert got2 == strip
    assert got1 == back
    assert ports.tx_errors == 0 and ports.rx_truncated == 0


def _switch_with_two_ranks_behind_port_1(compiled: bool) -> Pipeline:
    """A root job of two contributors, both behind port 1, and an L2 entry that sends frames
    for 02:00:00:00:00:01 back out of port 1: every copy leaves by port 1."""
    info = load_p4info()
    pipe = Pipeline.from_p4info(info)
    if compiled:
        assert pipe.use_compiled()
    installer.install(InProcessConnection(P4RuntimeService(pipe, 0, info)),
                      job_entries(0, 1, {1: (0, 2)}, pool_size=8, guard=False))
    pipe.state.insert("l2_forward", (0x020000000001,), Action("l2_to_port", {"port": 1}))
    return pipe


@pytest.mark.skipif(not mmsg.available(), reason="the compiled port loop needs recvmmsg")
def test_the_compiled_port_loop_sends_each_port_s_frames_in_the_python_pipeline_s_order(links):
    """PASSING frames (the compiled path) and other frames (Python) arriving mixed leave by the
    same port in the order a Python-only switch makes them, across batch boundaries."""
    interfaces, (t1, t2) = links
    pipe, twin = _switch_with_two_ranks_behind_port_1(True), \
        _switch_with_two_ranks_behind_port_1(False)
    sent = []
    for i in range(240):
        slot, rnd = i // 6 % 8, i // 48
        kind = i % 6
        if kind in (0, 3):  # rank 0's, then rank 1's contribution completes the slot
            f = contribution(0, 1, [i] * P.K, job_id=1, slot=slot, round=rnd,
                             contributor=kind // 3, frag=i)
        elif kind == 5 and i % 4 == 1:
            f = frame_of(i, 300, vlan=7)  # tagged: the Python pipeline drops it
        else:
            f = frame_of(i, 200 + i)  # to 02:00:00:00:00:01: back out of port 1
        sent.append(f)
    expected = [out for f in sent for port, out in twin.process(1, f) if port == 1]
    with _running(interfaces, pipe, (t1, t2)):
        for i, f in enumerate(sent):
            t1.send(f)
            if i % 37 == 0:
                time.sleep(0.01)  # several batches, of mixed kinds
        got = t1.recv(len(expected), timeout=10)
    assert len(expected) > 200
    assert got == expected
    for name, cells in twin.state.counters.items():
        assert (cells == pipe.state.counters[name]).all(), name
