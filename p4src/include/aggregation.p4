/* Slot pools: the SwitchML aggregation protocol with two versions per slot, generalised to a
 * two-level tree (ATP-style: a non-root switch sends its finished slot up as one contribution and
 * multicasts the result that comes back down).
 *
 * State per slot (register slot_state, 240 bits):
 *   [239:208] gen      job generation that wrote it
 *   [207:144] session  the agents' session that wrote it
 *   Slot state of any other (gen, session) reads as empty: a contribution of a new session
 *   takes the slot over, so no session ever sees another's sums (docs/protocol.md, Sessions).
 *   [143:72]  version 1 word, [71:0] version 0 word, each:
 *     [31:0] contributor bitmap  [39:32] count  [47:40] max exp  [63:48] sum of num_contrib
 *     [71:64] rdy: the slot holds the final result (at a root as soon as it completes; at a
 *             non-root once the result came back from the spine)
 * Values per slot and version (register slot_values): the K lanes of the running sum in
 * VALUE_WORDS 2048-bit words of 64 lanes, word w of version v of slot s at index
 * (2*s+v)*VALUE_WORDS + w (word 0 holds values 0..63, as hdr.values.w0). Each word is added
 * lane-parallel (SWAR): the low 31 bits of each lane are added with the top bits masked off, so a
 * carry can never leave its lane, and the top bits are then restored by XOR. That gives exact
 * 32-bit wrap-around sums per lane.
 *
 * BMv2 pays per action, table and primitive, not per bit, so this control is straight-line code:
 * slot_state is read and written once per packet, and each of the slot's value words once (a
 * write of an unchanged value where the packet changes nothing), and every decision is an
 * expression. The words are spelled out one by one (MERGE_WORD below): P4 has no loops in
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
    @name(".slot_state") register<bit<240>>(SLOT_CAPACITY) slot_state;
    @name(".slot_values") register<bit<WORD_BITS>>(SLOT_CAPACITY * 2 * VALUE_WORDS) slot_values;

    /* One action: inside an action p4c keeps ?: as an expression for BMv2, where in an apply
     * block it would turn each one into branches, tables and actions. */
    action aggregate() {
        bit<32> idx = meta.job.pool_base + (bit<32>)hdr.passing.slot;
        bit<32> vbase = ((idx << 1) + (bit<32>)hdr.passing.version) * VALUE_WORDS;
        bit<240> st;
        slot_state.read(st, idx);

        /* This version's word and the other one; all zero if written by another generation
         * or another session. */
        bool fresh = st[239:208] == meta.job.gen && st[207:144] == hdr.passing.session;
        bool v1 = hdr.passing.version == 1;
        bit<72> cur = !fresh ? 72w0 : (v1 ? st[143:72] : st[71:0]);
        bit<72> oth = !fresh ? 72w0 : (v1 ? st[71:0] : st[143:72]);
        bit<32> mybit = 32w1 << hdr.passing.contributor;
        bit<8> fan_in = meta.job.fan_in;

        bool is_result = (hdr.passing.flags & FLAG_RESULT) == FLAG_RESULT;
        /* A new contribution; the first of a round finds the bitmap empty. */
        bool is_new = !is_result && (cur[31:0] & mybit) == 0;
        bool first = cur[31:0] == 0;
        bit<8> cnt = !is_new ? cur[39:32] : (first ? 8w1 : cur[39:32] + 1);

        event = is_result ?
                    (cur[39:32] != fan_in ? DROP_STALE_RESULT : EVT_DOWNLINK) :
                (is_new ?
                    (cnt != fan_in ? EVT_PARTIAL :
                     (meta.job.is_root == ROLE_ROOT ? EVT_COMPLETE_ROOT : EVT_COMPLETE_UP)) :
                (cur[71:64] != 0 ? EVT_RESULT_AGAIN :
                 (cur[39:32] == fan_in ? EVT_RESEND_UP : EVT_DUPLICATE)));
        bool stored = event == EVT_DOWNLINK;

        /* Values: the spine's result, or the first contribution, overwrite; later
         * contributions add; anything else leaves the slot as it is. */
        bool overwrite = stored || (is_new && first);
        MERGE_WORD(0)
#if VALUE_WORDS > 1
        MERGE_WORD(1)
#endif
#if VALUE_WORDS > 2
        MERGE_WORD(2)
        MERGE_WORD(3)
#endif

        bit<8> ex = overwrite ? hdr.passing.exp :
                    ((is_new && hdr.passing.exp > cur[47:40]) ? hdr.passing.exp : cur[47:40]);
        bit<16> ns = overwrite ? hdr.passing.num_contrib :
                     (is_new ? cur[63:48] + hdr.passing.num_contrib : cur[63:48]);
        bit<8> rdy = (stored || event == EVT_COMPLETE_ROOT) ? 8w1 :
                     ((is_new && first) ? 8w0 : cur[71:64]);
        bit<32> bm = is_new ? cur[31:0] | mybit : cur[31:0];
        /* Joining this version means the sender has the other version's result, so its bit
         * there is cleared: that lets the other version be reused once all have moved on. */
        bit<72> other = is_new ? oth & ~((bit<72>)mybit) : oth;
        bit<72> mine = rdy ++ ns ++ ex ++ cnt ++ bm;
        /* A refused result leaves the slot exactly as it was: only contributions may take a
         * slot over for their session. */
        slot_state.write(idx, event == DROP_STALE_RESULT ? st :
                              meta.job.gen ++ hdr.passing.session ++
                              (v1 ? mine ++ other : other ++ mine));

        /* What leaves, and where. Dropped events leave nothing. */
        bool up = event == EVT_COMPLETE_UP || event == EVT_RESEND_UP;
        hdr.passing.exp = ex;
        hdr.passing.num_contrib = ns;
        hdr.passing.flags = (event == EVT_COMPLETE_UP) ? FLAG_CONTRIB :
                            ((event == EVT_RESEND_UP) ? (FLAG_CONTRIB | FLAG_RETRANS) : FLAG_RESULT);
        hdr.passing.level = up ? hdr.passing.level + 1 : hdr.passing.level;
        sm.mcast_grp = (event == EVT_COMPLETE_ROOT || stored) ? meta.job.mcast_grp : 16w0;
        meta.reply_rid = (event == EVT_RESULT_AGAIN) ? (bit<16>)hdr.passing.contributor : 16w0;
        sm.egress_spec = (event == EVT_RESULT_AGAIN) ? sm.ingress_port :
                         (up ? meta.job.uplink_port : DROP_PORT);
    }

    apply {
        aggregate();
    }
}

#endif
