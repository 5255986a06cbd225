/* The fair-share mark of the model switch's egress in C, for the compiled port loop
 * (fastpath_ports.c): switch_model/fair_share.py's FairShare.step, on the same arrays (ctx's
 * C_FAIRP and C_FAIRF, the Pipeline's), so the Python and the compiled loop of one switch share
 * their counters. docs/protocol.md, "Fair shares of a port", says what it does and why. */

#define _GNU_SOURCE
#include <time.h>

#include "fastpath.h"

enum { FP_EPOCH, FP_CUR, FP_PREV, FP_F, FP_ACTIVE, FP_ACTIVE_NEXT, FP_COLS };
enum { FF_EPOCH, FF_CUR, FF_PREV, FF_ACC, FF_COLS };

uint64_t fair_epoch_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    return (us >> FAIR_INTERVAL_SHIFT) & 0xFFFFFFFFu;
}

static void roll(uint64_t *epoch, uint64_t *cur, uint64_t *prev, uint64_t e) {
    *prev = ((*epoch + 1) & 0xFFFFFFFFu) == e ? *cur : 0;
    *cur = 0;
    *epoch = e;
}

int fp_fair_step(uint64_t *ports, uint64_t *flows, uint32_t port, uint32_t flow, uint64_t nbytes,
                 uint64_t e, int deep, int passing) {
    if (port >= FAIR_PORTS || flow >= FAIR_FLOWS) return 0;
    uint64_t *p = ports + (uint64_t)port * FP_COLS;
    if (p[FP_EPOCH] != e) {
        int last = ((p[FP_EPOCH] + 1) & 0xFFFFFFFFu) == e;
        p[FP_ACTIVE] = last ? p[FP_ACTIVE_NEXT] : 0;
        p[FP_ACTIVE_NEXT] = 0;
        roll(&p[FP_EPOCH], &p[FP_CUR], &p[FP_PREV], e);
        uint64_t f = p[FP_F] < FAIR_F_MIN ? FAIR_F_MIN : p[FP_F];
        if (deep) f = f - (f >> 2) < FAIR_F_MIN ? FAIR_F_MIN : f - (f >> 2);
        else f = f + (f >> 2) > FAIR_F_MAX ? FAIR_F_MAX : f + (f >> 2);
        p[FP_F] = f;
    }
    uint64_t *fl = flows + ((uint64_t)port * FAIR_FLOWS + flow) * FF_COLS;
    if (fl[FF_EPOCH] != e) roll(&fl[FF_EPOCH], &fl[FF_CUR], &fl[FF_PREV], e);
    int mark = 0;
    uint64_t prev = fl[FF_PREV], port_prev = p[FP_PREV];
    if (passing && deep && p[FP_ACTIVE] >= 2 && prev) {
        uint64_t rate = p[FP_ACTIVE] * prev * 16, fair = port_prev * p[FP_F];
        if (rate > fair) {
            uint64_t acc = fl[FF_ACC] + rate - fair;
            if (acc >= rate) {
                mark = 1;
                acc -= rate;
                if (acc >= rate) acc = 0;
            }
            fl[FF_ACC] = acc;
        }
    }
    uint64_t old = fl[FF_CUR];
    if ((old == 0 || old * FAIR_ACTIVE_DIV < port_prev) && (old + nbytes) * FAIR_ACTIVE_DIV >= port_prev)
        p[FP_ACTIVE_NEXT]++;
    fl[FF_CUR] = old + nbytes;
    p[FP_CUR] += nbytes;
    return mark;
}
