/* The model switch's Aggregation control in C (Pipeline._aggregate): a slot's version word and
 * values row after an admitted packet, and the packet's event. Part of the compiled PASSING path
 * (fastpath.c says what it is held to). */

#include "fastpath.h"

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
int aggregate(const uint64_t *ctx, const uint8_t *frame, const uint64_t *j, const struct hdr *h,
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
