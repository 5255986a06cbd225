"""What the controller relies on in a switch's program: the tables it writes and reads and the
counters it reads and zeroes, each with its keys, actions, parameters, size and unit; and the
number of values its packets carry (K), which no table shows.

A switch whose program was loaded by the switch's own tools (Tofino's `bf_switchd`: the
controller cannot push it) runs a P4Info the controller did not build: other ids, names under
the compiler's prefix (`pipe.`). The controller can drive it when this surface matches its own,
name by name (the last part of each) and width by width: the same entries mean the same there.
"""

from __future__ import annotations

import re

from p4.config.v1 import p4info_pb2

from passing.p4info import P4InfoIndex

# controller/tables/ and controller/counters.py
CONTROL_TABLES = ("job_config", "membership", "peer_rewrite", "result_guard", "l2_forward")
CONTROL_COUNTERS = ("global_drops", "job_stats", "late_contribs", "pool_contribs",
                    "egress_drops")


def _short(name: str) -> str:
    return name.split(".")[-1]


def _table(idx: P4InfoIndex, name: str) -> tuple:
    t = idx.table(name)
    actions = []
    for ref in t.action_refs:
        action = idx.action_name(ref.id)
        if _short(action) != "NoAction":
            actions.append((_short(action),
                            tuple((p.name, p.bitwidth) for p in idx.action(action).params)))
    keys = tuple((m.name, m.bitwidth, m.match_type) for m in t.match_fields)
    return ("table", name, keys, tuple(sorted(actions)), t.size)


def _counter(idx: P4InfoIndex, name: str) -> tuple:
    c = idx.counter(name)
    return ("counter", name, c.size, c.spec.unit)


def control_surface(info: p4info_pb2.P4Info) -> dict[str, tuple | None]:
    """Per table and counter the controller uses, its shape in `info` (None where `info` has
    none of that name)."""
    idx = P4InfoIndex(info)
    out: dict[str, tuple | None] = {}
    for name, shape in [*((n, _table) for n in CONTROL_TABLES),
                        *((n, _counter) for n in CONTROL_COUNTERS)]:
        try:
            out[name] = shape(idx, name)
        except KeyError:  # P4InfoError, or an action reference to no action: not ours
            out[name] = None
    return out


def surface_difference(mine: dict[str, tuple | None], theirs: p4info_pb2.P4Info) -> str | None:
    """None where the controller can drive a switch running `theirs` as one running the
    program whose control_surface is `mine`; else what differs first, in words."""
    other = control_surface(theirs)
    for name, shape in mine.items():
        kind = "table" if name in CONTROL_TABLES else "counter"
        if other[name] is None:
            return f"it has no {kind} {name}"
        if other[name] != shape:
            what = "keys, actions or size" if kind == "table" else "size or unit"
            return f"its {kind} {name} differs in {what}"
    return None


_LANE_PAIR = re.compile(r"slot_values_\d+")  # p4src/tna/slot_values.p4: two 32-bit lanes each
_LANE_BITS = 32


def values_per_packet(info: p4info_pb2.P4Info) -> int | None:
    """K of the program `info` describes, from the registers that hold a slot's values, or None
    where it has none of either shape. The v1model program keeps each slot version's K lanes as
    VALUE_WORDS words of one register (`slot_values`, 2 x SLOT_CAPACITY x VALUE_WORDS entries,
    beside `slot_state`'s one entry per slot); the TNA program, two lanes per register
    (`slot_values_0` ...). A switch of another K parses no packet of this one (its length
    check), so every call would time out: this is how the controller tells it first."""
    regs = {r.preamble.name.split(".")[-1]: r for r in info.registers}
    pairs = [n for n in regs if _LANE_PAIR.fullmatch(n)]
    if pairs:
        return 2 * len(pairs)
    values, state = regs.get("slot_values"), regs.get("slot_state")
    if values is None or state is None or not values.type_spec.HasField("bitstring"):
        return None
    width = values.type_spec.bitstring.bit.bitwidth
    words, rest = divmod(values.size, 2 * state.size)
    if rest or not words or width % _LANE_BITS:
        return None
    return words * width // _LANE_BITS
