/* The wire headers of PASSING's packets, shared by the v1model program (headers.p4) and the
 * TNA program (tna/headers.p4). The PASSING header's layout is documented in docs/protocol.md
 * and defined once in passing/protocol.py. */
#ifndef _PASSING_WIRE_P4_
#define _PASSING_WIRE_P4_

header ethernet_t {
    bit<48> dst_addr;
    bit<48> src_addr;
    bit<16> ether_type;
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> total_len;
    bit<16> identification;
    bit<3>  flags;
    bit<13> frag_offset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdr_checksum;
    bit<32> src_addr;
    bit<32> dst_addr;
}

header udp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

header passing_t {
    bit<16> job_id;
    bit<16> slot;
    bit<8>  contributor;
    bit<8>  flags;
    /* [0:0] the round's low bit (the slot's shadow copy); [7:1] the pool's epoch, which job_config
     * holds per pool: a packet of an older pool that shares the FLAG_POOL is told apart. */
    bit<8>  version;
    bit<8>  level;
    bit<32> frag;
    /* The slot's round in this session (0, 1, 2, ...; version's bit 0 is its low bit): the switch
     * keeps the round each version holds, so a late packet is never taken for a new round. */
    bit<32> round;
    bit<16> num_contrib;
    bit<8>  exp;
    bit<8>  tag;
    /* The agents' session (a random non-zero 64-bit number they agreed on when they started):
     * a slot only ever sums contributions of one session, and results carry it. */
    bit<64> session;
}

#endif
