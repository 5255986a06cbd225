"""Results of rounds this host has not sent yet (docs/protocol.md, "Rounds, quorum and late
contributions"): the other hosts closed them without it, and the multicast brought them early.
A late host takes them instead of sending (the switch may have left those rounds behind); this
is where they wait, by (slot, round)."""

from __future__ import annotations

import numpy as np

from host_agent.stream_call import TAG_CALL, Call
from passing import packet

# Results kept for rounds not sent yet: a whole large call's worth (4M values at K=64).
EARLY_MAX = 1 << 16


class EarlyResults:
    """The session's results kept early, on a pool of `window` slots whose next rounds are
    `rounds` (the session's array, shared with the rest of the streamer)."""

    def __init__(self, rounds: np.ndarray, window: int):
        self.rounds, self.window = rounds, window
        self.kept: dict[tuple[int, int], np.void] = {}

    def keep(self, recs: np.ndarray, slot: np.ndarray, unmatched: np.ndarray,
             call: Call | None, taken: np.ndarray | None = None) -> int:
        """Keep the results of rounds this host has not sent yet, of `call` (None: between
        calls) or a later one, among those `unmatched` marks (this session's, less those the
        call took); how many were kept. `taken`: slots whose results of the same batch the
        compiled window has already taken, judged as before it took them."""
        rest = np.flatnonzero(unmatched)
        if not rest.size or len(self.kept) >= EARLY_MAX:
            return 0
        s = slot[rest]
        pending = np.zeros(self.window, dtype=bool)
        rounds = self.rounds
        if call is not None:
            pending[:call.used] = call.pending
        if taken is not None and taken.size:
            pending[taken] = True
            rounds = rounds.copy()
            rounds[taken] -= np.uint32(1)
        ahead = (recs["round"][rest].astype(np.uint32) - rounds[s]).astype(np.uint32)
        rest = rest[(ahead < 1 << 31) & ((ahead > 0) | ~pending[s])]
        for i in rest.tolist():
            self.kept[int(slot[i]), int(recs["round"][i])] = recs[i].copy()
        return rest.size

    def pop_hits(self, call: Call, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Of `slots`, about to send their next packet of `call`: those whose result is
        already here (slots, records), taken out; None if none is. A kept result of their
        next round that is not that packet's (another call's, another fragment) is dropped:
        the round is this host's to send."""
        hits = []
        for s in slots.tolist():
            rec = self.kept.pop((s, int(self.rounds[s])), None)
            if rec is not None and int(rec["tag"]) & TAG_CALL == call.tag \
                    and int(rec["frag"]) == int(call.fragments(np.array([s]))[0]):
                hits.append((s, rec))
        if not hits:
            return None
        taken = np.array([s for s, _ in hits], dtype=np.int64)
        return taken, np.array([rec for _, rec in hits], dtype=packet.PAYLOAD_DTYPE)
