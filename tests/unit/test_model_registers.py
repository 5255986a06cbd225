"""The software switch model keeps slot_values in the P4 program's layout: VALUE_WORDS 2048-bit
words per slot and version, word w of version v of slot s at (2*s+v)*VALUE_WORDS + w, word 0
holding values 0..63. Register readers (the inspection service, the tests' fabric) see exactly
those cells."""

import socket

import numpy as np

from passing import protocol as P
from switch_model.inspect_server import serve_inspection
from testbed.entries import contribution, decode
from testbed.loopback import DEV, LoopbackSwitch

SLOT, VERSION = 2, 1


def word(values: np.ndarray, w: int) -> int:
    return int.from_bytes(values[64 * w:64 * w + 64].astype(">i4").tobytes(), "big")


def aggregated() -> tuple[LoopbackSwitch, np.ndarray, list]:
    """Two hosts' contributions summed in slot SLOT, version VERSION: (switch, sum, results)."""
    sw = LoopbackSwitch(2, slots=4)
    rng = np.random.default_rng(5)
    a, b = (rng.integers(-(2**31), 2**31, P.K) for _ in range(2))
    for port, vals in ((1, a), (2, b)):
        out = sw.pipe.process(port, contribution(DEV, port, vals, job_id=1, slot=SLOT,
                                                 version=VERSION))
    total = (a + b).astype(np.int64).astype(np.uint32).view(np.int32)
    return sw, total, out


def test_result_and_register_words_hold_the_sum():
    sw, total, out = aggregated()
    assert len(out) == 2 and all(decode(f)[1]["values"].tolist() == total.tolist()
                                 for _, f in out)
    cells = sw.pipe.slots.dump("slot_values")
    assert len(cells) == sw.pipe.slots.size("slot_values") == \
        2 * P.SLOT_CAPACITY * P.VALUE_WORDS
    base = (2 * SLOT + VERSION) * P.VALUE_WORDS
    expected = [word(total, w) for w in range(P.VALUE_WORDS)]
    assert cells[base:base + P.VALUE_WORDS] == expected
    assert [sw.pipe.slots.read("slot_values", base + w) for w in range(P.VALUE_WORDS)] == expected
    assert not any(cells[:base]) and not any(cells[base + P.VALUE_WORDS:])


def test_inspection_service_reads_each_word():
    sw, total, _ = aggregated()
    server = serve_inspection(sw.pipe, "127.0.0.1", 0)
    try:
        base = (2 * SLOT + VERSION) * P.VALUE_WORDS
        with socket.create_connection(server.server_address, timeout=5) as s:
            f = s.makefile("rw")
            for w in range(P.VALUE_WORDS):
                f.write(f"register_read slot_values {base + w}\n")
                f.flush()
                assert f.readline().strip() == f"slot_values[{base + w}]= {word(total, w)}"
            last = 2 * P.SLOT_CAPACITY * P.VALUE_WORDS
            f.write(f"register_read slot_values {last}\n")
            f.flush()
            assert "out of range" in f.readline()
    finally:
        server.shutdown()
        server.server_close()
