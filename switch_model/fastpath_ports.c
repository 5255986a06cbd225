/* The model switch's port loop in C, for the switch process (switch_model/ports.py): a batch of
 * frames received from a packet socket with recvmmsg, taken through the compiled PASSING path
 * (fastpath.c) up to the first frame it does not take, and the copies sent out of their egress
 * ports with sendmmsg, marked where the egress queue is deep or a job exceeds its fair share
 * (fastpath_fair.c). The Python port loop does the same
 * one frame at a time; tests/unit/test_model_ports.py runs both. */

#define _GNU_SOURCE
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "fastpath.h"

/* The egress queue's depth: the bytes the kernel still holds of what this switch sent on the
 * port (SIOCOUTQ: frames queued in the link's qdisc, each counted with its buffer), compared
 * with MARK_BYTES and FAIR_BYTES (fastpath.py says why) where the P4 program reads enq_qdepth. */
static int queued_bytes(int fd) {
    int queued = 0;
    return ioctl(fd, SIOCOUTQ, &queued) == 0 ? queued : 0;
}

/* The fair-share flow of a copy: its job's stat row if it is a PASSING copy of a known job
 * (the P4 program's meta.job.stat_idx), else the one flow of all other traffic. */
static uint32_t fair_flow(const uint64_t *ctx, const uint8_t *f, uint32_t len) {
    if (!passing_copy(f, len) || len < FLAGS_OFF + 1) return FAIR_FLOWS - 1;
    const uint64_t *j = find_job(ctx, be16(f + PASSING_OFF), (f[FLAGS_OFF] & FLAG_POOL) >> 4);
    return j && j[J_STAT] < FAIR_FLOWS - 1 ? (uint32_t)j[J_STAT] : FAIR_FLOWS - 1;
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
    uint64_t epoch = fair_epoch_now();
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
        int queued = queued_bytes((int)fds[port]);
        for (int c = 0; c < m; c++) { /* the egress marks PASSING packets only */
            uint8_t *f = iov[c].iov_base;
            uint32_t len = (uint32_t)iov[c].iov_len;
            int passing = passing_copy(f, len);
            int fair = fp_fair_step((uint64_t *)ctx[C_FAIRP], (uint64_t *)ctx[C_FAIRF], port,
                                    fair_flow(ctx, f, len), len, epoch, queued >= FAIR_BYTES,
                                    passing);
            if (passing && (queued >= MARK_BYTES || fair)) f[FLAGS_OFF] |= FLAG_CONGESTED;
        }
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
        while (j < k && skip[j] != 1 && !compiled_takes(ctx, lens[j], skip[j]))
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
