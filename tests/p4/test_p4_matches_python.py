"""p4src/, docs/protocol.md and passing/protocol.py describe one protocol. These tests read the P4
sources and the doc as text, so they run without p4c and catch drift the day it happens.

What depends on K is checked on the P4 program as the C preprocessor (what p4c runs first)
makes it for this process's K (PASSING_K); tests/unit/test_wide_k.py runs this module again at
every other K."""

import re
import subprocess
from pathlib import Path

from passing import lanes, packet
from passing import protocol as P
from tests.p4 import CPP, needs_cpp

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "p4src" / "include"


def p4_text(name: str) -> str:
    # Strip comments so commented-out code cannot satisfy a check.
    text = (INCLUDE / name).read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def p4_header_fields(header: str) -> list[tuple[str, int]]:
    body = re.search(r"header\s+" + header + r"\s*\{(.*?)\}", p4_text("wire.p4"), re.S)
    assert body, f"header {header} not found in wire.p4"
    fields = re.findall(r"bit<(\d+)>\s+(\w+)\s*;", body.group(1))
    return [(name, int(bits)) for bits, name in fields]


def p4_define(name: str) -> int:
    m = re.search(r"#define\s+" + name + r"\s+(\d+)", p4_text("config.p4"))
    assert m, f"#define {name} missing"
    return int(m.group(1))


def preprocessed(name: str, k: int = P.K, *flags: str) -> str:
    """include/`name` as p4c's preprocessor gives it for `k`: macros expanded, #if resolved,
    comments gone."""
    res = subprocess.run([CPP, "-P", "-undef", f"-DPASSING_K={k}", *flags, str(INCLUDE / name)],
                         capture_output=True, text=True, check=True)
    return res.stdout


def arith(expr: str) -> int:
    """A constant expression of the preprocessed P4 (digits, + and *, brackets)."""
    assert re.fullmatch(r"[\d\s+*()]+", expr), expr
    return eval(expr)  # noqa: S307 - digits and operators only, checked above


def p4_const(name: str) -> int:
    pattern = r"const\s+bit<\d+>\s+" + name + r"\s*=\s*([0-9a-fA-Fx]+)\s*;"
    m = re.search(pattern, p4_text("config.p4"))
    assert m, f"const {name} missing"
    return int(m.group(1), 0)


def test_passing_header_fields_match():
    python_fields = [(f.name, f.bits) for f in P.HEADER_FIELDS]
    assert p4_header_fields("passing_t") == python_fields
    assert sum(b for _, b in python_fields) == 8 * P.HEADER_BYTES == 224


def test_k_default_and_choices_match():
    """A bare p4c run builds the default K, and the program accepts exactly Python's choices,
    each as K/64 register words."""
    cfg = p4_text("config.p4")
    assert re.search(r"#ifndef\s+PASSING_K\s+#define\s+PASSING_K\s+(\d+)\s+#endif", cfg) \
        .group(1) == str(P.DEFAULT_K)
    table = re.findall(r"#(?:el)?if\s+PASSING_K\s*==\s*(\d+)\s+#define\s+VALUE_WORDS\s+(\d+)", cfg)
    assert {int(k): int(w) for k, w in table} == {k: k // P.LANES_PER_WORD for k in P.K_CHOICES}
    assert re.search(r"#else\s+#error", cfg)
    assert p4_define("WORD_BITS") == P.WORD_BITS == P.LANES_PER_WORD * P.VALUE_BITS == 2048


@needs_cpp
def test_values_header_is_k_values_in_words():
    macros = preprocessed("config.p4", P.K, "-dM")
    assert re.search(r"#define VALUE_WORDS (\d+)", macros).group(1) == str(P.VALUE_WORDS)
    body = re.search(r"header\s+values_t\s*\{(.*?)\}", preprocessed("headers.p4"), re.S)
    fields = [(n, int(b)) for b, n in re.findall(r"bit<(\d+)>\s+(\w+)\s*;", body.group(1))]
    assert fields == [(f"w{w}", P.WORD_BITS) for w in range(P.VALUE_WORDS)]
    assert sum(b for _, b in fields) == 8 * P.VALUES_BYTES


@needs_cpp
def test_every_word_is_stored_added_and_sent():
    """slot_values holds VALUE_WORDS words per slot and version; the action reads, adds, writes
    and sends each word of the packet, with the same SWAR expression."""
    agg = preprocessed("aggregation.p4")
    size = re.search(r"register<bit<(\d+)>>\(([^)]*)\)\s*slot_values\s*;", agg)
    assert int(size.group(1)) == P.WORD_BITS
    assert arith(size.group(2)) == 2 * P.SLOT_CAPACITY * P.VALUE_WORDS
    assert re.search(r"vbase = \(\(meta\.agg\.idx << 1\) \+ "
                     r"\(bit<32>\)hdr\.passing\.version\[0:0\]\) \* " + str(P.VALUE_WORDS) + ";",
                     agg)
    reads = re.findall(r"slot_values\.read\(acc(\d+), vbase \+ (\d+)\)", agg)
    writes = re.findall(r"slot_values\.write\(vbase \+ (\d+), vals(\d+)\)", agg)
    assert sorted((int(a), int(b)) for a, b in reads) == \
        sorted((int(a), int(b)) for a, b in writes) == [(w, w) for w in range(P.VALUE_WORDS)]
    for w in range(P.VALUE_WORDS):
        swar = (f"(((acc{w}) & LANE_LOW) + ((hdr.values.w{w}) & LANE_LOW)) ^ "
                f"(((acc{w}) ^ (hdr.values.w{w})) & LANE_MSB)")
        assert swar in agg, w
        assert f"hdr.values.w{w} = vals{w};" in agg


def test_capacities_and_port_match():
    assert p4_define("SLOT_CAPACITY") == P.SLOT_CAPACITY
    assert p4_define("MAX_JOBS") == P.MAX_JOBS
    assert p4_define("JOB_STATS_STRIDE") == P.JOB_STATS_STRIDE
    assert p4_define("GLOBAL_DROP_SLOTS") == P.GLOBAL_DROP_SLOTS
    assert p4_define("MAX_FAN_IN") == P.MAX_FAN_IN
    assert p4_const("PASSING_UDP_PORT") == P.PASSING_UDP_PORT


def test_fair_share_constants_match():
    """The egress's fair-share mark (fair_share.p4) and the model's (switch_model/fair_share.py)
    count and decide with the same numbers."""
    assert p4_const("FAIR_INTERVAL_SHIFT") == P.FAIR_INTERVAL_SHIFT
    assert p4_const("FAIR_QDEPTH") == P.FAIR_QDEPTH
    assert p4_const("FAIR_F_MIN") == P.FAIR_F_MIN
    assert p4_const("FAIR_F_MAX") == P.FAIR_F_MAX
    assert p4_const("FAIR_ACTIVE_DIV") == P.FAIR_ACTIVE_DIV
    assert p4_define("FAIR_PORTS") == P.FAIR_PORTS == 2**9  # every v1model port
    assert p4_define("FAIR_FLOWS") == P.FAIR_FLOWS == P.MAX_JOBS + 1  # each stat row, and the rest


def test_flags_and_drop_reasons_match():
    assert p4_const("FLAG_CONTRIB") == P.Flag.CONTRIB
    assert p4_const("FLAG_RESULT") == P.Flag.RESULT
    assert p4_const("FLAG_RETRANS") == P.Flag.RETRANS
    assert p4_const("FLAG_CLOSE") == P.Flag.CLOSE
    assert p4_const("FLAGS_KNOWN") == P.FLAGS_MASK
    for reason in P.JobDrop:
        assert p4_const("DROP_" + reason.name) == reason.value, reason
    for reason in P.GlobalDrop:
        assert p4_const("GDROP_" + reason.name) == reason.value, reason
    for event in P.JobEvent:
        assert p4_const("EVT_" + event.name) == event.value, event
    assert max(P.JobEvent) < P.JOB_STATS_STRIDE
    assert max(P.JobDrop) < P.JOB_STATS_STRIDE


def test_pool_epoch_is_the_versions_upper_bits():
    """The epoch job_config holds is as wide as passing.protocol.pool_epoch's, and compared
    with the version's bits above the round's."""
    adm = preprocessed("job_admission.p4")
    bits = P.POOL_EPOCH_MASK.bit_length()
    assert re.search(rf"bit<{bits}> epoch\)", adm)
    assert "hdr.passing.version[7:1] != meta.job.epoch" in adm
    assert 1 + bits == next(f.bits for f in P.HEADER_FIELDS if f.name == "version")
    assert P.version_of(0x83, 5) == (3 << 1) | 1
    assert not set(P.JobDrop.__members__.values()) & set(P.JobEvent.__members__.values())


def test_lengths_checked_by_p4_match_packer():
    assert P.PAYLOAD_BYTES == packet.PAYLOAD_DTYPE.itemsize
    cfg = p4_text("config.p4")
    assert f"PASSING_UDP_LEN = 8 + {P.HEADER_BYTES} + (PASSING_K * 4)" in cfg
    assert f"PASSING_IPV4_LEN = 20 + 8 + {P.HEADER_BYTES} + (PASSING_K * 4)" in cfg
    assert f"PASSING_HDR_BYTES = {P.HEADER_BYTES}" in cfg


@needs_cpp
def test_lengths_at_this_k_match_the_frame():
    cfg = preprocessed("config.p4")
    udp = re.search(r"PASSING_UDP_LEN = ([^;]*);", cfg).group(1)
    ipv4 = re.search(r"PASSING_IPV4_LEN = ([^;]*);", cfg).group(1)
    assert arith(udp) == P.UDP_HEADER_BYTES + P.PAYLOAD_BYTES
    assert arith(ipv4) == P.IPV4_HEADER_BYTES + P.UDP_HEADER_BYTES + P.PAYLOAD_BYTES
    assert P.FRAME_BYTES == P.ETH_HEADER_BYTES + arith(ipv4) <= P.ETH_HEADER_BYTES + P.LINK_MTU
    # Ethernet's MTU wherever the frame fits it; jumbo frames only for the K that needs them.
    assert (P.LINK_MTU == P.ETHERNET_MTU) == (P.K <= 320)


def doc_field_table() -> list[tuple[int, str, int]]:
    doc = (ROOT / "docs" / "protocol.md").read_text()
    section = doc.split("## PASSING header", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*`(\w+)`\s*\|\s*(\d+)\s*\|", section, re.M)
    return [(int(o), n, int(b)) for o, n, b in rows]


def test_doc_table_matches_python_definition():
    offset = 0
    expected = []
    for f in P.HEADER_FIELDS:
        expected.append((offset, f.name, f.bits))
        offset += f.bits // 8
    assert doc_field_table() == expected


def test_doc_example_payload_decodes_as_described():
    doc = (ROOT / "docs" / "protocol.md").read_text()
    block = doc.split("<!-- example-payload -->", 1)[1].split("```")[1]
    hexes = re.sub(r"\(then K-4 x 00000000\)", "00000000" * (P.K - 4), block)
    wire = bytes.fromhex("".join(hexes.split()))
    rec = packet.unpack(wire)
    assert packet.header_dict(rec) == dict(job_id=7, slot=3, contributor=1, flags=1, version=0,
                                           level=0, frag=10, round=4, num_contrib=2, exp=130,
                                           tag=0,
                                           session=0x0123456789ABCDEF)
    assert rec["values"][:5].tolist() == [1, -1, 2**31 - 1, -(2**31), 0]


def test_lane_mask_is_top_bit_of_every_lane():
    cfg = p4_text("config.p4")
    m = re.search(r"MSB_128\s*=\s*128w0x([0-9a-fA-F]+)", cfg)
    assert m and int(m.group(1), 16) == int("80000000" * 4, 16)
    assert "MSB_512  = MSB_128 ++ MSB_128 ++ MSB_128 ++ MSB_128" in cfg
    assert "MSB_2048 = MSB_512 ++ MSB_512 ++ MSB_512 ++ MSB_512" in cfg
    assert re.search(r"const\s+bit<WORD_BITS>\s+LANE_MSB\s*=\s*MSB_2048\s*;", cfg)
    assert lanes.WORD_MSB == int("80000000" * 64, 16)
    assert lanes.LANE_MSB == int("80000000" * P.K, 16)
