"""A streamer's packets out (host_agent.stream_sender), read back off a recording transport: each
slot's next packet carries its round, version, fragment, tag and CLOSE as the protocol says,
resends carry RETRANS (and CLOSE once asked), and every transmission is numbered in order."""

from __future__ import annotations

import numpy as np
import pytest

from host_agent.stream_api import StreamConfig, StreamStats
from host_agent.stream_call import TAG_LAST, Call
from host_agent.stream_sender import Sender
from passing import packet
from passing import protocol as P

CFG = StreamConfig(job_id=3, contributor=1, window=4, streams=2, session=0x55, local_gpus=2,
                   pool=5)


class Recorder:
    def __init__(self, batches: bool):
        self.sent: list[bytes] = []
        if batches:
            self.send_rows = lambda rows: self.sent.extend(bytes(r) for r in rows)

    def send(self, payload: bytes) -> None:
        self.sent.append(payload)

    def records(self) -> np.ndarray:
        return np.frombuffer(b"".join(self.sent), dtype=packet.PAYLOAD_DTYPE)


def setup(batches: bool = True, nfrag: int = 8) -> tuple[Sender, Call, Recorder, np.ndarray]:
    rounds = np.array([7, 8, 0xFFFFFFFF, 0], dtype=np.uint32)
    transport = Recorder(batches)
    sender = Sender(CFG, transport, rounds, None, StreamStats())
    blocks = np.ones((nfrag, P.K))
    call = Call(blocks, np.full(nfrag, 130, dtype=np.uint8), CFG.window, CFG.streams, 9,
                predicted=np.full(nfrag, 131, dtype=np.uint8))
    call.payloads[:] = sender.header
    call.payloads["slot"] = np.arange(call.used)
    return sender, call, transport, rounds


@pytest.mark.parametrize("batches", [True, False])
def test_each_slots_next_packet_carries_its_round_fragment_and_tag(batches):
    sender, call, transport, rounds = setup(batches)
    sender.send(call, np.array([0, 1, 2, 3]))
    recs = transport.records()
    assert recs["slot"].tolist() == [0, 1, 2, 3]
    assert recs["round"].tolist() == rounds.tolist()
    # version: the pool's epoch and the round's low bit
    assert recs["version"].tolist() == [P.version_of(5, r & 1) for r in rounds.tolist()]
    assert recs["frag"].tolist() == [0, 1, 2, 3]
    assert recs["flags"].tolist() == [int(P.Flag.CONTRIB | P.Flag.POOL)] * 4  # pool 5: odd
    assert recs["tag"].tolist() == [9] * 4
    assert (recs["job_id"] == 3).all() and (recs["session"] == 0x55).all()
    assert (recs["contributor"] == 1).all() and (recs["num_contrib"] == 2).all()
    assert call.pending.all() and call.first_seq.tolist() == [0, 1, 2, 3]
    assert sender.stats.packets == 4 and sender.seq == 4
    # Their results come: the slots' next packets, the last of each slot's call tagged so.
    call.pending[:] = False
    call.step[:] += 1
    rounds += np.uint32(1)
    sender.send(call, np.array([3, 1]))
    recs = transport.records()[4:]
    assert recs["frag"].tolist() == [7, 5]
    assert recs["tag"].tolist() == [9 | TAG_LAST] * 2
    assert recs["round"].tolist() == [1, 9]
    assert call.first_seq[[3, 1]].tolist() == [4, 5]


def test_close_goes_out_at_once_only_where_the_quorum_allows_it():
    sender, call, transport, _ = setup()
    call.close_next[:] = [True, True, False, False]
    sender.send(call, np.array([0, 1, 2, 3]))  # not a quorum call: nobody asks
    assert not transport.records()["flags"].tolist()[0] & int(P.Flag.CLOSE)
    sender, call, transport, _ = setup()
    call.quorum = True
    call.close_next[:] = [True, False, False, False]
    sender.send(call, np.array([0, 1, 2, 3]))
    closes = transport.records()["flags"] & int(P.Flag.CLOSE)
    assert closes.astype(bool).tolist() == [True, False, False, False]
    assert sender.stats.closes == 1 and call.close.tolist() == [True, False, False, False]
    sender, call, transport, _ = setup()
    call.quorum = call.eager = True
    sender.send(call, np.array([0, 1, 2, 3]))
    assert (transport.records()["flags"] & int(P.Flag.CLOSE)).all()


def test_a_resend_is_the_same_packet_marked_retrans_and_numbered_anew():
    sender, call, transport, _ = setup()
    sender.send(call, np.array([0, 1, 2, 3]))
    first = transport.records().copy()
    call.close[2] = True  # its patience ran out
    sender.resend(call, np.array([1, 2]), now=5.0, probe=True)
    again = transport.records()[4:]
    retrans = int(P.Flag.CONTRIB | P.Flag.RETRANS | P.Flag.POOL)
    assert again["flags"].tolist() == [retrans, retrans | int(P.Flag.CLOSE)]
    for name in ("slot", "round", "frag", "version", "exp", "tag", "values"):
        assert again[name].tobytes() == first[[1, 2]][name].tobytes(), name
    assert call.last_seq.tolist() == [0, 4, 5, 3] and call.first_seq.tolist() == [0, 1, 2, 3]
    assert call.sent[[1, 2]].tolist() == [5.0, 5.0]
    assert call.probed[[1, 2]].all() and call.retried[[1, 2]].all()
    sender.resend(call, np.array([3]), now=6.0, probe=False, rotated=True)
    assert call.resent[3] and not call.retried[3] and not call.probed[3]
    assert sender.stats.retransmissions == 3 and sender.stats.packets == 7


def test_a_field_that_does_not_fit_is_refused_when_the_stream_is_made():
    with pytest.raises(ValueError, match="job_id"):
        Sender.fixed_header(StreamConfig(job_id=1 << 16, contributor=0, window=4, streams=1,
                                         session=1))
