"""The start line before each timed call (passing_agent.start_line): nobody's timer starts before
every rank is there, every call meets anew, a lost datagram costs a resend rather than the
meeting, and a rank that never comes is an error, not a hang."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from passing_agent import start_line as sl
from passing_agent.start_line import HostsMissing, StartLine


def _lines(n: int, token: int = 7, names: list[str] | None = None) -> list[StartLine]:
    """n ranks on this host, connected."""
    lines = [StartLine(("127.0.0.1", 0)) for _ in range(n)]
    for i, line in enumerate(lines):
        line.connect(i, [x.address for x in lines], token, names)
    return lines


def _run(lines: list[StartLine], calls: int, late: int, arrived: dict, passed: dict) -> None:
    def rank(i: int) -> None:
        for call in range(calls):
            if i == late:
                time.sleep(0.03)  # the same rank the last to arrive at every call
            arrived[i, call] = time.monotonic()
            lines[i].meet(call, 10.0)
            passed[i, call] = time.monotonic()

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(len(lines))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)


def test_no_rank_passes_before_the_last_arrives_in_any_call():
    calls = 5
    lines = _lines(4)
    arrived: dict = {}
    passed: dict = {}
    try:
        _run(lines, calls, late=3, arrived=arrived, passed=passed)
    finally:
        for line in lines:
            line.close()
    assert len(passed) == 4 * calls
    for call in range(calls):
        last = max(arrived[i, call] for i in range(4))
        assert all(passed[i, call] >= last for i in range(4)), call


def test_a_rank_whose_every_copy_from_the_last_arriver_was_lost_still_passes(monkeypatch):
    """The last to arrive sends its copies and leaves at once; when all of them to rank 0 are
    lost, rank 0 asks again and the last arriver's reader answers, although it has left."""
    dropped: list[tuple[int, int]] = []
    real_tell = StartLine._tell

    def lossy_tell(self, kind, call, ranks):
        ranks = list(ranks)
        # What rank 2 sends on arriving (not its reader's answers) never reaches rank 0.
        arriving = threading.current_thread().name != "start-line"
        if self.rank == 2 and arriving and 0 in ranks:
            dropped.append((call, 0))
            ranks.remove(0)
        real_tell(self, kind, call, ranks)

    monkeypatch.setattr(StartLine, "_tell", lossy_tell)
    lines = _lines(3)
    arrived: dict = {}
    passed: dict = {}
    try:
        _run(lines, 3, late=2, arrived=arrived, passed=passed)
    finally:
        for line in lines:
            line.close()
    assert len(passed) == 9
    assert {c for c, _ in dropped} == {0, 1, 2}  # rank 0 never got a copy of rank 2's arrival
    for call in range(3):
        assert passed[0, call] >= arrived[2, call]
        assert passed[2, call] <= passed[0, call]  # rank 2 had left before rank 0 passed


def test_a_rank_that_never_comes_is_an_error_at_the_timeout():
    line = StartLine(("127.0.0.1", 0))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as absent:  # h2 never starts
        absent.bind(("127.0.0.1", 0))
        line.connect(0, [line.address, absent.getsockname()], 7,
                     names=["h1 rank 0", "h2 rank 0"])
        try:
            t0 = time.monotonic()
            with pytest.raises(HostsMissing, match=r"1 of 2 ranks \(h2 rank 0\) did not come "
                                                   r"to call 0 within 0.3 s"):
                line.meet(0, 0.3)
            assert time.monotonic() - t0 < 5.0
        finally:
            line.close()


@pytest.mark.parametrize("forged", ["another run's token", "a short datagram", "its own rank"])
def test_a_datagram_not_of_this_run_lets_nobody_pass(forged):
    """A late datagram of an earlier run (another token), or any other, counts for nobody."""
    line = StartLine(("127.0.0.1", 0))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            line.connect(0, [line.address, s.getsockname()], 7)
            data = {"another run's token": struct.pack(sl._FORMAT, sl._MAGIC, sl._ASK, 1, 0, 8),
                    "a short datagram": struct.pack(sl._FORMAT, sl._MAGIC, sl._ASK, 1, 0, 7)[:-1],
                    "its own rank": struct.pack(sl._FORMAT, sl._MAGIC, sl._ASK, 0, 0, 7)}[forged]
            s.sendto(data, line.address)
            with pytest.raises(HostsMissing):
                line.meet(0, 0.3)
            # The real rank 1's ask, by contrast, does count.
            s.sendto(struct.pack(sl._FORMAT, sl._MAGIC, sl._ASK, 1, 1, 7), line.address)
            line.meet(1, 5.0)
    finally:
        line.close()


def test_a_line_ignores_everything_until_it_is_connected_and_asks_again_then():
    """A rank that meets before another has connected: the other ignored its copies (it knew
    no token yet), and gets its arrival when it meets, by asking."""
    early, late = StartLine(("127.0.0.1", 0)), StartLine(("127.0.0.1", 0))
    addresses = [early.address, late.address]
    try:
        early.connect(0, addresses, 7)
        waiting = threading.Thread(target=early.meet, args=(0, 5.0))
        waiting.start()
        time.sleep(0.05)  # early's copies reached late before it was connected
        assert not late._heard
        late.connect(1, addresses, 7)
        late.meet(0, 5.0)
        waiting.join(5.0)
        assert not waiting.is_alive()
    finally:
        early.close()
        late.close()


def test_two_lines_on_one_host_never_ask_for_the_same_port():
    """Two jobs' ranks on one host: each line listens on a port of its own."""
    lines = [StartLine(("127.0.0.1", 0)) for _ in range(4)]
    try:
        assert len({line.address for line in lines}) == 4
        with pytest.raises(ValueError, match="not this line's address"):
            lines[0].connect(1, [x.address for x in lines], 7)
    finally:
        for line in lines:
            line.close()


def test_a_closed_line_stops_its_reader_and_frees_its_port():
    lines = _lines(2)
    try:
        threads = [threading.Thread(target=line.meet, args=(0, 5.0)) for line in lines]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads)
    finally:
        for line in lines:
            line.close()
    assert not any(line._reader.is_alive() for line in lines)
    again = StartLine(lines[0].address)  # the next command may bind it again
    again.close()


def test_the_last_to_arrive_sends_one_datagram_per_rank_and_asks_no_answer(monkeypatch):
    """The ranks before it have told it they are there, so it only tells them (one copy each
    to a rank on its own host) and none of them answers: the start line's datagrams cross
    the links and switches the timed calls use."""
    # The waiting ranks ask again after 5 ms; on a loaded machine that can fall between this
    # rank's arrival and their hearing of it, and its reader then rightly answers them. A
    # first resend of a second keeps that race out of what this test counts.
    monkeypatch.setattr(sl, "_RESEND_FIRST_S", 1.0)
    lines = _lines(3)  # one host: 127.0.0.1
    try:
        early = [threading.Thread(target=lines[i].meet, args=(0, 5.0)) for i in (0, 1)]
        for t in early:
            t.start()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and len(lines[2]._heard.get(0, ())) < 2:
            time.sleep(0.001)  # until ranks 0 and 1 have told rank 2
        lines[2].meet(0, 5.0)
        for t in early:
            t.join(5.0)
        assert not any(t.is_alive() for t in early)
        assert lines[2].sent == 2
        assert not any(key[0] == 2 for line in lines[:2] for key in line._answered)
    finally:
        for line in lines:
            line.close()
