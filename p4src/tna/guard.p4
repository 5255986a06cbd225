/* Results reach an agent only from its own switch: the v1model program's guard.p4, the same
 * table and reasons (a forged result, unchecked UDP, a VLAN tag), on Tofino. */
#ifndef _PASSING_TNA_GUARD_P4_
#define _PASSING_TNA_GUARD_P4_

#include "headers.p4"

control ResultGuard(inout headers_t hdr, inout metadata_t meta) {
    @name(".guard_port") action guard_port(bit<32> stat_idx) {
        meta.guarded = 1;
        meta.job.row_stats = stat_idx[26:0] ++ 5w0;
    }
    @name(".result_guard") table result_guard {
        key = { hdr.udp.dst_port: exact @name("udp_port"); }
        actions = { guard_port; @defaultonly NoAction; }
        default_action = NoAction();
        size = 1024;
    }

    apply {
        if (hdr.ethernet.ether_type == ETHERTYPE_VLAN ||
                hdr.ethernet.ether_type == ETHERTYPE_QINQ ||
                hdr.ethernet.ether_type == ETHERTYPE_QINQ_OLD) {
            meta.gdrop = GDROP_TAGGED;
        } else if (hdr.udp.isValid()) {
            if (hdr.udp.src_port == PASSING_UDP_PORT) {
                meta.gdrop = GDROP_FORGED;
            } else {
                result_guard.apply();
            }
        } else if (hdr.ipv4.isValid() && hdr.ipv4.protocol == IP_PROTO_UDP &&
                   hdr.ipv4.frag_offset == 0) {
            meta.gdrop = GDROP_UNCHECKED_UDP;
        }
    }
}

#endif
