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
 * Frames off the parser's PASSING path go through the result guard and L2 forwarding
 * (fastpath_forward.c); fp_run stops at a frame with a tag the kernel took off, or one too short
 * or too long for it, and the Python pipeline takes those.
 *
 * The port loop that feeds it from packet sockets is fastpath_ports.c; what both use, fastpath.h. The
 * constants come from passing.protocol as -D definitions (switch_model/fastpath.py): K,
 * PASSING_PORT, the flags, the event and drop codes. */

#include "fastpath.h"

void count(const uint64_t *ctx, int which, uint64_t index, uint64_t nbytes) {
    uint64_t *cells = (uint64_t *)ctx[which];
    if (index >= ctx[which + 1]) return; /* as SwitchState.count: never crash the switch */
    cells[2 * index] += 1;
    cells[2 * index + 1] += nbytes;
}

static uint32_t fold(uint64_t total) {
    while (total >> 16) total = (total & 0xFFFF) + (total >> 16);
    return ~total & 0xFFFF;
}

const uint64_t *find_job(const uint64_t *ctx, uint32_t job, uint32_t pool) {
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

/* Whether this path takes a received frame (skip: 0 as received, 1 dropped unseen, 2 with
 * the tag the kernel took off): one with an Ethernet header, short enough for the output
 * arrays, while the tables are usable. The frames left are Pipeline.process's. */
int compiled_takes(const uint64_t *ctx, uint32_t len, uint8_t skip) {
    return !skip && ctx[C_MAXCOPIES] && len >= IPV4_OFF && len <= FAST_MAX_FRAME;
}

void emit(const uint64_t *ctx, uint64_t *io, uint32_t port, const uint8_t *frame, uint32_t len) {
    uint64_t k = io[IO_NOUT]++;
    ((uint32_t *)ctx[C_OUTPORT])[k] = port;
    ((uint32_t *)ctx[C_OUTOFF])[k] = (uint32_t)io[IO_USED];
    ((uint32_t *)ctx[C_OUTLEN])[k] = len;
    memcpy((uint8_t *)ctx[C_OUT] + io[IO_USED], frame, len);
    io[IO_USED] += len;
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
 * nonzero for a frame the caller handles), all arrived on `port`: each frame this path takes
 * is processed here in order, until one it does not, or until the output arrays might not hold
 * the next frame's copies (then io[IO_FULL] = 1). Returns the index of the first frame not
 * processed. */
int64_t fp_run(const uint64_t *ctx, const uint8_t *rx, uint64_t stride, const uint32_t *lens,
               const uint8_t *skip, uint32_t port, int64_t start, int64_t end, uint64_t *io) {
    io[IO_FULL] = 0;
    for (int64_t i = start; i < end; i++) {
        const uint8_t *f = rx + i * stride;
        uint32_t len = lens[i];
        if (!compiled_takes(ctx, len, skip[i])) return i;
        if (io[IO_NOUT] + ctx[C_MAXCOPIES] > ctx[C_MAXOUT]
                || io[IO_USED] + ctx[C_MAXCOPIES] * len > ctx[C_OUTCAP]) {
            io[IO_FULL] = 1;
            return i;
        }
        if (passing_path(f, len)) passing(ctx, port, f, len, io);
        else forward(ctx, port, f, len, io);
    }
    return end;
}

int fp_abi(void) { return C_LEN * 1000 + K; }
