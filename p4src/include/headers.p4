/* Packet headers and metadata. The PASSING header layout is documented in docs/protocol.md and
 * defined once in passing/protocol.py. */
#ifndef _PASSING_HEADERS_P4_
#define _PASSING_HEADERS_P4_

#include "config.p4"

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

/* K 32-bit two's complement values, value 0 in the most significant bits of w0 (first on the
 * wire), values 64..127 in w1 and so on: one field per 2048-bit register word, so the aggregation
 * adds each word's 64 lanes in one operation. */
header values_t {
    bit<WORD_BITS> w0;
#if VALUE_WORDS > 1
    bit<WORD_BITS> w1;
#endif
#if VALUE_WORDS > 2
    bit<WORD_BITS> w2;
    bit<WORD_BITS> w3;
#endif
#if VALUE_WORDS > 4
    bit<WORD_BITS> w4;
#endif
#if VALUE_WORDS > 5
    bit<WORD_BITS> w5;
    bit<WORD_BITS> w6;
    bit<WORD_BITS> w7;
    bit<WORD_BITS> w8;
    bit<WORD_BITS> w9;
    bit<WORD_BITS> w10;
    bit<WORD_BITS> w11;
    bit<WORD_BITS> w12;
    bit<WORD_BITS> w13;
    bit<WORD_BITS> w14;
    bit<WORD_BITS> w15;
    bit<WORD_BITS> w16;
    bit<WORD_BITS> w17;
    bit<WORD_BITS> w18;
    bit<WORD_BITS> w19;
    bit<WORD_BITS> w20;
    bit<WORD_BITS> w21;
    bit<WORD_BITS> w22;
    bit<WORD_BITS> w23;
    bit<WORD_BITS> w24;
    bit<WORD_BITS> w25;
    bit<WORD_BITS> w26;
    bit<WORD_BITS> w27;
    bit<WORD_BITS> w28;
    bit<WORD_BITS> w29;
    bit<WORD_BITS> w30;
    bit<WORD_BITS> w31;
#endif
}

struct headers_t {
    ethernet_t ethernet;
    ipv4_t     ipv4;
    udp_t      udp;
    passing_t  passing;
    values_t   values;
}

/* What job_config and membership tell the pipeline about the packet's job. */
struct job_md_t {
    bit<1>  pool;          /* the packet's FLAG_POOL: which of the job's pools it uses */
    bit<7>  epoch;         /* that pool's number mod 128: what the version's upper bits must say */
    bit<1>  hit;
    bit<32> pool_base;
    bit<16> pool_size;
    bit<8>  fan_in;
    bit<8>  quorum;        /* contributions a CLOSE request may complete a round with */
    bit<16> mcast_grp;
    bit<32> gen;
    bit<1>  is_root;
    bit<9>  uplink_port;
    bit<32> stat_idx;
    bit<1>  is_member;
    bit<8>  member_cid;    /* the first contributor id behind this port */
    bit<8>  member_count;  /* how many: 1 for a server (PASSING), its GPUs for switch-only INA */
}

/* What the Aggregation control's actions hand each other (see aggregation.p4). */
struct agg_md_t {
    bit<32>  idx;      /* the slot's register index */
    bit<368> st;       /* its slot_state word as read */
    bit<136> cur;      /* the word of the packet's version (zero if another session's) */
    bit<136> oth;      /* ... of the other version */
    bit<1>   foreign_open; /* another session's or job's round is open in the slot */
    bit<1>   same;     /* the version holds the packet's round */
    bit<1>   older;    /* ... a round after the packet's */
    bit<1>   closed;   /* the held round completed here */
    bit<1>   ready;    /* ... and its final result is here */
    bit<1>   mine;     /* the sender is in the held round's bitmap */
    bit<8>   event;    /* the packet's one event */
    bit<1>   is_new;   /* a contribution counted now */
    bit<1>   first;    /* ... the first of a newer round: it overwrites */
    bit<1>   restart;  /* the packet's round is newer than the held one, or none is held */
    bit<8>   cnt;      /* the round's count after the packet */
}

struct metadata_t {
    job_md_t job;
    agg_md_t agg;
    bit<1>   flooded;
    /* A unicast answer goes to the contributor that asked; multicast replicas carry theirs in
     * egress_rid. Egress looks peers up by (job, port, rid) so ranks behind one port differ. */
    bit<16>  reply_rid;
    bit<16>  peer_rid;
}

#endif
