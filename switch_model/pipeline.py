"""The P4 program (p4src/passing.p4) executed in Python, packet for packet.

Every branch below mirrors a branch of the P4 source, in the same order, with the same register
layouts, so that what leaves a port, what the counters say and what the registers hold are the
same as on BMv2. The conformance suite (tests/conformance) holds both targets to that.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from p4.config.v1 import p4info_pb2

from passing import lanes
from passing import protocol as P
from passing.p4info import P4InfoIndex
from passing.protocol import JobEvent as E
from switch_model import fastpath
from switch_model.state import Action, SwitchState

ETH_IPV4 = b"\x08\x00"
IP_PROTO_UDP = 17
IPV4_OFF = P.ETH_HEADER_BYTES
UDP_OFF = IPV4_OFF + P.IPV4_HEADER_BYTES
PASSING_OFF = UDP_OFF + P.UDP_HEADER_BYTES
VALUES_OFF = PASSING_OFF + P.HEADER_BYTES
PASSING_END = VALUES_OFF + P.VALUES_BYTES
PASSING_UDP_LEN = P.UDP_HEADER_BYTES + P.PAYLOAD_BYTES
PASSING_IPV4_LEN = P.IPV4_HEADER_BYTES + PASSING_UDP_LEN

# Fields the parser and the checks read, by their place in an untagged IPv4/UDP frame.
ETHERTYPE = slice(12, IPV4_OFF)
IPV4_VER_IHL, IPV4_PROTO = IPV4_OFF, IPV4_OFF + 9
IPV4_FRAG_HI, IPV4_FRAG_LO = IPV4_OFF + 6, IPV4_OFF + 7  # flags ++ fragment offset
UDP_SPORT = slice(UDP_OFF, UDP_OFF + 2)
UDP_DPORT = slice(UDP_OFF + 2, UDP_OFF + 4)
UDP_LEN = slice(UDP_OFF + 4, UDP_OFF + 6)

_HDR = struct.Struct("!HHBBBBIIHBBQ")
# The same header in two parts, for copies that differ only in the contributor field.
_HDR_TO_CONTRIBUTOR = struct.Struct("!HHB")
_HDR_AFTER_CONTRIBUTOR = struct.Struct("!BBBIIHBBQ")
_IP_TAIL = struct.Struct("!HII")  # checksum, source and destination address


class Header(NamedTuple):
    """The PASSING header, field for field (passing.protocol.HEADER_FIELDS)."""

    job_id: int
    slot: int
    contributor: int
    flags: int
    version: int
    level: int
    frag: int
    round: int
    num_contrib: int
    exp: int
    tag: int
    session: int


_IPV4_WORDS = struct.Struct("!10H")
_UDP_PORTS = struct.Struct("!HH")
_PASSING_PORT_BYTES = P.PASSING_UDP_PORT.to_bytes(2, "big")

FLAG_CONTRIB, FLAG_RESULT, FLAG_RETRANS, FLAG_CLOSE, FLAG_POOL = (
    int(P.Flag.CONTRIB), int(P.Flag.RESULT), int(P.Flag.RETRANS), int(P.Flag.CLOSE),
    int(P.Flag.POOL))
FLAGS_KNOWN = P.FLAGS_MASK
DROP_NONE = None
IPV4_IHL = P.IPV4_HEADER_BYTES // 4  # the only header length the parser accepts (no options)

# config.p4's EVT_* codes, DROP_STALE_* and ROLE_ROOT as plain ints: the hot path compares
# them per packet, and looking up an IntEnum member costs several times the comparison.
(EVT_PARTIAL, EVT_COMPLETE_ROOT, EVT_COMPLETE_UP, EVT_DUPLICATE, EVT_RESULT_AGAIN, EVT_RESEND_UP,
 EVT_DOWNLINK, EVT_LATE, EVT_LATE_RESULT, EVT_CLOSED_ROOT, EVT_CLOSED_UP) = (
    int(e) for e in (E.PARTIAL, E.COMPLETE_ROOT, E.COMPLETE_UP, E.DUPLICATE, E.RESULT_AGAIN,
                     E.RESEND_UP, E.DOWNLINK, E.LATE, E.LATE_RESULT, E.CLOSED_ROOT,
                     E.CLOSED_UP))
DROP_STALE_RESULT = int(P.JobDrop.STALE_RESULT)
DROP_STALE_ROUND = int(P.JobDrop.STALE_ROUND)
ROLE_ROOT = int(P.Role.ROOT)

# Events that send the slot up to the spine, that multicast it, that answer the sender alone,
# and those the late_contribs counter counts.
_UP = frozenset((EVT_COMPLETE_UP, EVT_CLOSED_UP, EVT_RESEND_UP))
_MCAST = frozenset((EVT_COMPLETE_ROOT, EVT_CLOSED_ROOT, EVT_DOWNLINK))
_UNICAST = frozenset((EVT_RESULT_AGAIN, EVT_LATE_RESULT))
_LATE = frozenset((EVT_LATE, EVT_LATE_RESULT, DROP_STALE_ROUND))
_REFUSED = frozenset((DROP_STALE_RESULT, DROP_STALE_ROUND))

# Defaults the P4 program declares for its tables (P4Info only carries const defaults).
INITIAL_DEFAULTS = {
    "job_config": Action("NoAction", {}),
    "membership": Action("NoAction", {}),
    "peer_rewrite": Action("no_peer", {}),
    "result_guard": Action("NoAction", {}),
    "l2_forward": Action("l2_drop", {}),
}

# One version's word of slot_state: round ++ flags ++ nsum ++ exp ++ count ++ bitmap, the
# field at bit <name>_AT (aggregation.p4); the slot's word is gen ++ session ++ v1 ++ v0.
_BM_BITS = P.MAX_FAN_IN
_CNT_AT, _EXP_AT, _NS_AT, _FLAGS_AT, _ROUND_AT = 64, 72, 80, 96, 104
_WORD_BITS = 136
_SESSION_AT, _GEN_AT = 2 * _WORD_BITS, 2 * _WORD_BITS + 64
_MASK_WORD = (1 << _WORD_BITS) - 1
_MASK_BM = (1 << _BM_BITS) - 1
_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
_READY, _CLOSED = 1, 2  # the version word's flags


class SlotStore:
    """Registers slot_state and slot_values of the Aggregation control.

    Held as arrays, one per field, so that the compiled PASSING path (switch_model/fastpath.c)
    reads and writes the same memory; `word` and `set_word` give the P4's slot_state word as
    one int, `row` and `set_row` a version's values as one row (passing.lanes).
    """

    def __init__(self, capacity: int = P.SLOT_CAPACITY):
        self.capacity = capacity
        # slot_state word: gen(32) ++ session(64) ++ v1(136) ++ v0(136); each version word:
        # round(32) ++ flags(8: ready, closed) ++ nsum(16) ++ exp(8) ++ count(8) ++ bitmap(64).
        # A version's fields at index 2*slot+version.
        self.gen = np.zeros(capacity, dtype=np.uint32)
        self.session = np.zeros(capacity, dtype=np.uint64)
        self.round = np.zeros(2 * capacity, dtype=np.uint32)
        self.flags = np.zeros(2 * capacity, dtype=np.uint8)
        self.nsum = np.zeros(2 * capacity, dtype=np.uint16)
        self.exp = np.zeros(2 * capacity, dtype=np.uint8)
        self.count = np.zeros(2 * capacity, dtype=np.uint8)
        self.bitmap = np.zeros(2 * capacity, dtype=np.uint64)
        # slot_values as one row of K lanes (uint32, the int32 bits) per slot and version
        # (row 2*slot+version): the P4's VALUE_WORDS register words at
        # (2*slot+version)*VALUE_WORDS + w, concatenated. read() and dump() give the words.
        self.values = np.zeros((2 * capacity, P.K), dtype=np.uint32)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.gen, self.session, self.round, self.flags, self.nsum, self.exp,
                self.count, self.bitmap, self.values)

    def reset(self) -> None:
        for a in self.arrays():
            a[...] = 0  # in place: the compiled path holds their addresses

    def _version_word(self, i: int) -> int:
        return ((int(self.round[i]) << _ROUND_AT) | (int(self.flags[i]) << _FLAGS_AT)
                | (int(self.nsum[i]) << _NS_AT) | (int(self.exp[i]) << _EXP_AT)
                | (int(self.count[i]) << _CNT_AT) | int(self.bitmap[i]))

    def _set_version_word(self, i: int, w: int) -> None:
        self.round[i], self.flags[i] = w >> _ROUND_AT, (w >> _FLAGS_AT) & 0xFF
        self.nsum[i], self.exp[i] = (w >> _NS_AT) & 0xFFFF, (w >> _EXP_AT) & 0xFF
        self.count[i], self.bitmap[i] = (w >> _CNT_AT) & 0xFF, w & _MASK_BM

    def word(self, idx: int) -> int:
        """Slot `idx`'s slot_state word, as the P4 program holds it."""
        return ((int(self.gen[idx]) << _GEN_AT) | (int(self.session[idx]) << _SESSION_AT)
                | (self._version_word(2 * idx + 1) << _WORD_BITS)
                | self._version_word(2 * idx))

    def set_word(self, idx: int, word: int) -> None:
        self.gen[idx], self.session[idx] = word >> _GEN_AT, (word >> _SESSION_AT) & _MASK64
        self._set_version_word(2 * idx + 1, (word >> _WORD_BITS) & _MASK_WORD)
        self._set_version_word(2 * idx, word & _MASK_WORD)

    def row(self, vidx: int) -> int:
        return lanes.row_from_bytes(self.values[vidx].astype(">u4").tobytes())

    def set_row(self, vidx: int, row: int) -> None:
        self.values[vidx] = np.frombuffer(lanes.row_to_bytes(row), dtype=">u4")

    def _check(self, register: str) -> None:
        if register not in ("slot_state", "slot_values"):
            raise KeyError(f"no register {register}")

    def size(self, register: str) -> int:
        """Cells of `register`, as the P4 program declares it."""
        self._check(register)
        return self.capacity if register == "slot_state" else \
            2 * self.capacity * P.VALUE_WORDS

    def dump(self, register: str) -> list[int]:
        """Every cell of `register`, in the P4 program's index order."""
        self._check(register)
        if register == "slot_state":
            return [self.word(i) for i in range(self.capacity)]
        return [w for r in range(2 * self.capacity) for w in lanes.row_words(self.row(r))]

    def read(self, register: str, index: int) -> int:
        if not 0 <= index < self.size(register):
            raise IndexError(f"{register}[{index}] out of range (size {self.size(register)})")
        if register == "slot_state":
            return self.word(index)
        row, word = divmod(index, P.VALUE_WORDS)
        return lanes.row_words(self.row(row))[word]


class Pipeline:
    def __init__(self, state: SwitchState):
        self.state = state
        self.slots = SlotStore()
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
                    and frame[UDP_DPORT] == _PASSING_PORT_BYTES):
                return self._passing(port, frame)
            if len(frame) < IPV4_OFF:
                return []
            if self._guard(frame):
                return []
            return self._l2(port, frame)

    # -- ResultGuard -------------------------------------------------------------------------
    def _guard(self, frame: bytes) -> bool:
        """True if the frame is dropped as a forged result, unchecked UDP or tagged (counted)."""
        st = self.state
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
        if frame[UDP_SPORT] == _PASSING_PORT_BYTES:
            st.count("global_drops", P.GlobalDrop.FORGED, len(frame))
            return True
        guard = st.tables["result_guard"].entries.get((int.from_bytes(frame[UDP_DPORT], "big"),))
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
        ip = _IPV4_WORDS.unpack_from(frame, IPV4_OFF) if nbytes >= PASSING_END else None
        if ip is None or not _well_formed(frame, ip):
            st.count("global_drops", P.GlobalDrop.MALFORMED, nbytes)
            return []
        h = Header._make(_HDR.unpack_from(frame, PASSING_OFF))
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
        if event in _LATE:
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
        cur, oth = _version_words(word, gen, h)
        v = _verdict(cur, h, j, _foreign_open(word, gen, h))
        if v.event in _REFUSED:
            return v.event, []  # the slot is left exactly as it was, as in the P4 program
        overwrite = v.event == EVT_DOWNLINK or v.first
        vals = self._merge_values(((idx << 1) + (h.version & 1)) & 0xFFFFFFFF, frame, overwrite,
                                  v.is_new)
        mine = _next_version_word(cur, h, v, overwrite)
        pair = (mine << _WORD_BITS) | oth if h.version & 1 else (oth << _WORD_BITS) | mine
        slots.set_word(idx, (gen << _GEN_AT) | (h.session << _SESSION_AT) | pair)
        egress = self._egress_of(port, j, h, v.event)
        if not egress:
            return v.event, []
        return v.event, self._peer_rewrite(frame, ip, egress, _leaving_header(h, v.event, mine),
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
        if event in _MCAST:
            return list(self.state.mcast.get(j["mcast_grp"], ()))
        if event in _UNICAST:
            return [(port, h.contributor)]
        if event in _UP:
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
        kept = _Kept(frame[IPV4_OFF:IPV4_OFF + 10], sum(ip[:5]),
                     _HDR_AFTER_CONTRIBUTOR.pack(*h[3:]), frame[UDP_LEN],
                     b"".join((values, frame[PASSING_END:])))
        for port, rid in egress:
            peer = peers.get((h.job_id, port, rid))
            if peer is None:
                st.count("egress_drops", 0, len(frame))
                continue
            out.append((port, _rewrite(kept, peer.params, h)))
        return out


def _fold(total: int) -> int:
    """csum16 of a sum of 16-bit words: the carries folded in, then complemented."""
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _well_formed(frame: bytes, ip: tuple[int, ...]) -> bool:
    """JobAdmission's first check: the whole PASSING packet is there (the caller checked the
    length), with a valid IPv4 checksum and exactly the lengths of one. `ip`: the IPv4
    header's ten 16-bit words (word 1 the total length, word 5 the checksum)."""
    return (_fold(sum(ip) - ip[5]) == ip[5] and ip[1] == PASSING_IPV4_LEN
            and int.from_bytes(frame[UDP_LEN], "big") == PASSING_UDP_LEN)


def _version_words(word: int, gen: int, h: Header) -> tuple[int, int]:
    """The slot_state word's word of the packet's version and the other version's; both zero
    when another generation or another session wrote the slot (it reads as empty)."""
    if word >> _GEN_AT != gen or (word >> _SESSION_AT) & _MASK64 != h.session:
        return 0, 0
    if h.version & 1:
        return (word >> _WORD_BITS) & _MASK_WORD, word & _MASK_WORD
    return word & _MASK_WORD, (word >> _WORD_BITS) & _MASK_WORD


class Verdict(NamedTuple):
    """What the aggregate action decided for one packet against its version's word."""

    event: int  # a JobEvent, or JobDrop.STALE_RESULT / STALE_ROUND
    is_new: bool  # a contribution counted now (not a duplicate, not late, not stale)
    first: bool  # ... and the first of a newer round: it overwrites the slot
    restart: bool  # the packet's round is newer than the held one, or none is held
    cnt: int  # the round's count after the packet


def _foreign_open(word: int, gen: int, h: Header) -> bool:
    """Another generation's or session's round is open in the slot (a version with
    contributors, not closed): a result from the spine may not take such a slot over."""
    if word >> _GEN_AT == gen and (word >> _SESSION_AT) & _MASK64 == h.session:
        return False
    return any(w & _MASK_BM and not (w >> _FLAGS_AT) & _CLOSED
               for w in (word & _MASK_WORD, (word >> _WORD_BITS) & _MASK_WORD))


def _verdict(cur: int, h: Header, j: dict[str, int], foreign_open: bool) -> Verdict:
    """The P4's decisions, expression for expression: the packet's round against the one
    this version holds (serial-number order), then its one event."""
    bm, ccnt, flags = cur & _MASK_BM, (cur >> _CNT_AT) & 0xFF, (cur >> _FLAGS_AT) & 0xFF
    mybit = (1 << h.contributor) & _MASK_BM
    is_result = h.flags & FLAG_RESULT == FLAG_RESULT
    used = bm != 0 or flags & _CLOSED != 0
    d = (h.round - (cur >> _ROUND_AT)) & _MASK32
    same = used and d == 0
    older = used and d >> 31 == 1
    restart = not used or (not same and not older)
    closed = same and flags & _CLOSED != 0
    ready = same and flags & _READY != 0
    mine = same and bm & mybit != 0
    is_new = not is_result and not older and (restart or (not mine and not closed))
    first = is_new and restart
    cnt = 1 if first else 0 if restart else (ccnt + 1) & 0xFF if is_new else ccnt
    full = cnt == j["fan_in"]
    completes = (not is_result and not older and not closed
                 and ((is_new and full) or (h.flags & FLAG_CLOSE != 0 and cnt >= j["quorum"])))
    root = j["is_root"] == ROLE_ROOT
    if is_result:
        event = DROP_STALE_RESULT if older or foreign_open else EVT_DOWNLINK
    elif older:
        event = DROP_STALE_ROUND
    elif completes:
        event = ((EVT_COMPLETE_ROOT if full else EVT_CLOSED_ROOT) if root else
                 (EVT_COMPLETE_UP if full else EVT_CLOSED_UP))
    elif is_new:
        event = EVT_PARTIAL
    elif mine:
        event = EVT_RESULT_AGAIN if ready else EVT_RESEND_UP if closed else EVT_DUPLICATE
    else:
        event = EVT_LATE_RESULT if ready else EVT_LATE
    return Verdict(event, is_new, first, restart, cnt)


def _next_version_word(cur: int, h: Header, v: Verdict, overwrite: bool) -> int:
    """The packet's version word after it: the spine's result or a newer round's first
    contribution overwrite it, a new contribution adds to it, anything else leaves it as it
    was (a result again, once final, stays ready). A newer round starts from the packet: its
    sender alone, or (a result from the spine for a round this switch never closed) nobody."""
    bm, rnd = cur & _MASK_BM, cur >> _ROUND_AT
    ex, ns = (cur >> _EXP_AT) & 0xFF, (cur >> _NS_AT) & 0xFFFF
    flags = (cur >> _FLAGS_AT) & 0xFF
    if overwrite:
        ex, ns = h.exp, h.num_contrib
    elif v.is_new:
        ex = h.exp if h.exp > ex else ex
        ns = (ns + h.num_contrib) & 0xFFFF
    if v.event in _MCAST:
        flags = _READY | _CLOSED
    elif v.event == EVT_COMPLETE_UP or v.event == EVT_CLOSED_UP:
        flags = _CLOSED
    elif v.first:
        flags = 0
    mybit = (1 << h.contributor) & _MASK_BM
    if v.restart:
        bm, rnd = (mybit if v.is_new else 0), h.round
    elif v.is_new:
        bm |= mybit
    return ((rnd << _ROUND_AT) | (flags << _FLAGS_AT) | (ns << _NS_AT) | (ex << _EXP_AT)
            | (v.cnt << _CNT_AT) | bm)


def _leaving_header(h: Header, event: int, mine: int) -> Header:
    """The header of what leaves for `event`: the slot's exponent and contributor sum from its
    version word `mine`, the flags of a sum going up (RETRANS when sent again, CLOSE when the
    packet carried it) or of a result, one level up when going up; always the packet's pool."""
    if event in _UP:
        level = (h.level + 1) & 0xFF
        flags = FLAG_CONTRIB | (h.flags & FLAG_CLOSE)  # the hosts' CLOSE goes up with the sum
        if event == EVT_RESEND_UP:
            flags |= FLAG_RETRANS
    else:
        level, flags = h.level, FLAG_RESULT
    return Header(h.job_id, h.slot, h.contributor, flags | (h.flags & FLAG_POOL), h.version,
                  level, h.frag, h.round, (mine >> _NS_AT) & 0xFFFF, (mine >> _EXP_AT) & 0xFF,
                  h.tag, h.session)


class _Kept(NamedTuple):
    """What the copies of one packet share (Aggregation._peer_rewrite makes it once)."""

    ip_head: bytes  # the arriving IPv4 header's first 10 bytes (up to the checksum)
    ip_head_sum: int  # ... as the sum of its 16-bit words
    hdr_tail: bytes  # the leaving PASSING header after its contributor field
    udp_len: bytes
    payload: bytes  # the values, and whatever trailed the PASSING part of the frame


def _rewrite(kept: _Kept, peer: dict[str, int], h: Header) -> bytes:
    """PeerRewrite.set_peer, then the checksum update and the deparser: the arriving IPv4
    header with the peer's addresses (its checksum computed over all of it, as
    update_checksum does), header `h` with the recipient's id, the values and the rest."""
    src, dst = peer["src_ip"], peer["dst_ip"]
    csum = _fold(kept.ip_head_sum + (src >> 16) + (src & 0xFFFF) + (dst >> 16) + (dst & 0xFFFF))
    return b"".join((
        peer["dst_mac"].to_bytes(6, "big"), peer["src_mac"].to_bytes(6, "big"), ETH_IPV4,
        kept.ip_head, _IP_TAIL.pack(csum, src, dst),
        _UDP_PORTS.pack(P.PASSING_UDP_PORT, peer["dst_port"]), kept.udp_len, b"\x00\x00",
        _HDR_TO_CONTRIBUTOR.pack(h.job_id, h.slot, peer["contributor"]), kept.hdr_tail,
        kept.payload,
    ))
