/* PASSING on Tofino 2 (T2NA): the v1model program's pipeline with Tofino's registers, one pass
 * through the ingress of one pipe (docs/tofino.md). One concern per file; this one wires them
 * together. */
#include <core.p4>
#if __TARGET_TOFINO__ == 2
#include <t2na.p4>
#else
/* Tofino 1's register actions return one word: the values' pairs and the slot state's three
 * answers need Tofino 2's (docs/tofino.md, "Tofino 1"). */
#error "the TNA program is for Tofino 2: p4c-barefoot --target tofino2 --arch t2na"
#endif

#include "config.p4"
#include "headers.p4"
#include "parser.p4"
#include "admission.p4"
#include "guard.p4"
#include "forwarding.p4"
#include "slot_state.p4"
#include "slot_status.p4"
#include "slot_values.p4"
#include "egress.p4"

control PassingIngress(inout headers_t hdr, inout metadata_t meta,
                       in ingress_intrinsic_metadata_t ig_md,
                       in ingress_intrinsic_metadata_from_parser_t prsr_md,
                       inout ingress_intrinsic_metadata_for_deparser_t dprsr_md,
                       inout ingress_intrinsic_metadata_for_tm_t tm_md) {
    @name(".global_drops") Counter<bit<32>, bit<32>>(GLOBAL_DROP_SLOTS, CounterType_t.PACKETS)
        global_drops;
    @name(".job_stats") Counter<bit<32>, bit<32>>(MAX_JOBS * JOB_STATS_STRIDE,
                                                  CounterType_t.PACKETS_AND_BYTES) job_stats;
    @name(".late_contribs") Counter<bit<32>, bit<32>>(MAX_JOBS * MAX_FAN_IN,
                                                      CounterType_t.PACKETS) late_contribs;
    @name(".pool_contribs") Counter<bit<32>, bit<32>>(MAX_JOBS * 2 * MAX_FAN_IN,
                                                      CounterType_t.PACKETS) pool_contribs;

    JobAdmission() admission;
    StatusInputs() status_inputs;
    ContributorBit() contributor_bit;
    ResultGuard() guard;
    L2Forward() l2;
    SlotState() slot_state;
    SlotStatus() slot_status;
    SlotValues() slot_values;

    /* What leaves, and where (the v1model program's commit()). The flags are rebuilt from the
     * bits kept and the bits set, each in metadata: Tofino writes a header byte only whole. */
    action send_up(bit<8> retrans) {
        meta.flag_keep = hdr.passing.flags & (FLAG_POOL | FLAG_CLOSE);
        meta.flag_set = FLAG_CONTRIB | retrans;
        hdr.passing.level = hdr.passing.level + 1;
        tm_md.ucast_egress_port = meta.job.uplink_port;
    }
    action multicast() {
        meta.flag_keep = hdr.passing.flags & FLAG_POOL;
        meta.flag_set = FLAG_RESULT;
        tm_md.mcast_grp_a = meta.job.mcast_grp;
    }
    action answer() {
        meta.flag_keep = hdr.passing.flags & FLAG_POOL;
        meta.flag_set = FLAG_RESULT;
        hdr.bridge.reply_cid = hdr.passing.contributor;
        tm_md.ucast_egress_port = ig_md.ingress_port;
    }
    action consume() {
        dprsr_md.drop_ctl = DROP_CTL_DROP;
    }
    table route {
        key = { meta.agg.event: exact; }
        actions = { send_up; multicast; answer; consume; }
        const entries = {
            EVT_COMPLETE_UP: send_up(0);
            EVT_CLOSED_UP: send_up(0);
            EVT_RESEND_UP: send_up(FLAG_RETRANS);
            EVT_COMPLETE_ROOT: multicast();
            EVT_CLOSED_ROOT: multicast();
            EVT_DOWNLINK: multicast();
            EVT_RESULT_AGAIN: answer();
            EVT_LATE_RESULT: answer();
        }
        default_action = consume();
        size = 16;
    }

    /* The counters count from tables of their own: Tofino takes a counter's index from one
     * field, which the earlier stages computed. */
    action count_pool() { pool_contribs.count(meta.stat_row); }
    table count_pool_contrib {
        actions = { count_pool; }
        default_action = count_pool();
        size = 1;
    }
    action count_late() { late_contribs.count(meta.stat_row); }
    table count_late_contrib {
        actions = { count_late; }
        default_action = count_late();
        size = 1;
    }
    action count_event() { job_stats.count(meta.stat_row); }
    table count_job_event {
        actions = { count_event; }
        default_action = count_event();
        size = 1;
    }

    apply {
        meta.gdrop = DROP_NONE;
        meta.jdrop = DROP_NONE;
        bit<1> count_job = 0;
        if (hdr.udp.isValid() && hdr.udp.dst_port == PASSING_UDP_PORT) {
            if ((hdr.passing.flags & (FLAG_CONTRIB | FLAG_RESULT)) == FLAG_CONTRIB) {
                meta.is_contrib = 1;
            }
            if ((hdr.passing.flags & (FLAG_CONTRIB | FLAG_RESULT)) == FLAG_RESULT) {
                meta.is_result = 1;
            }
            if ((hdr.passing.flags & FLAG_CLOSE) != 0) {
                meta.is_close = 1;
            }
            if ((hdr.passing.flags & FLAG_CONGESTED) != 0) {
                meta.is_cong = 1;
            }
            admission.apply(hdr, meta, ig_md.ingress_port);
            status_inputs.apply(hdr, meta);
            contributor_bit.apply(hdr, meta);
            /* Version v of slot idx at idx + v * TNA_SLOTS (slot < pool_size is checked). */
            if ((hdr.passing.version & 1) == 1) {
                meta.agg.vidx = meta.agg.idx + TNA_SLOTS;
            } else {
                meta.agg.vidx = meta.agg.idx;
            }
            if (meta.gdrop == DROP_NONE) {
                count_job = 1;
                meta.agg.event = meta.jdrop;
                if (meta.jdrop == DROP_NONE) {
                    if (meta.is_contrib == 1) {
                        /* (stat_idx * 2 + pool) * MAX_FAN_IN + contributor */
                        if ((hdr.passing.flags & FLAG_POOL) != 0) {
                            meta.stat_row = meta.job.row_pool1[31:6] ++
                                            hdr.passing.contributor[5:0];
                        } else {
                            meta.stat_row = meta.job.row_pool[31:6] ++
                                            hdr.passing.contributor[5:0];
                        }
                        count_pool_contrib.apply();
                    }
                    slot_state.apply(hdr, meta);
                    slot_status.apply(hdr, meta);
                    slot_values.apply(hdr, meta);
                    hdr.passing.exp = meta.agg.exp;
                    hdr.passing.num_contrib = meta.agg.nsum;
                    route.apply();
                    if (meta.agg.marked != 0) {
                        meta.flag_set = meta.flag_set | FLAG_CONGESTED;
                    }
                    meta.flag_keep = meta.flag_keep | meta.flag_set;
                    hdr.passing.flags = meta.flag_keep;
                    hdr.bridge.passing = 1;
                } else {
                    consume();
                }
                if (meta.agg.event == EVT_LATE || meta.agg.event == EVT_LATE_RESULT ||
                        meta.agg.event == DROP_STALE_ROUND) {
                    meta.stat_row = meta.job.row_late[31:6] ++ hdr.passing.contributor[5:0];
                    count_late_contrib.apply();
                }
            }
        } else if (hdr.ethernet.isValid()) {
            guard.apply(hdr, meta);
            if (meta.gdrop == DROP_NONE && meta.guarded == 1) {
                count_job = 1;
                meta.agg.event = DROP_FORGED_RESULT;
                consume();
            } else if (meta.gdrop == DROP_NONE) {
                l2.apply(hdr, tm_md, dprsr_md);
            }
        } else {
            consume();
        }
        if (meta.gdrop != DROP_NONE) {
            global_drops.count((bit<32>)meta.gdrop);
            consume();
        }
        if (count_job == 1) {
            meta.stat_row = meta.job.row_stats[31:5] ++ meta.agg.event[4:0];
            count_job_event.apply();
        }
    }
}

@pa_auto_init_metadata
Pipeline(PassingIngressParser(), PassingIngress(), PassingIngressDeparser(),
         PassingEgressParser(), PassingEgress(), PassingEgressDeparser()) pipe;

Switch(pipe) main;
