/* Slot pools: the SwitchML aggregation protocol with two versions per slot, generalised to a
 * two-level tree (ATP-style: a non-root switch sends its finished slot up as one contribution and
 * multicasts the result that comes back down), with explicit rounds and quorum completion.
 *
 * State per slot (register slot_state, 368 bits):
 *   [367:336] gen      job generation that wrote it
 *   [335:272] session  the agents' session that wrote it
 *   Slot state of any other (gen, session) reads as empty: a contribution of a new session
 *   takes the slot over, so no session ever sees another's sums (docs/protocol.md, Sessions).
 *   [271:136] version 1 word, [135:0] version 0 word, each:
 *     [63:0] contributor bitmap  [71:64] count  [79:72] max exp  [95:80] sum of num_contrib
 *     [96] ready: the slot holds the round's final result (at a root as soon as it completes;
 *          at a non-root once the result came back from the spine)
 *     [97] closed: the round completed here (at a non-root: its sum went up)
 *     [98] marked: a packet counted into this round carried FLAG_CONGESTED; whatever the
 *          round sends on carries it too
 *     [135:104] round: the slot's round this version holds (docs/protocol.md, Rounds)
 *   The bitmap is 64 bits (MAX_FAN_IN): on Tofino the widest word one register action reads
 *   and writes, as a pair of 32-bit halves (docs/protocol.md, "Limits per switch").
 * Values per slot and version (register slot_values): the K lanes of the running sum in
 * VALUE_WORDS 2048-bit words of 64 lanes, word w of version v of slot s at index
 * (2*s+v)*VALUE_WORDS + w (word 0 holds values 0..63, as hdr.values.w0). Each word is added
 * lane-parallel (SWAR): the low 31 bits of each lane are added with the top bits masked off, so a
 * carry can never leave its lane, and the top bits are then restored by XOR. That gives exact
 * 32-bit wrap-around sums per lane.
 *
 * BMv2 pays per action, table and primitive, not per bit, so this control is straight-line code
 * (four actions, below): slot_state is read and written once per packet, and each of the
 * slot's value words once (a write of an unchanged value where the packet changes nothing), and
 * every decision is an expression. The words are spelled out one by one (MERGE_WORD below): P4 has no loops in
 * actions, and one action of straight-line code is what BMv2 runs fastest. The packet's fate is
 * one event (EVT_* in config.p4), which the ingress counts and which sets where the packet goes.
 */
#ifndef _PASSING_AGGREGATION_P4_
#define _PASSING_AGGREGATION_P4_

#include "headers.p4"

/* One register word plus another, lane by lane (see above). */
#define SWAR_ADD(a, b) ((((a) & LANE_LOW) + ((b) & LANE_LOW)) ^ (((a) ^ (b)) & LANE_MSB))

/* Word W of the slot's values: read, overwritten by / added to / left as it is against the
 * packet's word W, written back, and put into the packet that leaves. */
#define MERGE_WORD(W)                                                                  \
        bit<WORD_BITS> acc##W;                                                         \
        slot_values.read(acc##W, vbase + W);                                           \
        bit<WORD_BITS> vals##W = overwrite ? hdr.values.w##W :                         \
                                 (is_new ? SWAR_ADD(acc##W, hdr.values.w##W) : acc##W); \
        slot_values.write(vbase + W, vals##W);                                         \
        hdr.values.w##W = vals##W;

control Aggregation(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm,
                    out bit<8> event) {
    @name(".slot_state") register<bit<368>>(SLOT_CAPACITY) slot_state;
    @name(".slot_values") register<bit<WORD_BITS>>(SLOT_CAPACITY * 2 * VALUE_WORDS) slot_values;

    /* Four actions of straight-line code, in order: inside an action p4c keeps ?: as an
     * expression for BMv2, where in an apply block it would turn each one into branches,
     * tables and actions. Four, not one: within an action p4c replaces every read of a value
     * written earlier in it by that value's whole expression, and the decisions nest (one
     * action made a 17 MB JSON); what one action leaves in meta.agg the next reads as a field. */

    /* The slot's state and the packet's version's word (zero if another session's). */
    action load() {
        meta.agg.idx = meta.job.pool_base + (bit<32>)hdr.passing.slot;
        slot_state.read(meta.agg.st, meta.agg.idx);
        bit<368> st = meta.agg.st;
        bool fresh = st[367:336] == meta.job.gen && st[335:272] == hdr.passing.session;
        bool v1 = hdr.passing.version[0:0] == 1;
        meta.agg.cur = !fresh ? 136w0 : (v1 ? st[271:136] : st[135:0]);
        meta.agg.oth = !fresh ? 136w0 : (v1 ? st[135:0] : st[271:136]);
        /* Another session's (or job's) round still open here: a result from the spine may
         * take the slot over only when nothing of anyone's is in progress in it. */
        meta.agg.foreign_open = (!fresh && ((st[63:0] != 0 && st[97:97] == 0) ||
                                            (st[199:136] != 0 && st[233:233] == 0))) ? 1w1 : 1w0;
    }

    /* The packet's round against the one its version holds, in serial-number order (RFC
     * 1982): older means the slot has left the packet's round behind. A version holds a round
     * once a contribution started it or a result from the spine closed it. */
    action place() {
        bit<136> cur = meta.agg.cur;
        bool used = cur[63:0] != 0 || cur[97:97] == 1;
        bit<32> d = hdr.passing.round - cur[135:104];
        bool same = used && d == 0;
        meta.agg.same = same ? 1w1 : 1w0;
        meta.agg.older = (used && d[31:31] == 1) ? 1w1 : 1w0;
        meta.agg.closed = (same && cur[97:97] == 1) ? 1w1 : 1w0;
        meta.agg.ready = (same && cur[96:96] == 1) ? 1w1 : 1w0;
        meta.agg.mine = (same && (cur[63:0] & (64w1 << hdr.passing.contributor)) != 0) ?
                        1w1 : 1w0;
    }

    /* The packet's one event. */
    action decide() {
        bool is_result = (hdr.passing.flags & FLAG_RESULT) == FLAG_RESULT;
        bool close = (hdr.passing.flags & FLAG_CLOSE) == FLAG_CLOSE;
        bool older = meta.agg.older == 1;
        bool closed = meta.agg.closed == 1;
        bool ready = meta.agg.ready == 1;
        bool mine = meta.agg.mine == 1;
        /* A new contribution: the first of a newer round, or one not yet counted in a round
         * still open. A contribution after its round closed is late and never added. */
        bool restart = meta.agg.same == 0 && !older;
        bool is_new = !is_result && !older && (restart || (!mine && !closed));
        bool first = is_new && restart;
        bit<8> cnt = first ? 8w1 : (restart ? 8w0 :
                     (is_new ? meta.agg.cur[71:64] + 1 : meta.agg.cur[71:64]));
        bool full = cnt == meta.job.fan_in;
        bool completes = !is_result && !older && !closed &&
                         ((is_new && full) || (close && cnt >= meta.job.quorum));
        meta.agg.is_new = is_new ? 1w1 : 1w0;
        meta.agg.first = first ? 1w1 : 1w0;
        meta.agg.restart = restart ? 1w1 : 1w0;
        meta.agg.cnt = cnt;
        meta.agg.event =
            is_result ? ((older || meta.agg.foreign_open == 1) ? DROP_STALE_RESULT :
                         EVT_DOWNLINK) :
            (older ? DROP_STALE_ROUND :
            (completes ? (meta.job.is_root == ROLE_ROOT ?
                              (full ? EVT_COMPLETE_ROOT : EVT_CLOSED_ROOT) :
                              (full ? EVT_COMPLETE_UP : EVT_CLOSED_UP)) :
            (is_new ? EVT_PARTIAL :
            (mine ? (ready ? EVT_RESULT_AGAIN : (closed ? EVT_RESEND_UP : EVT_DUPLICATE)) :
            (ready ? EVT_LATE_RESULT : EVT_LATE)))));
    }

    /* The slot after the packet, written back, and what leaves where. */
    action commit() {
        bit<136> cur = meta.agg.cur;
        bit<8> ev = meta.agg.event;
        bool is_new = meta.agg.is_new == 1;
        bool first = meta.agg.first == 1;
        bool restart = meta.agg.restart == 1;
        bool stored = ev == EVT_DOWNLINK;
        bool final = ev == EVT_COMPLETE_ROOT || ev == EVT_CLOSED_ROOT;
        bool up = ev == EVT_COMPLETE_UP || ev == EVT_CLOSED_UP;
        bit<64> mybit = 64w1 << hdr.passing.contributor;
        bit<32> vbase = ((meta.agg.idx << 1) + (bit<32>)hdr.passing.version[0:0]) * VALUE_WORDS;

        /* Values: the spine's result, or a round's first contribution, overwrite; later
         * contributions add; anything else leaves the slot as it is. */
        bool overwrite = stored || first;
        MERGE_WORD(0)
#if VALUE_WORDS > 1
        MERGE_WORD(1)
#endif
#if VALUE_WORDS > 2
        MERGE_WORD(2)
        MERGE_WORD(3)
#endif
#if VALUE_WORDS > 4
        MERGE_WORD(4)
#endif
#if VALUE_WORDS > 5
        MERGE_WORD(5)
        MERGE_WORD(6)
        MERGE_WORD(7)
        MERGE_WORD(8)
        MERGE_WORD(9)
        MERGE_WORD(10)
        MERGE_WORD(11)
        MERGE_WORD(12)
        MERGE_WORD(13)
        MERGE_WORD(14)
        MERGE_WORD(15)
        MERGE_WORD(16)
        MERGE_WORD(17)
        MERGE_WORD(18)
        MERGE_WORD(19)
        MERGE_WORD(20)
        MERGE_WORD(21)
        MERGE_WORD(22)
        MERGE_WORD(23)
        MERGE_WORD(24)
        MERGE_WORD(25)
        MERGE_WORD(26)
        MERGE_WORD(27)
        MERGE_WORD(28)
        MERGE_WORD(29)
        MERGE_WORD(30)
        MERGE_WORD(31)
#endif

        bit<8> ex = overwrite ? hdr.passing.exp :
                    ((is_new && hdr.passing.exp > cur[79:72]) ? hdr.passing.exp : cur[79:72]);
        bit<16> ns = overwrite ? hdr.passing.num_contrib :
                     (is_new ? cur[95:80] + hdr.passing.num_contrib : cur[95:80]);
        /* The mark: of the packets counted into the round (the first, a new one, the spine's
         * result), any that carried FLAG_CONGESTED. */
        bool absorbs = is_new || stored;
        bool marked = (absorbs && (hdr.passing.flags & FLAG_CONGESTED) != 0) ||
                      (!restart && cur[98:98] == 1);
        bit<8> flags = ((stored || final) ? 8w3 : (up ? 8w2 : (first ? 8w0 : cur[103:96]))) |
                       (marked ? 8w4 : 8w0);
        /* A newer round starts from the packet: its sender alone, or (a result from the spine
         * for a round this switch never closed) nobody. */
        bit<64> bm = restart ? (is_new ? mybit : 64w0) :
                     (is_new ? cur[63:0] | mybit : cur[63:0]);
        bit<32> rnd = restart ? hdr.passing.round : cur[135:104];
        bit<136> word = rnd ++ flags ++ ns ++ ex ++ meta.agg.cnt ++ bm;
        /* A refused packet leaves the slot exactly as it was: only contributions, and results
         * from the spine, of a round not left behind may take a slot over for their session. */
        slot_state.write(meta.agg.idx,
                         (ev == DROP_STALE_RESULT || ev == DROP_STALE_ROUND) ? meta.agg.st :
                         meta.job.gen ++ hdr.passing.session ++
                         (hdr.passing.version[0:0] == 1 ? word ++ meta.agg.oth :
                                                     meta.agg.oth ++ word));

        /* What leaves, and where. Dropped events leave nothing. A sum that goes up carries
         * the hosts' CLOSE: their patience ran out at the level above too. */
        bool resend = ev == EVT_RESEND_UP;
        bool unicast = ev == EVT_RESULT_AGAIN || ev == EVT_LATE_RESULT;
        hdr.passing.exp = ex;
        hdr.passing.num_contrib = ns;
        /* Whatever leaves names the pool it was summed in, so the next switch uses the same. */
        hdr.passing.flags = (hdr.passing.flags & FLAG_POOL) | (marked ? FLAG_CONGESTED : 8w0) |
                            (up ? (FLAG_CONTRIB | (hdr.passing.flags & FLAG_CLOSE)) :
                             (resend ? (FLAG_CONTRIB | FLAG_RETRANS |
                                        (hdr.passing.flags & FLAG_CLOSE)) : FLAG_RESULT));
        hdr.passing.level = (up || resend) ? hdr.passing.level + 1 : hdr.passing.level;
        sm.mcast_grp = (final || stored) ? meta.job.mcast_grp : 16w0;
        meta.reply_rid = unicast ? (bit<16>)hdr.passing.contributor : 16w0;
        sm.egress_spec = unicast ? sm.ingress_port :
                         ((up || resend) ? meta.job.uplink_port : DROP_PORT);
    }

    apply {
        load();
        place();
        decide();
        commit();
        event = meta.agg.event;
    }
}

#endif
