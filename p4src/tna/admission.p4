/* Admission of aggregation packets, as the v1model program's job_admission.p4 does it: the same
 * tables (names, keys, action parameters: the controller's plan installs on both programs), the
 * same checks and the same reasons, in the same order. Tofino compares fields by subtracting
 * them in an action and matching the difference's bits, so the checks are one ternary table
 * (reject) over differences computed the stage before, its entries in the v1model order. */
#ifndef _PASSING_TNA_ADMISSION_P4_
#define _PASSING_TNA_ADMISSION_P4_

#include "headers.p4"

control JobAdmission(inout headers_t hdr, inout metadata_t meta, in PortId_t ingress_port) {
    @name(".set_job") action set_job(bit<32> pool_base, bit<16> pool_size, bit<8> fan_in,
                                     bit<8> quorum, bit<16> mcast_grp, bit<32> gen,
                                     bit<1> is_root, bit<9> uplink_port, bit<32> stat_idx,
                                     bit<7> epoch) {
        meta.job.hit = 1;
        meta.job.epoch2 = epoch ++ 1w0;
        meta.job.base16 = pool_base[15:0];
        meta.job.pool_size = pool_size;
        meta.job.fan_in = fan_in;
        meta.job.quorum = quorum;
        meta.job.mcast_grp = mcast_grp;
        meta.job.gen = gen;
        meta.job.is_root = is_root;
        meta.job.uplink_port = uplink_port;
        meta.job.row_stats = stat_idx[26:0] ++ 5w0;
        meta.job.row_late = stat_idx[25:0] ++ 6w0;
        meta.job.row_pool = stat_idx[24:0] ++ 7w0;
        meta.job.row_pool1 = stat_idx[24:0] ++ 7w0x40;
    }
    @name(".job_config") table job_config {
        key = {
            hdr.passing.job_id: exact @name("job_id");
            hdr.passing.flags[4:4]: exact @name("pool");  /* FLAG_POOL */
        }
        actions = { set_job; @defaultonly NoAction; }
        default_action = NoAction();
        size = MAX_JOBS;
    }

    @name(".set_member") action set_member(bit<8> contributor, bit<8> count) {
        meta.job.is_member = 1;
        meta.job.member_cid = contributor;
        meta.job.member_count = count;
    }
    @name(".membership") table membership {
        key = {
            hdr.passing.job_id: exact @name("job_id");
            ingress_port: exact @name("ingress_port");
        }
        actions = { set_member; @defaultonly NoAction; }
        default_action = NoAction();
        size = 8192;
    }

    action differences() {
        meta.chk.offset = hdr.passing.contributor - meta.job.member_cid;
        meta.chk.slot_room = hdr.passing.slot - meta.job.pool_size;
        meta.chk.epoch_diff = hdr.passing.version ^ meta.job.epoch2;
        meta.chk.version_diff = hdr.passing.version ^ hdr.passing.round[7:0];
        meta.chk.port_diff = ingress_port ^ meta.job.uplink_port;
        meta.agg.idx = meta.job.base16 + hdr.passing.slot;
    }
    table admission_differences {
        actions = { differences; }
        default_action = differences();
        size = 1;
    }
    action id_room() {
        meta.chk.cid_room = meta.chk.offset - meta.job.member_count;
    }
    table admission_id_room {
        actions = { id_room; }
        default_action = id_room();
        size = 1;
    }

    /* The first fault in the v1model order names the reason. A contributor id inside the
     * port's range [cid, cid + count) has an offset below count <= 64: offset - count is
     * negative; an id below the range wraps to an offset of 64 or more. The slot and the pool
     * size are below 2^15, so the sign of their difference is right. */
    action refuse(bit<8> reason) { meta.jdrop = reason; }
    table reject {
        key = {
            hdr.passing.flags: ternary;
            meta.job.is_member: ternary;
            meta.chk.offset: ternary;
            meta.chk.cid_room: ternary;
            meta.job.is_root: ternary;
            meta.chk.port_diff: ternary;
            meta.chk.epoch_diff: ternary;
            hdr.passing.slot: ternary;
            meta.chk.slot_room: ternary;
            meta.chk.version_diff: ternary;
        }
        actions = { refuse; @defaultonly NoAction; }
        const entries = {
#define ANY _, _, _, _, _, _, _, _, _
            (0x80 &&& 0x80, ANY): refuse(DROP_BAD_FLAGS);
            (0x40 &&& 0x40, ANY): refuse(DROP_BAD_FLAGS);
            (0x00 &&& 0x03, ANY): refuse(DROP_BAD_FLAGS);
            (0x03 &&& 0x03, ANY): refuse(DROP_BAD_FLAGS);
            (0x0a &&& 0x0b, ANY): refuse(DROP_BAD_FLAGS);
#undef ANY
#define ANY _, _, _, _, _, _
            (0x01 &&& 0x03, 0, _, _, ANY): refuse(DROP_NOT_MEMBER);
            (0x01 &&& 0x03, _, 0x80 &&& 0x80, _, ANY): refuse(DROP_BAD_CONTRIBUTOR);
            (0x01 &&& 0x03, _, 0x40 &&& 0x40, _, ANY): refuse(DROP_BAD_CONTRIBUTOR);
            (0x01 &&& 0x03, _, _, 0x00 &&& 0x80, ANY): refuse(DROP_BAD_CONTRIBUTOR);
#undef ANY
#define ANY _, _, _, _
#define FORGED_PORT(B) (0x02 &&& 0x03, _, _, _, _, B &&& B, ANY): refuse(DROP_FORGED_RESULT);
            (0x02 &&& 0x03, _, _, _, ROLE_ROOT, _, ANY): refuse(DROP_FORGED_RESULT);
            FORGED_PORT(0x001) FORGED_PORT(0x002) FORGED_PORT(0x004) FORGED_PORT(0x008)
            FORGED_PORT(0x010) FORGED_PORT(0x020) FORGED_PORT(0x040) FORGED_PORT(0x080)
            FORGED_PORT(0x100)
#undef FORGED_PORT
#undef ANY
#define ANY _, _, _, _, _, _
#define STALE_EPOCH(B) (ANY, B &&& B, _, _, _): refuse(DROP_STALE_POOL);
            STALE_EPOCH(0x02) STALE_EPOCH(0x04) STALE_EPOCH(0x08) STALE_EPOCH(0x10)
            STALE_EPOCH(0x20) STALE_EPOCH(0x40) STALE_EPOCH(0x80)
#undef STALE_EPOCH
            (ANY, _, 0x8000 &&& 0x8000, _, _): refuse(DROP_SLOT_RANGE);
            (ANY, _, _, 0x0000 &&& 0x8000, _): refuse(DROP_SLOT_RANGE);
            (ANY, _, _, _, 0x01 &&& 0x01): refuse(DROP_BAD_VERSION);
#undef ANY
        }
        default_action = NoAction();
        size = 64;
    }

    apply {
        if (!hdr.values.isValid() || meta.checksum_err == 1 ||
                hdr.ipv4.total_len != PASSING_IPV4_LEN || hdr.udp.length != PASSING_UDP_LEN) {
            meta.gdrop = GDROP_MALFORMED;
        } else {
            job_config.apply();
            membership.apply();
            if (meta.job.hit == 0) {
                meta.gdrop = GDROP_UNKNOWN_JOB;
            } else {
                admission_differences.apply();
                admission_id_room.apply();
                reject.apply();
            }
        }
    }
}

#endif
