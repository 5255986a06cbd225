/* ResultGuard and L2Forward in C (switch_model/forwarding.py, p4src/include/guard.p4 and
 * forwarding.p4) for a frame off the PASSING path: drop the tagged, the unchecked and the forged
 * (counted), forward the rest by destination MAC. Why in C: a TCP segment through the Python
 * pipeline costs the model several times what an aggregation packet costs in C, so TCP beside a
 * job, and the baselines' rings, were held back by the emulator's CPU rather than by the links.
 * Held to the Python pipeline frame for frame by tests/unit/test_fastpath.py. */

#include "fastpath.h"

/* guard_drops: 1 (counted) if the frame is dropped. */
static int guard_drops(const uint64_t *ctx, const uint8_t *f, uint32_t len) {
    uint32_t type = be16(f + 12);
    if (type == TPID_0 || type == TPID_1 || type == TPID_2) {
        count(ctx, C_GLOBAL, GDROP_TAGGED, len);
        return 1;
    }
    if (len < UDP_OFF || type != 0x0800 || f[IPV4_OFF + 9] != 17 || (f[IPV4_OFF + 6] & 0x1F)
            || f[IPV4_OFF + 7])
        return 0; /* not IPv4 UDP, or a later fragment (no UDP header in it) */
    if ((f[IPV4_OFF] & 0x0F) != 5 || len < PASSING_OFF) {
        count(ctx, C_GLOBAL, GDROP_UNCHECKED_UDP, len);
        return 1;
    }
    if (be16(f + UDP_OFF) == PASSING_PORT) {
        count(ctx, C_GLOBAL, GDROP_FORGED, len);
        return 1;
    }
    const uint64_t *g = (const uint64_t *)ctx[C_GUARDS];
    uint32_t dport = be16(f + UDP_OFF + 2);
    for (uint64_t i = 0; i < ctx[C_NGUARDS]; i++)
        if (g[i * G_COLS + G_PORT] == dport) {
            count(ctx, C_JOBSTATS, g[i * G_COLS + G_STAT] * JOB_STATS_STRIDE + DROP_FORGED_RESULT,
                  len);
            return 1;
        }
    return 0;
}

/* l2_forward's entry for a MAC (rows sorted by MAC), or 0. */
static const uint64_t *find_l2(const uint64_t *ctx, uint64_t mac) {
    const uint64_t *rows = (const uint64_t *)ctx[C_L2];
    uint64_t lo = 0, hi = ctx[C_NL2];
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2, m = rows[mid * L_COLS + L_MAC];
        if (m == mac) return rows + mid * L_COLS;
        if (m < mac) lo = mid + 1; else hi = mid;
    }
    return 0;
}

void forward(const uint64_t *ctx, uint32_t port, const uint8_t *frame, uint32_t len, uint64_t *io) {
    if (guard_drops(ctx, frame, len)) return;
    uint64_t mac = ((uint64_t)be16(frame) << 32) | be32(frame + 2);
    const uint64_t *e = find_l2(ctx, mac);
    uint64_t kind = e ? e[L_KIND] : ctx[C_L2DEF], arg = e ? e[L_ARG] : ctx[C_L2DEFARG];
    if (kind == L2_TO_PORT) {
        emit(ctx, io, (uint32_t)arg, frame, len);
    } else if (kind == L2_FLOOD) { /* every replica of the group but the port it came in on */
        const uint64_t *r = (const uint64_t *)ctx[C_REPLICAS];
        for (uint64_t i = 0; i < ctx[C_NREPLICAS]; i++)
            if (r[i * R_COLS + R_GROUP] == arg && r[i * R_COLS + R_PORT] != port)
                emit(ctx, io, (uint32_t)r[i * R_COLS + R_PORT], frame, len);
    }
}
