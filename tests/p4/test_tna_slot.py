"""The TNA program's split slot state decides as the v1model program's one word does: on random
packet sequences (rounds old and new, duplicates, CLOSE with a quorum, the spine's results at a
non-root, congestion marks, a session that changes once, as when agents restart), the TNA
program's events and every field of the slot after each packet (round, count, closed, ready,
mark, exponent, contributor sum, the 64 values) equal the v1model program's. The one difference
allowed is the one docs/tofino.md describes: a late contribution's bit is set, so its
retransmission is answered as a counted contributor's (the result again, or the rack sum sent
up again) where the v1model program counts it late.

The v1model side is the software model's (switch_model.slot_word, held to p4src/include by the
conformance suite); the TNA side is tests/p4/tna_slot.py, whose tables are the P4's own."""

from __future__ import annotations

import random

import pytest

from switch_model.frame import (
    DROP_STALE_RESULT,
    DROP_STALE_ROUND,
    EVT_CLOSED_ROOT,
    EVT_CLOSED_UP,
    EVT_COMPLETE_ROOT,
    EVT_COMPLETE_UP,
    EVT_DOWNLINK,
    EVT_DUPLICATE,
    EVT_LATE,
    EVT_LATE_RESULT,
    EVT_PARTIAL,
    EVT_RESEND_UP,
    EVT_RESULT_AGAIN,
    FLAG_CLOSE,
    FLAG_CONGESTED,
    FLAG_CONTRIB,
    FLAG_RESULT,
    Header,
)
from switch_model.slot_store import (
    CLOSED,
    CNT_AT,
    EXP_AT,
    FLAGS_AT,
    GEN_AT,
    MARKED,
    MASK_BM,
    MASK_WORD,
    NS_AT,
    READY,
    ROUND_AT,
    SESSION_AT,
    WORD_BITS,
)
from switch_model.slot_word import foreign_open, next_version_word, verdict, version_words
from tests.p4 import needs_cpp
from tests.p4.tna_slot import M32, TnaSlot

pytestmark = needs_cpp

REFUSED = (DROP_STALE_RESULT, DROP_STALE_ROUND)
# What the v1model program says of a late contributor's retransmission -> what the TNA says.
LATE_AGAIN = {EVT_LATE_RESULT: EVT_RESULT_AGAIN, EVT_LATE: EVT_RESEND_UP}


class V1Slot:
    """One slot as the v1model program keeps it: one word (both versions, gen, session) and
    the values per version, changed as switch_model.pipeline's _aggregate changes them."""

    def __init__(self) -> None:
        self.word = 0
        self.values = [[0] * 64, [0] * 64]

    def process(self, h: Header, values: list[int],
                j: dict[str, int]) -> tuple[int, int, bool]:
        """The event, the packet's version word after it, and whether the version restarted."""
        gen = j["gen"]
        cur, oth = version_words(self.word, gen, h)
        v = verdict(cur, h, j, foreign_open(self.word, gen, h))
        if v.event in REFUSED:
            return v.event, cur, False
        overwrite = v.event == EVT_DOWNLINK or v.first
        acc = self.values[h.version & 1]
        self.values[h.version & 1] = (list(values) if overwrite else
                                      [(x + y) & M32 for x, y in zip(acc, values, strict=True)]
                                      if v.is_new else acc)
        mine = next_version_word(cur, h, v, overwrite)
        pair = (mine << WORD_BITS) | oth if h.version & 1 else (oth << WORD_BITS) | mine
        self.word = (gen << GEN_AT) | (h.session << SESSION_AT) | pair
        return v.event, mine, v.restart


def packets(rng: random.Random, j: dict[str, int], n: int):
    """A job's packets for one slot, round after round: each contributor's contribution in a
    random order, some sent again or left out (to come late), some with CLOSE or a mark, now
    and then one of an older or the next round, and below a root the spine's results; the
    session changes once (its first packet a contribution), its rounds starting again at 0."""
    sessions, rnd, switched, sent = [0x1111_2222_3333_4444, 0x5555_6666_7777_8888], 5, None, 0
    while sent < n:
        order = rng.sample(range(j["fan_in"]), j["fan_in"])
        late = [c for c in order if rng.random() < 0.1]
        for c in order + late:
            if switched is None and sent > n // 2 and rng.random() < 0.05:
                switched, rnd = sent, 0
            r = (rnd + rng.choice([0] * 12 + [-1, -2, 1])) & M32
            result = j["is_root"] == 0 and rng.random() < 0.1 and switched != sent
            flags = FLAG_RESULT if result else \
                FLAG_CONTRIB | (FLAG_CLOSE if rng.random() < 0.1 else 0)
            flags |= FLAG_CONGESTED if rng.random() < 0.2 else 0
            for _ in range(1 + (rng.random() < 0.1)):
                sent += 1
                yield Header(job_id=1, slot=0, contributor=c, flags=flags, version=r & 1,
                             level=0, frag=0, round=r, num_contrib=rng.randrange(1, 4),
                             exp=rng.randrange(12), tag=0, session=sessions[switched is not None]
                             ), [rng.getrandbits(32) for _ in range(64)]
        rnd += 1


def v1_fields(w: int) -> dict[str, int]:
    flags = (w >> FLAGS_AT) & 0xFF
    return {"round": w >> ROUND_AT, "cnt": (w >> CNT_AT) & 0xFF, "closed": int(flags & CLOSED != 0),
            "ready": int(flags & READY != 0), "marked": int(flags & MARKED != 0),
            "exp": (w >> EXP_AT) & 0xFF, "nsum": (w >> NS_AT) & 0xFFFF}


@pytest.mark.parametrize("fan_in,quorum,is_root", [
    (1, 0, 1), (3, 0, 1), (4, 2, 1), (4, 0, 0), (5, 3, 0), (64, 40, 1), (40, 9, 0)])
def test_the_tna_slot_decides_as_the_v1model_slot(fan_in, quorum, is_root):
    j = {"fan_in": fan_in, "quorum": quorum, "is_root": is_root, "gen": 7}
    seen: set[int] = set()
    for seed in range(60):
        rng = random.Random(seed * 1000 + fan_in)
        v1, tna = V1Slot(), TnaSlot()
        late: dict[int, set[int]] = {0: set(), 1: set()}  # per version: late in its round
        for n, (h, values) in enumerate(packets(rng, j, 40 + 4 * fan_in)):
            ver = h.version & 1
            ev1, word, restart = v1.process(h, values, j)
            ev2, tv = tna.process(h, values, j)
            where = f"seed {seed} packet {n}: {h}"
            mine = v1_fields(word)
            if restart:
                late[ver] = set()  # a new round: nobody in it is late yet
            if h.contributor in late[ver] and ev1 in LATE_AGAIN:
                assert ev2 == LATE_AGAIN[ev1], where
            else:
                assert ev2 == ev1, where
                if ev1 in LATE_AGAIN:
                    late[ver].add(h.contributor)
            seen.add(ev1)
            if ev1 in REFUSED:
                continue
            assert tv.owner == (j["gen"], h.session), where
            got = {"round": tv.round, "cnt": tv.cnt, "closed": int(tv.state != 0),
                   "ready": int(tv.state == 3), "marked": tv.marked, "exp": tv.exp,
                   "nsum": tv.nsum}
            assert got == mine, where
            late_bits = sum(1 << c for c in late[ver])
            assert tv.bitmap == (word & MASK_BM) | late_bits, where
            assert tv.values == v1.values[ver], where
            assert (word & MASK_WORD) == word
    # The sequences reach the events this job's role has: with a quorum, CLOSE closes most
    # rounds before the last contribution; at a root, a closed round is ready (never LATE).
    want = {EVT_RESULT_AGAIN, DROP_STALE_ROUND}
    if fan_in > 1:  # with one contributor every contribution closes its round at once
        want |= {EVT_PARTIAL, EVT_DUPLICATE, EVT_LATE_RESULT}
    if is_root:
        want |= {EVT_CLOSED_ROOT if quorum else EVT_COMPLETE_ROOT}
    else:
        want |= {EVT_RESEND_UP, EVT_DOWNLINK, DROP_STALE_RESULT, EVT_LATE,
                 EVT_CLOSED_UP if quorum else EVT_COMPLETE_UP}
    assert want <= seen, sorted(want - seen)
