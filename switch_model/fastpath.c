/* The model switch's PASSING path (JobAdmission, Aggregation, PeerRewrite) compiled, for a batch of
 * frames at a time.
 *
 * switch_model/pipeline.py is the reference: this file does exactly what Pipeline._passing does,
 * branch for branch and in the same order, on the same register arrays (SlotStore) and counters
 * (SwitchState), so that a switch may take either path frame by frame. tests/unit/
 * test_fastpath.py feeds both the same frames and compares every output, counter and register; the
 * conformance suite runs the switch model on this path. Why it exists: in Python each aggregation
 * packet costs ~15-20 us, which on a 2-core machine limits the emulated links (issue 15).
 *
 * Frames other than the parser's PASSING path (L2 traffic, the guard's drops, tagged frames) are
 * not handled here: fp_run stops at them and the Python pipeline takes them.
 *
 * The constants come from passing.protocol as -D definitions (switch_model/fastpath.py): K,
 * PASSING_PORT, the flags, the event and drop codes. */

#define _GNU_SOURCE
#include <errno.h>
#include <linux/if_packet.h>
#include <stdint.h>
#include <linux/sockios.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

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
    C_NPORTFD, C_FILTER_OUT, C_VLAN, C_SCRATCH, C_LEN
};
/* Table rows, as uint64 columns (FastPath._sync). */
enum { J_JOB, J_POOL, J_STAT, J_ROOT, J_UPLINK, J_EPOCH, J_PSIZE, J_PBASE, J_GEN, J_FANIN,
       J_QUORUM, J_MCAST, J_COLS };
enum { M_JOB, M_PORT, M_CONTRIB, M_COUNT, M_COLS };
enum { P_JOB, P_PORT, P_RID, P_SRCIP, P_DSTIP, P_SRCMAC, P_DSTMAC, P_DPORT, P_CONTRIB, P_COLS };
enum { R_GROUP, R_PORT, R_RID, R_COLS };
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

static void count(const uint64_t *ctx, int which, uint64_t index, uint64_t nbytes) {
    uint64_t *cells = (uint64_t *)ctx[which];
    if (index >= ctx[which + 1]) return; /* as SwitchState.count: never crash the switch */
    cells[2 * index] += 1;
    cells[2 * index + 1] += nbytes;
}

static uint32_t fold(uint64_t total) {
    while (total >> 16) total = (total & 0xFFFF) + (total >> 16);
    return ~total & 0xFFFF;
}

struct hdr {
    uint32_t job_id, slot, contributor, flags, version, level, frag, round, num_contrib, exp, tag;
    uint64_t session;
};

static const uint64_t *find_job(const uint64_t *ctx, uint32_t job, uint32_t pool) {
    const uint64_t *rows = (const uint64_t *)ctx[C_JOBS];
    for (uint64_t i = 0; i < ctx[C_NJOBS]; i++)
        if (rows[i * J_COLS + J_JOB] == job && rows[i * J_COLS + J_POOL] == pool) return rows + i * J_COLS;
    return 0;
}

static const uint64_t *find_member(const uint64_t *ctx, uint32_t job, uint32_t port) {
    const uint64_t *rows = (const uint64_t *)ctx[C_MEMBERS];
    for (uint64_t i = 0; i < ctx[C_NMEMBERS]; i++)
        if (rows[i * M_COLS + M_JOB] == job && rows[i * M_COLS + M_PORT] == port) return rows + i * M_COLS;
    return 0;
}

static const uint64_t *find_peer(const uint64_t *ctx, uint32_t job, uint64_t port, uint64_t rid) {
    const uint64_t *rows = (const uint64_t *)ctx[C_PEERS];
    for (uint64_t i = 0; i < ctx[C_NPEERS]; i++)
        if (rows[i * P_COLS + P_JOB] == job && rows[i * P_COLS + P_PORT] == port
                && rows[i * P_COLS + P_RID] == rid) return rows + i * P_COLS;
    return 0;
}

/* JobAdmission's verdict on a packet of a known job: a JobDrop code, or -1 (admitted). */
static int admission_drop(const uint64_t *ctx, uint32_t port, const struct hdr *h, const uint64_t *j) {
    uint32_t kind = h->flags & (FLAG_CONTRIB | FLAG_RESULT);
    if ((h->flags & ~FLAGS_KNOWN & 0xFF) || (kind != FLAG_CONTRIB && kind != FLAG_RESULT)
            || (kind == FLAG_RESULT && (h->flags & FLAG_CLOSE)))
        return DROP_BAD_FLAGS;
    if (kind == FLAG_CONTRIB) {
        const uint64_t *m = find_member(ctx, h->job_id, port);
        if (!m) return DROP_NOT_MEMBER;
        if (((h->contributor - m[M_CONTRIB]) & 0xFF) >= m[M_COUNT]) return DROP_BAD_CONTRIBUTOR;
    } else if (j[J_ROOT] == ROLE_ROOT || port != j[J_UPLINK]) {
        return DROP_FORGED_RESULT;
    }
    if ((h->version >> 1) != j[J_EPOCH]) return DROP_STALE_POOL;
    if (h->slot >= j[J_PSIZE]) return DROP_SLOT_RANGE;
    if ((h->version ^ h->round) & 1) return DROP_BAD_VERSION;
    return -1;
}

static int is_up(int e) { return e == EVT_COMPLETE_UP || e == EVT_CLOSED_UP || e == EVT_RESEND_UP; }
static int is_mcast(int e) { return e == EVT_COMPLETE_ROOT || e == EVT_CLOSED_ROOT || e == EVT_DOWNLINK; }
static int is_unicast(int e) { return e == EVT_RESULT_AGAIN || e == EVT_LATE_RESULT; }
static int is_late(int e) { return e == EVT_LATE || e == EVT_LATE_RESULT || e == DROP_STALE_ROUND; }

/* A version word, unpacked (round ++ flags ++ nsum ++ exp ++ count ++ bitmap in the P4). */
struct vword { uint32_t round, flags, nsum, exp, count; uint64_t bitmap; };

static struct vword load(const uint64_t *ctx, uint64_t i) {
    struct vword w = {((uint32_t *)ctx[C_ROUND])[i], ((uint8_t *)ctx[C_FLAGS])[i],
                      ((uint16_t *)ctx[C_NSUM])[i], ((uint8_t *)ctx[C_EXP])[i],
                      ((uint8_t *)ctx[C_COUNT])[i], ((uint64_t *)ctx[C_BITMAP])[i]};
    return w;
}

static void store(const uint64_t *ctx, uint64_t i, struct vword w) {
    ((uint32_t *)ctx[C_ROUND])[i] = w.round;
    ((uint8_t *)ctx[C_FLAGS])[i] = w.flags;
    ((uint16_t *)ctx[C_NSUM])[i] = w.nsum;
    ((uint8_t *)ctx[C_EXP])[i] = w.exp;
    ((uint8_t *)ctx[C_COUNT])[i] = w.count;
    ((uint64_t *)ctx[C_BITMAP])[i] = w.bitmap;
}

/* Aggregation.aggregate() for an admitted packet: the event; the slot's version word after it
 * in *mine, its values row in *row (NULL when nothing leaves). Mirrors Pipeline._aggregate. */
static int aggregate(const uint64_t *ctx, const uint8_t *frame, const uint64_t *j, const struct hdr *h,
                     struct vword *mine, uint32_t **row) {
    *row = 0;
    uint64_t idx = (j[J_PBASE] + h->slot) & 0xFFFFFFFFu;
    if (idx >= ctx[C_CAPACITY]) return EVT_DUPLICATE;
    uint32_t gen = (uint32_t)j[J_GEN];
    uint32_t *sgen = (uint32_t *)ctx[C_GEN];
    uint64_t *ssess = (uint64_t *)ctx[C_SESSION];
    int mine_v = h->version & 1;
    int same_owner = sgen[idx] == gen && ssess[idx] == h->session;
    struct vword zero = {0, 0, 0, 0, 0, 0};
    struct vword cur = same_owner ? load(ctx, 2 * idx + mine_v) : zero;
    struct vword oth = same_owner ? load(ctx, 2 * idx + (mine_v ^ 1)) : zero;
    int foreign_open = 0;
    if (!same_owner) {
        for (int v = 0; v < 2; v++) {
            struct vword w = load(ctx, 2 * idx + v);
            if (w.bitmap && !(w.flags & FLAG_CLOSED)) foreign_open = 1;
        }
    }
    /* _verdict */
    uint64_t mybit = h->contributor < MAX_FAN_IN ? (uint64_t)1 << h->contributor : 0;
    int is_result = (h->flags & FLAG_RESULT) == FLAG_RESULT;
    int used = cur.bitmap != 0 || (cur.flags & FLAG_CLOSED) != 0;
    uint32_t d = h->round - cur.round;
    int same = used && d == 0;
    int older = used && (d >> 31) == 1;
    int restart = !used || (!same && !older);
    int closed = same && (cur.flags & FLAG_CLOSED) != 0;
    int ready = same && (cur.flags & FLAG_READY) != 0;
    int mine_bit = same && (cur.bitmap & mybit) != 0;
    int is_new = !is_result && !older && (restart || (!mine_bit && !closed));
    int first = is_new && restart;
    uint32_t cnt = first ? 1 : restart ? 0 : is_new ? ((cur.count + 1) & 0xFF) : cur.count;
    int full = cnt == j[J_FANIN];
    int completes = !is_result && !older && !closed
        && ((is_new && full) || ((h->flags & FLAG_CLOSE) != 0 && cnt >= j[J_QUORUM]));
    int root = j[J_ROOT] == ROLE_ROOT;
    int event;
    if (is_result) event = (older || foreign_open) ? DROP_STALE_RESULT : EVT_DOWNLINK;
    else if (older) event = DROP_STALE_ROUND;
    else if (completes) event = root ? (full ? EVT_COMPLETE_ROOT : EVT_CLOSED_ROOT)
                                     : (full ? EVT_COMPLETE_UP : EVT_CLOSED_UP);
    else if (is_new) event = EVT_PARTIAL;
    else if (mine_bit) event = ready ? EVT_RESULT_AGAIN : closed ? EVT_RESEND_UP : EVT_DUPLICATE;
    else event = ready ? EVT_LATE_RESULT : EVT_LATE;
    if (event == DROP_STALE_RESULT || event == DROP_STALE_ROUND) return event; /* slot untouched */

    int overwrite = event == EVT_DOWNLINK || first;
    /* _merge_values: the row (K lanes, host order) of this version */
    uint64_t vidx = ((idx << 1) + mine_v) & 0xFFFFFFFFu;
    uint32_t *acc = (uint32_t *)ctx[C_VALUES] + vidx * K;
    const uint8_t *pkt = frame + VALUES_OFF;
    if (overwrite) {
        for (int i = 0; i < K; i++) acc[i] = be32(pkt + 4 * i);
    } else if (is_new) {
        for (int i = 0; i < K; i++) acc[i] += be32(pkt + 4 * i); /* int32 wrap-around */
    }
    /* _next_version_word */
    struct vword w = cur;
    if (overwrite) { w.exp = h->exp; w.nsum = h->num_contrib; }
    else if (is_new) { if (h->exp > w.exp) w.exp = h->exp; w.nsum = (w.nsum + h->num_contrib) & 0xFFFF; }
    int marked = ((is_new || event == EVT_DOWNLINK) && (h->flags & FLAG_CONGESTED))
        || (!restart && (cur.flags & FLAG_MARKED));
    if (is_mcast(event)) w.flags = FLAG_READY | FLAG_CLOSED;
    else if (event == EVT_COMPLETE_UP || event == EVT_CLOSED_UP) w.flags = FLAG_CLOSED;
    else if (first) w.flags = 0;
    if (marked) w.flags |= FLAG_MARKED;
    if (restart) { w.bitmap = is_new ? mybit : 0; w.round = h->round; }
    else if (is_new) w.bitmap |= mybit;
    w.count = cnt;
    sgen[idx] = gen;
    ssess[idx] = h->session;
    store(ctx, 2 * idx + mine_v, w);
    store(ctx, 2 * idx + (mine_v ^ 1), oth);
    *mine = w;
    *row = acc;
    return event;
}

/* One copy, as PeerRewrite.set_peer, the checksum update and the deparser make it (_rewrite). */
static void rewrite(uint8_t *o, const uint8_t *frame, uint32_t len, const uint64_t *peer,
                    const uint8_t *hdr_tail, const uint32_t *row, uint32_t ip_head_sum) {
    uint32_t src = (uint32_t)peer[P_SRCIP], dst = (uint32_t)peer[P_DSTIP];
    put48(o, peer[P_DSTMAC]);
    put48(o + 6, peer[P_SRCMAC]);
    o[12] = 0x08; o[13] = 0x00;
    memcpy(o + IPV4_OFF, frame + IPV4_OFF, 10);
    put16(o + IPV4_OFF + 10, fold((uint64_t)ip_head_sum + (src >> 16) + (src & 0xFFFF)
                                  + (dst >> 16) + (dst & 0xFFFF)));
    put32(o + IPV4_OFF + 12, src);
    put32(o + IPV4_OFF + 16, dst);
    put16(o + UDP_OFF, PASSING_PORT);
    put16(o + UDP_OFF + 2, (uint32_t)peer[P_DPORT]);
    memcpy(o + UDP_OFF + 4, frame + UDP_OFF + 4, 2);
    o[UDP_OFF + 6] = 0; o[UDP_OFF + 7] = 0;
    uint8_t *ph = o + PASSING_OFF;
    memcpy(ph, frame + PASSING_OFF, 4); /* job_id, slot */
    ph[4] = (uint8_t)peer[P_CONTRIB];
    memcpy(ph + 5, hdr_tail, HEADER_BYTES - 5);
    for (int i = 0; i < K; i++) put32(o + VALUES_OFF + 4 * i, row[i]);
    if (len > PASSING_END) memcpy(o + PASSING_END, frame + PASSING_END, len - PASSING_END);
}

/* Whether the parser takes the frame to parse_passing (Pipeline.process's first test). */
static int passing_path(const uint8_t *f, uint32_t len) {
    return len >= PASSING_OFF && f[12] == 0x08 && f[13] == 0x00 && (f[IPV4_OFF] & 0x0F) == 5
        && (f[IPV4_OFF + 6] & 0x1F) == 0 && f[IPV4_OFF + 7] == 0 && f[IPV4_OFF + 9] == 17
        && be16(f + UDP_OFF + 2) == PASSING_PORT;
}

/* Whether this path takes a received frame (skip: 0 as received, 1 dropped unseen, 2 tagged):
 * a PASSING-path frame short enough for the output arrays, while the tables are usable. */
static int compiled_takes(const uint64_t *ctx, const uint8_t *f, uint32_t len, uint8_t skip) {
    return !skip && ctx[C_MAXCOPIES] && len <= FAST_MAX_FRAME && passing_path(f, len);
}

/* Pipeline._passing for one frame; its copies appended to the output arrays. */
static void passing(const uint64_t *ctx, uint32_t port, const uint8_t *frame, uint32_t len, uint64_t *io) {
    if (len < PASSING_END) { count(ctx, C_GLOBAL, GDROP_MALFORMED, len); return; }
    uint64_t sum = 0;
    for (int i = 0; i < 10; i++) if (i != 5) sum += be16(frame + IPV4_OFF + 2 * i);
    if (fold(sum) != be16(frame + IPV4_OFF + 10) || be16(frame + IPV4_OFF + 2) != PASSING_IPV4_LEN
            || be16(frame + UDP_OFF + 4) != PASSING_UDP_LEN) {
        count(ctx, C_GLOBAL, GDROP_MALFORMED, len);
        return;
    }
    const uint8_t *p = frame + PASSING_OFF;
    struct hdr h = {be16(p), be16(p + 2), p[4], p[5], p[6], p[7], be32(p + 8), be32(p + 12),
                    be16(p + 16), p[18], p[19], be64(p + 20)};
    uint32_t pool = (h.flags & FLAG_POOL) >> 4;
    const uint64_t *j = find_job(ctx, h.job_id, pool);
    if (!j) { count(ctx, C_GLOBAL, GDROP_UNKNOWN_JOB, len); return; }
    uint64_t stat = j[J_STAT];
    int jdrop = admission_drop(ctx, port, &h, j);
    if (jdrop >= 0) { count(ctx, C_JOBSTATS, stat * JOB_STATS_STRIDE + jdrop, len); return; }
    if (h.flags & FLAG_CONTRIB)
        count(ctx, C_POOLC, ((stat << 1) + pool) * MAX_FAN_IN + h.contributor, len);
    struct vword mine;
    uint32_t *row;
    int event = aggregate(ctx, frame, j, &h, &mine, &row);
    count(ctx, C_JOBSTATS, stat * JOB_STATS_STRIDE + event, len);
    if (is_late(event)) count(ctx, C_LATE, stat * MAX_FAN_IN + h.contributor, len);
    if (!row) return;
    /* _egress_of: (port, rid) of every copy */
    uint64_t eports[MAX_COPIES], erids[MAX_COPIES];
    int n = 0;
    if (is_mcast(event)) {
        const uint64_t *r = (const uint64_t *)ctx[C_REPLICAS];
        for (uint64_t i = 0; i < ctx[C_NREPLICAS] && n < MAX_COPIES; i++)
            if (r[i * R_COLS + R_GROUP] == j[J_MCAST]) {
                eports[n] = r[i * R_COLS + R_PORT];
                erids[n++] = r[i * R_COLS + R_RID];
            }
    } else if (is_unicast(event)) {
        eports[n] = port; erids[n++] = h.contributor;
    } else if (is_up(event)) {
        eports[n] = j[J_UPLINK]; erids[n++] = 0;
    }
    if (!n) return;
    /* _leaving_header: what follows the contributor field */
    uint32_t level = h.level, flags;
    if (is_up(event)) {
        level = (h.level + 1) & 0xFF;
        flags = FLAG_CONTRIB | (h.flags & FLAG_CLOSE) | (event == EVT_RESEND_UP ? FLAG_RETRANS : 0);
    } else {
        flags = FLAG_RESULT;
    }
    flags |= (h.flags & FLAG_POOL) | ((mine.flags & FLAG_MARKED) ? FLAG_CONGESTED : 0);
    uint8_t tail[HEADER_BYTES - 5];
    tail[0] = flags; tail[1] = h.version; tail[2] = level;
    put32(tail + 3, h.frag); put32(tail + 7, h.round);
    put16(tail + 11, mine.nsum); tail[13] = mine.exp; tail[14] = h.tag;
    put64(tail + 15, h.session);
    uint32_t ip_head_sum = 0;
    for (int i = 0; i < 5; i++) ip_head_sum += be16(frame + IPV4_OFF + 2 * i);
    uint8_t *out = (uint8_t *)ctx[C_OUT];
    uint32_t *oport = (uint32_t *)ctx[C_OUTPORT], *ooff = (uint32_t *)ctx[C_OUTOFF],
             *olen = (uint32_t *)ctx[C_OUTLEN];
    for (int c = 0; c < n; c++) {
        const uint64_t *peer = find_peer(ctx, h.job_id, eports[c], erids[c]);
        if (!peer) { count(ctx, C_EGRESS, 0, len); continue; }
        uint64_t k = io[IO_NOUT]++;
        oport[k] = (uint32_t)eports[c];
        ooff[k] = (uint32_t)io[IO_USED];
        olen[k] = len;
        rewrite(out + io[IO_USED], frame, len, peer, tail, row, ip_head_sum);
        io[IO_USED] += len;
    }
}

/* Frames start..end-1 of a receive batch (frame i at rx + i * stride, lens[i] bytes, skip[i]
 * nonzero for a frame the caller handles), all arrived on `port`: each PASSING-path frame is
 * processed here in order, until one that is not, or until the output arrays might not hold
 * the next frame's copies (then io[IO_FULL] = 1). Returns the index of the first frame not
 * processed. */
int64_t fp_run(const uint64_t *ctx, const uint8_t *rx, uint64_t stride, const uint32_t *lens,
               const uint8_t *skip, uint32_t port, int64_t start, int64_t end, uint64_t *io) {
    io[IO_FULL] = 0;
    for (int64_t i = start; i < end; i++) {
        const uint8_t *f = rx + i * stride;
        uint32_t len = lens[i];
        if (!compiled_takes(ctx, f, len, skip[i])) return i;
        if (io[IO_NOUT] + ctx[C_MAXCOPIES] > ctx[C_MAXOUT]
                || io[IO_USED] + ctx[C_MAXCOPIES] * len > ctx[C_OUTCAP]) {
            io[IO_FULL] = 1;
            return i;
        }
        passing(ctx, port, f, len, io);
    }
    return end;
}

/* -- the port loop's receive and send, for the switch process (switch_model/ports.py) -------- */

/* The egress queue's depth, as the P4 program's enq_qdepth >= MARK_QDEPTH: the bytes the
 * kernel still holds of what this switch sent on the port (SIOCOUTQ: frames queued in the
 * link's qdisc, each counted with its buffer) against MARK_BYTES (fastpath.py says why). */
static int queue_deep(int fd) {
    int queued = 0;
    return ioctl(fd, SIOCOUTQ, &queued) == 0 && queued >= MARK_BYTES;
}

/* Every copy made since the last flush out of its egress port, each port's in the order made,
 * as many per sendmmsg as the kernel takes; a copy the kernel refuses is counted and skipped
 * (as Ports.send does). */
static void flush(const uint64_t *ctx, uint64_t *io) {
    uint64_t n = io[IO_NOUT];
    uint8_t *out = (uint8_t *)ctx[C_OUT];
    const uint32_t *oport = (const uint32_t *)ctx[C_OUTPORT], *ooff = (const uint32_t *)ctx[C_OUTOFF],
                   *olen = (const uint32_t *)ctx[C_OUTLEN];
    const int64_t *fds = (const int64_t *)ctx[C_PORTFD];
    /* scratch of the caller's (OUT_FRAMES of each), not static: two switches in one process
     * (tests) must not share it */
    struct mmsghdr *hdr = (struct mmsghdr *)ctx[C_SCRATCH];
    struct iovec *iov = (struct iovec *)(hdr + OUT_FRAMES);
    uint8_t *done = (uint8_t *)(iov + OUT_FRAMES);
    if (n > OUT_FRAMES) n = OUT_FRAMES; /* never: C_MAXOUT is OUT_FRAMES */
    memset(done, 0, n);
    for (uint64_t first = 0; first < n; first++) {
        if (done[first]) continue;
        uint32_t port = oport[first];
        int m = 0;
        for (uint64_t k = first; k < n; k++) {
            if (done[k] || oport[k] != port) continue;
            done[k] = 1;
            iov[m].iov_base = out + ooff[k];
            iov[m].iov_len = olen[k];
            memset(&hdr[m], 0, sizeof hdr[m]);
            hdr[m].msg_hdr.msg_iov = &iov[m];
            hdr[m].msg_hdr.msg_iovlen = 1;
            m++;
        }
        if (port >= ctx[C_NPORTFD] || fds[port] < 0) continue; /* no such port: dropped */
        if (queue_deep((int)fds[port]))
            for (int c = 0; c < m; c++) ((uint8_t *)iov[c].iov_base)[FLAGS_OFF] |= FLAG_CONGESTED;
        int sent = 0;
        while (sent < m) {
            int r = sendmmsg((int)fds[port], hdr + sent, m - sent, 0);
            if (r < 0) {
                if (errno == EINTR) continue;
                io[IO_TX_ERRORS]++; /* this copy is lost (ENOBUFS, a link gone down) */
                sent++;
            } else {
                sent += r;
            }
        }
    }
    io[IO_NOUT] = io[IO_USED] = 0;
}

/* The current batch from io[IO_NEXT] on: PASSING-path frames processed here; at the first frame
 * that is not (a tagged one, another kind), the copies so far are sent and 1 returned with
 * [IO_NEXT, IO_SLOW_END) the run of such frames for the caller, who sets IO_NEXT to IO_SLOW_END
 * and calls fp_resume. 0 once the batch is done and sent. */
int64_t fp_resume(const uint64_t *ctx, uint32_t port, uint64_t *io) {
    const uint8_t *rx = (const uint8_t *)ctx[C_RX];
    const uint32_t *lens = (const uint32_t *)ctx[C_RXLEN];
    const uint8_t *skip = (const uint8_t *)ctx[C_RXSKIP];
    uint64_t k = io[IO_K], stride = ctx[C_RXSLOT];
    while (io[IO_NEXT] < k) {
        io[IO_FULL] = 0;
        int64_t i = fp_run(ctx, rx, stride, lens, skip, port, io[IO_NEXT], k, io);
        io[IO_NEXT] = i;
        if (io[IO_FULL]) { flush(ctx, io); continue; }
        if ((uint64_t)i >= k) break;
        /* frames the compiled path drops unseen are skipped; the others go to Python */
        if (skip[i] == 1) { io[IO_NEXT] = i + 1; continue; }
        uint64_t j = i + 1;
        while (j < k && skip[j] != 1 && !compiled_takes(ctx, rx + j * stride, lens[j], skip[j]))
            j++;
        flush(ctx, io);
        io[IO_SLOW_END] = j;
        return 1;
    }
    flush(ctx, io);
    return 0;
}

/* One receive batch from packet socket `fd` (switch port `port`) through the pipeline and out.
 * Returns what fp_resume returns, or -errno where the receive failed (0 and IO_K = 0 when
 * nothing was waiting). Each frame's VLAN tag, if the kernel stripped one, is in ctx's C_VLAN
 * array (status, tpid, tci per frame) and the frame marked 2 in C_RXSKIP: the caller puts the tag
 * back for the Python pipeline (such frames never take the compiled path). */
int64_t fp_drain(const uint64_t *ctx, int fd, uint32_t port, uint64_t *io) {
    uint64_t batch = ctx[C_RXBATCH], slot = ctx[C_RXSLOT], cspace = ctx[C_CTRLSPACE];
    uint8_t *rx = (uint8_t *)ctx[C_RX], *ctrl = (uint8_t *)ctx[C_RXCTRL];
    uint8_t *skip = (uint8_t *)ctx[C_RXSKIP];
    uint32_t *lens = (uint32_t *)ctx[C_RXLEN], *vlan = (uint32_t *)ctx[C_VLAN];
    struct sockaddr_ll *names = (struct sockaddr_ll *)ctx[C_RXNAME];
    struct mmsghdr hdr[256];
    struct iovec iov[256];
    if (batch > 256) batch = 256;
    for (uint64_t i = 0; i < batch; i++) {
        iov[i].iov_base = rx + i * slot;
        iov[i].iov_len = slot;
        memset(&hdr[i], 0, sizeof hdr[i]);
        hdr[i].msg_hdr.msg_iov = &iov[i];
        hdr[i].msg_hdr.msg_iovlen = 1;
        hdr[i].msg_hdr.msg_control = ctrl + i * cspace;
        hdr[i].msg_hdr.msg_controllen = cspace;
        hdr[i].msg_hdr.msg_name = &names[i];
        hdr[i].msg_hdr.msg_namelen = sizeof names[i];
    }
    io[IO_K] = io[IO_NEXT] = 0;
    int k = recvmmsg(fd, hdr, (unsigned)batch, MSG_DONTWAIT, 0);
    if (k < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -errno;
    for (int i = 0; i < k; i++) {
        lens[i] = hdr[i].msg_len;
        skip[i] = 0;
        vlan[3 * i] = vlan[3 * i + 1] = vlan[3 * i + 2] = 0;
        if (hdr[i].msg_hdr.msg_flags & MSG_TRUNC) {
            io[IO_TRUNCATED]++; /* longer than any frame a link carries: never cut to size */
            skip[i] = 1;
            continue;
        }
        if (ctx[C_FILTER_OUT] && names[i].sll_pkttype == PACKET_OUTGOING) { skip[i] = 1; continue; }
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&hdr[i].msg_hdr); c; c = CMSG_NXTHDR(&hdr[i].msg_hdr, c)) {
            if (c->cmsg_level != SOL_PACKET || c->cmsg_type != PACKET_AUXDATA
                    || c->cmsg_len < CMSG_LEN(sizeof(struct tpacket_auxdata))) continue;
            struct tpacket_auxdata aux;
            memcpy(&aux, CMSG_DATA(c), sizeof aux);
            if (aux.tp_status & TP_STATUS_VLAN_VALID) {
                vlan[3 * i] = aux.tp_status;
                vlan[3 * i + 1] = aux.tp_vlan_tpid;
                vlan[3 * i + 2] = aux.tp_vlan_tci;
                skip[i] = 2;
            }
        }
    }
    io[IO_K] = k;
    return fp_resume(ctx, port, io);
}

/* The scratch flush needs (C_SCRATCH), in bytes. */
uint64_t fp_scratch_bytes(void) {
    return OUT_FRAMES * (sizeof(struct mmsghdr) + sizeof(struct iovec) + 1);
}

int fp_abi(void) { return C_LEN * 1000 + K; }
