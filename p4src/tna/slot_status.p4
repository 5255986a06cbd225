/* A slot version's (count, state), register slot_status, and the packet's one event. The state
 * is ST_OPEN, ST_CLOSED (a non-root sent its rack sum up) or ST_READY (the final result is here).
 * Tofino gives a register at most four register actions and two inputs from the packet, (a, b),
 * which StatusInputs sets from the job and the flags before the slot is reached:
 *   a  the count before a new contribution from which it closes the round: fan_in - 1, or with
 *      CLOSE quorum - 1 if smaller (0 for a quorum of 0); 0 for the spine's result
 *   b  the state a round reaches when it closes here: READY at a root and for the spine's
 *      result, CLOSED below a root
 * and the four actions do what the v1model program's decide() and commit() do to the word:
 *   status_first    a round's first contribution: count 1, state b if a is 0 (it alone closes
 *                   the round), else OPEN
 *   status_stored   the spine's result for a round this switch never closed: (0, READY)
 *   status_count    a new contribution to an open round: count + 1, state b if the count before
 *                   it was at least a
 *   status_settle   a counted contributor's packet, or the spine's result: state b if it is not
 *                   READY and the count exceeds a (with CLOSE: the count holds the quorum; the
 *                   result: any count; else a count it never exceeds while the round is open). */
#ifndef _PASSING_TNA_SLOT_STATUS_P4_
#define _PASSING_TNA_SLOT_STATUS_P4_

#include "headers.p4"
#include "slot_state.p4"

struct pair8_t {
    bit<8> lo;
    bit<8> hi;
}

control SlotStatus(inout headers_t hdr, inout metadata_t meta) {
    @name(".slot_status") Register<pair8_t, vidx_t>(TNA_VERSIONS) slot_status;
    RegisterAction<pair8_t, vidx_t, bit<8>>(slot_status) status_first = {
        void apply(inout pair8_t v, out bit<8> cnt, out bit<8> old, out bit<8> now) {
            v.lo = 1;
            if (meta.st.a == 0) {
                v.hi = meta.st.b;
            } else {
                v.hi = ST_OPEN;
            }
            cnt = v.lo;
            now = v.hi;
        }
    };
    RegisterAction<pair8_t, vidx_t, bit<8>>(slot_status) status_stored = {
        void apply(inout pair8_t v, out bit<8> cnt, out bit<8> old, out bit<8> now) {
            v.lo = 0;
            v.hi = ST_READY;
            cnt = v.lo;
            now = v.hi;
        }
    };
    RegisterAction<pair8_t, vidx_t, bit<8>>(slot_status) status_count = {
        void apply(inout pair8_t v, out bit<8> cnt, out bit<8> old, out bit<8> now) {
            old = v.hi;
            if (v.hi == ST_OPEN) {
                if (v.lo >= meta.st.a) {
                    v.hi = meta.st.b;
                }
                v.lo = v.lo + 1;
            }
            cnt = v.lo;
            now = v.hi;
        }
    };
    RegisterAction<pair8_t, vidx_t, bit<8>>(slot_status) status_settle = {
        void apply(inout pair8_t v, out bit<8> cnt, out bit<8> old, out bit<8> now) {
            old = v.hi;
            if (v.hi != ST_READY && v.lo > meta.st.a) {
                v.hi = meta.st.b;
            }
            cnt = v.lo;
            now = v.hi;
        }
    };
#define STATUS(NAME) \
    action do_##NAME() { \
        meta.agg.cnt = status_##NAME.execute(meta.agg.vidx, meta.agg.st_old, meta.agg.st_new); \
    }
    STATUS(first)
    STATUS(stored)
    STATUS(count)
    STATUS(settle)
#undef STATUS
    /* Keyed by the bitmap half the bitmap returned, so that "the round counted the sender"
     * takes no stage of its own: mine_bit (slot_state.p4) tells the same to the later tables. */
    table status_op {
        key = {
            meta.agg.rel: ternary;
            meta.is_contrib: ternary;
            hdr.passing.contributor: ternary;
            meta.agg.bm_old: ternary;
        }
        actions = { do_first; do_stored; do_count; do_settle; NoAction; }
        const entries = {
            (REL_OLDER, _, _, _): NoAction();
            (REL_RESTART, 1, _, _): do_first();
            (REL_RESTART, 0, _, _): do_stored();
#define MINE(I) (REL_SAME, 1, I &&& 0x1f, (32w1 << I) &&& (32w1 << I)): do_settle();
            MINE(0) MINE(1) MINE(2) MINE(3) MINE(4) MINE(5) MINE(6) MINE(7)
            MINE(8) MINE(9) MINE(10) MINE(11) MINE(12) MINE(13) MINE(14) MINE(15)
            MINE(16) MINE(17) MINE(18) MINE(19) MINE(20) MINE(21) MINE(22) MINE(23)
            MINE(24) MINE(25) MINE(26) MINE(27) MINE(28) MINE(29) MINE(30) MINE(31)
#undef MINE
            (REL_SAME, 1, _, _): do_count();
            (REL_SAME, 0, _, _): do_settle();
        }
        default_action = NoAction();
        size = 64;
    }

    /* The packet's one event, as the v1model program's decide() names it; entries in order. */
    action event(bit<8> e) { meta.agg.event = e; }
    table decide {
        key = {
            meta.is_result: ternary;
            meta.agg.rel: ternary;
            meta.job.is_root: ternary;
            meta.agg.mine: ternary;
            meta.agg.st_old: ternary;
            meta.agg.st_new: ternary;
            meta.agg.full: ternary;
        }
        actions = { event; }
        const entries = {
            (1, REL_OLDER, _, _, _, _, _): event(DROP_STALE_RESULT);
            (1, _, _, _, _, _, _): event(EVT_DOWNLINK);
            (0, REL_OLDER, _, _, _, _, _): event(DROP_STALE_ROUND);
            /* a round's first contribution: it alone may close the round */
            (0, REL_RESTART, _, _, _, ST_OPEN, _): event(EVT_PARTIAL);
            (0, REL_RESTART, ROLE_ROOT, _, _, _, 1): event(EVT_COMPLETE_ROOT);
            (0, REL_RESTART, ROLE_ROOT, _, _, _, 0): event(EVT_CLOSED_ROOT);
            (0, REL_RESTART, ROLE_NON_ROOT, _, _, _, 1): event(EVT_COMPLETE_UP);
            (0, REL_RESTART, ROLE_NON_ROOT, _, _, _, 0): event(EVT_CLOSED_UP);
            /* the held round: the packet closed it (OPEN before, not after) */
            (0, REL_SAME, ROLE_ROOT, _, ST_OPEN, ST_READY, 1): event(EVT_COMPLETE_ROOT);
            (0, REL_SAME, ROLE_ROOT, _, ST_OPEN, ST_READY, 0): event(EVT_CLOSED_ROOT);
            (0, REL_SAME, ROLE_NON_ROOT, _, ST_OPEN, ST_CLOSED, 1): event(EVT_COMPLETE_UP);
            (0, REL_SAME, ROLE_NON_ROOT, _, ST_OPEN, ST_CLOSED, 0): event(EVT_CLOSED_UP);
            (0, REL_SAME, _, 0, ST_OPEN, ST_OPEN, _): event(EVT_PARTIAL);
            (0, REL_SAME, _, 1, ST_READY, _, _): event(EVT_RESULT_AGAIN);
            (0, REL_SAME, _, 1, ST_CLOSED, _, _): event(EVT_RESEND_UP);
            (0, REL_SAME, _, 1, _, _, _): event(EVT_DUPLICATE);
            (0, REL_SAME, _, 0, ST_READY, _, _): event(EVT_LATE_RESULT);
            (0, REL_SAME, _, _, _, _, _): event(EVT_LATE);
        }
        default_action = event(EVT_LATE);
        size = 32;
    }

    apply {
        status_op.apply();
        if (meta.agg.cnt == meta.job.fan_in) {
            meta.agg.full = 1;
        }
        decide.apply();
    }
}

/* The status register's two inputs (see above), from the job and the flags alone, so they are
 * ready, beside admission, before the packet reaches the slot. fan_in and quorum are at most
 * 64, so the sign of quorum - fan_in is right. */
control StatusInputs(inout headers_t hdr, inout metadata_t meta) {
    action thresholds() {
        meta.st.fan_in_m1 = meta.job.fan_in - 1;
        meta.st.quorum_m1 = meta.job.quorum - 1;
        meta.st.quorum_below = meta.job.quorum - meta.job.fan_in;
    }
    table status_thresholds {
        actions = { thresholds; }
        default_action = thresholds();
        size = 1;
    }

    apply {
        status_thresholds.apply();
        if (meta.is_result == 1) {
            meta.st.a = 0;
        } else if (meta.is_close == 1 && meta.job.quorum == 0) {
            meta.st.a = 0;
        } else if (meta.is_close == 1 && (meta.st.quorum_below & 0x80) != 0) {
            meta.st.a = meta.st.quorum_m1;
        } else {
            meta.st.a = meta.st.fan_in_m1;
        }
        if (meta.is_result == 1 || meta.job.is_root == ROLE_ROOT) {
            meta.st.b = ST_READY;
        } else {
            meta.st.b = ST_CLOSED;
        }
    }
}

#endif
