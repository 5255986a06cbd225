"""The one definition of the PASSING wire format and of the switch's numeric constants.

Everything else derives from this file: the numpy packer (`passing.packet`), the scapy layer
(`testbed.scapy_layer`), and a test that parses `p4src/include/*.p4` and fails if the P4 program
disagrees with anything here. `docs/protocol.md` documents the same fields in prose.

K, the values per packet, is the one number chosen per deployment: from the environment variable
PASSING_K (64, 128, 256 or 320), read here at import; the P4 build is compiled with the same K
(`passing.p4build`), and an unsupported K stops any import of this module with KError.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

# UDP destination port that marks aggregation traffic (0xBEEF). Results leave the switch with this
# as their source port.
PASSING_UDP_PORT = 48879

# Values per packet, K, is chosen at compile time: this module reads it from the environment
# variable PASSING_K (default DEFAULT_K), and passing.p4build compiles the P4 program with
# -DPASSING_K=<this K>, so the switch, the model and the agents of one environment agree. Each
# 32-bit value is one lane of a 2048-bit register word (WORD_BITS, the widest register p4c
# accepts); the switch adds the 64 lanes of a word in one lane-parallel (SWAR) operation, so a
# packet costs VALUE_WORDS register reads, adds and writes. K is a multiple of 64 so that words
# are full; 320 (a 1350-byte frame) is the largest whose frame fits a 1500-byte MTU: 384 would
# need 1606 bytes. 2048 (an 8262-byte frame) is for jumbo frames (LINK_MTU 9000): one packet
# carries 6.4x the values of K=320, and BMv2 pays per packet (docs/protocol.md, "Choosing K").
K_ENV = "PASSING_K"
K_CHOICES = (64, 128, 256, 320, 2048)
DEFAULT_K = 320
VALUE_BITS = 32
WORD_BITS = 2048
LANES_PER_WORD = WORD_BITS // VALUE_BITS


class KError(ValueError):
    """PASSING_K names a K the P4 program cannot be built with."""


def k_from(text: str | None) -> int:
    """K as PASSING_K gives it (None or empty: DEFAULT_K); KError unless one of K_CHOICES."""
    if text is None or not text.strip():
        return DEFAULT_K
    try:
        k = int(text.strip())
    except ValueError:
        k = None
    if k not in K_CHOICES:
        raise KError(f"{K_ENV}={text!r}: K (values per packet) must be one of "
                     f"{', '.join(map(str, K_CHOICES))}, a whole number of 64-lane register "
                     "words with a frame under the 1500-byte MTU (2048: under a 9000-byte "
                     "jumbo MTU)")
    return k


K = k_from(os.environ.get(K_ENV))
VALUE_WORDS = K // LANES_PER_WORD  # 2048-bit register words per slot and version
VALUES_BYTES = K * VALUE_BITS // 8

# Fan-in at one switch is bounded by the 64-bit contributor bitmap kept per slot and version
# (docs/protocol.md, "Limits per switch": the widest word one Tofino register action holds).
MAX_FAN_IN = 64
# Slot capacity of one switch (slots; each slot has two versions) and number of per-job counter
# rows. Both are P4 compile-time constants.
SLOT_CAPACITY = 4096
MAX_JOBS = 256

# Which slots of a pool a call uses (docs/protocol.md, "Rounds, quorum and late contributions").
# When a call agrees on its scale first, each slot's first packet carries only an exponent, so
# it uses a slot per FRAGS_PER_SLOT fragments of a wider pool, at least MIN_SLOTS (pools of up
# to MIN_SLOTS: min(W, n), as before the rule): a 256-slot pool would otherwise add 25% to a
# 1 MiB call's wire. A call at a speculative scale sends no exponent packets: it uses the whole
# window (min(W, n)), so more of its fragments are in flight at once.
FRAGS_PER_SLOT = 16
MIN_SLOTS = 64


def slots_used(window: int, nfrag: int, speculating: bool = False) -> int:
    """Slots a call of `nfrag` fragments uses of a `window`-slot pool: slot s carries fragments
    s, s + used, s + 2 * used, .... Every host of the job computes the same (whether a call
    speculates is decided from results every host reads alike)."""
    if speculating:
        return min(window, nfrag)
    return min(window, nfrag, max(MIN_SLOTS, -(-nfrag // FRAGS_PER_SLOT)))


@dataclass(frozen=True)
class Field:
    name: str
    bits: int
    doc: str


# Order and widths are the wire layout (network byte order, no padding). Every field is a whole
# number of bytes so that numpy can pack and unpack it without bit twiddling.
HEADER_FIELDS: tuple[Field, ...] = (
    Field("job_id", 16, "Job identifier assigned by the controller."),
    Field("slot", 16, "Slot index within the job's pool at the receiving switch (0..pool_size-1)."),
    Field("contributor", 8, "Sender's contributor id within its group at this switch (0..31); "
          "in results, the recipient's id."),
    Field("flags", 8, "Bit 0 CONTRIB, bit 1 RESULT, bit 2 RETRANS, bit 3 CLOSE (with CONTRIB "
          "only), bit 4 POOL, bit 5 CONGESTED (set by switches); other bits must be 0."),
    Field("version", 8, "Bit 0: the low bit of `round` (the slot's SwitchML shadow copy); bits "
          "1-7: the pool's epoch, its number modulo 128 (see Live pool resizing)."),
    Field("level", 8, "Aggregation level: 0 host to ToR, 1 ToR to spine."),
    Field("frag", 32, "Fragment number: the values are tensor elements frag*K .. frag*K+K-1."),
    Field("round", 32, "The slot's round: how many times the session used this slot before "
          "(0, 1, 2, ...), the same on every host; tells a late packet from a new round."),
    Field("num_contrib", 16, "Original contributors folded into this packet (a host sends its "
          "local GPU count; the switch sums it)."),
    Field("exp", 8, "Block exponent proposed by the sender; the switch returns the maximum."),
    Field("tag", 8, "Chosen by the sender (agents: the call's number modulo 128, plus 0x80 on a "
          "slot's last packet of the call); the switch passes it "
          "through, so results carry the tag of the packet that produced them."),
    Field("session", 64, "The agents' session: a random non-zero number all hosts of one run "
          "agreed on. A slot sums contributions of one session only; results carry it."),
)

HEADER_BYTES = sum(f.bits for f in HEADER_FIELDS) // 8
PAYLOAD_BYTES = HEADER_BYTES + VALUES_BYTES  # UDP payload of every aggregation packet
# The headers in front of the payload: untagged Ethernet, IPv4 without options (the switch drops
# tagged frames and does not parse options), UDP.
ETH_HEADER_BYTES = 14
IPV4_HEADER_BYTES = 20
UDP_HEADER_BYTES = 8
IPV4_PACKET_BYTES = IPV4_HEADER_BYTES + UDP_HEADER_BYTES + PAYLOAD_BYTES  # what an MTU must hold
FRAME_BYTES = ETH_HEADER_BYTES + IPV4_PACKET_BYTES
# The IPv4 MTU every link of the fabric needs for one aggregation packet: Ethernet's 1500
# where K's frame fits (K <= 320), jumbo frames' 9000 otherwise (K = 2048).
ETHERNET_MTU, JUMBO_MTU = 1500, 9000
LINK_MTU = ETHERNET_MTU if IPV4_PACKET_BYTES <= ETHERNET_MTU else JUMBO_MTU


class Flag(enum.IntFlag):
    CONTRIB = 0x01
    RESULT = 0x02
    RETRANS = 0x04
    # A host that waited long enough for the others: complete the round with the contributions
    # counted so far if they reach the job's quorum at this switch (docs/protocol.md, Quorum).
    CLOSE = 0x08
    # Which of the job's two pools (job_config's second key): a live resize moves the agents
    # from one to the other at a call boundary (docs/protocol.md, "Live pool resizing").
    POOL = 0x10
    # Congestion experienced: a switch's egress queue held MARK_QDEPTH packets or more when
    # this packet (or one counted into its slot's round) passed; the agents' congestion
    # windows shrink on it (docs/protocol.md, "Congestion control"). It never changes a sum.
    CONGESTED = 0x20


FLAGS_MASK = int(Flag.CONTRIB | Flag.RESULT | Flag.RETRANS | Flag.CLOSE | Flag.POOL
                 | Flag.CONGESTED)
# The egress queue depth, in packets, from which a switch marks PASSING packets CONGESTED (the
# P4 program's enq_qdepth; the model's count of queued bytes over FRAME_BYTES): under BMv2's
# default 64-packet queues, so marks come before drops.
MARK_QDEPTH = 32
# The fair-share mark (docs/protocol.md, "Fair shares of a port"): approximate fair dropping
# (AFD) done as marks. Per egress port, the bytes of each job and of all other traffic are
# counted in intervals of 2**FAIR_INTERVAL_SHIFT microseconds; while the port's queue holds
# FAIR_QDEPTH packets or more, a job that sent more than f times the port's bytes over its
# active flows last interval has that excess fraction of its packets marked. f, in 1/16ths
# from FAIR_F_MIN to FAIR_F_MAX, grows x1.25 at each interval that starts with a short queue
# and shrinks x0.75 at one that starts deep; a flow is active with at least 1/FAIR_ACTIVE_DIV
# of the port's bytes. Ports and flows (jobs' stat rows, the last for all other traffic).
FAIR_INTERVAL_SHIFT = 13
FAIR_QDEPTH = 8
FAIR_F_MIN = 16
FAIR_F_MAX = 128
FAIR_ACTIVE_DIV = 20
FAIR_PORTS = 512
FAIR_FLOWS = 257  # MAX_JOBS + 1

# A pool's epoch, in the version's upper 7 bits: its number (JobParams.pool) modulo 128. FLAG_POOL
# alone repeats every second resize; a delayed packet of the pool two resizes back must not be
# admitted to the pool that took its bit over (docs/protocol.md, "Live pool resizing").
POOL_EPOCH_MASK = 0x7F


def pool_epoch(pool: int) -> int:
    """The epoch packets of pool number `pool` carry, and its job_config entries hold."""
    return pool & POOL_EPOCH_MASK


def version_of(pool: int, round_: int) -> int:
    """The `version` byte of a packet of pool `pool` in slot round `round_`."""
    return (pool_epoch(pool) << 1) | (round_ & 1)


class JobDrop(enum.IntEnum):
    """Per-job drop reasons; also events 0..7 and 19 of counter `job_stats` (see JobEvent)."""

    NOT_MEMBER = 0  # ingress port is not a member of the job (or wrong direction for the flags)
    BAD_CONTRIBUTOR = 1  # contributor id outside the ingress port's member range
    SLOT_RANGE = 2  # slot >= the job's pool size at this switch
    BAD_VERSION = 3  # version's low bit not the low bit of round
    BAD_FLAGS = 4  # neither CONTRIB nor RESULT, both, or unknown bits
    STALE_RESULT = 5  # a RESULT from the spine for a round older than the one the slot holds
    FORGED_RESULT = 6  # a RESULT not from the job's uplink, or UDP to one of its agents' ports
    STALE_ROUND = 7  # a contribution of a round the slot has left behind: never added
    # A packet of an older pool under the same FLAG_POOL (a resize two or more back): its
    # version's epoch is not the pool's. Event cells 8..18 were taken when it came.
    STALE_POOL = 19


class JobEvent(enum.IntEnum):
    """What an admitted packet did; with JobDrop, exactly one event per packet of a known job is
    counted in `job_stats[stat_idx * JOB_STATS_STRIDE + event]`."""

    PARTIAL = 8  # new contribution, slot not complete: consumed
    COMPLETE_ROOT = 9  # new contribution completed the slot at a root: multicast
    COMPLETE_UP = 10  # new contribution completed the rack sum at a non-root: sent up
    DUPLICATE = 11  # already counted, round not finished: dropped
    RESULT_AGAIN = 12  # already counted, slot final: the result unicast back to the sender
    RESEND_UP = 13  # already counted, rack sum waiting for the spine: sent up again
    DOWNLINK = 14  # result from the spine: stored, multicast to local members
    LATE = 15  # a contribution after its round closed here, result not back yet: dropped
    LATE_RESULT = 16  # a contribution after its round completed: not added, result unicast back
    CLOSED_ROOT = 17  # a CLOSE request completed the slot with a quorum at a root: multicast
    CLOSED_UP = 18  # a CLOSE request completed the rack sum with a quorum: sent up


JOB_STATS_STRIDE = 32


class GlobalDrop(enum.IntEnum):
    """Drops that belong to no job: index in counter `global_drops`."""

    UNKNOWN_JOB = 0
    MALFORMED = 1  # truncated, wrong lengths or bad IPv4 checksum on the PASSING port
    FORGED = 2  # UDP from source port 48879 to another port: only switches send from it
    UNCHECKED_UDP = 3  # UDP whose ports the parser cannot see (IPv4 options)
    TAGGED = 4  # a VLAN-tagged frame: the fabric is untagged, and a tag hides IPv4/UDP


# EtherTypes of VLAN tags (802.1Q, 802.1ad, and the older QinQ one): dropped as TAGGED.
VLAN_TPIDS = (0x8100, 0x88A8, 0x9100)


GLOBAL_DROP_SLOTS = 8

# Per-job totals an operator reads, as sums of job_stats events.
JOB_COUNTERS: dict[str, tuple[int, ...]] = {
    "job_contributions": (JobEvent.PARTIAL, JobEvent.COMPLETE_ROOT, JobEvent.COMPLETE_UP),
    "job_duplicates": (JobEvent.DUPLICATE,),
    "job_results": (JobEvent.COMPLETE_ROOT, JobEvent.CLOSED_ROOT),
    "job_quorum_rounds": (JobEvent.CLOSED_ROOT, JobEvent.CLOSED_UP),
    "job_late": (JobEvent.LATE, JobEvent.LATE_RESULT, JobDrop.STALE_ROUND),
    "job_result_retransmits": (JobEvent.RESULT_AGAIN,),
    "job_uplink": (JobEvent.COMPLETE_UP, JobEvent.CLOSED_UP, JobEvent.RESEND_UP),
    "job_downlink": (JobEvent.DOWNLINK,),
}


class Role(enum.IntEnum):
    ROOT = 1  # finished slots are multicast to members
    NON_ROOT = 0  # finished slots go up as one contribution; results from above come down
