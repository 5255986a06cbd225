/* Parsers and deparsers of the TNA program. Ingress parses what the v1model parser does
 * (Ethernet / IPv4 without options or fragments / UDP to PASSING_UDP_PORT / passing_t / values)
 * and verifies the IPv4 checksum; a packet cut short inside the PASSING part leaves hdr.values
 * invalid, and admission drops it as malformed. Egress parses only up to the PASSING header:
 * it re-addresses the packet and never reads the values, which stay payload. */
#ifndef _PASSING_TNA_PARSER_P4_
#define _PASSING_TNA_PARSER_P4_

#include "headers.p4"

parser PassingIngressParser(packet_in packet, out headers_t hdr, out metadata_t meta,
                            out ingress_intrinsic_metadata_t ig_md) {
    Checksum() ipv4_checksum;

    state start {
        packet.extract(ig_md);
        packet.advance(PORT_METADATA_SIZE);
        /* What egress will need, set here where Tofino writes fields at no cost. */
        hdr.bridge.setValid();
        hdr.bridge.flooded = 0;
        hdr.bridge.passing = 0;
        hdr.bridge.ingress_port = ig_md.ingress_port;
        hdr.bridge.reply_cid = 0;
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        ipv4_checksum.add(hdr.ipv4);
        meta.checksum_err = (bit<1>)ipv4_checksum.verify();
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (4w5, 13w0, IP_PROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            PASSING_UDP_PORT: parse_passing;
            default: accept;
        }
    }

    state parse_passing {
        packet.extract(hdr.passing);
        packet.extract(hdr.values);
        transition accept;
    }
}

control PassingIngressDeparser(packet_out packet, inout headers_t hdr, in metadata_t meta,
                               in ingress_intrinsic_metadata_for_deparser_t dprsr_md) {
    apply {
        packet.emit(hdr.bridge);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.passing);
        packet.emit(hdr.values);
    }
}

parser PassingEgressParser(packet_in packet, out headers_t hdr, out egress_metadata_t meta,
                           out egress_intrinsic_metadata_t eg_md) {
    state start {
        packet.extract(eg_md);
        packet.extract(meta.bridge);
        meta.peer_rid = 0;
        packet.extract(hdr.ethernet);
        transition select(meta.bridge.passing) {
            1: parse_ipv4;
            default: accept;
        }
    }

    /* Only the packets the aggregation sent on: it built them, so they are well formed. */
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        packet.extract(hdr.udp);
        packet.extract(hdr.passing);
        transition accept;
    }
}

/* Egress rewrites the addresses of every PASSING packet it sends: the IPv4 checksum follows. */
control PassingEgressDeparser(packet_out packet, inout headers_t hdr, in egress_metadata_t meta,
                              in egress_intrinsic_metadata_for_deparser_t dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        if (hdr.passing.isValid()) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({
                hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
                hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
                hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr });
        }
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.passing);
    }
}

#endif
