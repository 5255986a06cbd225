"""The P4 program (p4src/passing.p4) executed in Python, packet for packet.

Every branch below mirrors a branch of the P4 source, in the same order, with the same register
layouts, so that what leaves a port, what the counters say and what the registers hold are the
same as on BMv2. The conformance suite (tests/conformance) holds both targets to that.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from p4.config.v1 import p4info_pb2

from passing import lanes
from passing import protocol as P
from passing.p4info import P4InfoIndex
from passing.protocol import JobEvent as E
from switch_model.state import Action, SwitchState

ETH_IPV4 = b"\x08\x00"
IPV4_OFF, UDP_OFF, PASSING_OFF = 14, 34, 42
VALUES_OFF = PASSING_OFF + P.HEADER_BYTES
PASSING_END = VALUES_OFF + P.VALUES_BYTES
PASSING_UDP_LEN = 8 + P.PAYLOAD_BYTES
PASSING_IPV4_LEN = 20 + PASSING_UDP_LEN

_HDR = struct.Struct("!HHBBBBIHBBQ")


class Header(NamedTuple):
    """The PASSING header, field for field (passing.protocol.HEADER_FIELDS)."""

    job_id: int
    slot: int
    contributor: int
    flags: int
    version: int
    level: int
    frag: int
    num_contrib: int
    exp: int
    tag: int
    session: int


_IPV4_WORDS = struct.Struct("!10H")
_UDP_PORTS = struct.Struct("!HH")
_PASSING_PORT_BYTES = P.PASSING_UDP_PORT.to_bytes(2, "big")

FLAG_CONTRIB, FLAG_RESULT, FLAG_RETRANS = (int(P.Flag.CONTRIB), int(P.Flag.RESULT),
                                           int(P.Flag.RETRANS))
FLAGS_KNOWN = P.FLAGS_MASK
DROP_NONE = None

# Defaults the P4 program declares for its tables (P4Info only carries const defaults).
INITIAL_DEFAULTS = {
    "job_config": Action("NoAction", {}),
    "membership": Action("NoAction", {}),
    "peer_rewrite": Action("no_peer", {}),
    "result_guard": Action("NoAction", {}),
    "l2_forward": Action("l2_drop", {}),
}

_MASK72 = (1 << 72) - 1
_MASK64 = (1 << 64) - 1


def ipv4_checksum(header20: bytes | bytearray) -> int:
    """csum16 over the IPv4 header with the checksum field taken as zero."""
    words = _IPV4_WORDS.unpack_from(header20)
    total = sum(words) - words[5]
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


class SlotStore:
    """Registers slot_state and slot_values of the Aggregation control."""

    def __init__(self, capacity: int = P.SLOT_CAPACITY):
        self.capacity = capacity
        # slot_state word: gen(32) ++ session(64) ++ v1(72) ++ v0(72); each version word:
        # rdy(8) ++ nsum(16) ++ exp(8) ++ count(8) ++ bitmap(32). Kept as ints, as in the P4.
        self.state = [0] * capacity
        self.values = [0] * (2 * capacity)

    def reset(self) -> None:
        self.state = [0] * self.capacity
        self.values = [0] * (2 * self.capacity)

    def _cells(self, register: str) -> list[int]:
        regs = {"slot_state": self.state, "slot_values": self.values}
        if register not in regs:
            raise KeyError(f"no register {register}")
        return regs[register]

    def dump(self, register: str) -> list[int]:
        """Every cell of `register`, in index order."""
        return list(self._cells(register))

    def read(self, register: str, index: int) -> int:
        cells = self._cells(register)
        if not 0 <= index < len(cells):
            raise IndexError(f"{register}[{index}] out of range (size {len(cells)})")
        return cells[index]


class Pipeline:
    def __init__(self, state: SwitchState):
        self.state = state
        self.slots = SlotStore()
        for table, action in INITIAL_DEFAULTS.items():
            state.tables[table].default = action

    @classmethod
    def from_p4info(cls, info: p4info_pb2.P4Info) -> Pipeline:
        return cls(SwitchState(P4InfoIndex(info)))

    def reset(self) -> None:
        self.state.reset()
        self.slots.reset()
        for table, action in INITIAL_DEFAULTS.items():
            self.state.tables[table].default = action

    # -- ingress + egress for one packet -------------------------------------------------------
    def process(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Packets (egress port, frame) that leave the switch for `frame` arriving on `port`."""
        with self.state.lock:
            # The parser's path to parse_passing: IPv4 with ihl 5, fragment offset 0, UDP, and
            # the PASSING port; a frame too short for the UDP header never gets there.
            if (len(frame) >= 42 and frame[12:14] == ETH_IPV4 and frame[14] & 0x0F == 5
                    and (frame[20] & 0x1F) == 0 and frame[21] == 0
                    and frame[23] == 17 and frame[36:38] == _PASSING_PORT_BYTES):
                return self._passing(port, frame)
            if len(frame) < 14:
                return []
            if self._guard(frame):
                return []
            return self._l2(port, frame)

    # -- ResultGuard -------------------------------------------------------------------------
    def _guard(self, frame: bytes) -> bool:
        """True if the frame is dropped as a forged result, unchecked UDP or tagged (counted)."""
        st = self.state
        if int.from_bytes(frame[12:14], "big") in P.VLAN_TPIDS:
            st.count("global_drops", P.GlobalDrop.TAGGED, len(frame))
            return True
        if len(frame) < 34 or frame[12:14] != ETH_IPV4 or frame[23] != 17 \
                or frame[20] & 0x1F or frame[21]:
            return False  # not IPv4 UDP, or a later fragment (no UDP header in it)
        if frame[14] & 0x0F != 5 or len(frame) < 42:
            st.count("global_drops", P.GlobalDrop.UNCHECKED_UDP, len(frame))
            return True
        if frame[34:36] == _PASSING_PORT_BYTES:
            st.count("global_drops", P.GlobalDrop.FORGED, len(frame))
            return True
        guard = st.tables["result_guard"].entries.get((int.from_bytes(frame[36:38], "big"),))
        if guard is None:
            return False
        st.count("job_stats", guard.params["stat_idx"] * P.JOB_STATS_STRIDE
                 + P.JobDrop.FORGED_RESULT, len(frame))
        return True

    # -- L2Forward / L2Prune ---------------------------------------------------------------------
    def _l2(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        st = self.state
        t = st.tables["l2_forward"]
        action = t.entries.get((int.from_bytes(frame[0:6], "big"),)) or t.default
        if action.name == "l2_to_port":
            return [(action.params["port"], frame)]
        if action.name == "l2_flood":
            return [(p, frame) for p, _ in st.mcast.get(action.params["mcast_grp"], ())
                    if p != port]
        return []

    # -- JobAdmission, Aggregation, PeerRewrite ---------------------------------------------
    def _passing(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        st = self.state
        nbytes = len(frame)
        # JobAdmission: well-formedness.
        if (nbytes < PASSING_END
                or ipv4_checksum(frame[IPV4_OFF:IPV4_OFF + 20]) != (frame[24] << 8 | frame[25])
                or int.from_bytes(frame[16:18], "big") != PASSING_IPV4_LEN
                or int.from_bytes(frame[38:40], "big") != PASSING_UDP_LEN):
            st.count("global_drops", P.GlobalDrop.MALFORMED, nbytes)
            return []
        h = Header._make(_HDR.unpack_from(frame, PASSING_OFF))
        job = st.tables["job_config"].entries.get((h.job_id,))
        if job is None:
            st.count("global_drops", P.GlobalDrop.UNKNOWN_JOB, nbytes)
            return []
        j = job.params
        member = st.tables["membership"].entries.get((h.job_id, port))
        kind = h.flags & (FLAG_CONTRIB | FLAG_RESULT)
        jdrop = DROP_NONE
        if h.flags & ~FLAGS_KNOWN & 0xFF or (kind != FLAG_CONTRIB and kind != FLAG_RESULT):
            jdrop = P.JobDrop.BAD_FLAGS
        elif kind == FLAG_CONTRIB:
            if member is None:
                jdrop = P.JobDrop.NOT_MEMBER
            elif (h.contributor - member.params["contributor"]) & 0xFF >= member.params["count"]:
                jdrop = P.JobDrop.BAD_CONTRIBUTOR
        elif j["is_root"] == P.Role.ROOT or port != j["uplink_port"]:
            jdrop = P.JobDrop.FORGED_RESULT
        if jdrop is DROP_NONE:
            if h.slot >= j["pool_size"]:
                jdrop = P.JobDrop.SLOT_RANGE
            elif h.version > 1:
                jdrop = P.JobDrop.BAD_VERSION
        if jdrop is not DROP_NONE:
            st.count("job_stats", j["stat_idx"] * P.JOB_STATS_STRIDE + jdrop, nbytes)
            return []
        event, out = self._aggregate(port, frame, j, h)
        st.count("job_stats", j["stat_idx"] * P.JOB_STATS_STRIDE + event, nbytes)
        return out

    def _aggregate(self, port: int, frame: bytes, j: dict[str, int],
                   h: Header) -> tuple[int, list[tuple[int, bytes]]]:
        """Aggregation.aggregate(): both registers read and written once, one event."""
        st, slots = self.state, self.slots
        idx = (j["pool_base"] + h.slot) & 0xFFFFFFFF
        vidx = ((idx << 1) + h.version) & 0xFFFFFFFF
        if idx >= slots.capacity:
            # BMv2 would fault on an out-of-range register index; the controller never
            # configures one (JobConfig checks pool_base + pool_size <= capacity).
            return E.DUPLICATE, []
        word = slots.state[idx]
        acc = slots.values[vidx]
        gen = j["gen"]
        if word >> 208 != gen or (word >> 144) & _MASK64 != h.session:
            cur = oth = 0  # another job's or another session's state: empty for this packet
        elif h.version == 1:
            cur, oth = (word >> 72) & _MASK72, word & _MASK72
        else:
            cur, oth = word & _MASK72, (word >> 72) & _MASK72
        mybit = (1 << h.contributor) & 0xFFFFFFFF
        fan_in = j["fan_in"]
        bm, ccnt = cur & 0xFFFFFFFF, (cur >> 32) & 0xFF
        cex, cns, crdy = (cur >> 40) & 0xFF, (cur >> 48) & 0xFFFF, (cur >> 64) & 0xFF

        is_result = h.flags & FLAG_RESULT == FLAG_RESULT
        is_new = not is_result and bm & mybit == 0
        first = bm == 0
        cnt = ccnt if not is_new else 1 if first else (ccnt + 1) & 0xFF
        if is_result:
            event = P.JobDrop.STALE_RESULT if ccnt != fan_in else E.DOWNLINK
        elif is_new:
            event = E.PARTIAL if cnt != fan_in else \
                E.COMPLETE_ROOT if j["is_root"] == P.Role.ROOT else E.COMPLETE_UP
        else:
            event = E.RESULT_AGAIN if crdy != 0 else \
                E.RESEND_UP if ccnt == fan_in else E.DUPLICATE
        if event == P.JobDrop.STALE_RESULT:
            return event, []  # the slot is left exactly as it was, as in the P4 program
        stored = event == E.DOWNLINK
        overwrite = stored or (is_new and first)
        pkt = lanes.word_from_bytes(frame[VALUES_OFF:PASSING_END])
        vals = pkt if overwrite else lanes.swar_add(acc, pkt) if is_new else acc
        slots.values[vidx] = vals
        ex = h.exp if overwrite or (is_new and h.exp > cex) else cex
        ns = h.num_contrib if overwrite else (cns + h.num_contrib) & 0xFFFF if is_new else cns
        rdy = 1 if stored or event == E.COMPLETE_ROOT else 0 if is_new and first else crdy
        bm = bm | mybit if is_new else bm
        other = oth & ~mybit & _MASK72 if is_new else oth
        mine = (rdy << 64) | (ns << 48) | (ex << 40) | (cnt << 32) | bm
        pair = (mine << 72) | other if h.version == 1 else (other << 72) | mine
        slots.state[idx] = (gen << 208) | (h.session << 144) | pair

        # (egress port, rid): replicas carry the group's rid, an answer the asker's id.
        level = h.level
        if event in (E.COMPLETE_ROOT, E.DOWNLINK):
            ports = list(st.mcast.get(j["mcast_grp"], ()))
        elif event == E.RESULT_AGAIN:
            ports = [(port, h.contributor)]
        elif event in (E.COMPLETE_UP, E.RESEND_UP):
            ports = [(j["uplink_port"], 0)]
            level = (level + 1) & 0xFF
        else:
            return event, []
        flags = FLAG_CONTRIB if event == E.COMPLETE_UP else \
            FLAG_CONTRIB | FLAG_RETRANS if event == E.RESEND_UP else FLAG_RESULT
        out_hdr = h._replace(flags=flags, level=level, num_contrib=ns, exp=ex)
        values = lanes.word_to_bytes(vals)
        out = []
        for egress, rid in ports:
            peer = st.tables["peer_rewrite"].entries.get((h.job_id, egress, rid))
            if peer is None:
                st.count("egress_drops", 0, len(frame))
                continue
            out.append((egress, self._rewrite(frame, peer.params, out_hdr, values)))
        return event, out

    @staticmethod
    def _rewrite(frame: bytes, peer: dict[str, int], h: Header, values: bytes) -> bytes:
        """PeerRewrite.set_peer, then the checksum update and the deparser: the frame's
        IPv4 header with the peer's addresses, header `h` with the recipient's id, `values`,
        and whatever trailed the PASSING part of the frame."""
        ip = bytearray(frame[IPV4_OFF:IPV4_OFF + 20])
        ip[12:16] = peer["src_ip"].to_bytes(4, "big")
        ip[16:20] = peer["dst_ip"].to_bytes(4, "big")
        ip[10:12] = ipv4_checksum(ip).to_bytes(2, "big")
        return b"".join((
            peer["dst_mac"].to_bytes(6, "big"), peer["src_mac"].to_bytes(6, "big"), ETH_IPV4,
            ip,
            _UDP_PORTS.pack(P.PASSING_UDP_PORT, peer["dst_port"]), frame[38:40], b"\x00\x00",
            _HDR.pack(*h._replace(contributor=peer["contributor"])),
            values, frame[PASSING_END:],
        ))
