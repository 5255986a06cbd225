/* The fair-share mark of the egress (docs/protocol.md, "Fair shares of a port"): approximate
 * fair dropping (AFD) done as marks. Per egress port, the bytes of each job (its stat row) and of
 * all other traffic (one more flow) are counted in intervals of 2^FAIR_INTERVAL_SHIFT us. While
 * the port's queue holds FAIR_QDEPTH packets or more, a PASSING copy of a job that sent more than
 * f x (the port's bytes / its active flows) last interval is marked with probability
 * 1 - fair / rate, spread evenly by an accumulator (no random numbers, no division). f, in
 * 1/16ths, is AFD's control loop: it grows x1.25 at an interval that starts with a short queue
 * and shrinks x0.75 at one that starts deep. A flow is active in an interval when its bytes
 * reach 1/FAIR_ACTIVE_DIV of what the port carried the interval before (counted as they first
 * do); the marks of an interval use the last one's counts only.
 * switch_model/fair_share.py is the same step in Python (and fastpath_fair.c in C). */
#ifndef _PASSING_FAIR_SHARE_P4_
#define _PASSING_FAIR_SHARE_P4_

#include "headers.p4"

control FairShare(inout headers_t hdr, in metadata_t meta, inout standard_metadata_t sm) {
    /* Per port: the interval, bytes in it and in the last one, f, flows active in the last one
     * and so far in this one. */
    @name(".fair_port_epoch") register<bit<32>>(FAIR_PORTS) port_epoch;
    @name(".fair_port_cur") register<bit<32>>(FAIR_PORTS) port_cur;
    @name(".fair_port_prev") register<bit<32>>(FAIR_PORTS) port_prev;
    @name(".fair_port_f") register<bit<8>>(FAIR_PORTS) port_f;
    @name(".fair_port_active") register<bit<16>>(FAIR_PORTS) port_active;
    @name(".fair_port_active_next") register<bit<16>>(FAIR_PORTS) port_active_next;
    /* Per port and flow: the interval, bytes in it and in the last one, the accumulator. */
    @name(".fair_flow_epoch") register<bit<32>>(FAIR_PORTS * FAIR_FLOWS) flow_epoch;
    @name(".fair_flow_cur") register<bit<32>>(FAIR_PORTS * FAIR_FLOWS) flow_cur;
    @name(".fair_flow_prev") register<bit<32>>(FAIR_PORTS * FAIR_FLOWS) flow_prev;
    @name(".fair_flow_acc") register<bit<64>>(FAIR_PORTS * FAIR_FLOWS) flow_acc;

    apply {
        bit<32> port = (bit<32>)sm.egress_port;
        bit<32> e = (bit<32>)(sm.egress_global_timestamp >> FAIR_INTERVAL_SHIFT);
        bool deep = sm.enq_qdepth >= FAIR_QDEPTH;
        bool passing = hdr.passing.isValid();
        bool job = passing && meta.job.hit == 1 && meta.job.stat_idx < (bit<32>)(FAIR_FLOWS - 1);
        bit<32> flow = job ? meta.job.stat_idx : (bit<32>)(FAIR_FLOWS - 1);
        bit<32> len = sm.packet_length;

        bit<32> pe; bit<32> pcur; bit<32> pprev; bit<8> f; bit<16> active; bit<16> active_next;
        port_epoch.read(pe, port);
        port_cur.read(pcur, port);
        port_prev.read(pprev, port);
        port_f.read(f, port);
        port_active.read(active, port);
        port_active_next.read(active_next, port);
        if (pe != e) {
            pprev = (pe + 1 == e) ? pcur : 0;
            active = (pe + 1 == e) ? active_next : 0;
            pcur = 0;
            active_next = 0;
            if (f < FAIR_F_MIN) {
                f = FAIR_F_MIN;
            }
            if (deep) {
                f = f - (f >> 2);
                if (f < FAIR_F_MIN) {
                    f = FAIR_F_MIN;
                }
            } else {
                f = f + (f >> 2);
                if (f > FAIR_F_MAX) {
                    f = FAIR_F_MAX;
                }
            }
            port_epoch.write(port, e);
            port_prev.write(port, pprev);
            port_f.write(port, f);
            port_active.write(port, active);
        }

        bit<32> fi = port * FAIR_FLOWS + flow;
        bit<32> fe; bit<32> fcur; bit<32> fprev; bit<64> acc;
        flow_epoch.read(fe, fi);
        flow_cur.read(fcur, fi);
        flow_prev.read(fprev, fi);
        flow_acc.read(acc, fi);
        if (fe != e) {
            fprev = (fe + 1 == e) ? fcur : 0;
            fcur = 0;
            flow_epoch.write(fi, e);
            flow_prev.write(fi, fprev);
        }

        if (passing && deep && active >= 2 && fprev != 0) {
            /* rate and fair share, both x active x 16 */
            bit<64> rate = (bit<64>)active * (bit<64>)fprev * 16;
            bit<64> fair = (bit<64>)pprev * (bit<64>)f;
            if (rate > fair) {
                acc = acc + (rate - fair);
                if (acc >= rate) {
                    hdr.passing.flags = hdr.passing.flags | FLAG_CONGESTED;
                    acc = acc - rate;
                    if (acc >= rate) {
                        acc = 0;
                    }
                }
                flow_acc.write(fi, acc);
            }
        }
        /* Active this interval: the flow's bytes reach 1/FAIR_ACTIVE_DIV of the port's last. */
        bit<64> old = (bit<64>)fcur * FAIR_ACTIVE_DIV;
        bit<64> now = ((bit<64>)fcur + (bit<64>)len) * FAIR_ACTIVE_DIV;
        if ((fcur == 0 || old < (bit<64>)pprev) && now >= (bit<64>)pprev) {
            active_next = active_next + 1;
        }
        flow_cur.write(fi, fcur + len);
        port_cur.write(port, pcur + len);
        port_active_next.write(port, active_next);
    }
}

#endif
