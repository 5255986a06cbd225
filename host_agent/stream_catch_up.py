"""How many whole calls a late host finds already summed among the results kept early
(SlotStreamer.calls_ready): a walk of the kept results as this host's next calls would take
them, without sending anything."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from host_agent import fixed_point as fx
from host_agent.stream_call import TAG_CALL, TAG_CALLS, TAG_LAST
from host_agent.stream_scales import Kept, next_scales, prediction
from passing import protocol as P

Early = Mapping[tuple[int, int], np.void]


def calls_ready(early: Early, rounds: np.ndarray, scales: Mapping[int, Kept], calls: int,
                nfrag: int, most: int, window: int) -> int:
    """How many of the next calls of `nfrag` fragments (this host has made `calls` so far, its
    slots' next rounds are `rounds`, on a `window`-slot pool) the kept results `early` make
    up entirely, `most` at most. Each is walked as this host would send it: exponent packets
    first or a speculative scale (from `scales`, then from what each walked call proposed),
    and a fragment sent again where a speculation did not hold. A call counts only if each
    slot's last result is tagged as its slot's last packet of the call (TAG_LAST) and no slot
    beyond the call's holds a result of the same call: results do not say how large the
    others' call was."""
    rounds = [int(r) for r in rounds]
    kept = scales.get(nfrag)
    ready = 0
    while ready < most:
        tag = (calls + ready) % TAG_CALLS
        predicted = prediction(kept)
        used = P.slots_used(window, nfrag, speculating=predicted is not None)
        for s in range(used, window):  # a larger call would use them too
            rec = early.get((s, rounds[s]))
            if rec is not None and int(rec["tag"]) & TAG_CALL == tag:
                return ready
        exps = np.zeros(nfrag, dtype=np.uint8)
        for s in range(used):
            walked = _walk_slot(early, s, rounds[s], nfrag, used, tag, predicted, exps)
            if walked is None:
                return ready
            rounds[s] = walked
        kept = next_scales(kept, exps, window)
        ready += 1
    return ready


def _walk_slot(early: Early, s: int, round_: int, nfrag: int, used: int, tag: int,
               predicted: np.ndarray | None, exps: np.ndarray) -> int | None:
    """The kept results of slot `s` from round `round_` on, as one call of `nfrag`
    fragments would use them (filling `exps` with what it proposed): the round after
    its last, or None if they do not make up such a call."""
    def take(frag: int) -> np.void | None:
        nonlocal round_
        rec = early.get((s, round_ & 0xFFFFFFFF))
        round_ += 1
        if rec is None or int(rec["tag"]) & TAG_CALL != tag or int(rec["frag"]) != frag:
            return None
        return rec

    rec = None
    if predicted is None:
        rec = take(s)  # the exponent packet
        if rec is None:
            return None
        exps[s] = rec["exp"]
    for frag in range(s, nfrag, used):
        rec = take(frag)
        if rec is None:
            return None
        most = rec["exp"]
        if predicted is None:
            if frag + used < nfrag:
                exps[frag + used] = most
            continue
        exps[frag] = most
        if not fx.speculation_holds(predicted[frag], most):
            rec = take(frag)  # sent again at the maximum
            if rec is None:
                return None
    if not int(rec["tag"]) & TAG_LAST:
        return None  # the slot goes on: the others' call is larger
    return round_
