"""The in-process switch's frames (testbed/loopback.py) are built from cached headers: they must
be byte for byte the frames scapy builds for the same datagram, for every port and length."""

from __future__ import annotations

import numpy as np

from passing import protocol as P
from testbed.entries import to_switch
from testbed.loopback import DEV, LoopbackSwitch


def test_cached_frames_equal_what_scapy_builds():
    sw = LoopbackSwitch(3)
    rng = np.random.default_rng(4)
    for port in (1, 2, 3, 1):
        for n in (P.PAYLOAD_BYTES, P.PAYLOAD_BYTES, 7, P.PAYLOAD_BYTES + 1, 0):
            payload = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            assert sw.frame_of(port, payload) == to_switch(DEV, port, payload, udp_chksum=0), \
                (port, n)
