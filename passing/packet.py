"""Fast, vectorized packing and unpacking of PASSING UDP payloads (header + K values).

A batch of packets is one numpy structured array whose dtype is derived from
`passing.protocol.HEADER_FIELDS`, so building n packets is a handful of array assignments and one
`tobytes()`, with no per-value Python loop.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from passing import protocol as P

_NUMPY_UINT = {8: ">u1", 16: ">u2", 32: ">u4", 64: ">u8"}

HEADER_DTYPE = np.dtype([(f.name, _NUMPY_UINT[f.bits]) for f in P.HEADER_FIELDS])
PAYLOAD_DTYPE = np.dtype(HEADER_DTYPE.descr + [("values", ">i4", (P.K,))])
assert HEADER_DTYPE.itemsize == P.HEADER_BYTES
assert PAYLOAD_DTYPE.itemsize == P.PAYLOAD_BYTES

HEADER_NAMES: tuple[str, ...] = tuple(f.name for f in P.HEADER_FIELDS)


class ProtocolError(ValueError):
    """A payload that is not a well-formed PASSING packet."""


def _check_range(name: str, value: np.ndarray | int, bits: int) -> None:
    # Checked on every batch an agent sends: a plain int without numpy, an unsigned array
    # without its minimum.
    if isinstance(value, int):
        if not 0 <= value < 1 << bits:
            raise ProtocolError(f"field {name}={value} does not fit in {bits} bits")
        return
    arr = np.asarray(value)
    if arr.size and ((arr.dtype.kind != "u" and arr.min() < 0) or arr.max() >= (1 << bits)):
        raise ProtocolError(f"field {name}={arr.min() if arr.min() < 0 else arr.max()} "
                            f"does not fit in {bits} bits")


def pack_batch(values: np.ndarray, pool: int = 0, **fields: int | np.ndarray) -> np.ndarray:
    """Build n packets at once.

    `values` is an (n, K) integer array (taken modulo 2**32 as two's complement int32); each
    header field is a scalar (same for every packet) or an array of length n. Missing fields are
    0, except that `version` is pool `pool`'s epoch and the low bit of `round`, and a `round`
    left out beside a `version` is its low bit (the slot's first or second round), so one of
    them is enough. `pool` (the job's pool number, JobParams.pool) sets only the version's
    epoch, not FLAG_POOL.
    Returns a structured array; `.tobytes()` or `payload_rows()` give the wire bytes.
    """
    vals = np.asarray(values)
    if vals.ndim != 2 or vals.shape[1] != P.K:
        raise ProtocolError(f"values must have shape (n, {P.K}), got {vals.shape}")
    unknown = set(fields) - set(HEADER_NAMES)
    if unknown:
        raise ProtocolError(f"unknown header field(s): {', '.join(sorted(unknown))}")
    out = np.zeros(vals.shape[0], dtype=PAYLOAD_DTYPE)
    if "version" not in fields:
        rnd = fields.get("round", 0)
        _check_range("round", rnd, 32)
        fields = {**fields, "version": P.version_of(pool, np.asarray(rnd))}
    elif "round" not in fields:
        fields = {**fields, "round": np.asarray(fields["version"]) & 1}
    for f in P.HEADER_FIELDS:
        if f.name in fields:
            _check_range(f.name, fields[f.name], f.bits)
            out[f.name] = fields[f.name]
    if vals.dtype != np.int32:
        # Wrap to 32-bit two's complement the way the switch's adders do.
        vals = vals.astype(np.int64, copy=False).astype(np.uint32).view(np.int32)
    out["values"] = vals
    return out


def pack(values: Iterable[int] | np.ndarray, **fields: int) -> bytes:
    """One packet's UDP payload."""
    return pack_batch(np.asarray(values).reshape(1, P.K), **fields).tobytes()


def payload_rows(batch: np.ndarray) -> np.ndarray:
    """View a packed batch as an (n, PAYLOAD_BYTES) uint8 array; each row is one datagram."""
    return batch.view(np.uint8).reshape(batch.shape[0], P.PAYLOAD_BYTES)


def rows_of(payloads: list[bytes]) -> tuple[np.ndarray, int]:
    """The datagrams of the payload size among `payloads` as an (n, PAYLOAD_BYTES) uint8 array,
    and how many others there were."""
    good = [p for p in payloads if len(p) == P.PAYLOAD_BYTES]
    rows = np.frombuffer(b"".join(good), dtype=np.uint8).reshape(-1, P.PAYLOAD_BYTES)
    return rows, len(payloads) - len(good)


FLAGS_OFFSET = HEADER_DTYPE.fields["flags"][1]


def with_flags(payload: bytes, flags: int) -> bytes:
    """The same packet with its flags byte replaced (e.g. a resend marked RETRANS)."""
    b = bytearray(payload)
    b[FLAGS_OFFSET] = flags
    return bytes(b)


def unpack(payload: bytes | bytearray | memoryview, *, strict: bool = True) -> np.void:
    """Decode one UDP payload. Raises ProtocolError if it is truncated, too long, or (strict)
    carries impossible field values."""
    n = len(payload)
    if n != P.PAYLOAD_BYTES:
        kind = "truncated" if n < P.PAYLOAD_BYTES else "oversized"
        raise ProtocolError(f"{kind} PASSING payload: {n} bytes, expected {P.PAYLOAD_BYTES}")
    rec = np.frombuffer(payload, dtype=PAYLOAD_DTYPE, count=1)[0]
    if strict:
        validate(rec)
    return rec


def unpack_batch(payloads: Iterable[bytes], *, strict: bool = True) -> np.ndarray:
    """Decode many payloads into one structured array (same checks as `unpack`)."""
    chunks = list(payloads)
    for i, p in enumerate(chunks):
        if len(p) != P.PAYLOAD_BYTES:
            raise ProtocolError(f"payload {i}: {len(p)} bytes, expected {P.PAYLOAD_BYTES}")
    arr = np.frombuffer(b"".join(chunks), dtype=PAYLOAD_DTYPE)
    if strict and arr.size:
        validate(arr)
    return arr


def validate(rec: np.ndarray | np.void) -> None:
    flags = np.asarray(rec["flags"])
    if np.any(flags & (0xFF ^ P.FLAGS_MASK)):
        raise ProtocolError(f"unknown flag bits in {int(np.max(flags)):#04x}")
    kind = flags & int(P.Flag.CONTRIB | P.Flag.RESULT)
    if np.any((kind != P.Flag.CONTRIB) & (kind != P.Flag.RESULT)):
        raise ProtocolError("exactly one of CONTRIB and RESULT must be set")
    if np.any((kind == P.Flag.RESULT) & (flags & int(P.Flag.CLOSE) != 0)):
        raise ProtocolError("CLOSE goes with CONTRIB only")
    if np.any((np.asarray(rec["version"]) ^ np.asarray(rec["round"])) & 1):
        raise ProtocolError("the version's low bit must be the low bit of round")
    if np.any(np.asarray(rec["contributor"]) >= P.MAX_FAN_IN):
        raise ProtocolError(f"contributor id must be below {P.MAX_FAN_IN}")


def header_dict(rec: np.void) -> dict[str, int]:
    return {name: int(rec[name]) for name in HEADER_NAMES}


def describe(rec: np.void) -> str:
    h = header_dict(rec)
    flags = "|".join(f.name for f in P.Flag if h["flags"] & f) or "0"
    return (f"job={h['job_id']} slot={h['slot']}.r{h['round']} from={h['contributor']} "
            f"flags={flags} level={h['level']} frag={h['frag']} n={h['num_contrib']} "
            f"exp={h['exp']}")
