/* Headers and metadata of the TNA program: the wire headers (../include/wire.p4, shared with the
 * v1model program), the K = 64 values as 32-bit fields (Tofino's register actions are 32 bits
 * wide), the metadata ingress bridges to egress, and what the ingress controls hand each other. */
#ifndef _PASSING_TNA_HEADERS_P4_
#define _PASSING_TNA_HEADERS_P4_

#include "config.p4"
#include "../include/wire.p4"

/* Value i is the i-th 32-bit word after the PASSING header, as on the v1model program's wire. */
header values_t {
    bit<32> v0;
    bit<32> v1;
    bit<32> v2;
    bit<32> v3;
    bit<32> v4;
    bit<32> v5;
    bit<32> v6;
    bit<32> v7;
    bit<32> v8;
    bit<32> v9;
    bit<32> v10;
    bit<32> v11;
    bit<32> v12;
    bit<32> v13;
    bit<32> v14;
    bit<32> v15;
    bit<32> v16;
    bit<32> v17;
    bit<32> v18;
    bit<32> v19;
    bit<32> v20;
    bit<32> v21;
    bit<32> v22;
    bit<32> v23;
    bit<32> v24;
    bit<32> v25;
    bit<32> v26;
    bit<32> v27;
    bit<32> v28;
    bit<32> v29;
    bit<32> v30;
    bit<32> v31;
    bit<32> v32;
    bit<32> v33;
    bit<32> v34;
    bit<32> v35;
    bit<32> v36;
    bit<32> v37;
    bit<32> v38;
    bit<32> v39;
    bit<32> v40;
    bit<32> v41;
    bit<32> v42;
    bit<32> v43;
    bit<32> v44;
    bit<32> v45;
    bit<32> v46;
    bit<32> v47;
    bit<32> v48;
    bit<32> v49;
    bit<32> v50;
    bit<32> v51;
    bit<32> v52;
    bit<32> v53;
    bit<32> v54;
    bit<32> v55;
    bit<32> v56;
    bit<32> v57;
    bit<32> v58;
    bit<32> v59;
    bit<32> v60;
    bit<32> v61;
    bit<32> v62;
    bit<32> v63;
}

/* What egress needs of ingress: Tofino's egress sees only what the ingress deparser emits. */
header bridge_t {
    bit<1>  flooded;       /* an L2 flood: its copy never goes back out of its ingress port */
    bit<1>  passing;       /* a PASSING packet the aggregation sends on */
    @padding bit<5> _pad0;
    PortId_t ingress_port;
    bit<8>  reply_cid;     /* a unicast answer's contributor id (peer_rewrite's rid) */
}

struct headers_t {
    bridge_t   bridge;
    ethernet_t ethernet;
    ipv4_t     ipv4;
    udp_t      udp;
    passing_t  passing;
    values_t   values;
}

/* What job_config and membership tell the pipeline about the packet's job, in the forms the
 * later stages use (set_job derives them from its parameters, admission.p4). */
struct job_md_t {
    bit<1>  hit;
    bit<16> base16;        /* pool_base */
    bit<8>  epoch2;        /* epoch << 1: the version's bits 7..1 */
    bit<16> pool_size;
    bit<8>  fan_in;
    bit<8>  quorum;
    bit<16> mcast_grp;
    bit<32> gen;
    bit<1>  is_root;
    bit<9>  uplink_port;
    bit<32> row_stats;     /* stat_idx * JOB_STATS_STRIDE: job_stats' row */
    bit<32> row_late;      /* stat_idx * MAX_FAN_IN: late_contribs' row */
    bit<32> row_pool;      /* stat_idx * 2 * MAX_FAN_IN: pool_contribs' row, pool 0 */
    bit<32> row_pool1;     /* ... + MAX_FAN_IN: pool 1 */
    bit<1>  is_member;
    bit<8>  member_cid;
    bit<8>  member_count;
}

/* The slot's registers' answers and what the tables after them decide (slot_state.p4,
 * slot_status.p4, slot_values.p4). */
struct agg_md_t {
    bit<16> idx;           /* the slot: pool_base + slot */
    vidx_t  vidx;          /* the version's register index: idx + version * TNA_SLOTS */
    bit<1>  own_lo;        /* slot_owner held the packet's (gen, session bits 31..0) */
    bit<1>  own_hi;        /* slot_owner_hi held the session's bits 63..32 */
    bit<2>  rel;           /* REL_*: the packet's round against the version's */
    bit<32> mybit_lo;      /* the contributor's bit in the bitmap's low or high half */
    bit<32> mybit_hi;
    bit<32> bm_old;        /* the bitmap half holding the contributor's bit, before */
    bit<1>  mine;          /* the held round had counted the sender */
    bit<8>  cnt;           /* the round's count after the packet */
    bit<8>  st_old;        /* the version's state before the packet (not after a restart) */
    bit<8>  st_new;        /* ... and after it */
    bit<1>  full;          /* the count is the job's fan_in */
    bit<8>  event;
    bit<8>  marked;
    bit<8>  exp;
    bit<16> nsum;
}

/* The inputs of register slot_status (slot_status.p4). */
struct status_md_t {
    bit<8> fan_in_m1;
    bit<8> quorum_m1;
    bit<8> quorum_below;   /* quorum - fan_in: negative when the quorum is smaller */
    bit<8> a;
    bit<8> b;
}

/* Admission's differences (admission.p4). */
struct chk_md_t {
    bit<8>  offset;        /* contributor - the port's first id */
    bit<8>  cid_room;      /* offset - the port's count */
    bit<16> slot_room;     /* slot - pool_size */
    bit<8>  epoch_diff;    /* version ^ (epoch << 1) */
    bit<8>  version_diff;  /* version ^ the round's low byte */
    bit<9>  port_diff;     /* ingress port ^ the job's uplink port */
}

struct metadata_t {
    chk_md_t chk;
    status_md_t st;
    job_md_t job;
    agg_md_t agg;
    bit<1>   checksum_err;
    bit<1>   is_contrib;
    bit<1>   is_result;
    bit<1>   is_close;
    bit<8>   is_cong;       /* 1: FLAG_CONGESTED (a slot_marked input) */
    bit<8>   gdrop;
    bit<8>   jdrop;
    bit<1>   guarded;
    bit<32>  stat_row;
    bit<8>   flag_keep;     /* the flags a PASSING packet keeps when it leaves */
    bit<8>   flag_set;      /* ... and those it leaves with besides */
}

struct egress_metadata_t {
    bridge_t bridge;
    bit<16>  peer_rid;
}

#endif
