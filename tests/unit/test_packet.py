"""The numpy packer/unpacker: round trips, wire layout, wrap-around, rejection of bad payloads."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from passing import packet
from passing import protocol as P
from passing.packet import ProtocolError
from tests.lane_values import k_values


def header_strategy():
    return st.fixed_dictionaries({
        "job_id": st.integers(0, 0xFFFF),
        "slot": st.integers(0, 0xFFFF),
        "contributor": st.integers(0, P.MAX_FAN_IN - 1),
        "flags": st.sampled_from([P.Flag.CONTRIB, P.Flag.RESULT,
                                  P.Flag.CONTRIB | P.Flag.RETRANS, P.Flag.RESULT | P.Flag.RETRANS,
                                  P.Flag.CONTRIB | P.Flag.RETRANS | P.Flag.CLOSE]),
        "round": st.integers(0, 2**32 - 1),
        "level": st.integers(0, 1),
        "frag": st.integers(0, 0xFFFFFFFF),
        "num_contrib": st.integers(0, 0xFFFF),
        "exp": st.integers(0, 0xFF),
        "session": st.integers(0, 2**64 - 1),
    })


values_strategy = k_values()


@settings(max_examples=200, deadline=None)
@given(header_strategy(), values_strategy)
def test_round_trip_single(hdr, values):
    wire = packet.pack(values, **{k: int(v) for k, v in hdr.items()})
    assert len(wire) == P.PAYLOAD_BYTES
    rec = packet.unpack(wire)
    # the version is the round's low bit
    assert packet.header_dict(rec) == {**{k: int(v) for k, v in hdr.items()}, "tag": 0,
                                       "version": hdr["round"] & 1}
    assert rec["values"].tolist() == values


@pytest.mark.parametrize("pool,round_,version", [
    (0, 5, 1), (1, 4, 2), (2, 7, 5), (127, 1, 255), (128, 1, 1), (129, 0, 2)])
def test_version_carries_the_pools_epoch_above_the_rounds_bit(pool, round_, version):
    """Bits 1-7: the pool number modulo 128 (what job_config's epoch must equal); bit 0: the
    round's low bit. Such a packet is valid, whatever its pool."""
    rec = packet.unpack(packet.pack([0] * P.K, pool=pool, round=round_, flags=1))
    assert (int(rec["version"]), int(rec["round"])) == (version, round_)
    assert P.version_of(pool, round_) == version


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 300), st.integers(0, 2**32 - 1))
def test_round_trip_batch(n, seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(-(2**31), 2**31, size=(n, P.K), dtype=np.int64).astype(np.int32)
    frags = np.arange(n, dtype=np.uint32) + 1000
    slots = np.arange(n) % 7
    batch = packet.pack_batch(values, job_id=9, slot=slots, frag=frags, version=slots % 2,
                              flags=int(P.Flag.CONTRIB), num_contrib=3)
    rows = packet.payload_rows(batch)
    assert rows.shape == (n, P.PAYLOAD_BYTES)
    back = packet.unpack_batch(bytes(r) for r in rows)
    assert np.array_equal(back["values"], values)
    assert np.array_equal(back["frag"], frags)
    assert np.array_equal(back["slot"], slots)
    assert np.all(back["job_id"] == 9) and np.all(back["num_contrib"] == 3)


def test_wire_layout_is_big_endian_and_packed():
    vals = [1, -1, 2**31 - 1, -(2**31)] + [0] * (P.K - 4)
    wire = packet.pack(vals, job_id=7, slot=3, contributor=1, flags=int(P.Flag.CONTRIB),
                       round=5, level=0, frag=10, num_contrib=2, exp=130,
                       session=0x0123456789ABCDEF)
    assert wire[:28].hex() == ("00070003010101000000000a00000005" "00028200"
                               "0123456789abcdef")
    assert wire[28:44].hex() == "00000001ffffffff7fffffff80000000"
    assert wire[44:] == b"\x00" * (4 * (P.K - 4))


def test_large_values_wrap_like_int32():
    vals = np.array([[2**31, 2**32 + 5, -(2**31) - 1] + [0] * (P.K - 3)], dtype=np.int64)
    rec = packet.unpack(packet.pack_batch(vals, flags=1).tobytes())
    assert rec["values"][:3].tolist() == [-(2**31), 5, 2**31 - 1]


@pytest.mark.parametrize("cut", [0, 1, P.HEADER_BYTES - 1, P.HEADER_BYTES, P.PAYLOAD_BYTES - 1])
def test_truncated_payload_rejected(cut):
    wire = packet.pack([0] * P.K, flags=1)
    with pytest.raises(ProtocolError, match="truncated"):
        packet.unpack(wire[:cut])


def test_oversized_payload_rejected():
    with pytest.raises(ProtocolError, match="oversized"):
        packet.unpack(packet.pack([0] * P.K, flags=1) + b"\x00")


def test_batch_rejects_one_bad_length():
    good = packet.pack([0] * P.K, flags=1)
    with pytest.raises(ProtocolError, match="payload 1"):
        packet.unpack_batch([good, good[:-4], good])


@pytest.mark.parametrize("field,value,msg", [
    ("flags", 0x40 | 0x01, "unknown flag"),
    ("flags", 0x08 | 0x02, "CLOSE goes with CONTRIB"),
    ("flags", 0x00, "exactly one"),
    ("flags", 0x03, "exactly one"),
    ("version", 3, "version"),  # with round 0: bit 0 is not the round's (bits 1-7: epoch 1)
    ("contributor", 64, "contributor"),
])
def test_strict_unpack_rejects_impossible_fields(field, value, msg):
    fields = {"flags": 1, "round": 0, field: value}
    wire = packet.pack([0] * P.K, **fields)
    with pytest.raises(ProtocolError, match=msg):
        packet.unpack(wire)
    assert packet.unpack(wire, strict=False)[field] == value


def test_pack_rejects_out_of_range_and_unknown_fields():
    with pytest.raises(ProtocolError, match="does not fit in 16 bits"):
        packet.pack([0] * P.K, job_id=70000)
    with pytest.raises(ProtocolError, match="does not fit"):
        packet.pack([0] * P.K, slot=-1)
    with pytest.raises(ProtocolError, match="unknown header field"):
        packet.pack([0] * P.K, job=1)
    with pytest.raises(ProtocolError, match="shape"):
        packet.pack_batch(np.zeros((2, P.K + 1), dtype=np.int32))


def test_describe_names_the_flags():
    rec = packet.unpack(packet.pack([0] * P.K, job_id=3, slot=5, round=7,
                                    flags=int(P.Flag.RESULT | P.Flag.RETRANS)))
    assert "job=3 slot=5.r7" in packet.describe(rec)
    assert "RESULT|RETRANS" in packet.describe(rec)
