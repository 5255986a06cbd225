/* Packet headers and metadata of the v1model program: the wire headers (wire.p4, shared with the
 * TNA program), the values as 2048-bit words, and the metadata its controls hand each other. */
#ifndef _PASSING_HEADERS_P4_
#define _PASSING_HEADERS_P4_

#include "config.p4"
#include "wire.p4"

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
