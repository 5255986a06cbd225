"""Batched UDP I/O: every datagram of a batch arrives whole and in order, datagrams of another
size are told apart (never taken for a payload), and the transport behaves the same batched or
not."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from host_agent.transport import UdpTransport
from passing import mmsg
from passing import protocol as P

pytestmark = pytest.mark.skipif(not mmsg.available(), reason="sendmmsg/recvmmsg: Linux only")


def _pair() -> tuple[socket.socket, socket.socket]:
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # the whole batch waits there
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    a.connect(b.getsockname())
    b.setblocking(False)
    return a, b


def test_a_batch_goes_out_in_one_piece_and_in_order():
    a, b = _pair()
    try:
        rows = np.random.default_rng(1).integers(0, 256, (300, 77), dtype=np.uint8)
        assert mmsg.send_rows(a, rows) == (300, 0)
        rx = mmsg.Receiver(batch=128, slot=128)
        got = []
        deadline = time.monotonic() + 5
        while len(got) < 300 and time.monotonic() < deadline:
            buf, lengths = rx.receive(b)
            assert np.all(lengths == 77)
            got += [bytes(r[:77]) for r in buf]
        assert got == [r.tobytes() for r in rows]
        assert len(rx.receive(b)[1]) == 0  # nothing more, and no blocking
    finally:
        a.close()
        b.close()


def test_a_datagram_longer_than_a_slot_is_marked_not_cut_to_size():
    a, b = _pair()
    try:
        a.send(bytes(100))
        a.send(bytes(40))
        time.sleep(0.05)
        buf, lengths = mmsg.Receiver(batch=8, slot=64).receive(b)
        assert lengths.tolist() == [0xFFFFFFFF, 40]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("batched", [True, False])
def test_the_transport_takes_payloads_and_counts_the_rest(batched):
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.bind(("127.0.0.2", 0))
    agent = UdpTransport("127.0.0.1", 0, *switch.getsockname(), batched=batched)
    me = agent.sock.getsockname()
    try:
        payloads = np.arange(5 * P.PAYLOAD_BYTES, dtype=np.uint32).astype(np.uint8)
        payloads = payloads.reshape(5, P.PAYLOAD_BYTES)
        agent.send_rows(payloads)
        for row in payloads:
            data, addr = switch.recvfrom(4096)
            assert data == row.tobytes() and addr == me
        for row in payloads[:3]:
            switch.sendto(row.tobytes(), me)
        switch.sendto(b"short", me)
        switch.sendto(bytes(P.PAYLOAD_BYTES + 1), me)
        time.sleep(0.05)
        rows, other = agent.recv_rows(1.0)
        assert [r.tobytes() for r in rows] == [r.tobytes() for r in payloads[:3]]
        assert other == 2
    finally:
        switch.close()
        agent.close()
