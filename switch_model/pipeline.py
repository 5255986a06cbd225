"""The P4 program (p4src/passing.p4) executed in Python, packet for packet: the parser's path,
JobAdmission, the Aggregation control's register reads and writes, and PeerRewrite's copies.
Ordinary frames go to switch_model.forwarding, the slot decisions are switch_model.slot_word's,
the registers switch_model.slot_store's, the frame's layout switch_model.frame's.

Every branch mirrors a branch of the P4 source, in the same order, with the same register
layouts, so that what leaves a port, what the counters say and what the registers hold are the
same as on BMv2. The conformance suite (tests/conformance) holds both targets to that.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from p4.config.v1 import p4info_pb2

from passing import lanes
from passing import protocol as P
from passing.p4info import P4InfoIndex
from switch_model import fastpath
from switch_model.fair_share import FairShare
from switch_model.forwarding import guard_drops, l2_forward
from switch_model.frame import (
    DROP_NONE,
    ETH_IPV4,
    ETHERTYPE,
    EVT_DOWNLINK,
    EVT_DUPLICATE,
    FLAG_CLOSE,
    FLAG_CONTRIB,
    FLAG_POOL,
    FLAG_RESULT,
    FLAGS_KNOWN,
    HDR,
    HDR_AFTER_CONTRIBUTOR,
    IP_PROTO_UDP,
    IPV4_FRAG_HI,
    IPV4_FRAG_LO,
    IPV4_IHL,
    IPV4_OFF,
    IPV4_PROTO,
    IPV4_VER_IHL,
    IPV4_WORDS,
    LATE_EVENTS,
    MCAST_EVENTS,
    PASSING_END,
    PASSING_OFF,
    PASSING_PORT_BYTES,
    REFUSED_EVENTS,
    ROLE_ROOT,
    UDP_DPORT,
    UDP_LEN,
    UNICAST_EVENTS,
    UP_EVENTS,
    VALUES_OFF,
    Header,
    Kept,
    rewrite_copy,
    well_formed,
)
from switch_model.slot_store import GEN_AT, SESSION_AT, WORD_BITS, SlotStore
from switch_model.slot_word import (
    foreign_open,
    leaving_header,
    next_version_word,
    verdict,
    version_words,
)
from switch_model.state import Action, SwitchState

# Defaults the P4 program declares for its tables (P4Info only carries const defaults).
INITIAL_DEFAULTS = {
    "job_config": Action("NoAction", {}),
    "membership": Action("NoAction", {}),
    "peer_rewrite": Action("no_peer", {}),
    "result_guard": Action("NoAction", {}),
    "l2_forward": Action("l2_drop", {}),
}

class Pipeline:
    def __init__(self, state: SwitchState):
        self.state = state
        self.slots = SlotStore()
        self.fair = FairShare()  # the egress's fair-share counters, shared with the C loop
        # The compiled PASSING path (switch_model/fastpath.py), once use_compiled() found it.
        self.fast: fastpath.FastPath | None = None
        for table, action in INITIAL_DEFAULTS.items():
            state.tables[table].default = action

    @classmethod
    def from_p4info(cls, info: p4info_pb2.P4Info) -> Pipeline:
        return cls(SwitchState(P4InfoIndex(info)))

    def reset(self) -> None:
        self.state.reset()
        self.slots.reset()
        self.fair.reset()
        for table, action in INITIAL_DEFAULTS.items():
            self.state.tables[table].default = action

    def use_compiled(self) -> bool:
        """Take PASSING-path frames of batches through the compiled path from now on, where
        it can be built (a C compiler found). True if so."""
        self.fast = fastpath.load(self)
        return self.fast is not None

    def process_batch(self, port: int, frames: Sequence[bytes]) -> list[tuple[int, bytes]]:
        """What `process` gives for each of `frames` in turn, concatenated, with the compiled
        path taking the PASSING-path frames if use_compiled() enabled it."""
        n = len(frames)
        buf = np.zeros((n, fastpath.FAST_MAX_FRAME), dtype=np.uint8)
        lengths = np.fromiter(map(len, frames), dtype=np.uint32, count=n)
        for i, f in enumerate(frames):
            if len(f) <= fastpath.FAST_MAX_FRAME:
                buf[i, :len(f)] = np.frombuffer(f, dtype=np.uint8)
        out: list[tuple[int, bytes]] = []
        from_python: list[tuple[int, bytes]] = []
        fast = self.fast

        def flush() -> None:
            out.extend(from_python)
            from_python.clear()
            if fast is not None and fast.pending():
                mem = fast.out
                out.extend((int(p), mem[o:o + ln].tobytes())
                           for p, o, ln in zip(*fast.frames(), strict=True))
                fast.clear()

        fastpath.interleave(self, fast, port, buf, lengths, np.zeros(n, dtype=np.uint8),
                            frames.__getitem__, from_python.extend, flush)
        return out

    # -- ingress + egress for one packet -------------------------------------------------------
    def process(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Packets (egress port, frame) that leave the switch for `frame` arriving on `port`."""
        with self.state.lock:
            # The parser's path to parse_passing: IPv4 without options, fragment offset 0, UDP,
            # and the PASSING port; a frame too short for the UDP header never gets there.
            if (len(frame) >= PASSING_OFF and frame[ETHERTYPE] == ETH_IPV4
                    and frame[IPV4_VER_IHL] & 0x0F == IPV4_IHL
                    and (frame[IPV4_FRAG_HI] & 0x1F) == 0 and frame[IPV4_FRAG_LO] == 0
                    and frame[IPV4_PROTO] == IP_PROTO_UDP
                    and frame[UDP_DPORT] == PASSING_PORT_BYTES):
                return self._passing(port, frame)
            if len(frame) < IPV4_OFF:
                return []
            if guard_drops(self.state, frame):
                return []
            return l2_forward(self.state, port, frame)

    # -- JobAdmission, Aggregation, PeerRewrite ---------------------------------------------
    def _passing(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        st = self.state
        nbytes = len(frame)
        ip = IPV4_WORDS.unpack_from(frame, IPV4_OFF) if nbytes >= PASSING_END else None
        if ip is None or not well_formed(frame, ip):
            st.count("global_drops", P.GlobalDrop.MALFORMED, nbytes)
            return []
        h = Header._make(HDR.unpack_from(frame, PASSING_OFF))
        pool = (h.flags & FLAG_POOL) >> 4
        job = st.tables["job_config"].entries.get((h.job_id, pool))
        if job is None:
            st.count("global_drops", P.GlobalDrop.UNKNOWN_JOB, nbytes)
            return []
        j = job.params
        jdrop = self._admission_drop(port, h, j)
        if jdrop is not DROP_NONE:
            st.count("job_stats", j["stat_idx"] * P.JOB_STATS_STRIDE + jdrop, nbytes)
            return []
        if h.flags & FLAG_CONTRIB:
            st.count("pool_contribs", ((j["stat_idx"] << 1) + pool) * P.MAX_FAN_IN
                     + h.contributor, nbytes)
        event, out = self._aggregate(port, frame, j, h, ip)
        st.count("job_stats", j["stat_idx"] * P.JOB_STATS_STRIDE + event, nbytes)
        if event in LATE_EVENTS:
            st.count("late_contribs", j["stat_idx"] * P.MAX_FAN_IN + h.contributor, nbytes)
        return out

    def _admission_drop(self, port: int, h: Header, j: dict[str, int]) -> int | None:
        """JobAdmission's verdict on a packet of a known job: why it is dropped, or DROP_NONE.
        `j` is the job's job_config entry (set_job's parameters)."""
        kind = h.flags & (FLAG_CONTRIB | FLAG_RESULT)
        if h.flags & ~FLAGS_KNOWN & 0xFF or (kind != FLAG_CONTRIB and kind != FLAG_RESULT) \
                or (kind == FLAG_RESULT and h.flags & FLAG_CLOSE):
            return P.JobDrop.BAD_FLAGS
        if kind == FLAG_CONTRIB:
            member = self.state.tables["membership"].entries.get((h.job_id, port))
            if member is None:
                return P.JobDrop.NOT_MEMBER
            if (h.contributor - member.params["contributor"]) & 0xFF >= member.params["count"]:
                return P.JobDrop.BAD_CONTRIBUTOR
        elif j["is_root"] == ROLE_ROOT or port != j["uplink_port"]:
            return P.JobDrop.FORGED_RESULT
        if h.version >> 1 != j["epoch"]:
            return P.JobDrop.STALE_POOL
        if h.slot >= j["pool_size"]:
            return P.JobDrop.SLOT_RANGE
        if (h.version ^ h.round) & 1:
            return P.JobDrop.BAD_VERSION
        return DROP_NONE

    def _aggregate(self, port: int, frame: bytes, j: dict[str, int], h: Header,
                   ip: tuple[int, ...]) -> tuple[int, list[tuple[int, bytes]]]:
        """Aggregation.aggregate(): both registers read and written once, one event. The steps
        are the P4 action's sections, in its order; each version word is the P4's
        round ++ flags ++ nsum ++ exp ++ count ++ bitmap, kept as an int."""
        slots = self.slots
        idx = (j["pool_base"] + h.slot) & 0xFFFFFFFF
        if idx >= slots.capacity:
            # BMv2 would fault on an out-of-range register index; the controller never
            # configures one (JobConfig checks pool_base + pool_size <= capacity).
            return EVT_DUPLICATE, []
        gen = j["gen"]
        word = slots.word(idx)
        cur, oth = version_words(word, gen, h)
        v = verdict(cur, h, j, foreign_open(word, gen, h))
        if v.event in REFUSED_EVENTS:
            return v.event, []  # the slot is left exactly as it was, as in the P4 program
        overwrite = v.event == EVT_DOWNLINK or v.first
        vals = self._merge_values(((idx << 1) + (h.version & 1)) & 0xFFFFFFFF, frame, overwrite,
                                  v.is_new)
        mine = next_version_word(cur, h, v, overwrite)
        pair = (mine << WORD_BITS) | oth if h.version & 1 else (oth << WORD_BITS) | mine
        slots.set_word(idx, (gen << GEN_AT) | (h.session << SESSION_AT) | pair)
        egress = self._egress_of(port, j, h, v.event)
        if not egress:
            return v.event, []
        return v.event, self._peer_rewrite(frame, ip, egress, leaving_header(h, v.event, mine),
                                           lanes.row_to_bytes(vals))

    def _merge_values(self, vidx: int, frame: bytes, overwrite: bool, is_new: bool) -> int:
        """The slot's values (row `vidx`: its VALUE_WORDS register words) after the packet,
        written back: its values (the spine's result, or a round's first contribution), the
        lane-wise sum with them (a later contribution), or unchanged. The P4 program does this
        word by word; adding the whole row is the same (passing.lanes)."""
        slots = self.slots
        pkt = lanes.row_from_bytes(frame[VALUES_OFF:PASSING_END])
        acc = slots.row(vidx)
        vals = pkt if overwrite else lanes.swar_add(acc, pkt) if is_new else acc
        slots.set_row(vidx, vals)
        return vals

    def _egress_of(self, port: int, j: dict[str, int], h: Header,
                   event: int) -> list[tuple[int, int]]:
        """(egress port, rid) of every copy that leaves: the job's multicast group (replicas
        carry the group's rid), the asker alone (rid: its id), or the uplink; none when the
        event drops the packet (DROP_PORT)."""
        if event in MCAST_EVENTS:
            return list(self.state.mcast.get(j["mcast_grp"], ()))
        if event in UNICAST_EVENTS:
            return [(port, h.contributor)]
        if event in UP_EVENTS:
            return [(j["uplink_port"], 0)]
        return []

    # -- PeerRewrite ---------------------------------------------------------------------------
    def _peer_rewrite(self, frame: bytes, ip: tuple[int, ...], egress: list[tuple[int, int]],
                      h: Header, values: bytes) -> list[tuple[int, bytes]]:
        """Each copy addressed to the peer behind its (port, rid); a copy with no peer is
        counted in egress_drops (with the arriving frame's length) and dropped. `ip`: the
        arriving frame's IPv4 header as 16-bit words."""
        st = self.state
        peers = st.tables["peer_rewrite"].entries
        out = []
        # What every copy shares, made once: all but the addresses and the recipient's id.
        kept = Kept(frame[IPV4_OFF:IPV4_OFF + 10], sum(ip[:5]),
                     HDR_AFTER_CONTRIBUTOR.pack(*h[3:]), frame[UDP_LEN],
                     b"".join((values, frame[PASSING_END:])))
        for port, rid in egress:
            peer = peers.get((h.job_id, port, rid))
            if peer is None:
                st.count("egress_drops", 0, len(frame))
                continue
            out.append((port, rewrite_copy(kept, peer.params, h)))
        return out
