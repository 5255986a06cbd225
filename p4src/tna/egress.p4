/* Egress: every PASSING packet the switch sends is re-addressed from (job, egress port, rid), as
 * the v1model program's peers.p4 does it (the same table and action), and marked when its queue
 * was deep; a flooded copy never goes back out of the port it came in on. */
#ifndef _PASSING_TNA_EGRESS_P4_
#define _PASSING_TNA_EGRESS_P4_

#include "headers.p4"

control PassingEgress(inout headers_t hdr, inout egress_metadata_t meta,
                      in egress_intrinsic_metadata_t eg_md,
                      in egress_intrinsic_metadata_from_parser_t prsr_md,
                      inout egress_intrinsic_metadata_for_deparser_t dprsr_md,
                      inout egress_intrinsic_metadata_for_output_port_t oport_md) {
    @name(".egress_drops") Counter<bit<32>, bit<1>>(1, CounterType_t.PACKETS) egress_drops;

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
        dprsr_md.drop_ctl = DROP_CTL_DROP;
    }
    @name(".peer_rewrite") table peer_rewrite {
        key = {
            hdr.passing.job_id: exact @name("job_id");
            eg_md.egress_port: exact @name("egress_port");
            meta.peer_rid: exact @name("rid");
        }
        actions = { set_peer; @defaultonly no_peer; }
        default_action = no_peer();
        size = 8192;
    }

    apply {
        if (hdr.passing.isValid()) {
            /* At most one is non-zero: replicas have no reply_rid, answers no rid. */
            meta.peer_rid = eg_md.egress_rid | (bit<16>)meta.bridge.reply_cid;
            peer_rewrite.apply();
            if (eg_md.enq_qdepth >= MARK_QDEPTH) {
                hdr.passing.flags = hdr.passing.flags | FLAG_CONGESTED;
            }
        } else if (meta.bridge.flooded == 1 && eg_md.egress_port == meta.bridge.ingress_port) {
            dprsr_md.drop_ctl = DROP_CTL_DROP;
        }
    }
}

#endif
