"""The window's decisions on one call (docs/protocol.md, "Loss recovery"), without I/O: which
results are the awaited ones, which packets were lost, which to probe, which waited out the
patience, and when the loop must wake. Everything reads and writes the call's arrays
(host_agent.stream_call.Call) and the times it is given; the caller sends what is decided."""

from __future__ import annotations

import numpy as np

from host_agent.stream_call import TAG_CALL, Call

PROBES_COUNTED = 30  # doublings of the probe period counted: it reaches max_rto long before


class Recovery:
    """One call's loss recovery: `mark` is the newest transmission known to have been summed
    by every host (a packet last sent before it and still unanswered was lost), and the
    silence since the last result (`last_progress`) is answered by one probe per period,
    doubled per probe (`probes`) since `probe_ref`."""

    def __init__(self, now: float, max_rto: float):
        self.mark = -1
        self.last_progress = self.probe_ref = now
        self.probes = 0
        self.max_rto = max_rto

    def probe_due(self, period: float) -> float:
        """When the silence calls for a probe: `period`, doubled per probe sent."""
        return self.probe_ref + min(period * (1 << self.probes), self.max_rto)

    def wake(self, call: Call, period: float, patience: float | None) -> float:
        """When the loop must act if no result comes: the next probe, or the first packet's
        patience running out (silence since the later of its first send and the last
        result)."""
        wake = self.probe_due(period)
        if patience is not None:
            waiting = call.pending & ~call.close & ~call.abstaining
            if waiting.any():
                wake = min(wake, max(float(call.first_sent[waiting].min()),
                                     self.last_progress) + patience)
        return wake

    def answered(self, call: Call, now: float, newest: int) -> None:
        """Results came at `now`, proving every host's packets up to transmission `newest`
        summed: the silence, the probes and the probes' turn start again."""
        self.last_progress = self.probe_ref = now
        self.probes = 0
        call.rotation = -1
        self.mark = max(self.mark, newest)

    def overtaken(self, call: Call) -> np.ndarray:
        """Fast recovery: every host sends a call's packets in the same order, and links and
        switches keep each port's order, so a slot completes only after every slot sent
        before it. The packets whose latest transmission precedes `mark` and that are still
        unanswered were therefore lost (their contribution, another host's, or their
        result): the slots to resend now, not after a timer."""
        return np.flatnonzero(call.pending & (call.last_seq < self.mark))

    def probed(self, now: float) -> None:
        self.probes = min(self.probes + 1, PROBES_COUNTED)
        self.probe_ref = now


def probe_turn(call: Call) -> tuple[np.ndarray, np.ndarray]:
    """No result for a timer period: the newest waiting packet's slot (as a probe), and the
    older ones to resend in turn (possibly none). The newest's answer, once it comes, settles
    every older packet (Recovery.overtaken).

    The older ones are needed because after two losses each host's newest packet may be
    waiting for another host (one that lost the result of an older round of that slot, or
    its own contribution to it), while what that host lost is an older packet its own
    probe of the newest never resends. So each probe also resends the oldest waiting
    packets not yet resent in this silence, an eighth of those waiting (at least one):
    within eight silent periods every packet a host waits on has been resent once, and
    the turn starts again. A host that is merely slow costs the others 1 + W/8 packets per
    (doubling) period, not the whole window each time. The older packets' answers count
    as ordinary ones (not `probed`): an old packet's result may come back while newer ones
    still wait for a slow host, which are not lost."""
    waiting = np.flatnonzero(call.pending)
    order = waiting[np.argsort(call.first_seq[waiting])]
    newest, older = order[-1:], order[:-1]
    if not older.size:
        return newest, older
    turn = older[call.first_seq[older] > call.rotation]
    if not turn.size:
        turn = older  # every older packet was resent once in this silence: again
    share = -(-waiting.size // 8)
    turn = turn[:share]
    call.rotation = int(call.first_seq[turn[-1]])
    return newest, turn


def overdue(call: Call, now: float, patience: float) -> np.ndarray:
    """The slots whose packets waited `patience` for the others: marked to ask for CLOSE, once
    each (their later resends carry it too), and to be resent now."""
    due = np.flatnonzero(call.pending & ~call.close & ~call.abstaining
                         & (now - call.first_sent >= patience))
    if due.size:
        call.close[due] = call.waited[due] = True
    return due


def match(call: Call, recs: np.ndarray, slot: np.ndarray, ours: np.ndarray) -> np.ndarray:
    """Which of the records `recs` (on slots `slot`; `ours`: of this job's session, on a slot
    of its window) are the awaited result of a slot of `call`, by index in order of arrival:
    its tag, slot, fragment and round, the slot still waiting, and only the first where one
    batch brings a slot's result twice (a resend's answer)."""
    cand = np.flatnonzero(ours & ((recs["tag"] & TAG_CALL) == call.tag) & (slot < call.used))
    s = slot[cand]
    cand = cand[call.pending[s] & (call.p_frag[s] == recs["frag"][cand])
                & (call.p_round[s] == recs["round"][cand])]
    return first_of_each(cand, slot[cand])


def settle(call: Call, slots: np.ndarray) -> int:
    """`slots` got their awaited results: they stop waiting. Returns the latest transmission
    the results prove every host's packets up to were summed. A probe's answer comes after
    every older packet's would: its own transmission counts. Any other answer may be the
    first transmission's, so only that counts."""
    newest = int(np.max(np.where(call.probed[slots], call.last_seq[slots],
                                 call.first_seq[slots])))
    call.pending[slots] = False
    return newest


def first_of_each(idx: np.ndarray, key: np.ndarray) -> np.ndarray:
    """`idx` without the entries whose `key` an earlier entry has, in order (np.unique's
    first occurrences, without its generic machinery: it runs on every batch of results)."""
    if idx.size < 2:
        return idx
    order = np.argsort(key, kind="stable")
    ranked = key[order]
    repeat = np.zeros(idx.size, dtype=bool)
    repeat[order[1:]] = ranked[1:] == ranked[:-1]
    return idx[~repeat] if repeat.any() else idx
