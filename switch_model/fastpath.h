/* What the model switch's compiled units share (fastpath.c: the PASSING path; fastpath_aggregate.c,
 * fastpath_forward.c: its Aggregation and its guard and L2 forwarding; fastpath_ports.c: the port
 * loop's receive and send): the frame layout, the layouts of the arrays Python shares
 * (switch_model/fastpath.py mirrors the enums), the byte helpers, and the path's entry points.
 * The constants come from passing.protocol as -D definitions (switch_model/fastpath.py). */

#ifndef PASSING_FASTPATH_H
#define PASSING_FASTPATH_H

#include <stdint.h>
#include <string.h>

#define IPV4_OFF 14
#define UDP_OFF 34
#define PASSING_OFF 42
#define FLAGS_OFF (PASSING_OFF + 5) /* job_id, slot, contributor before it */
#define VALUES_OFF (PASSING_OFF + HEADER_BYTES)
#define VALUES_BYTES (K * 4)
#define PASSING_END (VALUES_OFF + VALUES_BYTES)
#define PASSING_UDP_LEN (8 + HEADER_BYTES + VALUES_BYTES)
#define PASSING_IPV4_LEN (20 + PASSING_UDP_LEN)
#define FLAG_READY 1
#define FLAG_CLOSED 2
#define FLAG_MARKED 4 /* a packet counted into the round carried FLAG_CONGESTED */

/* ctx: addresses and sizes of the arrays Python shares (FastPath._ctx builds it). */
enum {
    C_JOBS, C_NJOBS, C_MEMBERS, C_NMEMBERS, C_PEERS, C_NPEERS, C_REPLICAS, C_NREPLICAS,
    C_CAPACITY, C_GEN, C_SESSION, C_ROUND, C_FLAGS, C_NSUM, C_EXP, C_COUNT, C_BITMAP, C_VALUES,
    C_GLOBAL, C_NGLOBAL, C_JOBSTATS, C_NJOBSTATS, C_POOLC, C_NPOOLC, C_LATE, C_NLATE,
    C_EGRESS, C_NEGRESS, C_OUT, C_OUTCAP, C_OUTPORT, C_OUTOFF, C_OUTLEN, C_MAXOUT, C_MAXCOPIES,
    C_RX, C_RXSLOT, C_RXBATCH, C_RXLEN, C_RXSKIP, C_RXCTRL, C_CTRLSPACE, C_RXNAME, C_PORTFD,
    C_NPORTFD, C_FILTER_OUT, C_VLAN, C_SCRATCH, C_L2, C_NL2, C_GUARDS, C_NGUARDS, C_L2DEF,
    C_L2DEFARG, C_FAIRP, C_FAIRF, C_LEN
};
/* Table rows, as uint64 columns (FastPath._sync). */
enum { J_JOB, J_POOL, J_STAT, J_ROOT, J_UPLINK, J_EPOCH, J_PSIZE, J_PBASE, J_GEN, J_FANIN,
       J_QUORUM, J_MCAST, J_COLS };
enum { M_JOB, M_PORT, M_CONTRIB, M_COUNT, M_COLS };
enum { P_JOB, P_PORT, P_RID, P_SRCIP, P_DSTIP, P_SRCMAC, P_DSTMAC, P_DPORT, P_CONTRIB, P_COLS };
enum { R_GROUP, R_PORT, R_RID, R_COLS };
enum { L_MAC, L_KIND, L_ARG, L_COLS };   /* l2_forward, sorted by MAC; kinds L2_TO_PORT, L2_FLOOD */
enum { G_PORT, G_STAT, G_COLS };          /* result_guard */
/* io: what a call leaves for the caller. */
enum { IO_NOUT, IO_USED, IO_FULL, IO_K, IO_NEXT, IO_SLOW_END, IO_TX_ERRORS, IO_TRUNCATED };

static inline uint32_t be16(const uint8_t *p) { return ((uint32_t)p[0] << 8) | p[1]; }
static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }
static inline void put16(uint8_t *p, uint32_t v) { p[0] = v >> 8; p[1] = v; }
static inline void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static inline void put48(uint8_t *p, uint64_t v) { for (int i = 5; i >= 0; i--, v >>= 8) p[i] = v; }
static inline void put64(uint8_t *p, uint64_t v) { put32(p, v >> 32); put32(p + 4, (uint32_t)v); }

/* Which way an event sends the packet (Pipeline._passing's tests). */
static inline int is_up(int e) { return e == EVT_COMPLETE_UP || e == EVT_CLOSED_UP || e == EVT_RESEND_UP; }
static inline int is_mcast(int e) { return e == EVT_COMPLETE_ROOT || e == EVT_CLOSED_ROOT || e == EVT_DOWNLINK; }
static inline int is_unicast(int e) { return e == EVT_RESULT_AGAIN || e == EVT_LATE_RESULT; }
static inline int is_late(int e) { return e == EVT_LATE || e == EVT_LATE_RESULT || e == DROP_STALE_ROUND; }

/* A PASSING header, parsed. */
struct hdr {
    uint32_t job_id, slot, contributor, flags, version, level, frag, round, num_contrib, exp, tag;
    uint64_t session;
};

/* A version word, unpacked (round ++ flags ++ nsum ++ exp ++ count ++ bitmap in the P4). */
struct vword { uint32_t round, flags, nsum, exp, count; uint64_t bitmap; };

/* fastpath_aggregate.c: Aggregation.aggregate() (the event; the version word and values row). */
int aggregate(const uint64_t *ctx, const uint8_t *frame, const uint64_t *j, const struct hdr *h,
              struct vword *mine, uint32_t **row);

/* Whether the parser sees the frame's UDP ports: IPv4 without options, fragment offset 0, UDP. */
static inline int udp_ports_visible(const uint8_t *f, uint32_t len) {
    return len >= PASSING_OFF && be16(f + 12) == 0x0800 && (f[IPV4_OFF] & 0x0F) == 5
        && (f[IPV4_OFF + 6] & 0x1F) == 0 && f[IPV4_OFF + 7] == 0 && f[IPV4_OFF + 9] == 17;
}

/* The parser's path to parse_passing (Pipeline.process's first test): to the PASSING port. */
static inline int passing_path(const uint8_t *f, uint32_t len) {
    return udp_ports_visible(f, len) && be16(f + UDP_OFF + 2) == PASSING_PORT;
}

/* Whether a copy the path made is a PASSING packet (an aggregation packet, or a result), which
 * the egress may mark: the switch sends those, and only those, from the PASSING port, since
 * ResultGuard drops every other UDP datagram from it whose ports it can see. */
static inline int passing_copy(const uint8_t *f, uint32_t len) {
    return udp_ports_visible(f, len) && be16(f + UDP_OFF) == PASSING_PORT;
}

/* fastpath.c: a counter cell counts a packet of nbytes (SwitchState.count); a copy of a frame
 * appended to the output arrays, to leave on `port`. */
void count(const uint64_t *ctx, int which, uint64_t index, uint64_t nbytes);
void emit(const uint64_t *ctx, uint64_t *io, uint32_t port, const uint8_t *frame, uint32_t len);

/* fastpath_forward.c: ResultGuard and L2Forward for a frame off the PASSING path. */
void forward(const uint64_t *ctx, uint32_t port, const uint8_t *frame, uint32_t len, uint64_t *io);

/* fastpath.c: the job_config row of (job, pool), or NULL. */
const uint64_t *find_job(const uint64_t *ctx, uint32_t job, uint32_t pool);

/* fastpath_fair.c: the current interval's number, and FairShare for one packet leaving a port
 * (1: mark it). */
uint64_t fair_epoch_now(void);
int fp_fair_step(uint64_t *ports, uint64_t *flows, uint32_t port, uint32_t flow, uint64_t nbytes,
                 uint64_t e, int deep, int passing);

/* fastpath.c: whether the compiled path takes a received frame, and a run of a batch through it. */
int compiled_takes(const uint64_t *ctx, uint32_t len, uint8_t skip);
int64_t fp_run(const uint64_t *ctx, const uint8_t *rx, uint64_t stride, const uint32_t *lens,
               const uint8_t *skip, uint32_t port, int64_t start, int64_t end, uint64_t *io);

#endif
