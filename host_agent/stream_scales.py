"""The session's memory for speculation (docs/protocol.md, "Speculative scale"): per size of
call, the exponents the hosts proposed in the last call of that size, and whether the next call
of that size speculates from them. Every host keeps the same, since they come from the
results."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from host_agent import fixed_point as fx
from host_agent.stream_api import StreamStats
from host_agent.stream_call import Call
from passing import protocol as P

# The sessions' exponents kept for speculation: those of the last call of each of this many
# fragment counts (an all-reduce of every bucket of a model, each its own size).
SCALES_KEPT = 64

Kept = tuple[np.ndarray, bool]


def prediction(kept: Kept | None) -> np.ndarray | None:
    """The speculative scale of a call of a size kept in `ScaleMemory.scales`, or None:
    the call agrees on exponents first."""
    return fx.predict(kept[0]) if kept is not None and kept[1] else None


def next_scales(kept: Kept | None, exps: np.ndarray, window: int) -> Kept | None:
    """What a call of n fragments that proposed `exps` leaves for the next call of n (`kept`:
    what the one before it left) on a `window`-slot pool: None after NaN/Inf (nothing to
    predict from), else its exponents and whether the next speculates. It does unless
    speculating on this call (from `kept`) would have missed as many fragments as a call of n
    that agrees first uses slots (P.slots_used), or more: each miss costs a packet, and
    agreeing first costs one per such slot. A gradient whose blocks' magnitudes jump from
    step to step is then summed as without speculation; every host decides alike (the
    exponents are the results')."""
    if np.any(exps == fx.POISON):
        return None
    if kept is None:
        return exps.copy(), True
    missed = np.count_nonzero(~fx.speculation_holds(fx.predict(kept[0]), exps))
    return exps.copy(), bool(missed < P.slots_used(window, exps.size))


class ScaleMemory:
    """What the session's calls proposed, by fragment count, least recently used first."""

    def __init__(self, window: int):
        self.window = window
        self.scales: OrderedDict[int, Kept] = OrderedDict()

    def prediction(self, nfrag: int) -> np.ndarray | None:
        """The speculative scale of the next call of `nfrag` fragments (None: agree first)."""
        return prediction(self.scales.get(nfrag))

    def keep(self, call: Call, stats: StreamStats) -> None:
        """Keep what `call` proposed, for the next call of its size (next_scales)."""
        if call.predicted is not None:
            stats.speculated += call.nfrag
            stats.spec_missed += call.missed
        kept = next_scales(self.scales.pop(call.nfrag, None), call.exponents(), self.window)
        if kept is not None:
            stats.spec_declined += not kept[1]
            self.scales[call.nfrag] = kept
            while len(self.scales) > SCALES_KEPT:
                self.scales.popitem(last=False)
