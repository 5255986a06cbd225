"""One all-reduce's state as it goes through the window (host_agent.stream): its fragments,
how far each slot has got through them, the packet each slot waits on, and what the results
made of them (sums, agreed exponents, speculation's misses). Arrays are indexed by slot, so that
a batch of results is matched and absorbed in numpy (or by host_agent/window.c, which reads the
same arrays).
"""

from __future__ import annotations

import numpy as np

from host_agent import fixed_point as fx
from host_agent.scratch import Scratch
from passing import packet
from passing import protocol as P

# A packet's tag: the call's number modulo TAG_CALLS, and TAG_LAST on its slot's last packet of
# the call.
TAG_CALLS = 128
TAG_LAST = 0x80
TAG_CALL = TAG_LAST - 1  # the call's number in a tag


class Call:
    """One allreduce's fragments, how far each slot has got through them, and the packet each
    slot is waiting on (arrays indexed by slot, so a batch of results is matched in numpy)."""

    def __init__(self, blocks: np.ndarray, local_exp: np.ndarray, window: int, streams: int,
                 tag: int, predicted: np.ndarray | None = None, out: np.ndarray | None = None):
        """`out`: where the sums go, an array of blocks' shape (zeroed here; default new)."""
        self.blocks, self.local_exp, self.tag = blocks, local_exp, tag
        self.nfrag = blocks.shape[0]
        # Slot s carries fragments s, s + used, s + 2 * used, ...; a speculating call uses
        # every slot (no exponent packets to save).
        self.used = used = P.slots_used(window, self.nfrag, speculating=predicted is not None)
        self.s_bits = fx.scale_bits(streams)
        # The exp field each fragment's values were (or are to be) quantized with.
        self.agreed = np.zeros(self.nfrag, dtype=np.uint8)
        # Speculative scale (fx.predict) per fragment, or None: exponent packets first.
        self.predicted = predicted
        # The maximum of the hosts' own exponents of each fragment: the next call's prediction.
        self.proposed = np.zeros(self.nfrag, dtype=np.uint8)
        # Per slot: its packet resends a fragment whose speculation did not hold, at the
        # proposed maximum.
        self.redo = np.zeros(used, dtype=bool)
        self.missed = 0  # fragments sent again
        if out is None:
            out = np.empty(blocks.shape)
        out.fill(0)  # a fragment no sum is written to (POISON) reads 0
        self.out = out
        self.counts = np.zeros(self.nfrag, dtype=np.int64)  # GPUs each fragment's sum holds
        # step[s]: 0 = exponent packet of fragment s, i >= 1 = fragment s + (i-1)*used;
        # speculating, i = fragment s + i*used
        self.step = np.zeros(used, dtype=np.int64)
        # The packet each slot waits on. Sequence numbers order every transmission of this
        # streamer (first_seq: the packet's first, last_seq: its latest); see
        # stream_window.Recovery.overtaken.
        self.pending = np.zeros(used, dtype=bool)
        self.p_frag = np.zeros(used, dtype=np.int64)
        self.p_round = np.zeros(used, dtype=np.uint32)
        self.first_seq = np.zeros(used, dtype=np.int64)
        self.last_seq = np.zeros(used, dtype=np.int64)
        self.sent = np.zeros(used, dtype=np.float64)  # time of the latest transmission
        self.first_sent = np.zeros(used, dtype=np.float64)  # ... and of the first
        self.close = np.zeros(used, dtype=bool)  # patience ran out: its resends carry CLOSE
        # The slot's packet waited the whole patience for the others (it asked for CLOSE then),
        # and, per slot, whether its next packet asks for CLOSE when first sent (see
        # stream_sender.Sender.send).
        self.waited = np.zeros(used, dtype=bool)
        self.close_next = np.zeros(used, dtype=bool)
        self.quorum = False  # this call may close rounds without everyone (patience applies)
        self.abstaining = np.zeros(used, dtype=bool)  # its packet abstains: it may not CLOSE
        self.eager = False  # ... and asks for CLOSE in every packet, at once (Sender.send)
        self.resent = np.zeros(used, dtype=bool)
        # ... resent other than in a probe's turn through the older packets: its round waited
        # for the others, or for a loss, or asked for CLOSE (what adaptive patience skips).
        self.retried = np.zeros(used, dtype=bool)
        self.probed = np.zeros(used, dtype=bool)  # the latest transmission was a probe
        # The first send of the older packet a probe resent last (stream_window.probe_turn); -1
        # after any result: a new silence starts with the oldest waiting packet.
        self.rotation = -1
        # Each slot's packet as sent (kept for a resend): the fields no packet of the call
        # changes are filled in once (Sender.header), the rest per send (Sender.send).
        self.payloads = np.zeros(used, dtype=packet.PAYLOAD_DTYPE)
        # The compiled window's context for this call (host_agent.window_c), or None: numpy.
        self.ctx: np.ndarray | None = None

    def fragments(self, slots: np.ndarray) -> np.ndarray:
        """The fragment each of `slots` is at (for an exponent packet, the one it announces)."""
        st = self.step[slots]
        if self.predicted is not None:
            return slots + st * self.used
        return np.where(st == 0, slots, slots + (st - 1) * self.used)

    def speculating(self, slots: np.ndarray) -> np.ndarray:
        """Whether each of `slots`' next packet is at a speculative scale (not a resend of a
        fragment that missed)."""
        if self.predicted is None:
            return np.zeros(slots.size, dtype=bool)
        return ~self.redo[slots]

    def tags(self, slots: np.ndarray, frag: np.ndarray) -> np.ndarray:
        """The tag of each of `slots`' next packet: the call's, with TAG_LAST on the slot's
        last packet of the call (what tells a late host the others' call ended there)."""
        last = frag + self.used >= self.nfrag
        if self.predicted is None:
            last &= self.step[slots] > 0  # an exponent packet is followed by the values
        return np.where(last, self.tag | TAG_LAST, self.tag)

    def values_and_exponents(self, slots: np.ndarray, frag: np.ndarray
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The next packet of each slot: fragment `frag` quantized with its agreed exponent
        (zeros in an exponent packet, or once a host reported NaN/Inf), the exponent it
        proposes: this host's of the fragment itself (exponent packet) or of the slot's next
        fragment (0 after the last), and whether it abstains: its values do not fit the
        agreed scale (a round closed by a quorum left its proposal out), so it sends zeros
        that count for no GPU rather than values that would overflow the sum."""
        st = self.step[slots]
        own = self.local_exp[frag]
        if self.predicted is not None:
            # Speculating, each packet proposes its own fragment's exponent.
            scale = np.where(self.redo[slots], self.agreed[frag], self.predicted[frag])
            data = scale != fx.POISON
            # A host with NaN/Inf (its blocks zeroed, its proposal POISON) sends zeros for its
            # GPUs, as when agreeing first: the round's POISON fails the call everywhere, and
            # its counts say nothing of a GPU left out.
            abstain = data & (own > scale) & (own != fx.POISON)
        else:
            scale = self.agreed[frag]
            data = (st > 0) & (scale != fx.POISON)
            abstain = data & (own > scale)
        data &= ~abstain
        if data.all():  # (the usual batch: no mask to copy through)
            values = fx.quantize(self.blocks[frag], scale, self.s_bits)
        else:
            values = np.zeros((slots.size, P.K), dtype=np.int32)
            if data.any():
                values[data] = fx.quantize(self.blocks[frag[data]], scale[data], self.s_bits)
        if self.predicted is not None:
            return values, own, abstain
        nxt = frag + self.used
        ahead = self.local_exp[np.minimum(nxt, self.nfrag - 1)]
        exp = np.where(st == 0, self.local_exp[slots], np.where(nxt < self.nfrag, ahead, 0))
        return values, exp, abstain

    def absorb(self, slots: np.ndarray, frags: np.ndarray, recs: np.ndarray) -> np.ndarray:
        """Take the results `recs` of `slots` (at fragments `frags`): an exponent packet's
        result is the fragment's agreed exponent, a value packet's the fragment's sum and the
        agreed exponent of the slot's next fragment. Returns the slots that have another
        fragment to send."""
        if self.predicted is not None:
            return self._absorb_speculated(slots, frags, recs)
        agreed, nfrag, used = self.agreed, self.nfrag, self.used
        first = self.step[slots] == 0
        agreed[frags[first]] = recs["exp"][first]
        rest = ~first
        self.counts[frags[rest]] = recs["num_contrib"][rest]
        data = rest & (agreed[frags] != fx.POISON)
        if data.all():  # (the usual batch: no mask to copy through)
            self.out[frags] = fx.dequantize(recs["values"], agreed[frags], self.s_bits)
        elif data.any():
            self.out[frags[data]] = fx.dequantize(recs["values"][data], agreed[frags[data]],
                                                  self.s_bits)
        ahead = rest & (frags + used < nfrag)
        agreed[frags[ahead] + used] = recs["exp"][ahead]
        self.step[slots] += 1
        return slots[slots + (self.step[slots] - 1) * used < nfrag]

    def _absorb_speculated(self, slots: np.ndarray, frags: np.ndarray, recs: np.ndarray
                           ) -> np.ndarray:
        """absorb, speculating: a result whose proposed maximum the prediction covers (and
        not by more than SPEC_SLACK) is the fragment's sum; otherwise the slot sends the
        fragment again, quantized at that maximum, and that result is the sum."""
        agreed, most = self.agreed, recs["exp"]
        redo = self.redo[slots]
        predicted = self.predicted[frags]
        holds = ~redo & fx.speculation_holds(predicted, most)
        if holds.all():  # (the usual batch: every speculation held, no mask to copy through)
            self.proposed[frags] = most
            agreed[frags] = scale = np.where(most == fx.POISON, fx.POISON, predicted)
            self.counts[frags] = recs["num_contrib"]
            data = scale != fx.POISON
            if data.all():
                self.out[frags] = fx.dequantize(recs["values"], scale, self.s_bits)
            elif data.any():
                self.out[frags[data]] = fx.dequantize(recs["values"][data], scale[data],
                                                      self.s_bits)
            self.step[slots] += 1
            return slots[slots + self.step[slots] * self.used < self.nfrag]
        self.proposed[frags[~redo]] = most[~redo]
        agreed[frags[holds]] = np.where(most[holds] == fx.POISON, fx.POISON,
                                        self.predicted[frags[holds]])
        missed = ~redo & ~holds
        agreed[frags[missed]] = most[missed]
        done = ~missed
        self.counts[frags[done]] = recs["num_contrib"][done]
        data = done & (agreed[frags] != fx.POISON)
        if data.any():
            self.out[frags[data]] = fx.dequantize(recs["values"][data], agreed[frags[data]],
                                                  self.s_bits)
        self.redo[slots] = missed
        self.missed += int(missed.sum())
        self.step[slots[done]] += 1
        return slots[missed | (slots + self.step[slots] * self.used < self.nfrag)]

    def exponents(self) -> np.ndarray:
        """What the call's fragments proposed at most: the prediction of the next call of
        this size."""
        return self.proposed if self.predicted is not None else self.agreed


def as_blocks(flat: np.ndarray, nfrag: int, scratch: Scratch
              ) -> tuple[np.ndarray, np.ndarray, str | None]:
    """A call's `nfrag` blocks of K values from `flat` (in `scratch`'s memory, the last block
    padded with zeros), each block's exponent, and None; or, where `flat` holds NaN/Inf (or a
    value beyond float32's range), zeros, POISON exponents and the error's message."""
    n = flat.size
    # float32 values stay float32 until quantized (per batch, in float64): half the memory
    # to fill and scan; anything else is kept as float64, exactly.
    blocks = scratch.get("blocks", (nfrag, P.K), np.float32
                         if flat.dtype == np.float32 else np.float64)
    try:
        fx.check_finite(flat)
        blocks.ravel()[:n] = flat
        blocks.ravel()[n:] = 0  # the last block's padding: the last call's values
        # An all-zero block proposes 0: a speculative sum whose maximum is 0 is exactly
        # zero, whatever its scale (fx.speculation_holds).
        return blocks, fx.block_exponents(blocks), None
    except (fx.NonFiniteError, ValueError) as e:
        # The message, not the exception: its traceback holds the caller's frame, and the
        # cycle would keep the caller's process groups (and their gloo threads) alive until a
        # garbage collection, possibly one at interpreter exit, where a gloo thread
        # releasing a tensor aborts the process.
        local_error = str(e)
    blocks[:] = 0
    return blocks, np.full(nfrag, fx.POISON, dtype=np.uint8), local_error
