"""What the model does with frames that are not aggregation packets, as the ResultGuard and
L2Forward controls do (p4src/include/guard.p4, forwarding.p4): drop the forged, the unchecked
and the tagged (counted), forward the rest by destination MAC."""

from __future__ import annotations

from passing import protocol as P
from switch_model.frame import (
    ETH_IPV4,
    ETHERTYPE,
    IP_PROTO_UDP,
    IPV4_FRAG_HI,
    IPV4_FRAG_LO,
    IPV4_IHL,
    IPV4_PROTO,
    IPV4_VER_IHL,
    PASSING_OFF,
    PASSING_PORT_BYTES,
    UDP_DPORT,
    UDP_OFF,
    UDP_SPORT,
)
from switch_model.state import SwitchState


def guard_drops(st: SwitchState, frame: bytes) -> bool:
    """True if the frame is dropped as a forged result, unchecked UDP or tagged (counted)."""
    if int.from_bytes(frame[ETHERTYPE], "big") in P.VLAN_TPIDS:
        st.count("global_drops", P.GlobalDrop.TAGGED, len(frame))
        return True
    if len(frame) < UDP_OFF or frame[ETHERTYPE] != ETH_IPV4 \
            or frame[IPV4_PROTO] != IP_PROTO_UDP \
            or frame[IPV4_FRAG_HI] & 0x1F or frame[IPV4_FRAG_LO]:
        return False  # not IPv4 UDP, or a later fragment (no UDP header in it)
    if frame[IPV4_VER_IHL] & 0x0F != IPV4_IHL or len(frame) < PASSING_OFF:
        st.count("global_drops", P.GlobalDrop.UNCHECKED_UDP, len(frame))
        return True
    if frame[UDP_SPORT] == PASSING_PORT_BYTES:
        st.count("global_drops", P.GlobalDrop.FORGED, len(frame))
        return True
    guard = st.tables["result_guard"].entries.get((int.from_bytes(frame[UDP_DPORT], "big"),))
    if guard is None:
        return False
    st.count("job_stats", guard.params["stat_idx"] * P.JOB_STATS_STRIDE
             + P.JobDrop.FORGED_RESULT, len(frame))
    return True


def l2_forward(st: SwitchState, port: int, frame: bytes) -> list[tuple[int, bytes]]:
    """Where an ordinary frame goes: its destination MAC's port, a flood, or nowhere."""
    t = st.tables["l2_forward"]
    action = t.entries.get((int.from_bytes(frame[0:6], "big"),)) or t.default
    if action.name == "l2_to_port":
        return [(action.params["port"], frame)]
    if action.name == "l2_flood":
        return [(p, frame) for p, _ in st.mcast.get(action.params["mcast_grp"], ())
                if p != port]
    return []
