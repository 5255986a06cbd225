/* What a slot version sums: the K = 64 values as 32 registers of value pairs (one register
 * action adds two 32-bit lanes, four such actions per stage), and the round's largest exponent,
 * its number of contributions and its congestion mark. Whatever the operation, the packet
 * leaves with the slot's values after it, as on the v1model program; two's complement addition
 * wraps per 32-bit lane, as the v1model program's lane-parallel sum does. */
#ifndef _PASSING_TNA_SLOT_VALUES_P4_
#define _PASSING_TNA_SLOT_VALUES_P4_

#include "headers.p4"
#include "slot_state.p4"

/* The operation from what the slot's state stages found, so that the values need not wait for
 * the event: the spine's result and a round's first contribution overwrite (PUT), a new
 * contribution (not counted, the round open) adds (ADD); a packet of an older round, and any
 * other, leaves the slot as it is (GET). */
#define SUM_KEY \
    meta.is_result: ternary; meta.agg.rel: ternary; meta.agg.mine: ternary; \
    meta.agg.st_old: ternary;
#define SUM_ENTRIES(PUT, ADD, GET) \
    (_, REL_OLDER, _, _): GET(); \
    (1, _, _, _): PUT(); \
    (0, REL_RESTART, _, _): PUT(); \
    (0, REL_SAME, 0, ST_OPEN): ADD(); \
    (_, _, _, _): GET();

#define VALUE_PAIR(N, A, B, NAME) \
    @name(NAME) Register<pair32_t, vidx_t>(TNA_VERSIONS) slot_values_##N; \
    RegisterAction<pair32_t, vidx_t, bit<32>>(slot_values_##N) put_##N = { \
        void apply(inout pair32_t v, out bit<32> a, out bit<32> b) { \
            v.lo = hdr.values.v##A; \
            v.hi = hdr.values.v##B; \
            a = v.lo; \
            b = v.hi; \
        } \
    }; \
    RegisterAction<pair32_t, vidx_t, bit<32>>(slot_values_##N) add_##N = { \
        void apply(inout pair32_t v, out bit<32> a, out bit<32> b) { \
            v.lo = v.lo + hdr.values.v##A; \
            v.hi = v.hi + hdr.values.v##B; \
            a = v.lo; \
            b = v.hi; \
        } \
    }; \
    RegisterAction<pair32_t, vidx_t, bit<32>>(slot_values_##N) get_##N = { \
        void apply(inout pair32_t v, out bit<32> a, out bit<32> b) { \
            a = v.lo; \
            b = v.hi; \
        } \
    }; \
    action do_put_##N() { hdr.values.v##A = put_##N.execute(meta.agg.vidx, hdr.values.v##B); } \
    action do_add_##N() { hdr.values.v##A = add_##N.execute(meta.agg.vidx, hdr.values.v##B); } \
    action do_get_##N() { hdr.values.v##A = get_##N.execute(meta.agg.vidx, hdr.values.v##B); } \
    table values_##N { \
        key = { SUM_KEY } \
        actions = { do_put_##N; do_add_##N; do_get_##N; @defaultonly NoAction; } \
        const entries = { SUM_ENTRIES(do_put_##N, do_add_##N, do_get_##N) } \
        default_action = NoAction(); \
        size = 4; \
    }

control SlotValues(inout headers_t hdr, inout metadata_t meta) {
    VALUE_PAIR(0, 0, 1, ".slot_values_0")
    VALUE_PAIR(1, 2, 3, ".slot_values_1")
    VALUE_PAIR(2, 4, 5, ".slot_values_2")
    VALUE_PAIR(3, 6, 7, ".slot_values_3")
    VALUE_PAIR(4, 8, 9, ".slot_values_4")
    VALUE_PAIR(5, 10, 11, ".slot_values_5")
    VALUE_PAIR(6, 12, 13, ".slot_values_6")
    VALUE_PAIR(7, 14, 15, ".slot_values_7")
    VALUE_PAIR(8, 16, 17, ".slot_values_8")
    VALUE_PAIR(9, 18, 19, ".slot_values_9")
    VALUE_PAIR(10, 20, 21, ".slot_values_10")
    VALUE_PAIR(11, 22, 23, ".slot_values_11")
    VALUE_PAIR(12, 24, 25, ".slot_values_12")
    VALUE_PAIR(13, 26, 27, ".slot_values_13")
    VALUE_PAIR(14, 28, 29, ".slot_values_14")
    VALUE_PAIR(15, 30, 31, ".slot_values_15")
    VALUE_PAIR(16, 32, 33, ".slot_values_16")
    VALUE_PAIR(17, 34, 35, ".slot_values_17")
    VALUE_PAIR(18, 36, 37, ".slot_values_18")
    VALUE_PAIR(19, 38, 39, ".slot_values_19")
    VALUE_PAIR(20, 40, 41, ".slot_values_20")
    VALUE_PAIR(21, 42, 43, ".slot_values_21")
    VALUE_PAIR(22, 44, 45, ".slot_values_22")
    VALUE_PAIR(23, 46, 47, ".slot_values_23")
    VALUE_PAIR(24, 48, 49, ".slot_values_24")
    VALUE_PAIR(25, 50, 51, ".slot_values_25")
    VALUE_PAIR(26, 52, 53, ".slot_values_26")
    VALUE_PAIR(27, 54, 55, ".slot_values_27")
    VALUE_PAIR(28, 56, 57, ".slot_values_28")
    VALUE_PAIR(29, 58, 59, ".slot_values_29")
    VALUE_PAIR(30, 60, 61, ".slot_values_30")
    VALUE_PAIR(31, 62, 63, ".slot_values_31")

    @name(".slot_exp") Register<bit<8>, vidx_t>(TNA_VERSIONS) slot_exp;
    RegisterAction<bit<8>, vidx_t, bit<8>>(slot_exp) exp_put = {
        void apply(inout bit<8> v, out bit<8> now) {
            v = hdr.passing.exp;
            now = v;
        }
    };
    RegisterAction<bit<8>, vidx_t, bit<8>>(slot_exp) exp_max = {
        void apply(inout bit<8> v, out bit<8> now) {
            if (hdr.passing.exp > v) {
                v = hdr.passing.exp;
            }
            now = v;
        }
    };
    RegisterAction<bit<8>, vidx_t, bit<8>>(slot_exp) exp_get = {
        void apply(inout bit<8> v, out bit<8> now) {
            now = v;
        }
    };
    action do_exp_put() { meta.agg.exp = exp_put.execute(meta.agg.vidx); }
    action do_exp_max() { meta.agg.exp = exp_max.execute(meta.agg.vidx); }
    action do_exp_get() { meta.agg.exp = exp_get.execute(meta.agg.vidx); }
    table exp_op {
        key = { SUM_KEY }
        actions = { do_exp_put; do_exp_max; do_exp_get; @defaultonly NoAction; }
        const entries = { SUM_ENTRIES(do_exp_put, do_exp_max, do_exp_get) }
        default_action = NoAction();
        size = 4;
    }

    @name(".slot_nsum") Register<bit<16>, vidx_t>(TNA_VERSIONS) slot_nsum;
    RegisterAction<bit<16>, vidx_t, bit<16>>(slot_nsum) nsum_put = {
        void apply(inout bit<16> v, out bit<16> now) {
            v = hdr.passing.num_contrib;
            now = v;
        }
    };
    RegisterAction<bit<16>, vidx_t, bit<16>>(slot_nsum) nsum_add = {
        void apply(inout bit<16> v, out bit<16> now) {
            v = v + hdr.passing.num_contrib;
            now = v;
        }
    };
    RegisterAction<bit<16>, vidx_t, bit<16>>(slot_nsum) nsum_get = {
        void apply(inout bit<16> v, out bit<16> now) {
            now = v;
        }
    };
    action do_nsum_put() { meta.agg.nsum = nsum_put.execute(meta.agg.vidx); }
    action do_nsum_add() { meta.agg.nsum = nsum_add.execute(meta.agg.vidx); }
    action do_nsum_get() { meta.agg.nsum = nsum_get.execute(meta.agg.vidx); }
    table nsum_op {
        key = { SUM_KEY }
        actions = { do_nsum_put; do_nsum_add; do_nsum_get; @defaultonly NoAction; }
        const entries = { SUM_ENTRIES(do_nsum_put, do_nsum_add, do_nsum_get) }
        default_action = NoAction();
        size = 4;
    }

    /* The mark: a packet summed or stored into the round that carried FLAG_CONGESTED marks
     * the round, and a restarted round forgets the last one's. */
    @name(".slot_marked") Register<bit<8>, vidx_t>(TNA_VERSIONS) slot_marked;
    RegisterAction<bit<8>, vidx_t, bit<8>>(slot_marked) mark_set = {
        void apply(inout bit<8> v, out bit<8> now) {
            v = meta.is_cong;
            now = v;
        }
    };
    RegisterAction<bit<8>, vidx_t, bit<8>>(slot_marked) mark_or = {
        void apply(inout bit<8> v, out bit<8> now) {
            v = v | meta.is_cong;
            now = v;
        }
    };
    RegisterAction<bit<8>, vidx_t, bit<8>>(slot_marked) mark_get = {
        void apply(inout bit<8> v, out bit<8> now) {
            now = v;
        }
    };
    action do_mark_set() { meta.agg.marked = mark_set.execute(meta.agg.vidx); }
    action do_mark_or() { meta.agg.marked = mark_or.execute(meta.agg.vidx); }
    action do_mark_get() { meta.agg.marked = mark_get.execute(meta.agg.vidx); }
    table mark_op {
        key = { SUM_KEY }
        actions = { do_mark_set; do_mark_or; do_mark_get; @defaultonly NoAction; }
        /* what the round absorbs: a restart starts from the packet's mark, a result of the
         * held round or a new contribution adds its mark to the round's */
        const entries = {
            (_, REL_OLDER, _, _): do_mark_get();
            (_, REL_RESTART, _, _): do_mark_set();
            (1, REL_SAME, _, _): do_mark_or();
            (0, REL_SAME, 0, ST_OPEN): do_mark_or();
            (_, _, _, _): do_mark_get();
        }
        default_action = NoAction();
        size = 4;
    }

    apply {
        mark_op.apply();
        exp_op.apply();
        nsum_op.apply();
        values_0.apply();
        values_1.apply();
        values_2.apply();
        values_3.apply();
        values_4.apply();
        values_5.apply();
        values_6.apply();
        values_7.apply();
        values_8.apply();
        values_9.apply();
        values_10.apply();
        values_11.apply();
        values_12.apply();
        values_13.apply();
        values_14.apply();
        values_15.apply();
        values_16.apply();
        values_17.apply();
        values_18.apply();
        values_19.apply();
        values_20.apply();
        values_21.apply();
        values_22.apply();
        values_23.apply();
        values_24.apply();
        values_25.apply();
        values_26.apply();
        values_27.apply();
        values_28.apply();
        values_29.apply();
        values_30.apply();
        values_31.apply();
    }
}

#endif
