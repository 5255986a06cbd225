"""Where a PASSING frame's fields are, the header as a tuple, the events of the P4 program as
ints, and the copy PeerRewrite makes of a frame: what the model's pipeline (switch_model.pipeline)
and its decisions on a slot (switch_model.slot_word) share. Offsets and lengths are
passing.protocol's, for this process's K."""

from __future__ import annotations

import struct
from typing import NamedTuple

from passing import protocol as P
from passing.protocol import JobEvent as E

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

HDR = struct.Struct("!HHBBBBIIHBBQ")
# The same header in two parts, for copies that differ only in the contributor field.
HDR_TO_CONTRIBUTOR = struct.Struct("!HHB")
HDR_AFTER_CONTRIBUTOR = struct.Struct("!BBBIIHBBQ")
IP_TAIL = struct.Struct("!HII")  # checksum, source and destination address


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


IPV4_WORDS = struct.Struct("!10H")
UDP_PORTS = struct.Struct("!HH")
PASSING_PORT_BYTES = P.PASSING_UDP_PORT.to_bytes(2, "big")

FLAG_CONTRIB, FLAG_RESULT, FLAG_RETRANS, FLAG_CLOSE, FLAG_POOL, FLAG_CONGESTED = (
    int(P.Flag.CONTRIB), int(P.Flag.RESULT), int(P.Flag.RETRANS), int(P.Flag.CLOSE),
    int(P.Flag.POOL), int(P.Flag.CONGESTED))
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
UP_EVENTS = frozenset((EVT_COMPLETE_UP, EVT_CLOSED_UP, EVT_RESEND_UP))
MCAST_EVENTS = frozenset((EVT_COMPLETE_ROOT, EVT_CLOSED_ROOT, EVT_DOWNLINK))
UNICAST_EVENTS = frozenset((EVT_RESULT_AGAIN, EVT_LATE_RESULT))
LATE_EVENTS = frozenset((EVT_LATE, EVT_LATE_RESULT, DROP_STALE_ROUND))
REFUSED_EVENTS = frozenset((DROP_STALE_RESULT, DROP_STALE_ROUND))



def fold(total: int) -> int:
    """csum16 of a sum of 16-bit words: the carries folded in, then complemented."""
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def well_formed(frame: bytes, ip: tuple[int, ...]) -> bool:
    """JobAdmission's first check: the whole PASSING packet is there (the caller checked the
    length), with a valid IPv4 checksum and exactly the lengths of one. `ip`: the IPv4
    header's ten 16-bit words (word 1 the total length, word 5 the checksum)."""
    return (fold(sum(ip) - ip[5]) == ip[5] and ip[1] == PASSING_IPV4_LEN
            and int.from_bytes(frame[UDP_LEN], "big") == PASSING_UDP_LEN)



class Kept(NamedTuple):
    """What the copies of one packet share (Aggregation._peer_rewrite makes it once)."""

    ip_head: bytes  # the arriving IPv4 header's first 10 bytes (up to the checksum)
    ip_head_sum: int  # ... as the sum of its 16-bit words
    hdr_tail: bytes  # the leaving PASSING header after its contributor field
    udp_len: bytes
    payload: bytes  # the values, and whatever trailed the PASSING part of the frame


def rewrite_copy(kept: Kept, peer: dict[str, int], h: Header) -> bytes:
    """PeerRewrite.set_peer, then the checksum update and the deparser: the arriving IPv4
    header with the peer's addresses (its checksum computed over all of it, as
    update_checksum does), header `h` with the recipient's id, the values and the rest."""
    src, dst = peer["src_ip"], peer["dst_ip"]
    csum = fold(kept.ip_head_sum + (src >> 16) + (src & 0xFFFF) + (dst >> 16) + (dst & 0xFFFF))
    return b"".join((
        peer["dst_mac"].to_bytes(6, "big"), peer["src_mac"].to_bytes(6, "big"), ETH_IPV4,
        kept.ip_head, IP_TAIL.pack(csum, src, dst),
        UDP_PORTS.pack(P.PASSING_UDP_PORT, peer["dst_port"]), kept.udp_len, b"\x00\x00",
        HDR_TO_CONTRIBUTOR.pack(h.job_id, h.slot, peer["contributor"]), kept.hdr_tail,
        kept.payload,
    ))


FLAGS_AT_BYTE = UDP_OFF + P.UDP_HEADER_BYTES + 5  # after job_id, slot and contributor


def is_passing_copy(frame: bytes) -> bool:
    """Whether a frame this switch sends is a PASSING packet of its own (the egress's
    hdr.passing): UDP from the aggregation port, which only the PASSING path sends from (the
    guard drops any other datagram from it whose ports it can see)."""
    return (len(frame) > FLAGS_AT_BYTE and frame[ETHERTYPE] == ETH_IPV4
            and frame[IPV4_VER_IHL] & 0x0F == 5 and (frame[IPV4_FRAG_HI] & 0x1F) == 0
            and frame[IPV4_FRAG_LO] == 0 and frame[IPV4_PROTO] == IP_PROTO_UDP
            and frame[UDP_SPORT] == PASSING_PORT_BYTES)


def congested(frame: bytes) -> bytes:
    """The frame as PassingEgress sends it when it marks: a PASSING copy of this switch's
    (is_passing_copy) with FLAG_CONGESTED set (its UDP checksum is zero); anything else as it
    is."""
    return with_mark(frame) if is_passing_copy(frame) else frame


def with_mark(frame: bytes) -> bytes:
    """A PASSING copy (is_passing_copy, which the caller has checked) with FLAG_CONGESTED set."""
    out = bytearray(frame)
    out[FLAGS_AT_BYTE] |= FLAG_CONGESTED
    return bytes(out)
