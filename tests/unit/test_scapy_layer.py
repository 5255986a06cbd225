"""The scapy layer agrees byte for byte with the numpy packer and decodes captures."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from passing import packet
from passing import protocol as P
from testbed.scapy_layer import Passing
from tests.lane_values import k_values


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF), st.integers(0, 31),
       st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF),
       k_values())
def test_scapy_bytes_equal_packer_bytes(job, slot, contrib, rnd, frag, values):
    fields = dict(job_id=job, slot=slot, contributor=contrib, flags=int(P.Flag.CONTRIB),
                  version=rnd & 1, round=rnd, level=1, frag=frag, num_contrib=2, exp=77)
    assert bytes(Passing(values=values, **fields)) == packet.pack(values, **fields)


def test_full_frame_decodes_from_bytes():
    vals = list(range(-P.K // 2, P.K // 2))
    frame = (Ether(dst="00:00:00:00:01:fe", src="00:00:00:00:01:01")
             / IP(src="10.0.1.1", dst="10.0.1.254")
             / UDP(sport=40000, dport=P.PASSING_UDP_PORT)
             / Passing(job_id=5, slot=2, flags="CONTRIB+RETRANS", values=vals))
    raw = bytes(frame)
    assert len(raw) == P.FRAME_BYTES
    back = Ether(raw)
    assert back.haslayer(Passing)
    assert back[Passing].job_id == 5 and back[Passing].values == vals
    assert back[Passing].flags == int(P.Flag.CONTRIB | P.Flag.RETRANS)
    assert back[IP].len == 20 + 8 + P.PAYLOAD_BYTES


def test_results_from_switch_decode_by_source_port():
    raw = bytes(Ether() / IP() / UDP(sport=P.PASSING_UDP_PORT, dport=50001)
                / Passing(flags="RESULT", values=[3] * P.K))
    assert Ether(raw)[Passing].values == [3] * P.K


def test_short_value_list_is_zero_padded():
    p = Passing(values=[9, 8])
    assert len(bytes(p)) == P.PAYLOAD_BYTES
    assert packet.unpack(bytes(p), strict=False)["values"][:3].tolist() == [9, 8, 0]


def test_truncated_capture_does_not_crash_scapy():
    raw = bytes(Ether() / IP() / UDP(dport=P.PASSING_UDP_PORT) / Passing(values=[1] * P.K))
    for cut in (14 + 20 + 8 + 3, 14 + 20 + 8 + P.HEADER_BYTES + 7, len(raw) - 1):
        pkt = Ether(raw[:cut])  # must not raise
        assert pkt.haslayer(UDP)


def test_packer_batch_rows_decode_in_scapy():
    vals = np.arange(2 * P.K, dtype=np.int32).reshape(2, P.K) - 50
    rows = packet.payload_rows(packet.pack_batch(vals, job_id=4, frag=[0, 1], flags=1))
    for i, row in enumerate(rows):
        layer = Passing(bytes(row))
        assert layer.frag == i and layer.values == vals[i].tolist()
