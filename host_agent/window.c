/* The host agent's window, compiled (host_agent/window_c.py): a call's next packets built and
 * its results taken, a batch at a time, on the arrays of host_agent.stream._Call.
 *
 * Each function does, slot by slot, what SlotStreamer._send and SlotStreamer._collect with
 * _Call.absorb do in numpy for a whole batch; tests/host_agent/test_window_c.py holds the two
 * to the same bytes and the same state after every batch. Python keeps everything else: loss
 * recovery, probes, quorum, results kept early, timing. Why slot by slot gives the same answer
 * as numpy's batch: a slot has one packet in flight, so a batch holds each slot at most once,
 * and the fragments of different slots are disjoint.
 *
 * Constants (-D, from passing.protocol and passing.packet): K, PAYLOAD_BYTES, the header's
 * field offsets (OFF_*), EXP_BIAS, POISON, MIN_E, SPEC_SLACK, TAG_LAST, the flags. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The layout of the context (uint64 each), as window_c.py's. */
enum {
    X_BLOCKS, X_BLOCKS_F32, X_LOCAL_EXP, X_AGREED, X_PREDICTED, X_PROPOSED, X_REDO, X_OUT,
    X_COUNTS, X_STEP, X_PENDING, X_PFRAG, X_PROUND, X_FIRST_SEQ, X_LAST_SEQ, X_SENT, X_CLOSE,
    X_WAITED, X_CLOSE_NEXT, X_ABSTAINING, X_RESENT, X_RETRIED, X_PROBED, X_PAYLOADS, X_ROUNDS,
    X_NFRAG, X_USED, X_SBITS, X_TAG, X_QUORUM, X_EAGER, X_LOCAL_GPUS, X_POOL_FLAG, X_EPOCH_BITS,
    X_JOB, X_SESSION, X_WINDOW, X_RESULT_FLAGS, X_COMPLETE, X_LEN
};

#define TAG_CALL (TAG_LAST - 1)

static inline uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }
static inline void put16(uint8_t *p, uint32_t v) { p[0] = v >> 8; p[1] = v; }
static inline void put32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

#define PTR(t, i) ((t *)(uintptr_t)x[i])

/* 2**(S - e) for an exp field; an all-zero block (field 0) uses the smallest exponent
 * (fixed_point._shift). */
static double shift(int field, int s_bits) {
    int e = field > 0 ? field - EXP_BIAS : MIN_E;
    return ldexp(1.0, s_bits - e);
}

int wc_abi(void) { return X_LEN * 1000 + K; }

/* The fragment a slot's next packet carries: its exponent round (step 0, agreeing first) or a
 * data round. */
static int64_t next_fragment(int64_t s, int64_t st, int64_t used, int predicted) {
    if (predicted)
        return s + st * used;
    return st == 0 ? s : s + (st - 1) * used;
}

/* _send without the transmission: the next packet of each of `slots` written into its row of
 * the call's payloads, and the slot's state set as waiting on it (sequence numbers seq0, ...).
 * res[0] += packets that abstain, res[1] += packets that ask for CLOSE. Every slot is checked
 * first, nothing written if one is not of this call or has no next packet: res[2] is then its
 * position plus one (the caller raises; a wrong index must not read or write past the call's
 * arrays). */
void wc_send(const uint64_t *x, const int64_t *slots, int64_t n, int64_t seq0, int64_t *res) {
    const uint8_t *local_exp = PTR(uint8_t, X_LOCAL_EXP), *agreed = PTR(uint8_t, X_AGREED);
    const uint8_t *predicted = PTR(uint8_t, X_PREDICTED);
    const uint32_t *rounds = PTR(uint32_t, X_ROUNDS);
    const int64_t *step = PTR(int64_t, X_STEP);
    uint8_t *redo = PTR(uint8_t, X_REDO), *pending = PTR(uint8_t, X_PENDING);
    uint8_t *close = PTR(uint8_t, X_CLOSE), *waited = PTR(uint8_t, X_WAITED);
    uint8_t *close_next = PTR(uint8_t, X_CLOSE_NEXT), *abstaining = PTR(uint8_t, X_ABSTAINING);
    uint8_t *resent = PTR(uint8_t, X_RESENT), *retried = PTR(uint8_t, X_RETRIED);
    uint8_t *probed = PTR(uint8_t, X_PROBED), *payloads = PTR(uint8_t, X_PAYLOADS);
    int64_t *p_frag = PTR(int64_t, X_PFRAG), *first_seq = PTR(int64_t, X_FIRST_SEQ);
    int64_t *last_seq = PTR(int64_t, X_LAST_SEQ);
    uint32_t *p_round = PTR(uint32_t, X_PROUND);
    const int64_t nfrag = (int64_t)x[X_NFRAG], used = (int64_t)x[X_USED];
    const int s_bits = (int)x[X_SBITS], quorum = (int)x[X_QUORUM], eager = (int)x[X_EAGER];
    const int f32 = (int)x[X_BLOCKS_F32];
    const uint32_t tag = (uint32_t)x[X_TAG];
    for (int64_t i = 0; i < n; i++) {
        const int64_t s = slots[i];
        const int64_t f = s >= 0 && s < used ? next_fragment(s, step[s], used, predicted) : -1;
        if (f < 0 || f >= nfrag || step[s] < 0) {
            res[2] = i + 1;
            return;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t s = slots[i], st = step[s];
        const int64_t f = next_fragment(s, st, used, predicted);
        const int own = local_exp[f];
        int scale, data, abstain;
        if (predicted) {
            scale = redo[s] ? agreed[f] : predicted[f];
            data = scale != POISON;
            abstain = data && own > scale && own != POISON;
        } else {
            scale = agreed[f];
            data = st > 0 && scale != POISON;
            abstain = data && own > scale;
        }
        data = data && !abstain;
        uint8_t *row = payloads + s * PAYLOAD_BYTES;
        uint8_t *v = row + OFF_VALUES;
        if (data) {
            const double m = shift(scale, s_bits);
            if (f32) {
                const float *b = PTR(float, X_BLOCKS) + f * K;
                for (int k = 0; k < K; k++)
                    put32(v + 4 * k, (uint32_t)(int32_t)rint((double)b[k] * m));
            } else {
                const double *b = PTR(double, X_BLOCKS) + f * K;
                for (int k = 0; k < K; k++)
                    put32(v + 4 * k, (uint32_t)(int32_t)rint(b[k] * m));
            }
        } else {
            memset(v, 0, 4 * K);
        }
        int exp;
        if (predicted)
            exp = own;
        else if (st == 0)
            exp = local_exp[s];
        else
            exp = f + used < nfrag ? local_exp[f + used] : 0;
        const int speculating = predicted && !redo[s];
        const int holds_back = abstain && !speculating;
        const int cl = (close_next[s] || eager) && quorum && !holds_back;
        abstaining[s] = holds_back;
        int last = f + used >= nfrag;
        if (!predicted)
            last = last && st > 0;
        const uint32_t rnd = rounds[s];
        row[OFF_FLAGS] = (cl ? FLAG_CONTRIB | FLAG_CLOSE : FLAG_CONTRIB) | (uint8_t)x[X_POOL_FLAG];
        row[OFF_VERSION] = (uint8_t)x[X_EPOCH_BITS] | (rnd & 1);
        put32(row + OFF_ROUND, rnd);
        put32(row + OFF_FRAG, (uint32_t)f);
        put16(row + OFF_NUM_CONTRIB, abstain ? 0 : (uint32_t)x[X_LOCAL_GPUS]);
        row[OFF_EXP] = (uint8_t)exp;
        row[OFF_TAG] = (uint8_t)(last ? tag | TAG_LAST : tag);
        pending[s] = 1;
        p_frag[s] = f;
        p_round[s] = rnd;
        first_seq[s] = last_seq[s] = seq0 + i;
        resent[s] = retried[s] = probed[s] = 0;
        close[s] = cl;
        waited[s] = 0;
        res[0] += abstain;
        res[1] += cl;
    }
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* _collect and absorb: each of the n result rows (PAYLOAD_BYTES each, in order of arrival)
 * that is the awaited result of a slot is taken, in that order. code[i]: 1 taken, 2 a result of
 * this session not taken (for SlotStreamer._keep_early), 0 anything else. Out: taken slots
 * (`slots`) and their rows (`keep`), the slots with another packet to send (`more`), the clean
 * round trips' median and minimum (`rtt`). res: [taken, more, newest transmission proved
 * summed (-1: none), clean round trips, speculations missed]. */
void wc_take(const uint64_t *x, const uint8_t *rows, int64_t n, double now, uint8_t *code,
             int64_t *slots, int64_t *keep, int64_t *more, double *rtt, int64_t *res) {
    const uint8_t *predicted = PTR(uint8_t, X_PREDICTED);
    uint8_t *agreed = PTR(uint8_t, X_AGREED), *proposed = PTR(uint8_t, X_PROPOSED);
    uint8_t *redo = PTR(uint8_t, X_REDO), *pending = PTR(uint8_t, X_PENDING);
    const uint8_t *resent = PTR(uint8_t, X_RESENT), *probed = PTR(uint8_t, X_PROBED);
    const uint8_t *waited = PTR(uint8_t, X_WAITED);
    uint8_t *close_next = PTR(uint8_t, X_CLOSE_NEXT);
    const int64_t *p_frag = PTR(int64_t, X_PFRAG), *first_seq = PTR(int64_t, X_FIRST_SEQ);
    const int64_t *last_seq = PTR(int64_t, X_LAST_SEQ);
    const uint32_t *p_round = PTR(uint32_t, X_PROUND);
    const double *sent = PTR(double, X_SENT);
    double *out = PTR(double, X_OUT);
    int64_t *counts = PTR(int64_t, X_COUNTS), *step = PTR(int64_t, X_STEP);
    uint32_t *rounds = PTR(uint32_t, X_ROUNDS);
    const int64_t nfrag = (int64_t)x[X_NFRAG], used = (int64_t)x[X_USED];
    const int64_t window = (int64_t)x[X_WINDOW], complete = (int64_t)x[X_COMPLETE];
    const int s_bits = (int)x[X_SBITS];
    const uint32_t tag = (uint32_t)x[X_TAG], job = (uint32_t)x[X_JOB];
    const uint8_t result_flags = (uint8_t)x[X_RESULT_FLAGS];
    const uint64_t session = x[X_SESSION];
    int64_t taken = 0, nmore = 0, newest = -1, clean = 0, missed = 0, marked = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *r = rows + i * PAYLOAD_BYTES;
        const int64_t s = get16(r + OFF_SLOT);
        code[i] = 0;
        if (get16(r + OFF_JOB_ID) != job || (r[OFF_FLAGS] & ~FLAG_CONGESTED) != result_flags
                || get64(r + OFF_SESSION) != session || s >= window)
            continue;
        const int64_t f = get32(r + OFF_FRAG);
        code[i] = 2;
        if ((r[OFF_TAG] & TAG_CALL) != tag || s >= used || !pending[s] || p_frag[s] != f
                || p_round[s] != get32(r + OFF_ROUND))
            continue;
        code[i] = 1;
        marked += (r[OFF_FLAGS] & FLAG_CONGESTED) != 0;
        pending[s] = 0;
        slots[taken] = s;
        keep[taken++] = i;
        if (!resent[s])  /* Karn: a resent packet's round trip is ambiguous */
            rtt[2 + clean++] = now - sent[s];
        const int64_t seq = probed[s] ? last_seq[s] : first_seq[s];
        if (seq > newest)
            newest = seq;
        const int64_t contrib = get16(r + OFF_NUM_CONTRIB);
        const int most = r[OFF_EXP];
        close_next[s] = waited[s] && contrib < complete;
        rounds[s] += 1;
        int sum = 0;  /* this result is the fragment's sum, at agreed[f] */
        int next;  /* the slot has another packet to send */
        if (!predicted) {
            if (step[s] == 0) {
                agreed[f] = most;
            } else {
                counts[f] = contrib;
                sum = 1;
                if (f + used < nfrag)
                    agreed[f + used] = most;
            }
            /* (agreed[f] read before the look-ahead write, which is another fragment's) */
            step[s] += 1;
            next = s + (step[s] - 1) * used < nfrag;
        } else {
            const int pred = predicted[f];
            const int holds = !redo[s] && (most == POISON || most == 0
                                           || (most <= pred && most + SPEC_SLACK >= pred));
            if (!redo[s])
                proposed[f] = most;
            if (holds)
                agreed[f] = most == POISON ? POISON : pred;
            const int miss = !redo[s] && !holds;
            if (miss) {
                agreed[f] = most;
                missed++;
            } else {
                counts[f] = contrib;
                sum = 1;
                step[s] += 1;
            }
            redo[s] = miss;
            next = miss || s + step[s] * used < nfrag;
        }
        if (sum && agreed[f] != POISON) {
            const double m = 1.0 / shift(agreed[f], s_bits);
            const uint8_t *v = r + OFF_VALUES;
            double *o = out + f * K;
            for (int k = 0; k < K; k++)
                o[k] = (double)(int32_t)get32(v + 4 * k) * m;
        }
        if (next)
            more[nmore++] = s;
    }
    if (clean) {
        double *d = rtt + 2;
        qsort(d, clean, sizeof *d, by_value);
        rtt[0] = clean % 2 ? d[clean / 2] : (d[clean / 2 - 1] + d[clean / 2]) / 2;
        rtt[1] = d[0];
    }
    res[0] = taken;
    res[1] = nmore;
    res[2] = newest;
    res[3] = clean;
    res[4] = missed;
    res[5] = marked;
}
