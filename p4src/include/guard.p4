/* Results reach an agent only from its own switch. A result is addressed at the switch that
 * delivers it (peer_rewrite), so any other UDP packet that looks like one is forged: one sent
 * from the aggregation port (48879) to another port, or one addressed to a port the controller
 * reserved for a job's agents. Both are dropped and counted before L2 forwarding sees them, and
 * so is UDP whose ports the parser cannot see (IPv4 options, a VLAN tag: the fabric carries
 * untagged Ethernet only, so every tagged frame is dropped). Later fragments carry no UDP
 * header; without their first fragment, which these checks see, they reassemble into nothing. */
#ifndef _PASSING_GUARD_P4_
#define _PASSING_GUARD_P4_

#include "headers.p4"

control ResultGuard(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm,
                    out bit<8> gdrop, out bit<1> guarded) {
    /* The job whose agents receive on this UDP port: its counter row takes the drop. */
    @name(".guard_port") action guard_port(bit<32> stat_idx) {
        guarded = 1;
        meta.job.stat_idx = stat_idx;
    }
    @name(".result_guard") table result_guard {
        key = { hdr.udp.dst_port: exact @name("udp_port"); }
        actions = { guard_port; @defaultonly NoAction; }
        default_action = NoAction();
        size = 1024;
    }

    apply {
        gdrop = DROP_NONE;
        guarded = 0;
        if (hdr.ethernet.ether_type == ETHERTYPE_VLAN || hdr.ethernet.ether_type == ETHERTYPE_QINQ ||
                hdr.ethernet.ether_type == ETHERTYPE_QINQ_OLD) {
            gdrop = GDROP_TAGGED;
        } else if (hdr.udp.isValid()) {
            if (hdr.udp.src_port == PASSING_UDP_PORT) {
                gdrop = GDROP_FORGED;
            } else {
                result_guard.apply();
            }
        } else if (hdr.ipv4.isValid() && hdr.ipv4.protocol == IP_PROTO_UDP &&
                   hdr.ipv4.frag_offset == 0) {
            /* IPv4 options (or a cut UDP header) hide the ports from the parser: such a
             * datagram could carry a forged result past the checks above. */
            gdrop = GDROP_UNCHECKED_UDP;
        }
    }
}

#endif
