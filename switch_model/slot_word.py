"""The Aggregation control's decisions on one packet against its slot's version word, expression
for expression as in p4src/include/aggregation.p4: which version word is the packet's, its one
event, the word after it, and the header of what leaves. Ints in, ints out: no registers, no I/O
(switch_model.pipeline reads and writes the registers)."""

from __future__ import annotations

from typing import NamedTuple

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
    FLAG_POOL,
    FLAG_RESULT,
    FLAG_RETRANS,
    MCAST_EVENTS,
    ROLE_ROOT,
    UP_EVENTS,
    Header,
)
from switch_model.slot_store import (
    CLOSED,
    CNT_AT,
    EXP_AT,
    FLAGS_AT,
    GEN_AT,
    MARKED,
    MASK32,
    MASK64,
    MASK_BM,
    MASK_WORD,
    NS_AT,
    READY,
    ROUND_AT,
    SESSION_AT,
    WORD_BITS,
)


def version_words(word: int, gen: int, h: Header) -> tuple[int, int]:
    """The slot_state word's word of the packet's version and the other version's; both zero
    when another generation or another session wrote the slot (it reads as empty)."""
    if word >> GEN_AT != gen or (word >> SESSION_AT) & MASK64 != h.session:
        return 0, 0
    if h.version & 1:
        return (word >> WORD_BITS) & MASK_WORD, word & MASK_WORD
    return word & MASK_WORD, (word >> WORD_BITS) & MASK_WORD


class Verdict(NamedTuple):
    """What the aggregate action decided for one packet against its version's word."""

    event: int  # a JobEvent, or JobDrop.STALE_RESULT / STALE_ROUND
    is_new: bool  # a contribution counted now (not a duplicate, not late, not stale)
    first: bool  # ... and the first of a newer round: it overwrites the slot
    restart: bool  # the packet's round is newer than the held one, or none is held
    cnt: int  # the round's count after the packet


def foreign_open(word: int, gen: int, h: Header) -> bool:
    """Another generation's or session's round is open in the slot (a version with
    contributors, not closed): a result from the spine may not take such a slot over."""
    if word >> GEN_AT == gen and (word >> SESSION_AT) & MASK64 == h.session:
        return False
    return any(w & MASK_BM and not (w >> FLAGS_AT) & CLOSED
               for w in (word & MASK_WORD, (word >> WORD_BITS) & MASK_WORD))


def verdict(cur: int, h: Header, j: dict[str, int], foreign_open: bool) -> Verdict:
    """The P4's decisions, expression for expression: the packet's round against the one
    this version holds (serial-number order), then its one event."""
    bm, ccnt, flags = cur & MASK_BM, (cur >> CNT_AT) & 0xFF, (cur >> FLAGS_AT) & 0xFF
    mybit = (1 << h.contributor) & MASK_BM
    is_result = h.flags & FLAG_RESULT == FLAG_RESULT
    used = bm != 0 or flags & CLOSED != 0
    d = (h.round - (cur >> ROUND_AT)) & MASK32
    same = used and d == 0
    older = used and d >> 31 == 1
    restart = not used or (not same and not older)
    closed = same and flags & CLOSED != 0
    ready = same and flags & READY != 0
    mine = same and bm & mybit != 0
    is_new = not is_result and not older and (restart or (not mine and not closed))
    first = is_new and restart
    cnt = 1 if first else 0 if restart else (ccnt + 1) & 0xFF if is_new else ccnt
    full = cnt == j["fan_in"]
    completes = (not is_result and not older and not closed
                 and ((is_new and full) or (h.flags & FLAG_CLOSE != 0 and cnt >= j["quorum"])))
    root = j["is_root"] == ROLE_ROOT
    if is_result:
        event = DROP_STALE_RESULT if older or foreign_open else EVT_DOWNLINK
    elif older:
        event = DROP_STALE_ROUND
    elif completes:
        event = ((EVT_COMPLETE_ROOT if full else EVT_CLOSED_ROOT) if root else
                 (EVT_COMPLETE_UP if full else EVT_CLOSED_UP))
    elif is_new:
        event = EVT_PARTIAL
    elif mine:
        event = EVT_RESULT_AGAIN if ready else EVT_RESEND_UP if closed else EVT_DUPLICATE
    else:
        event = EVT_LATE_RESULT if ready else EVT_LATE
    return Verdict(event, is_new, first, restart, cnt)


def next_version_word(cur: int, h: Header, v: Verdict, overwrite: bool) -> int:
    """The packet's version word after it: the spine's result or a newer round's first
    contribution overwrite it, a new contribution adds to it, anything else leaves it as it
    was (a result again, once final, stays ready). A newer round starts from the packet: its
    sender alone, or (a result from the spine for a round this switch never closed) nobody."""
    bm, rnd = cur & MASK_BM, cur >> ROUND_AT
    ex, ns = (cur >> EXP_AT) & 0xFF, (cur >> NS_AT) & 0xFFFF
    flags = (cur >> FLAGS_AT) & 0xFF
    if overwrite:
        ex, ns = h.exp, h.num_contrib
    elif v.is_new:
        ex = h.exp if h.exp > ex else ex
        ns = (ns + h.num_contrib) & 0xFFFF
    # The mark: of the packets counted into the round (the first, a new one, the spine's
    # result), any that carried FLAG_CONGESTED.
    absorbs = v.is_new or v.event == EVT_DOWNLINK
    marked = (absorbs and h.flags & FLAG_CONGESTED != 0) or (not v.restart and flags & MARKED)
    if v.event in MCAST_EVENTS:
        flags = READY | CLOSED
    elif v.event == EVT_COMPLETE_UP or v.event == EVT_CLOSED_UP:
        flags = CLOSED
    elif v.first:
        flags = 0
    if marked:
        flags |= MARKED
    mybit = (1 << h.contributor) & MASK_BM
    if v.restart:
        bm, rnd = (mybit if v.is_new else 0), h.round
    elif v.is_new:
        bm |= mybit
    return ((rnd << ROUND_AT) | (flags << FLAGS_AT) | (ns << NS_AT) | (ex << EXP_AT)
            | (v.cnt << CNT_AT) | bm)


def leaving_header(h: Header, event: int, mine: int) -> Header:
    """The header of what leaves for `event`: the slot's exponent and contributor sum from its
    version word `mine`, the flags of a sum going up (RETRANS when sent again, CLOSE when the
    packet carried it) or of a result, one level up when going up; always the packet's pool."""
    marked = FLAG_CONGESTED if (mine >> FLAGS_AT) & MARKED else 0
    if event in UP_EVENTS:
        level = (h.level + 1) & 0xFF
        flags = FLAG_CONTRIB | (h.flags & FLAG_CLOSE)  # the hosts' CLOSE goes up with the sum
        if event == EVT_RESEND_UP:
            flags |= FLAG_RETRANS
    else:
        level, flags = h.level, FLAG_RESULT
    return Header(h.job_id, h.slot, h.contributor, flags | marked | (h.flags & FLAG_POOL),
                  h.version, level, h.frag, h.round, (mine >> NS_AT) & 0xFFFF,
                  (mine >> EXP_AT) & 0xFF, h.tag, h.session)
