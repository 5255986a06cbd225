"""Batched UDP I/O: every datagram of a batch arrives whole and in order, datagrams of another
size are told apart (never taken for a payload), and the transport behaves the same batched or
not."""

from __future__ import annotations

import errno
import socket
import time

import numpy as np
import pytest

from host_agent import transport
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
            data, addr = switch.recvfrom(65535)
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


def _drain(rx: mmsg.Receiver, sock: socket.socket, n: int, size: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(got) < n and time.monotonic() < deadline:
        buf, lengths = rx.receive(sock)
        assert np.all(lengths == size), lengths  # never a super-datagram, never a cut one
        got += [bytes(r[:size]) for r in buf]
    return got


@pytest.mark.parametrize("segments", [2, 8, 11, 64])
@pytest.mark.parametrize("n", [1, 7, 300])
def test_segmented_messages_arrive_as_the_same_datagrams_in_order(segments, n):
    """UDP segmentation changes how rows reach the kernel, not what the receiver sees: one
    datagram per row, in order, a short last message included."""
    _send_and_take(np.random.default_rng(n).integers(0, 256, (n, 1316), dtype=np.uint8),
                   segments)


def _send_and_take(rows: np.ndarray, segments: int) -> None:
    """`rows` sent `segments` per message arrive as one datagram each, in order, and nothing
    else does."""
    a, b = _pair()
    try:
        assert mmsg.send_rows(a, rows, segments) == (len(rows), 0)
        rx = mmsg.Receiver(batch=256, slot=transport.RECEIVE_SLOT)
        assert _drain(rx, b, len(rows), rows.shape[1]) == [r.tobytes() for r in rows]
        assert len(rx.receive(b)[1]) == 0
    finally:
        a.close()
        b.close()


def test_a_socket_that_cannot_segment_sends_every_row_one_by_one():
    """Where the kernel refuses segmentation (here: a socket without UDP checksums, which
    segmentation needs), the transport falls back to one datagram per row for good, and
    loses nothing."""
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    switch.bind(("127.0.0.2", 0))
    switch.setblocking(False)
    agent = UdpTransport("127.0.0.1", 0, *switch.getsockname(), segments=8)
    agent.sock.setsockopt(socket.SOL_SOCKET, 11, 1)  # SO_NO_CHECK
    try:
        payloads = np.random.default_rng(3).integers(0, 256, (50, P.PAYLOAD_BYTES),
                                                     dtype=np.uint8)
        with pytest.warns(RuntimeWarning, match="UDP segmentation refused"):
            agent.send_rows(payloads[:20])
        assert agent.segments == 1 and agent.dropped_on_send == 0
        agent.send_rows(payloads[20:])
        rx = mmsg.Receiver(batch=64, slot=transport.RECEIVE_SLOT)
        got = _drain(rx, switch, 50, P.PAYLOAD_BYTES)
        assert got == [r.tobytes() for r in payloads]
    finally:
        switch.close()
        agent.close()


def test_a_segmented_message_lost_on_send_counts_every_row_in_it(monkeypatch):
    """A full queue refuses a whole message: each of its rows is counted lost (the window's
    timers resend them), and the rows after it still go."""
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.bind(("127.0.0.2", 0))
    agent = UdpTransport("127.0.0.1", 0, *switch.getsockname(), segments=4)
    calls = []
    real = mmsg.send_rows

    def refuse_the_second_message(sock, rows, segments=1):
        calls.append((len(rows), segments))
        if len(calls) == 1:
            sent, err = real(sock, rows[:4], segments)
            return sent, errno.ENOBUFS
        return real(sock, rows, segments)
    monkeypatch.setattr(mmsg, "send_rows", refuse_the_second_message)
    try:
        rows = np.random.default_rng(4).integers(0, 256, (10, P.PAYLOAD_BYTES), dtype=np.uint8)
        agent.send_rows(rows)
        assert calls == [(10, 4), (2, 4)] and agent.dropped_on_send == 4
        got = [switch.recv(65535) for _ in range(6)]
        assert got == [r.tobytes() for r in (*rows[:4], *rows[8:])]
    finally:
        switch.close()
        agent.close()


def test_messages_hold_about_a_millisecond_of_a_shaped_link(monkeypatch):
    """A message's datagrams leave an emulated link together: about a millisecond's worth of
    its frames (1,350 bytes each at K=320), one at a time where a millisecond holds fewer than
    two, the default unshaped, and never more than the kernel takes."""
    frame = P.PAYLOAD_BYTES + 42
    for mbps in (2, 10, 20, 50, 80, 100, 1000, 100_000):
        n = transport.segments_for_link(mbps)
        assert 1 <= n <= transport.MAX_SEGMENTS
        assert n == transport.MAX_SEGMENTS or n == 1 or \
            n * frame <= mbps * 125 < (n + 1) * frame, (mbps, n)
    assert [transport.segments_for_link(b) for b in (20, 80, 100)] == \
        [1, 10_000 // frame, 12_500 // frame]
    assert transport.segments_for_link(0) == transport.DEFAULT_SEGMENTS
    monkeypatch.setenv(transport.SEGMENTS_ENV, "3")
    assert transport.default_segments() == 3
    for bad in ("0", "65", "x", "2.5"):
        monkeypatch.setenv(transport.SEGMENTS_ENV, bad)
        with pytest.raises(ValueError, match="datagrams per message"):
            UdpTransport("127.0.0.1", 0, "127.0.0.2", 9)


def test_a_message_never_holds_more_than_one_udp_datagram_can():
    """64 rows of a full-size packet (1,308 bytes at K=320) are 83 KB, more than a UDP datagram
    holds: a message takes 50 of them, and a refused one counts those 50 lost."""
    assert mmsg.per_message(64, P.PAYLOAD_BYTES) == 65507 // P.PAYLOAD_BYTES == \
        {320: 50, 2048: 7}.get(P.K, 65507 // P.PAYLOAD_BYTES)
    assert mmsg.per_message(64, 100) == 64 and mmsg.per_message(8, 70000) == 1
    assert mmsg.per_message(100, 10) == 64 and mmsg.per_message(8, 0) == 1
    _send_and_take(np.random.default_rng(5).integers(0, 256, (256, P.PAYLOAD_BYTES),
                                                     dtype=np.uint8), 64)


def test_a_kernel_that_does_not_know_segmentation_is_never_asked(monkeypatch):
    """Before Linux 4.18 the kernel ignores UDP_SEGMENT and would send a whole message as one
    fragmented datagram, which no switch aggregates: such a socket sends one datagram per
    row from the start."""
    monkeypatch.setattr(transport, "_can_segment", lambda sock: False)
    agent = UdpTransport("127.0.0.1", 0, "127.0.0.2", 9, segments=8)
    try:
        assert agent.segments == 1
    finally:
        agent.close()
    monkeypatch.undo()
    agent = UdpTransport("127.0.0.1", 0, "127.0.0.2", 9, segments=8)
    try:
        assert agent.segments == 8  # this kernel knows it
    finally:
        agent.close()
