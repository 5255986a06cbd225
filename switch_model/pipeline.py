"""The P4 program (p4src/passing.p4) executed in Python, packet for packet.

Every branch below mirrors a branch of the P4 source, in the same order, with the same register
layouts, so that what leaves a port, what the counters say and what the registers hold are the
same as on BMv2. The conformance suite (tests/conformance) holds both targets to that.
"""

from __future__ import annotations

import struct

from passing import lanes
from passing import protocol as P
from passing.protocol import JobEvent as E
from switch_model.state import Action, SwitchState

ETH_IPV4 = b"\x08\x00"
IPV4_OFF, UDP_OFF, PASSING_OFF = 14, 34, 42
VALUES_OFF = PASSING_OFF + P.HEADER_BYTES
PASSING_END = VALUES_OFF + P.VALUES_BYTES
PASSING_UDP_LEN = 8 + P.PAYLOAD_BYTES
PASSING_IPV4_LEN = 20 + PASSING_UDP_LEN

_HDR = struct.Struct("!HHBBBBIHBB")
_IPV4_WORDS = struct.Struct("!10H")
_UDP_PORTS = struct.Struct("!HH")
_PASSING_PORT_BYTES = P.PASSING_UDP_PORT.to_bytes(2, "big")

FLAG_CONTRIB, FLAG_RESULT, FLAG_RETRANS = int(P.Flag.CONTRIB), int(P.Flag.RESULT), 4
FLAGS_KNOWN = P.FLAGS_MASK
DROP_NONE = None

# Defaults the P4 program declares for its tables (P4Info only carries const defaults).
INITIAL_DEFAULTS = {
    "job_config": Action("NoAction", {}),
    "membership": Action("NoAction", {}),
    "peer_rewrite": Action("no_peer", {}),
    "l2_forward": Action("l2_drop", {}),
}

_MASK72 = (1 << 72) - 1


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
        # slot_state word: gen(32) ++ v1(72) ++ v0(72); each version word:
        # rdy(8) ++ nsum(16) ++ exp(8) ++ count(8) ++ bitmap(32). Kept as ints, as in the P4.
        self.state = [0] * capacity
        self.values = [0] * (2 * capacity)

    def reset(self) -> None:
        self.state = [0] * self.capacity
        self.values = [0] * (2 * self.capacity)

    def read(self, register: str, index: int) -> int:
        regs = {"slot_state": self.state, "slot_values": self.values}
        if register not in regs:
            raise KeyError(f"no register {register}")
        cells = regs[register]
        if not 0 <= index < len(cells):
            raise IndexError(f"{register}[{index}] out of range (size {len(cells)})")
        return cells[index]


class Pipeline:
    def __init__(self, state: SwitchState):
        self.state = state
        self.slots = SlotStore()
        for table, action in INITIAL_DEFAULTS.items():
            state.tables[table].default = action

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
            return self._l2(port, frame)

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
        job_id, slot, contrib, flags, version, level, frag, ncontrib, exp, tag = \
            _HDR.unpack_from(frame, PASSING_OFF)
        job = st.tables["job_config"].entries.get((job_id,))
        if job is None:
            st.count("global_drops", P.GlobalDrop.UNKNOWN_JOB, nbytes)
            return []
        j = job.params
        member = st.tables["membership"].entries.get((job_id, port))
        kind = flags & (FLAG_CONTRIB | FLAG_RESULT)
        jdrop = DROP_NONE
        if flags & ~FLAGS_KNOWN & 0xFF or (kind != FLAG_CONTRIB and kind != FLAG_RESULT):
            jdrop = P.JobDrop.BAD_FLAGS
        elif kind == FLAG_CONTRIB:
            if member is None:
                jdrop = P.JobDrop.NOT_MEMBER
            elif (contrib - member.params["contributor"]) & 0xFF >= member.params["count"]:
                jdrop = P.JobDrop.BAD_CONTRIBUTOR
        elif j["is_root"] == P.Role.ROOT or port != j["uplink_port"]:
            jdrop = P.JobDrop.NOT_MEMBER
        if jdrop is DROP_NONE:
            if slot >= j["pool_size"]:
                jdrop = P.JobDrop.SLOT_RANGE
            elif version > 1:
                jdrop = P.JobDrop.BAD_VERSION
        if jdrop is not DROP_NONE:
            st.count("job_stats", j["stat_idx"] * P.JOB_STATS_STRIDE + jdrop, nbytes)
            return []
        event, out = self._aggregate(port, frame, j, job_id, slot, contrib, flags, version,
                                     level, frag, ncontrib, exp, tag)
        st.count("job_stats", j["stat_idx"] * P.JOB_STATS_STRIDE + event, nbytes)
        return out

    def _aggregate(self, port, frame, j, job_id, slot, contrib, flags, version, level, frag,
                   ncontrib, exp, tag) -> tuple[int, list[tuple[int, bytes]]]:
        """Aggregation.aggregate(): both registers read and written once, one event."""
        st, slots = self.state, self.slots
        idx = (j["pool_base"] + slot) & 0xFFFFFFFF
        vidx = ((idx << 1) + version) & 0xFFFFFFFF
        if idx >= slots.capacity:
            # BMv2 would fault on an out-of-range register index; the controller never
            # configures one (JobConfig checks pool_base + pool_size <= capacity).
            return E.DUPLICATE, []
        word = slots.state[idx]
        acc = slots.values[vidx]
        gen = j["gen"]
        if word >> 144 != gen:
            cur = oth = 0
        elif version == 1:
            cur, oth = (word >> 72) & _MASK72, word & _MASK72
        else:
            cur, oth = word & _MASK72, (word >> 72) & _MASK72
        mybit = (1 << contrib) & 0xFFFFFFFF
        fan_in = j["fan_in"]
        bm, ccnt = cur & 0xFFFFFFFF, (cur >> 32) & 0xFF
        cex, cns, crdy = (cur >> 40) & 0xFF, (cur >> 48) & 0xFFFF, (cur >> 64) & 0xFF

        is_result = flags & FLAG_RESULT == FLAG_RESULT
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
        stored = event == E.DOWNLINK
        overwrite = stored or (is_new and first)
        pkt = lanes.word_from_bytes(frame[VALUES_OFF:PASSING_END])
        vals = pkt if overwrite else lanes.swar_add(acc, pkt) if is_new else acc
        slots.values[vidx] = vals
        ex = exp if overwrite or (is_new and exp > cex) else cex
        ns = ncontrib if overwrite else (cns + ncontrib) & 0xFFFF if is_new else cns
        rdy = 1 if stored or event == E.COMPLETE_ROOT else 0 if is_new and first else crdy
        bm = bm | mybit if is_new else bm
        other = oth & ~mybit & _MASK72 if is_new else oth
        mine = (rdy << 64) | (ns << 48) | (ex << 40) | (cnt << 32) | bm
        pair = (mine << 72) | other if version == 1 else (other << 72) | mine
        slots.state[idx] = (gen << 144) | pair

        # (egress port, rid): replicas carry the group's rid, an answer the asker's id.
        if event in (E.COMPLETE_ROOT, E.DOWNLINK):
            ports = list(st.mcast.get(j["mcast_grp"], ()))
        elif event == E.RESULT_AGAIN:
            ports = [(port, contrib)]
        elif event in (E.COMPLETE_UP, E.RESEND_UP):
            ports = [(j["uplink_port"], 0)]
            level = (level + 1) & 0xFF
        else:
            return event, []
        flags = FLAG_CONTRIB if event == E.COMPLETE_UP else \
            FLAG_CONTRIB | FLAG_RETRANS if event == E.RESEND_UP else FLAG_RESULT
        values = lanes.word_to_bytes(vals)
        tail = frame[PASSING_END:]
        out = []
        for egress, rid in ports:
            peer = st.tables["peer_rewrite"].entries.get((job_id, egress, rid))
            if peer is None:
                st.count("egress_drops", 0, len(frame))
                continue
            out.append((egress, self._rewrite(frame, peer.params, slot, flags, version, level,
                                              frag, ns, ex, tag, job_id, values, tail)))
        return event, out

    @staticmethod
    def _rewrite(frame, peer, slot, flags, version, level, frag, ncontrib, exp, tag,
                 job_id, values, tail) -> bytes:
        """PeerRewrite.set_peer, then the checksum update and the deparser."""
        ip = bytearray(frame[IPV4_OFF:IPV4_OFF + 20])
        ip[12:16] = peer["src_ip"].to_bytes(4, "big")
        ip[16:20] = peer["dst_ip"].to_bytes(4, "big")
        ip[10:12] = ipv4_checksum(ip).to_bytes(2, "big")
        return b"".join((
            peer["dst_mac"].to_bytes(6, "big"), peer["src_mac"].to_bytes(6, "big"), ETH_IPV4,
            ip,
            _UDP_PORTS.pack(P.PASSING_UDP_PORT, peer["dst_port"]), frame[38:40], b"\x00\x00",
            _HDR.pack(job_id, slot, peer["contributor"], flags, version, level, frag, ncontrib,
                      exp, tag),
            values, tail,
        ))
