/* Ordinary (non-aggregation) traffic: exact-match L2 forwarding on the destination MAC, with a
 * controller-chosen flood group as the default so ARP and unknown unicast reach every host. */
#ifndef _PASSING_FORWARDING_P4_
#define _PASSING_FORWARDING_P4_

#include "headers.p4"

control L2Forward(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    @name(".l2_to_port") action to_port(bit<9> port) {
        sm.egress_spec = port;
    }
    @name(".l2_flood") action flood(bit<16> mcast_grp) {
        sm.mcast_grp = mcast_grp;
        meta.flooded = 1;
    }
    @name(".l2_drop") action drop() {
        mark_to_drop(sm);
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

/* Egress half: a flooded copy never goes back out of the port it came in on. */
control L2Prune(inout metadata_t meta, inout standard_metadata_t sm) {
    apply {
        if (meta.flooded == 1 && sm.egress_port == sm.ingress_port) {
            mark_to_drop(sm);
        }
    }
}

#endif
