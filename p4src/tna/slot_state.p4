/* A slot version's state, the v1model program's slot_state word split over Tofino registers of
 * at most 64 bits, one access each per packet, in pipeline order (docs/tofino.md). This file
 * holds the first four, slot_status.p4 the last:
 *
 *   slot_owner     (gen, session bits 31..0)   whose round the version holds: anything else
 *   slot_owner_hi  (session bits 63..32)       reads as empty, and the packet takes it over
 *   slot_round     the round the version holds (serial-number order, RFC 1982)
 *   slot_bitmap    the contributors counted (64 bits: two halves)
 *   slot_status    (count, state): OPEN, CLOSED (the rack sum went up) or READY
 *
 * Every packet passes every stage in the same order, so each register sees the packets in one
 * order and the split state changes as the one word did. One difference, written in
 * docs/tofino.md: the bitmap comes before the status, so a contribution that arrives after its
 * round closed sets its bit though it is not summed; its retransmission is then answered as a
 * duplicate (the result again, or the rack sum sent up again) rather than counted late. What is
 * summed is decided by slot_status alone, so no value changes.
 *
 * A register is reached from one table only, so each has one, whose const entries choose the
 * register action from what the earlier stages found. */
#ifndef _PASSING_TNA_SLOT_STATE_P4_
#define _PASSING_TNA_SLOT_STATE_P4_

#include "headers.p4"

struct pair32_t {
    bit<32> lo;
    bit<32> hi;
}

control SlotState(inout headers_t hdr, inout metadata_t meta) {
    /* The owner: (gen, session), split in two. Whatever the packet, the version then belongs to
     * it: a packet of another session or job finds it empty (REL_RESTART) and takes it over. */
    @name(".slot_owner") Register<pair32_t, vidx_t>(TNA_VERSIONS) slot_owner;
    RegisterAction<pair32_t, vidx_t, bit<1>>(slot_owner) own = {
        void apply(inout pair32_t v, out bit<1> same) {
            same = 0;
            if (v.lo == meta.job.gen && v.hi == hdr.passing.session[31:0]) {
                same = 1;
            }
            v.lo = meta.job.gen;
            v.hi = hdr.passing.session[31:0];
        }
    };
    @name(".slot_owner_hi") Register<bit<32>, vidx_t>(TNA_VERSIONS) slot_owner_hi;
    RegisterAction<bit<32>, vidx_t, bit<1>>(slot_owner_hi) own_hi = {
        void apply(inout bit<32> v, out bit<1> same) {
            same = 0;
            if (v == hdr.passing.session[63:32]) {
                same = 1;
            }
            v = hdr.passing.session[63:32];
        }
    };

    /* The round: a newer one (or any round of a version taken over) restarts the version. */
    @name(".slot_round") Register<bit<32>, vidx_t>(TNA_VERSIONS) slot_round;
    RegisterAction<bit<32>, vidx_t, bit<2>>(slot_round) round_take = {
        void apply(inout bit<32> v, out bit<2> rel) {
            v = hdr.passing.round;
            rel = REL_RESTART;
        }
    };
    RegisterAction<bit<32>, vidx_t, bit<2>>(slot_round) round_place = {
        void apply(inout bit<32> v, out bit<2> rel) {
            if ((int<32>)(hdr.passing.round - v) > 0) {
                v = hdr.passing.round;
                rel = REL_RESTART;
            } else if (hdr.passing.round == v) {
                rel = REL_SAME;
            } else {
                rel = REL_OLDER;
            }
        }
    };
    action take_round() { meta.agg.rel = round_take.execute(meta.agg.vidx); }
    action place_round() { meta.agg.rel = round_place.execute(meta.agg.vidx); }
    table round_op {
        key = { meta.agg.own_lo: exact; meta.agg.own_hi: exact; }
        actions = { take_round; place_round; }
        const entries = {
            (1, 1): place_round();
            (0, 0): take_round();
            (0, 1): take_round();
            (1, 0): take_round();
        }
        size = 4;
    }

    @name(".slot_bitmap") Register<pair32_t, vidx_t>(TNA_VERSIONS) slot_bitmap;
    RegisterAction<pair32_t, vidx_t, bit<32>>(slot_bitmap) bm_first = {
        void apply(inout pair32_t v) {
            v.lo = meta.agg.mybit_lo;
            v.hi = meta.agg.mybit_hi;
        }
    };
    RegisterAction<pair32_t, vidx_t, bit<32>>(slot_bitmap) bm_clear = {
        void apply(inout pair32_t v) {
            v.lo = 0;
            v.hi = 0;
        }
    };
    RegisterAction<pair32_t, vidx_t, bit<32>>(slot_bitmap) bm_add_lo = {
        void apply(inout pair32_t v, out bit<32> before) {
            before = v.lo;
            v.lo = v.lo | meta.agg.mybit_lo;
        }
    };
    RegisterAction<pair32_t, vidx_t, bit<32>>(slot_bitmap) bm_add_hi = {
        void apply(inout pair32_t v, out bit<32> before) {
            before = v.hi;
            v.hi = v.hi | meta.agg.mybit_hi;
        }
    };
    action bitmap_first() { bm_first.execute(meta.agg.vidx); }
    action bitmap_clear() { bm_clear.execute(meta.agg.vidx); }
    action bitmap_add_lo() { meta.agg.bm_old = bm_add_lo.execute(meta.agg.vidx); }
    action bitmap_add_hi() { meta.agg.bm_old = bm_add_hi.execute(meta.agg.vidx); }
    /* A round restarts from its first contribution's bit, or (the spine's result for a round
     * this switch never closed) from nobody; a result of the held round, or a packet of an
     * older round, leaves the bitmap as it is. */
    table bitmap_op {
        key = {
            meta.agg.rel: exact;
            meta.is_contrib: exact;
            hdr.passing.contributor: ternary;
        }
        actions = { bitmap_first; bitmap_clear; bitmap_add_lo; bitmap_add_hi; NoAction; }
        const entries = {
            (REL_RESTART, 1, _): bitmap_first();
            (REL_RESTART, 0, _): bitmap_clear();
            (REL_SAME, 1, 0 &&& 0x20): bitmap_add_lo();
            (REL_SAME, 1, 0x20 &&& 0x20): bitmap_add_hi();
        }
        default_action = NoAction();
        size = 8;
    }

    /* The contributor's bit in the half the bitmap returned: the round had counted it. */
    action counted() { meta.agg.mine = 1; }
    table mine_bit {
        key = { hdr.passing.contributor: ternary; meta.agg.bm_old: ternary; }
        actions = { counted; @defaultonly NoAction; }
        const entries = {
#define MINE(I) (I &&& 0x1f, (32w1 << I) &&& (32w1 << I)): counted();
            MINE(0) MINE(1) MINE(2) MINE(3) MINE(4) MINE(5) MINE(6) MINE(7)
            MINE(8) MINE(9) MINE(10) MINE(11) MINE(12) MINE(13) MINE(14) MINE(15)
            MINE(16) MINE(17) MINE(18) MINE(19) MINE(20) MINE(21) MINE(22) MINE(23)
            MINE(24) MINE(25) MINE(26) MINE(27) MINE(28) MINE(29) MINE(30) MINE(31)
#undef MINE
        }
        default_action = NoAction();
        size = 32;
    }

    apply {
        meta.agg.own_lo = own.execute(meta.agg.vidx);
        meta.agg.own_hi = own_hi.execute(meta.agg.vidx);
        round_op.apply();
        bitmap_op.apply();
        mine_bit.apply();
    }
}

/* The contributor's bit, in the bitmap half that holds it: set before the slot is reached. */
control ContributorBit(inout headers_t hdr, inout metadata_t meta) {
    action contributor_bit(bit<32> lo, bit<32> hi) {
        meta.agg.mybit_lo = lo;
        meta.agg.mybit_hi = hi;
    }
    table contributor_bits {
        key = { hdr.passing.contributor: exact; }
        actions = { contributor_bit; @defaultonly NoAction; }
        const entries = {
            0: contributor_bit(32w0x00000001, 32w0);
            1: contributor_bit(32w0x00000002, 32w0);
            2: contributor_bit(32w0x00000004, 32w0);
            3: contributor_bit(32w0x00000008, 32w0);
            4: contributor_bit(32w0x00000010, 32w0);
            5: contributor_bit(32w0x00000020, 32w0);
            6: contributor_bit(32w0x00000040, 32w0);
            7: contributor_bit(32w0x00000080, 32w0);
            8: contributor_bit(32w0x00000100, 32w0);
            9: contributor_bit(32w0x00000200, 32w0);
            10: contributor_bit(32w0x00000400, 32w0);
            11: contributor_bit(32w0x00000800, 32w0);
            12: contributor_bit(32w0x00001000, 32w0);
            13: contributor_bit(32w0x00002000, 32w0);
            14: contributor_bit(32w0x00004000, 32w0);
            15: contributor_bit(32w0x00008000, 32w0);
            16: contributor_bit(32w0x00010000, 32w0);
            17: contributor_bit(32w0x00020000, 32w0);
            18: contributor_bit(32w0x00040000, 32w0);
            19: contributor_bit(32w0x00080000, 32w0);
            20: contributor_bit(32w0x00100000, 32w0);
            21: contributor_bit(32w0x00200000, 32w0);
            22: contributor_bit(32w0x00400000, 32w0);
            23: contributor_bit(32w0x00800000, 32w0);
            24: contributor_bit(32w0x01000000, 32w0);
            25: contributor_bit(32w0x02000000, 32w0);
            26: contributor_bit(32w0x04000000, 32w0);
            27: contributor_bit(32w0x08000000, 32w0);
            28: contributor_bit(32w0x10000000, 32w0);
            29: contributor_bit(32w0x20000000, 32w0);
            30: contributor_bit(32w0x40000000, 32w0);
            31: contributor_bit(32w0x80000000, 32w0);
            32: contributor_bit(32w0, 32w0x00000001);
            33: contributor_bit(32w0, 32w0x00000002);
            34: contributor_bit(32w0, 32w0x00000004);
            35: contributor_bit(32w0, 32w0x00000008);
            36: contributor_bit(32w0, 32w0x00000010);
            37: contributor_bit(32w0, 32w0x00000020);
            38: contributor_bit(32w0, 32w0x00000040);
            39: contributor_bit(32w0, 32w0x00000080);
            40: contributor_bit(32w0, 32w0x00000100);
            41: contributor_bit(32w0, 32w0x00000200);
            42: contributor_bit(32w0, 32w0x00000400);
            43: contributor_bit(32w0, 32w0x00000800);
            44: contributor_bit(32w0, 32w0x00001000);
            45: contributor_bit(32w0, 32w0x00002000);
            46: contributor_bit(32w0, 32w0x00004000);
            47: contributor_bit(32w0, 32w0x00008000);
            48: contributor_bit(32w0, 32w0x00010000);
            49: contributor_bit(32w0, 32w0x00020000);
            50: contributor_bit(32w0, 32w0x00040000);
            51: contributor_bit(32w0, 32w0x00080000);
            52: contributor_bit(32w0, 32w0x00100000);
            53: contributor_bit(32w0, 32w0x00200000);
            54: contributor_bit(32w0, 32w0x00400000);
            55: contributor_bit(32w0, 32w0x00800000);
            56: contributor_bit(32w0, 32w0x01000000);
            57: contributor_bit(32w0, 32w0x02000000);
            58: contributor_bit(32w0, 32w0x04000000);
            59: contributor_bit(32w0, 32w0x08000000);
            60: contributor_bit(32w0, 32w0x10000000);
            61: contributor_bit(32w0, 32w0x20000000);
            62: contributor_bit(32w0, 32w0x40000000);
            63: contributor_bit(32w0, 32w0x80000000);
        }
        size = 64;
    }

    apply {
        contributor_bits.apply();
    }
}

#endif
