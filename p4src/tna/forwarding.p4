/* Ordinary traffic: the v1model program's forwarding.p4 on Tofino, the same table and actions
 * (exact-match L2 on the destination MAC, a flood group as the default). Egress prunes a flooded
 * copy from the port it came in on (passing_tna.p4), from what ingress bridges. */
#ifndef _PASSING_TNA_FORWARDING_P4_
#define _PASSING_TNA_FORWARDING_P4_

#include "headers.p4"

control L2Forward(inout headers_t hdr, inout ingress_intrinsic_metadata_for_tm_t tm_md,
                  inout ingress_intrinsic_metadata_for_deparser_t dprsr_md) {
    @name(".l2_to_port") action to_port(bit<9> port) {
        tm_md.ucast_egress_port = port;
    }
    @name(".l2_flood") action flood(bit<16> mcast_grp) {
        tm_md.mcast_grp_a = mcast_grp;
        hdr.bridge.flooded = 1;
    }
    @name(".l2_drop") action drop() {
        dprsr_md.drop_ctl = DROP_CTL_DROP;
    }
    @name(".l2_forward") table l2_forward {
        key = { hdr.ethernet.dst_addr: exact @name("dst_mac"); }
        actions = { to_port; flood; drop; }
        default_action = drop();
        size = 1024;
    }
    apply {
        l2_forward.apply();
    }
}

#endif
