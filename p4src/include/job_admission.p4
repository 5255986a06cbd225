/* Admission of aggregation packets: well-formedness, job lookup, membership, and the range checks
 * that guarantee a packet can only ever touch its own job's slots. A rejected packet leaves with a
 * reason: gdrop when no job can be named, jdrop otherwise; the ingress counts and drops it. */
#ifndef _PASSING_JOBS_P4_
#define _PASSING_JOBS_P4_

#include "headers.p4"

control JobAdmission(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm,
                     out bit<8> gdrop, out bit<8> jdrop) {
    /* One entry per job at this switch. gen makes slot state left by any earlier job count as
     * empty (BMv2's P4Runtime cannot clear registers); is_root/uplink_port give the job's role. */
    @name(".set_job") action set_job(bit<32> pool_base, bit<16> pool_size, bit<8> fan_in,
                                     bit<8> quorum, bit<16> mcast_grp, bit<32> gen,
                                     bit<1> is_root, bit<9> uplink_port, bit<32> stat_idx,
                                     bit<7> epoch) {
        meta.job.hit = 1;
        meta.job.epoch = epoch;
        meta.job.pool_base = pool_base;
        meta.job.pool_size = pool_size;
        meta.job.fan_in = fan_in;
        meta.job.quorum = quorum;
        meta.job.mcast_grp = mcast_grp;
        meta.job.gen = gen;
        meta.job.is_root = is_root;
        meta.job.uplink_port = uplink_port;
        meta.job.stat_idx = stat_idx;
    }
    /* Keyed by the pool bit too: during a live resize a job has two pools, the one its agents
     * are leaving and the one they move to, each with its own slots and generation. */
    @name(".job_config") table job_config {
        key = {
            hdr.passing.job_id: exact @name("job_id");
            meta.job.pool: exact @name("pool");
        }
        actions = { set_job; @defaultonly NoAction; }
        default_action = NoAction();
        size = MAX_JOBS;
    }

    /* (job, ingress port) -> the contributor ids that port may use: [contributor,
     * contributor + count). count is 1 for a server that pre-aggregates its GPUs (PASSING) and
     * the number of GPUs when each GPU streams on its own (switch-only INA). */
    @name(".set_member") action set_member(bit<8> contributor, bit<8> count) {
        meta.job.is_member = 1;
        meta.job.member_cid = contributor;
        meta.job.member_count = count;
    }
    @name(".membership") table membership {
        key = {
            hdr.passing.job_id: exact @name("job_id");
            sm.ingress_port: exact @name("ingress_port");
        }
        actions = { set_member; @defaultonly NoAction; }
        default_action = NoAction();
        size = 8192;
    }

    /* The order of these checks is part of the contract (docs/protocol.md): it decides which
     * reason a packet with several faults is counted under. An action of expressions rather
     * than if/else: BMv2 pays per action and table, and each branch would become one of each. */
    action check() {
        bit<8> kind = hdr.passing.flags & (FLAG_CONTRIB | FLAG_RESULT);
        jdrop = ((hdr.passing.flags & ~FLAGS_KNOWN) != 0 ||
                 (kind != FLAG_CONTRIB && kind != FLAG_RESULT) ||
                 (kind == FLAG_RESULT && (hdr.passing.flags & FLAG_CLOSE) != 0)) ?
                    DROP_BAD_FLAGS :
                ((kind == FLAG_CONTRIB) ?
                    ((meta.job.is_member == 0) ? DROP_NOT_MEMBER :
                     /* one unsigned compare: ids below the range wrap to large values */
                     ((hdr.passing.contributor - meta.job.member_cid >= meta.job.member_count) ?
                         DROP_BAD_CONTRIBUTOR : DROP_NONE)) :
                /* Results are only accepted from above, by a non-root switch. */
                ((meta.job.is_root == ROLE_ROOT ||
                  sm.ingress_port != meta.job.uplink_port) ? DROP_FORGED_RESULT : DROP_NONE));
        /* The epoch before the slot range: a stale pool's packet may name a slot beyond the new
         * pool, and is counted as what it is. */
        jdrop = (jdrop != DROP_NONE) ? jdrop :
                ((hdr.passing.version[7:1] != meta.job.epoch) ? DROP_STALE_POOL :
                 ((hdr.passing.slot >= meta.job.pool_size) ? DROP_SLOT_RANGE :
                  ((hdr.passing.version[0:0] != hdr.passing.round[0:0]) ? DROP_BAD_VERSION :
                   DROP_NONE)));
    }

    apply {
        gdrop = DROP_NONE;
        jdrop = DROP_NONE;
        if (!hdr.values.isValid() || sm.checksum_error == 1 ||
                hdr.ipv4.total_len != PASSING_IPV4_LEN || hdr.udp.length != PASSING_UDP_LEN) {
            gdrop = GDROP_MALFORMED;
        } else {
            meta.job.pool = (bit<1>)((hdr.passing.flags & FLAG_POOL) >> 4);
            job_config.apply();
            if (meta.job.hit == 0) {
                gdrop = GDROP_UNKNOWN_JOB;
            } else {
                membership.apply();
                check();
            }
        }
    }
}

#endif
