"""A call's state (host_agent.stream_call) on its own: the tensor as blocks, each slot's walk
through its fragments (exponent packet first, or speculating), the tags, and absorbing results
into sums."""

from __future__ import annotations

import numpy as np

from host_agent import fixed_point as fx
from host_agent.scratch import Scratch
from host_agent.stream_call import TAG_LAST, Call, as_blocks
from passing import packet
from passing import protocol as P


def test_a_tensor_becomes_padded_blocks_or_poison_with_the_reason():
    flat = np.arange(P.K + 3, dtype=np.float32)
    blocks, exps, error = as_blocks(flat, 2, Scratch())
    assert error is None and blocks.dtype == np.float32 and blocks.shape == (2, P.K)
    assert blocks.ravel()[:P.K + 3].tolist() == flat.tolist()
    assert not blocks.ravel()[P.K + 3:].any()
    assert exps.tolist() == fx.block_exponents(blocks).tolist()
    bad = flat.astype(np.float64)
    bad[5] = np.inf
    blocks, exps, error = as_blocks(bad, 2, Scratch())
    assert "flat index 5" in error
    assert not blocks.any() and (exps == fx.POISON).all()


def result(frags, exp, values, num_contrib=2) -> np.ndarray:
    recs = np.zeros(len(frags), dtype=packet.PAYLOAD_DTYPE)
    recs["frag"], recs["exp"], recs["num_contrib"] = frags, exp, num_contrib
    recs["values"] = values
    return recs


def test_agreeing_first_each_slot_sends_the_exponent_then_its_fragments():
    nfrag = 6
    blocks = np.ones((nfrag, P.K))
    call = Call(blocks, np.full(nfrag, 129, dtype=np.uint8), 3, 2, 4)
    assert call.used == 3
    slots = np.arange(3)
    assert call.fragments(slots).tolist() == [0, 1, 2]
    assert call.tags(slots, call.fragments(slots)).tolist() == [4, 4, 4]  # exponent packets
    values, exp, abstain = call.values_and_exponents(slots, call.fragments(slots))
    assert not values.any() and exp.tolist() == [129] * 3 and not abstain.any()
    more = call.absorb(slots, np.arange(3), result([0, 1, 2], 130, 0))
    assert more.tolist() == [0, 1, 2] and call.agreed[:3].tolist() == [130] * 3
    frag = call.fragments(slots)
    assert frag.tolist() == [0, 1, 2]
    assert call.tags(slots, frag).tolist() == [4, 4, 4]  # fragments 3-5 still to come
    values, exp, _ = call.values_and_exponents(slots, frag)
    assert values.any() and exp.tolist() == [129] * 3  # the exponent of the fragment ahead
    sums = fx.quantize(blocks[:3], np.full(3, 130, dtype=np.uint8), call.s_bits) * 2
    more = call.absorb(slots, frag, result([0, 1, 2], 131, sums))
    assert np.allclose(call.out[:3], 2.0) and call.agreed[3:].tolist() == [131] * 3
    frag = call.fragments(more)
    assert frag.tolist() == [3, 4, 5]
    assert call.tags(more, frag).tolist() == [4 | TAG_LAST] * 3
    assert call.absorb(more, frag, result([3, 4, 5], 0, 0)).size == 0  # every slot done
    assert call.counts.tolist() == [2] * 6


def test_a_speculation_that_did_not_hold_sends_the_fragment_again():
    nfrag = 2
    predicted = np.array([130, 130], dtype=np.uint8)
    call = Call(np.ones((nfrag, P.K)), np.full(nfrag, 129, dtype=np.uint8), 4, 2, 0,
                predicted)
    slots = np.arange(2)
    assert call.used == 2 and call.speculating(slots).all()
    # Fragment 0's maximum fits the prediction; fragment 1's came back above it.
    more = call.absorb(slots, np.arange(2), result([0, 1], [129, 131], 0))
    assert more.tolist() == [1] and call.missed == 1
    assert call.redo.tolist() == [False, True] and not call.speculating(more).any()
    assert call.agreed.tolist() == [130, 131]
    assert call.absorb(more, np.array([1]), result([1], 131, 0)).size == 0
    assert call.exponents().tolist() == [129, 131]  # what the next call predicts from
