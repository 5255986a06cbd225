/* Parser and deparser. Aggregation packets are Ethernet / IPv4 (no options, not fragmented) /
 * UDP to PASSING_UDP_PORT / passing_t / values_t. A packet cut short inside the PASSING part ends
 * the parser with an error; the ingress sees hdr.values invalid and drops it as malformed. */
#ifndef _PASSING_PARSER_P4_
#define _PASSING_PARSER_P4_

#include "headers.p4"

parser PassingParser(packet_in packet,
                     out headers_t hdr,
                     inout metadata_t meta,
                     inout standard_metadata_t sm) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
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

control PassingDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.passing);
        packet.emit(hdr.values);
    }
}

#endif
