/* Compile-time constants of the PASSING pipeline.
 * passing/protocol.py holds the same numbers; tests/p4/test_p4_matches_python.py fails if they drift. */
#ifndef _PASSING_CONFIG_P4_
#define _PASSING_CONFIG_P4_

/* Values per packet, K, chosen at compile time: passing.p4build passes -DPASSING_K=<K> with
 * passing.protocol.K (environment variable PASSING_K), so the program and the Python side are
 * built from one number. This default serves a bare p4c run and equals protocol.DEFAULT_K. */
#ifndef PASSING_K
#define PASSING_K 320
#endif

/* 64 lanes x 32 bits fill one 2048-bit word, the widest register p4c accepts; a slot's K values
 * are VALUE_WORDS such words, each read, added and written with one primitive per packet (see
 * aggregation.p4). Only whole words: K is a multiple of 64, at most 320 under a 1500-byte MTU
 * (a 1350-byte frame; 384 would need 1606 bytes), and 2048 with jumbo frames (an 8262-byte
 * frame under a 9000-byte MTU; docs/protocol.md, "Choosing K"). */
#define WORD_BITS 2048
#if PASSING_K == 64
#define VALUE_WORDS 1
#elif PASSING_K == 128
#define VALUE_WORDS 2
#elif PASSING_K == 256
#define VALUE_WORDS 4
#elif PASSING_K == 320
#define VALUE_WORDS 5
#elif PASSING_K == 2048
#define VALUE_WORDS 32
#else
#error "PASSING_K must be 64, 128, 256, 320 or 2048"
#endif

/* Slots per switch (each slot has two versions) and rows of per-job counters. */
#define SLOT_CAPACITY 4096
#define MAX_JOBS 256
#define JOB_STATS_STRIDE 32
#define GLOBAL_DROP_SLOTS 8

const bit<16> PASSING_UDP_PORT = 48879;
const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8>  IP_PROTO_UDP = 17;

/* Byte counts used to reject truncated or padded aggregation packets. */
const bit<16> PASSING_HDR_BYTES = 28;
const bit<16> PASSING_UDP_LEN = 8 + 28 + (PASSING_K * 4);
const bit<16> PASSING_IPV4_LEN = 20 + 8 + 28 + (PASSING_K * 4);

/* flags */
const bit<8> FLAG_CONTRIB = 0x01;
const bit<8> FLAG_RESULT  = 0x02;
const bit<8> FLAG_RETRANS = 0x04;
/* A host that waited long enough: complete the round with a quorum (CONTRIB only). */
const bit<8> FLAG_CLOSE   = 0x08;
/* Which of the job's two pools the packet uses (job_config's second key): a live resize installs
 * the new pool under the other value while the agents still finish calls in the old one. */
const bit<8> FLAG_POOL    = 0x10;
/* Congestion experienced (docs/protocol.md, "Congestion control"): set by a switch's egress on
 * a PASSING packet that found its queue at least MARK_QDEPTH deep, remembered by the slot that
 * counts it, and carried by everything that slot sends on, so the hosts' results bring it back.
 * It only slows the senders' windows: no switch or agent lets it change a sum. */
const bit<8> FLAG_CONGESTED = 0x20;
const bit<8> FLAGS_KNOWN  = 0x3f;
/* Egress queue depth, in packets (v1model's enq_qdepth), from which PASSING packets are marked:
 * under BMv2's default 64-packet queues, so marks come before drops. */
const bit<19> MARK_QDEPTH = 32;
/* The fair-share mark (fair_share.p4): intervals of 2^FAIR_INTERVAL_SHIFT us of egress time;
 * from a queue of FAIR_QDEPTH packets; f in 1/16ths within [FAIR_F_MIN, FAIR_F_MAX]; a flow
 * with 1/FAIR_ACTIVE_DIV of a port's bytes is active. Counters for every v1model port (9 bits)
 * and flow (each job's stat row, and one for all other traffic). */
const bit<8> FAIR_INTERVAL_SHIFT = 13;
const bit<19> FAIR_QDEPTH = 8;
const bit<8> FAIR_F_MIN = 16;
const bit<8> FAIR_F_MAX = 128;
const bit<64> FAIR_ACTIVE_DIV = 20;
#define FAIR_PORTS 512
#define FAIR_FLOWS 257

/* Per-job events, counted in job_stats[stat_idx * JOB_STATS_STRIDE + event]: exactly one per
 * packet that names a known job. 0..7 and 19 are drops (by reason), 8..18 what the slot did. */
const bit<8> DROP_NONE            = 0xff;
const bit<8> DROP_NOT_MEMBER      = 0;
const bit<8> DROP_BAD_CONTRIBUTOR = 1;
const bit<8> DROP_SLOT_RANGE      = 2;
const bit<8> DROP_BAD_VERSION     = 3;
const bit<8> DROP_BAD_FLAGS       = 4;
const bit<8> DROP_STALE_RESULT    = 5;
const bit<8> DROP_FORGED_RESULT   = 6;   /* claims to be a result, from where none may come */
const bit<8> DROP_STALE_ROUND     = 7;   /* a contribution of a round the slot left behind */
const bit<8> EVT_PARTIAL          = 8;   /* new contribution, slot not complete: consumed */
const bit<8> EVT_COMPLETE_ROOT    = 9;   /* new contribution completed the slot: multicast */
const bit<8> EVT_COMPLETE_UP      = 10;  /* new contribution completed the rack sum: sent up */
const bit<8> EVT_DUPLICATE        = 11;  /* already counted, round not finished: dropped */
const bit<8> EVT_RESULT_AGAIN     = 12;  /* already counted, slot final: result unicast back */
const bit<8> EVT_RESEND_UP        = 13;  /* already counted, rack sum waiting: sent up again */
const bit<8> EVT_DOWNLINK         = 14;  /* result from the spine: stored, multicast down */
const bit<8> EVT_LATE             = 15;  /* after its round closed, result not back: dropped */
const bit<8> EVT_LATE_RESULT      = 16;  /* after its round completed: result unicast back */
const bit<8> EVT_CLOSED_ROOT      = 17;  /* CLOSE completed the slot with a quorum: multicast */
const bit<8> EVT_CLOSED_UP        = 18;  /* CLOSE completed the rack sum with a quorum: up */
/* A packet of an older pool under the same FLAG_POOL (two resizes back, delayed or replayed):
 * its version's upper bits are not the pool's epoch. Dropped before it can count as a pool
 * contribution or take a slot of the new pool over. */
const bit<8> DROP_STALE_POOL      = 19;

/* Late contributions per contributor id: late_contribs[stat_idx * MAX_FAN_IN + contributor].
 * Admitted contributions per pool and contributor id:
 * pool_contribs[(stat_idx * 2 + pool) * MAX_FAN_IN + contributor]. */
#define MAX_FAN_IN 64

/* Drops that belong to no job (index in global_drops). */
const bit<8> GDROP_UNKNOWN_JOB = 0;
const bit<8> GDROP_MALFORMED   = 1;
/* UDP from the aggregation port to anything but the aggregation port: only switches send from
 * 48879, and a result is addressed at the switch that delivers it, never forwarded by another. */
const bit<8> GDROP_FORGED      = 2;
/* UDP the parser cannot check (IPv4 options, or a cut UDP header): see guard.p4. */
const bit<8> GDROP_UNCHECKED_UDP = 3;
/* A VLAN-tagged frame: the fabric is untagged Ethernet, and a tag would hide the IPv4 and UDP
 * headers from the parser, so a forged result could pass in one (see guard.p4). */
const bit<8> GDROP_TAGGED      = 4;

const bit<16> ETHERTYPE_VLAN   = 0x8100;
const bit<16> ETHERTYPE_QINQ   = 0x88a8;
const bit<16> ETHERTYPE_QINQ_OLD = 0x9100;

const bit<9> DROP_PORT = 511;  /* v1model BMv2: egress_spec 511 drops */

/* Job roles (job_config.set_job's is_root). */
const bit<1> ROLE_NON_ROOT = 0;
const bit<1> ROLE_ROOT     = 1;

/* The top bit of every 32-bit lane of a register word, for lane-parallel addition without carries
 * between lanes. */
const bit<128>  MSB_128  = 128w0x80000000800000008000000080000000;
const bit<512>  MSB_512  = MSB_128 ++ MSB_128 ++ MSB_128 ++ MSB_128;
const bit<2048> MSB_2048 = MSB_512 ++ MSB_512 ++ MSB_512 ++ MSB_512;
const bit<WORD_BITS> LANE_MSB = MSB_2048;
const bit<WORD_BITS> LANE_LOW = ~LANE_MSB;

#endif
