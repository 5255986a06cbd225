"""Bytes on the wire, per strategy: what the simulated flows carry.

PASSING and INA move fixed frames of passing.protocol.FRAME_BYTES, each carrying K values,
plus one exponent packet per slot a call uses unless it speculates on its scale (the counting
is bench.analytic's, which reads passing.protocol). The TCP strategies (gloo's ring, the
parameter server) carry 1448 bytes of payload per 1514-byte frame; their ACKs, on the other
direction, are left to SimGrid's cross-traffic (each flow also loads its reverse path by 5%).
"""

from __future__ import annotations

import math

from bench import analytic
from passing import protocol as P

FRAME_BYTES = P.FRAME_BYTES
VALUES_PER_PACKET = P.K
VALUE_BYTES = P.VALUE_BITS // 8


def stream_packets(size_bytes: int, window: int, speculating: bool) -> int:
    """Packets one PASSING/INA stream sends (and gets back) for a tensor of `size_bytes`."""
    return analytic.stream_packets(size_bytes // VALUE_BYTES, window, speculating)


def slots_in_flight(size_bytes: int, window: int, speculating: bool) -> int:
    """Packets a stream keeps in flight: the slots the call uses (passing.protocol)."""
    frags = math.ceil(size_bytes // VALUE_BYTES / VALUES_PER_PACKET)
    return max(1, P.slots_used(window, frags, speculating))


def tcp_wire_bytes(payload: float) -> float:
    """Frames' bytes in the data direction for `payload` bytes sent over TCP."""
    return payload / analytic.TCP_MSS * analytic.TCP_FRAME


def tcp_frames(payload: float) -> float:
    """Data frames for `payload` bytes over TCP."""
    return math.ceil(payload / analytic.TCP_MSS)


def parse_size(text: str) -> int:
    """`256K`, `16M`, `1G` (binary units, as passing-agent takes them), `100MB` (decimal), or
    a number of bytes."""
    t = text.strip().upper()
    decimal = {"KB": 10**3, "MB": 10**6, "GB": 10**9}
    binary = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "KIB": 1 << 10, "MIB": 1 << 20,
              "GIB": 1 << 30}
    for suffix, mult in sorted({**decimal, **binary}.items(), key=lambda kv: -len(kv[0])):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


def format_size(n: int) -> str:
    """256 KiB, 16 MiB, 100 MB, 1 GB: binary units when exact, else decimal."""
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}"
    for unit, mult in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}"
    return f"{n} B"
