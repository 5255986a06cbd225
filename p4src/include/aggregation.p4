/* Slot pools: the SwitchML aggregation protocol with two versions per slot, generalised to a
 * two-level tree (ATP-style: a non-root switch sends its finished slot up as one contribution and
 * multicasts the result that comes back down).
 *
 * State per slot (register slot_state, 176 bits, one read and one write per packet):
 *   [175:144] gen   job generation that wrote it; any other value means "empty"
 *   [143:72]  version 1 word, [71:0] version 0 word, each:
 *     [31:0] contributor bitmap  [39:32] count  [47:40] max exp  [63:48] sum of num_contrib
 *     [71:64] rdy: the slot holds the final result (always at a root once complete; at a
 *             non-root only after the result came back from the spine)
 * Values per slot and version (register slot_values, index 2*slot+version): the K lanes of the
 * running sum packed in one 2048-bit word, added lane-parallel (SWAR): the low 31 bits of each
 * lane are added with the top bits masked off, so a carry can never leave its lane, and the top
 * bits are then restored by XOR. This gives exact 32-bit wrap-around sums per lane for the cost of
 * one register read, one expression and one register write per packet, which is what BMv2's
 * per-primitive cost rewards.
 */
#ifndef _PASSING_AGGREGATION_P4_
#define _PASSING_AGGREGATION_P4_

#include "headers.p4"

control Aggregation(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm,
                    out bit<8> jdrop) {
    @name(".slot_state") register<bit<176>>(SLOT_CAPACITY) slot_state;
    @name(".slot_values") register<bit<VALUES_BITS>>(SLOT_CAPACITY * 2) slot_values;

    @name(".job_contributions") counter(MAX_JOBS, CounterType.packets_and_bytes) job_contributions;
    @name(".job_duplicates") counter(MAX_JOBS, CounterType.packets_and_bytes) job_duplicates;
    @name(".job_results") counter(MAX_JOBS, CounterType.packets_and_bytes) job_results;
    @name(".job_result_retransmits") counter(MAX_JOBS, CounterType.packets_and_bytes) job_result_retransmits;
    @name(".job_uplink") counter(MAX_JOBS, CounterType.packets_and_bytes) job_uplink;
    @name(".job_downlink") counter(MAX_JOBS, CounterType.packets_and_bytes) job_downlink;

    apply {
        jdrop = DROP_NONE;
        bit<32> idx = meta.job.pool_base + (bit<32>)hdr.passing.slot;
        bit<32> vidx = (idx << 1) + (bit<32>)hdr.passing.version;

        bit<176> st;
        slot_state.read(st, idx);
        bit<72> v0 = st[71:0];
        bit<72> v1 = st[143:72];
        if (st[175:144] != meta.job.gen) {
            v0 = 0;
            v1 = 0;
        }
        bit<72> cur = v0;
        bit<72> oth = v1;
        if (hdr.passing.version == 1) {
            cur = v1;
            oth = v0;
        }
        bit<32> bm = cur[31:0];
        bit<8> cnt = cur[39:32];
        bit<8> ex = cur[47:40];
        bit<16> ns = cur[63:48];
        bit<8> rdy = cur[71:64];
        bit<32> mybit = 32w1 << hdr.passing.contributor;
        bit<VALUES_BITS> acc;
        bit<1> store = 0;

        if ((hdr.passing.flags & FLAG_RESULT) == FLAG_RESULT) {
            /* A result from the spine (admission allowed it only at a non-root, from the uplink).
             * Accept it only for a slot whose rack sum this switch completed and sent up. */
            if (cnt != meta.job.fan_in) {
                jdrop = DROP_STALE_RESULT;
            } else {
                slot_values.write(vidx, hdr.values.data);
                rdy = 1;
                ex = hdr.passing.exp;
                ns = hdr.passing.num_contrib;
                store = 1;
                hdr.passing.flags = FLAG_RESULT;
                sm.mcast_grp = meta.job.mcast_grp;
                job_downlink.count(meta.job.stat_idx);
            }
        } else if ((bm & mybit) == 0) {
            /* A new contribution. Joining this version means the sender has the result of the
             * other version, so its bit there is cleared: that is what lets the other version be
             * reused once every contributor has moved on. */
            oth[31:0] = oth[31:0] & ~mybit;
            if (bm == 0) {
                /* First contribution of a new round: overwrite whatever the slot held. */
                acc = hdr.values.data;
                cnt = 1;
                ex = hdr.passing.exp;
                ns = hdr.passing.num_contrib;
                rdy = 0;
            } else {
                slot_values.read(acc, vidx);
                acc = ((acc & LANE_LOW) + (hdr.values.data & LANE_LOW)) ^
                      ((acc ^ hdr.values.data) & LANE_MSB);
                cnt = cnt + 1;
                if (hdr.passing.exp > ex) {
                    ex = hdr.passing.exp;
                }
                ns = ns + hdr.passing.num_contrib;
            }
            bm = bm | mybit;
            slot_values.write(vidx, acc);
            store = 1;
            job_contributions.count(meta.job.stat_idx);
            if (cnt == meta.job.fan_in) {
                hdr.values.data = acc;
                hdr.passing.exp = ex;
                hdr.passing.num_contrib = ns;
                if (meta.job.is_root == ROLE_ROOT) {
                    rdy = 1;
                    hdr.passing.flags = FLAG_RESULT;
                    sm.mcast_grp = meta.job.mcast_grp;
                    job_results.count(meta.job.stat_idx);
                } else {
                    hdr.passing.flags = FLAG_CONTRIB;
                    hdr.passing.level = hdr.passing.level + 1;
                    sm.egress_spec = meta.job.uplink_port;
                    job_uplink.count(meta.job.stat_idx);
                }
            } else {
                mark_to_drop(sm);
            }
        } else if (rdy != 0) {
            /* Retransmission into a finished slot: the sender lost the result; only it gets it. */
            slot_values.read(acc, vidx);
            hdr.values.data = acc;
            hdr.passing.exp = ex;
            hdr.passing.num_contrib = ns;
            hdr.passing.flags = FLAG_RESULT;
            sm.egress_spec = sm.ingress_port;
            job_result_retransmits.count(meta.job.stat_idx);
        } else if (cnt == meta.job.fan_in) {
            /* Non-root, rack sum sent up but no result yet: the uplink packet or the spine's
             * answer may be lost, so send the rack sum up again. */
            slot_values.read(acc, vidx);
            hdr.values.data = acc;
            hdr.passing.exp = ex;
            hdr.passing.num_contrib = ns;
            hdr.passing.flags = FLAG_CONTRIB | FLAG_RETRANS;
            hdr.passing.level = hdr.passing.level + 1;
            sm.egress_spec = meta.job.uplink_port;
            job_uplink.count(meta.job.stat_idx);
        } else {
            /* Already counted in this round and the round is not finished. */
            job_duplicates.count(meta.job.stat_idx);
            mark_to_drop(sm);
        }

        if (store == 1) {
            bit<72> nw = rdy ++ ns ++ ex ++ cnt ++ bm;
            if (hdr.passing.version == 1) {
                slot_state.write(idx, meta.job.gen ++ nw ++ oth);
            } else {
                slot_state.write(idx, meta.job.gen ++ oth ++ nw);
            }
        }
    }
}

#endif
