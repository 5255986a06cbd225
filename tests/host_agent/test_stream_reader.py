"""The streamer's reading (host_agent.stream_reader) and the results it keeps early
(host_agent.stream_early, through host_agent.stream_intake): between calls the reader thread
keeps this session's results of rounds not sent yet and drops anything else; during a call it
never touches the socket; a kept result stands in for the packet a slot would send."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from host_agent import stream_early
from host_agent.stream_api import StreamConfig, StreamStats
from host_agent.stream_call import TAG_LAST, Call
from host_agent.stream_early import EarlyResults
from host_agent.stream_intake import Intake, records
from host_agent.stream_reader import Reader
from host_agent.stream_timers import LinkTimers
from passing import packet
from passing import protocol as P

CFG = StreamConfig(job_id=7, contributor=0, window=8, streams=2, session=0xABC, pool=3)
RESULT = int(P.Flag.RESULT) | int(P.Flag.POOL)  # pool 3: odd, the POOL bit


def result(**fields) -> bytes:
    """One result datagram of CFG's session (fields override)."""
    rec = np.zeros(1, dtype=packet.PAYLOAD_DTYPE)
    for name, value in {"job_id": 7, "flags": RESULT, "session": 0xABC, **fields}.items():
        rec[name] = value
    return packet.payload_rows(rec).tobytes()


class Queued:
    """A transport whose receives take what the test put in, `recv` only."""

    def __init__(self):
        self.q: queue.Queue[bytes] = queue.Queue()
        self.closed = False

    def send(self, payload: bytes) -> None:
        pass

    def recv(self, timeout: float) -> list[bytes]:
        if self.closed:
            raise OSError("closed")
        try:
            out = [self.q.get(timeout=timeout)]
        except queue.Empty:
            return []
        while not self.q.empty():
            out.append(self.q.get_nowait())
        return out


class Counting(Queued):
    """Counts its receives."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def recv(self, timeout: float) -> list[bytes]:
        self.calls += 1
        return super().recv(timeout)


def parts(rounds: np.ndarray | None = None) -> tuple[EarlyResults, Intake, StreamStats]:
    rounds = np.zeros(CFG.window, dtype=np.uint32) if rounds is None else rounds
    early = EarlyResults(rounds, CFG.window)
    stats = StreamStats()
    intake = Intake(CFG, rounds, early, LinkTimers(0.02, 0.005, 1.0, 0.0), None, stats)
    return early, intake, stats


def wait_for(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)
    return cond()


def test_between_calls_results_of_rounds_not_sent_are_kept_and_foreign_ones_dropped():
    rounds = np.array([3, 3, 3, 3, 3, 3, 3, 3], dtype=np.uint32)
    early, intake, stats = parts(rounds)
    datagrams = [
        result(slot=1, round=3),                   # the slot's next round: kept
        result(slot=2, round=5),                   # a later one: kept
        result(slot=2, round=2),                   # a round already done: stale
        result(slot=4, round=3, session=0xABD),    # another session's
        result(slot=4, round=3, job_id=8),         # another job's
        result(slot=4, round=3, flags=int(P.Flag.RESULT)),  # the other pool's
        result(slot=9, round=0),                   # beyond the window
        b"short",                                  # not a PASSING payload
    ]
    rows, other = packet.rows_of(datagrams)
    intake.keep_idle(rows, other)
    assert sorted(early.kept) == [(1, 3), (2, 5)]
    assert stats.ignored == 6


def test_during_a_call_the_round_a_slot_waits_on_is_not_kept_the_next_is():
    early, intake, stats = parts()
    call = Call(np.zeros((8, P.K)), np.zeros(8, dtype=np.uint8), 8, 2, 0,
                predicted=np.zeros(8, dtype=np.uint8))
    call.pending[1] = True
    rows, _ = packet.rows_of([result(slot=1, round=0), result(slot=1, round=1),
                              result(slot=2, round=0)])
    recs, slot = records(rows)
    assert early.keep(recs, slot, np.ones(3, dtype=bool), call) == 2
    assert sorted(early.kept) == [(1, 1), (2, 0)]


def test_no_more_is_kept_once_the_store_is_full(monkeypatch):
    monkeypatch.setattr(stream_early, "EARLY_MAX", 2)
    early, intake, stats = parts()
    rows, _ = packet.rows_of([result(slot=s, round=1) for s in range(2)])
    intake.keep_idle(rows, 0)
    rows, _ = packet.rows_of([result(slot=3, round=1)])
    intake.keep_idle(rows, 0)
    assert sorted(early.kept) == [(0, 1), (1, 1)] and stats.ignored == 1


def test_a_kept_result_stands_in_for_the_slots_packet_only_if_it_is_that_packets():
    early, _, _ = parts(np.array([0, 4, 4, 0, 0, 0, 0, 0], dtype=np.uint32))
    call = Call(np.zeros((8, P.K)), np.zeros(8, dtype=np.uint8), 8, 2, 9,
                predicted=np.zeros(8, dtype=np.uint8))
    for s, tag in ((1, 9 | TAG_LAST), (2, 10)):  # slot 2's is another call's
        rec = np.zeros(1, dtype=packet.PAYLOAD_DTYPE)[0]
        rec["slot"], rec["round"], rec["frag"], rec["tag"] = s, 4, s, tag
        early.kept[s, 4] = rec
    assert early.pop_hits(call, np.array([0])) is None
    taken, recs = early.pop_hits(call, np.array([0, 1, 2]))
    assert taken.tolist() == [1] and recs["frag"].tolist() == [1]
    assert early.kept == {}  # the mismatch is dropped: that round is this host's to send


def test_the_reader_reads_between_calls_only():
    early, intake, stats = parts()
    transport = Queued()
    reader = Reader(transport, "passing-drain-test", intake.keep_idle)
    assert not reader.draining
    reader.drain(True)
    try:
        transport.q.put(result(slot=0, round=0))
        transport.q.put(result(slot=0, round=0, session=1))
        assert wait_for(lambda: len(early.kept) == 1 and stats.ignored == 1)
        with reader.holding():  # a call: the socket is the call's
            transport.q.put(result(slot=1, round=0))
            time.sleep(0.2)
            assert (1, 0) not in early.kept
            rows, other = reader.receive(1.0)
            assert len(rows) == 1 and other == 0
        transport.q.put(result(slot=2, round=0))
        assert wait_for(lambda: (2, 0) in early.kept)
    finally:
        reader.stop()
    assert not [t for t in threading.enumerate() if t.name == "passing-drain-test"]


def test_the_reader_stops_and_starts_with_the_policy_and_not_after_stop():
    _, intake, _ = parts()
    reader = Reader(Queued(), "passing-drain-policy", intake.keep_idle)

    def threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "passing-drain-policy"]

    reader.drain(True)
    [first] = threads()
    reader.drain(True)
    assert threads() == [first]
    reader.drain(False)
    assert not first.is_alive() and not reader.draining
    reader.drain(True)
    assert len(threads()) == 1
    reader.stop()
    assert threads() == []
    reader.drain(True)  # stopped for good, whatever the policy says after
    reader.drain(False)
    reader.drain(True)
    assert threads() == [] and not reader.draining


def test_a_reader_waiting_for_the_socket_reads_nothing_once_a_call_or_stop_came_first():
    """The thread passed its idle check and waits for the socket while a call takes it (or the
    streamer is stopped, its transport handed to another pool's): once it gets the socket it
    must look again, not read a datagram of the call or of the transport's new owner."""
    for stopping in (False, True):
        transport = Counting()
        reader = Reader(transport, "passing-drain-race", lambda rows, other: None)
        reader.drain(True)
        try:
            assert wait_for(lambda transport=transport: transport.calls > 0)
            with reader._io:  # the thread, idle, now waits for the socket
                time.sleep(0.2)
                before = transport.calls
                if stopping:
                    reader._stop.set()
                else:
                    reader._idle.clear()  # a call began
            time.sleep(0.3)
            assert transport.calls == before
            if not stopping:
                reader._idle.set()  # the call ended: the thread reads again
                assert wait_for(lambda t=transport, n=before: t.calls > n)
        finally:
            reader.stop()


def test_a_closed_transport_ends_the_reader():
    _, intake, _ = parts()
    transport = Queued()
    reader = Reader(transport, "passing-drain-closed", intake.keep_idle)
    reader.drain(True)
    transport.closed = True
    assert wait_for(lambda: not any(t.name == "passing-drain-closed"
                                    for t in threading.enumerate()))
    reader.stop()


def test_receive_takes_batches_where_the_transport_offers_them():
    class Batched(Queued):
        def recv_rows(self, timeout: float) -> tuple[np.ndarray, int]:
            return np.zeros((2, P.PAYLOAD_BYTES), dtype=np.uint8), 5

    rows, other = Reader(Batched(), "x", lambda rows, other: None).receive(0.0)
    assert rows.shape == (2, P.PAYLOAD_BYTES) and other == 5
    plain = Queued()
    plain.q.put(result(slot=0))
    plain.q.put(b"odd")
    rows, other = Reader(plain, "x", lambda rows, other: None).receive(0.5)
    assert rows.shape == (1, P.PAYLOAD_BYTES) and other == 1
