/* PASSING: in-network aggregation of pre-aggregated gradients (v1model, BMv2 simple_switch_grpc).
 * One concern per file under include/; this file only wires them together. */
#include <core.p4>
#include <v1model.p4>

#include "include/config.p4"
#include "include/headers.p4"
#include "include/parser.p4"
#include "include/checksums.p4"
#include "include/forwarding.p4"
#include "include/job_admission.p4"
#include "include/guard.p4"
#include "include/aggregation.p4"
#include "include/peers.p4"
#include "include/fair_share.p4"

control PassingIngress(inout headers_t hdr, inout metadata_t meta,
                       inout standard_metadata_t sm) {
    @name(".global_drops") counter(GLOBAL_DROP_SLOTS, CounterType.packets) global_drops;
    @name(".job_stats") counter(MAX_JOBS * JOB_STATS_STRIDE, CounterType.packets_and_bytes)
        job_stats;
    /* Late contributions (not added: their round had closed here or was left behind) per job
     * and contributor id: who is straggling, as the switch sees it. */
    @name(".late_contribs") counter(MAX_JOBS * MAX_FAN_IN, CounterType.packets) late_contribs;
    /* Contributions admitted per pool and contributor id: once every contributor has used the
     * pool a resize moved the job to, no agent needs the old one and the controller frees it. */
    @name(".pool_contribs") counter(MAX_JOBS * 2 * MAX_FAN_IN, CounterType.packets)
        pool_contribs;

    JobAdmission() admission;
    ResultGuard() guard;
    Aggregation() aggregation;
    L2Forward() l2;

    apply {
        if (hdr.udp.isValid() && hdr.udp.dst_port == PASSING_UDP_PORT) {
            bit<8> gdrop;
            bit<8> jdrop;
            admission.apply(hdr, meta, sm, gdrop, jdrop);
            if (gdrop != DROP_NONE) {
                global_drops.count((bit<32>)gdrop);
                mark_to_drop(sm);
            } else {
                bit<8> event = jdrop;
                if (jdrop == DROP_NONE) {
                    if ((hdr.passing.flags & FLAG_CONTRIB) != 0) {
                        pool_contribs.count(((meta.job.stat_idx << 1) + (bit<32>)meta.job.pool) *
                                            MAX_FAN_IN + (bit<32>)hdr.passing.contributor);
                    }
                    aggregation.apply(hdr, meta, sm, event);
                } else {
                    mark_to_drop(sm);
                }
                job_stats.count(meta.job.stat_idx * JOB_STATS_STRIDE + (bit<32>)event);
                if (event == EVT_LATE || event == EVT_LATE_RESULT ||
                        event == DROP_STALE_ROUND) {
                    late_contribs.count(meta.job.stat_idx * MAX_FAN_IN +
                                        (bit<32>)hdr.passing.contributor);
                }
            }
        } else if (hdr.ethernet.isValid()) {
            bit<8> gdrop;
            bit<1> guarded;
            guard.apply(hdr, meta, sm, gdrop, guarded);
            if (gdrop != DROP_NONE) {
                global_drops.count((bit<32>)gdrop);
                mark_to_drop(sm);
            } else if (guarded == 1) {
                job_stats.count(meta.job.stat_idx * JOB_STATS_STRIDE +
                                (bit<32>)DROP_FORGED_RESULT);
                mark_to_drop(sm);
            } else {
                l2.apply(hdr, meta, sm);
            }
        } else {
            mark_to_drop(sm);
        }
    }
}

control PassingEgress(inout headers_t hdr, inout metadata_t meta,
                      inout standard_metadata_t sm) {
    PeerRewrite() peers;
    L2Prune() prune;
    FairShare() fair_share;

    apply {
        if (hdr.passing.isValid()) {
            peers.apply(hdr, meta, sm);
            /* ECN for aggregation: this copy waited behind MARK_QDEPTH packets or more. */
            if (sm.enq_qdepth >= MARK_QDEPTH) {
                hdr.passing.flags = hdr.passing.flags | FLAG_CONGESTED;
            }
        } else {
            prune.apply(meta, sm);
        }
        /* Every packet that leaves counts towards its port's shares (a dropped one does not). */
        if (sm.egress_spec != DROP_PORT) {
            fair_share.apply(hdr, meta, sm);
        }
    }
}

V1Switch(PassingParser(),
         PassingVerifyChecksum(),
         PassingIngress(),
         PassingEgress(),
         PassingComputeChecksum(),
         PassingDeparser()) main;
