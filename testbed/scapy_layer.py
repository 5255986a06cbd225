"""Scapy layer for the PASSING header, built from `passing.protocol.HEADER_FIELDS`.

Importing this module binds the layer to UDP port PASSING_UDP_PORT (either direction), so
captures decode and tests can write `Ether()/IP()/UDP(dport=PASSING_UDP_PORT)/Passing(...)`.
"""

from __future__ import annotations

from scapy.fields import BitField, FieldListField, FlagsField, SignedIntField
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from passing import protocol as P

_FLAG_NAMES = ["CONTRIB", "RESULT", "RETRANS", "CLOSE", "b4", "b5", "b6", "b7"]


def _field(f: P.Field):
    if f.name == "flags":
        return FlagsField(f.name, int(P.Flag.CONTRIB), f.bits, _FLAG_NAMES)
    default = 1 if f.name == "num_contrib" else 0
    return BitField(f.name, default, f.bits)


class Passing(Packet):
    name = "PASSING"
    fields_desc = [_field(f) for f in P.HEADER_FIELDS] + [
        # max_count: scapy refuses lists longer than conf.max_list_count (100) unless told, and
        # K may be 128 or 256.
        FieldListField("values", [0] * P.K, SignedIntField("v", 0), count_from=lambda _: P.K,
                       max_count=P.K),
    ]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        # A packet built with fewer than K values is padded so that it is always well-formed.
        short = P.PAYLOAD_BYTES - len(pkt)
        if short > 0:
            pkt += b"\x00" * short
        return pkt + pay

    def extract_padding(self, s: bytes):
        return b"", s


bind_layers(UDP, Passing, dport=P.PASSING_UDP_PORT)
bind_layers(UDP, Passing, sport=P.PASSING_UDP_PORT)
