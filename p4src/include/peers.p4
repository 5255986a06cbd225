/* Egress addressing of aggregation packets. Every PASSING packet the switch sends (multicast
 * replica, unicast result, rack sum to the spine) is re-addressed here from (job, egress port,
 * rid): to a member host (one rid per contributor behind the port: the replica's egress_rid, or
 * the asking contributor's id for a unicast answer), to a member ToR, or to the spine (rid 0).
 * Source addresses are the switch's own. */
#ifndef _PASSING_PEERS_P4_
#define _PASSING_PEERS_P4_

#include "headers.p4"

control PeerRewrite(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    /* Packets the controller gave no address for (a configuration error, never a data error). */
    @name(".egress_drops") counter(1, CounterType.packets) egress_drops;

    /* contributor: the recipient's id for results, this switch's id at the spine for rack sums. */
    @name(".set_peer") action set_peer(bit<48> dst_mac, bit<48> src_mac, bit<32> dst_ip,
                                       bit<32> src_ip, bit<16> dst_port, bit<8> contributor) {
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ethernet.src_addr = src_mac;
        hdr.ipv4.dst_addr = dst_ip;
        hdr.ipv4.src_addr = src_ip;
        hdr.udp.src_port = PASSING_UDP_PORT;
        hdr.udp.dst_port = dst_port;
        hdr.udp.checksum = 0;
        hdr.passing.contributor = contributor;
    }
    @name(".no_peer") action no_peer() {
        egress_drops.count(0);
        mark_to_drop(sm);
    }
    @name(".peer_rewrite") table peer_rewrite {
        key = {
            hdr.passing.job_id: exact @name("job_id");
            sm.egress_port: exact @name("egress_port");
            meta.peer_rid: exact @name("rid");
        }
        actions = { set_peer; @defaultonly no_peer; }
        default_action = no_peer();
        size = 8192;
    }
    apply {
        /* At most one of the two is non-zero: replicas have no reply_rid, answers no rid. */
        meta.peer_rid = sm.egress_rid | meta.reply_rid;
        peer_rewrite.apply();
    }
}

#endif
