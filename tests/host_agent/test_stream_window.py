"""The window's decisions without I/O (host_agent.stream_window), on a call's arrays with fake
times and fake records: which results are the awaited ones, which packets were lost, when the
silence calls for a probe and what it resends, which packets waited out their patience."""

from __future__ import annotations

import numpy as np
import pytest

from host_agent.stream_call import TAG_LAST, Call
from host_agent.stream_window import (
    Recovery,
    first_of_each,
    match,
    overdue,
    probe_turn,
    settle,
)
from passing import packet
from passing import protocol as P

TAG = 5


def call_of(slots: int = 8, tag: int = TAG) -> Call:
    """A speculating call of `slots` fragments: it uses one slot per fragment."""
    nfrag = slots
    return Call(np.zeros((nfrag, P.K)), np.zeros(nfrag, dtype=np.uint8), slots, 2, tag,
                predicted=np.zeros(nfrag, dtype=np.uint8))


def sent(call: Call, slots, seqs, at: float = 0.0, rounds=None) -> None:
    """`slots` waiting on packets first sent as transmissions `seqs` at time `at`."""
    slots = np.asarray(slots)
    call.pending[slots] = True
    call.p_frag[slots] = slots
    call.p_round[slots] = 0 if rounds is None else rounds
    call.first_seq[slots] = call.last_seq[slots] = seqs
    call.first_sent[slots] = call.sent[slots] = at


def results(*fields: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Records with `fields` (the rest zero), each one's slot, and all marked as ours."""
    recs = np.zeros(len(fields), dtype=packet.PAYLOAD_DTYPE)
    for i, f in enumerate(fields):
        for name, value in f.items():
            recs[name][i] = value
    slot = recs["slot"].astype(np.int64)
    return recs, slot, np.ones(len(fields), dtype=bool)


def test_only_the_awaited_result_of_a_waiting_slot_matches():
    call = call_of()
    sent(call, [0, 1, 2, 3], [10, 11, 12, 13], rounds=[4, 4, 4, 4])
    recs, slot, ours = results(
        dict(slot=0, frag=0, round=4, tag=TAG),            # awaited
        dict(slot=1, frag=1, round=3, tag=TAG),            # a stale round
        dict(slot=1, frag=1, round=5, tag=TAG),            # a later round
        dict(slot=2, frag=9, round=4, tag=TAG),            # another fragment
        dict(slot=3, frag=3, round=4, tag=TAG + 1),        # another call's
        dict(slot=5, frag=5, round=0, tag=TAG),            # a slot not waiting
        dict(slot=3, frag=3, round=4, tag=TAG | TAG_LAST), # awaited, the slot's last packet
    )
    assert match(call, recs, slot, ours).tolist() == [0, 6]
    foreign = ours.copy()
    foreign[0] = False  # another session's, on the same slot and round
    assert match(call, recs, slot, foreign).tolist() == [6]


def test_a_result_that_comes_twice_is_taken_once():
    """A resend's answer in the same batch as the first transmission's: only the first counts;
    once settled, the slot no longer waits, and the same result in a later batch matches
    nothing (it would otherwise be absorbed twice)."""
    call = call_of()
    sent(call, [2, 4], [1, 2])
    recs, slot, ours = results(dict(slot=4, frag=4, tag=TAG), dict(slot=2, frag=2, tag=TAG),
                               dict(slot=4, frag=4, tag=TAG))
    keep = match(call, recs, slot, ours)
    assert keep.tolist() == [0, 1]
    assert settle(call, slot[keep]) == 2
    assert not call.pending.any()
    assert match(call, recs, slot, ours).size == 0


def test_a_probes_answer_proves_its_own_transmission_and_others_their_first():
    call = call_of()
    sent(call, [0, 1], [3, 4])
    call.last_seq[[0, 1]] = [20, 21]  # both resent since
    call.probed[1] = True
    assert settle(call, np.array([0])) == 3  # may be the first transmission's answer
    assert settle(call, np.array([1])) == 21


def test_a_packet_overtaken_by_an_answered_later_one_is_lost_and_resent_once():
    call = call_of()
    sent(call, [0, 1, 2, 3], [0, 1, 2, 3])
    rec = Recovery(now=0.0, max_rto=1.0)
    assert rec.overtaken(call).size == 0  # nothing answered yet: nothing known lost
    call.pending[2] = False
    rec.answered(call, now=0.01, newest=2)  # slot 2's packet (sequence 2) was summed
    assert rec.overtaken(call).tolist() == [0, 1]  # sent before it, unanswered
    call.last_seq[[0, 1]] = [4, 5]  # resent: their new transmissions follow the mark
    assert rec.overtaken(call).size == 0
    rec.answered(call, now=0.02, newest=1)  # an older proof moves nothing back
    assert rec.mark == 2 and rec.overtaken(call).size == 0


def test_silence_is_probed_after_the_period_not_before_doubling_up_to_max_rto():
    rec = Recovery(now=100.0, max_rto=0.05)
    period = 0.01
    assert rec.probe_due(period) == pytest.approx(100.01)
    rec.probed(100.01)
    assert rec.probe_due(period) == pytest.approx(100.03)
    rec.probed(100.03)
    rec.probed(100.07)
    assert rec.probe_due(period) == pytest.approx(100.12)  # 0.08 doubled, capped at 0.05
    call = call_of()
    rec.answered(call, now=100.1, newest=0)  # a result: one period again
    assert rec.probe_due(period) == pytest.approx(100.11)


def test_the_loop_wakes_for_the_probe_or_the_first_patience_whichever_is_sooner():
    call = call_of()
    sent(call, [0, 1, 2], [0, 1, 2], at=0.0)
    call.first_sent[1] = -0.5  # the oldest, but asked for CLOSE already
    call.close[1] = True
    rec = Recovery(now=0.2, max_rto=1.0)
    assert rec.wake(call, period=0.1, patience=None) == pytest.approx(0.3)
    # slot 1 closed: the waiting ones were first sent at 0.0, silence counted from 0.2
    assert rec.wake(call, period=0.5, patience=0.05) == pytest.approx(0.25)
    assert rec.wake(call, period=0.01, patience=0.05) == pytest.approx(0.21)
    call.abstaining[[0, 2]] = True  # abstaining packets never ask for CLOSE
    assert rec.wake(call, period=0.5, patience=0.05) == pytest.approx(0.7)


def test_a_probe_resends_the_newest_and_an_eighth_of_the_older_in_turn():
    call = call_of(slots=32)
    order = np.random.default_rng(1).permutation(32)
    sent(call, order, np.arange(32))  # slot order[i] first sent as transmission i
    turns = []
    for _ in range(9):
        newest, turn = probe_turn(call)
        assert newest.tolist() == [order[31]]
        turns.append(turn.tolist())
    # 32 waiting: 4 a probe, oldest first, each once per silence, then the turn again
    for i in range(8):
        want = order[4 * i:4 * i + 4].tolist() if i < 7 else order[28:31].tolist()
        assert turns[i] == want, i
    assert turns[8] == order[:4].tolist()
    call.rotation = -1  # (a result: Recovery.answered) the turn starts with the oldest
    assert probe_turn(call)[1].tolist() == order[:4].tolist()
    alone = call_of()
    sent(alone, [3], [7])
    newest, turn = probe_turn(alone)
    assert newest.tolist() == [3] and turn.size == 0 and alone.rotation == -1


def test_packets_past_their_patience_ask_for_close_once():
    call = call_of()
    sent(call, [0, 1, 2, 3], [0, 1, 2, 3], at=1.0)
    call.first_sent[3] = 1.5
    call.abstaining[2] = True
    due = overdue(call, now=1.1, patience=0.1)
    assert due.tolist() == [0, 1]
    assert call.close[[0, 1]].all() and call.waited[[0, 1]].all()
    assert not call.close[[2, 3]].any()
    assert overdue(call, now=1.2, patience=0.1).size == 0  # once each
    assert overdue(call, now=1.6, patience=0.1).tolist() == [3]


def test_first_of_each_keeps_the_first_entry_per_key_in_order():
    idx = np.array([7, 3, 9, 4, 8])
    key = np.array([2, 1, 2, 5, 1])
    assert first_of_each(idx, key).tolist() == [7, 3, 4]
    assert first_of_each(idx[:1], key[:1]).tolist() == [7]
