"""Index of a P4Info: names -> ids and bit widths, and the P4Runtime byte encoding of values.

Every P4Runtime message the controller builds goes through this, so a table, action, parameter or
counter name that the loaded pipeline does not have is an error naming the thing and what exists.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from passing import protocol as P


def sized_for_k(info: p4info_pb2.P4Info, k: int = P.K) -> p4info_pb2.P4Info:
    """`info` as p4c compiles the program for `k`: K changes nothing in the P4Info but the size
    of register slot_values, 2 * SLOT_CAPACITY * (k / 64) words (tests/p4/test_build.py
    compiles every K and checks exactly that)."""
    out = p4info_pb2.P4Info()
    out.CopyFrom(info)
    for r in out.registers:
        if r.preamble.name.lstrip(".") == "slot_values":
            r.size = 2 * P.SLOT_CAPACITY * (k // P.LANES_PER_WORD)
    return out


class P4InfoError(KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class FieldInfo:
    id: int
    name: str
    bitwidth: int


def encode_value(value: int | str | bytes, bitwidth: int) -> bytes:
    """Canonical P4Runtime bytestring (shortest big-endian form) of an int, a MAC or IPv4 string."""
    if isinstance(value, bytes):
        value = int.from_bytes(value, "big")
    if isinstance(value, str):
        if ":" in value:
            value = int(value.replace(":", ""), 16)
        elif "." in value:
            value = int(ipaddress.IPv4Address(value))
        else:
            value = int(value, 0)
    if value < 0 or value >= (1 << bitwidth):
        raise ValueError(f"value {value} does not fit in {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def decode_value(data: bytes) -> int:
    return int.from_bytes(data, "big")


class P4InfoIndex:
    def __init__(self, p4info: p4info_pb2.P4Info):
        self.p4info = p4info
        self._tables = {self._key(t.preamble): t for t in p4info.tables}
        self._actions = {self._key(a.preamble): a for a in p4info.actions}
        self._counters = {self._key(c.preamble): c for c in p4info.counters}
        self._registers = {self._key(r.preamble): r for r in p4info.registers}
        self._action_names = {a.preamble.id: self._key(a.preamble) for a in p4info.actions}

    @staticmethod
    def _key(preamble) -> str:
        return preamble.name.lstrip(".")

    @classmethod
    def from_file(cls, path: str | Path) -> P4InfoIndex:
        """A P4Info in text format, or binary (`.bin`, as p4c writes it): the binary form keeps
        target-specific externs (the Tofino compiler's) as opaque `Any`, which the text parser
        cannot read without their definitions."""
        info = p4info_pb2.P4Info()
        path = Path(path)
        if path.suffix == ".bin":
            info.ParseFromString(path.read_bytes())
        else:
            text_format.Merge(path.read_text(), info)
        return cls(info)

    @staticmethod
    def _find(kind: str, items: dict, name: str):
        if name in items:
            return items[name]
        matches = [v for k, v in items.items() if k.split(".")[-1] == name]
        if len(matches) == 1:
            return matches[0]
        have = ", ".join(sorted(items))
        raise P4InfoError(f"no {kind} named {name!r} in the P4Info (have: {have})")

    def table(self, name: str):
        return self._find("table", self._tables, name)

    def action(self, name: str):
        return self._find("action", self._actions, name)

    def counter(self, name: str):
        return self._find("counter", self._counters, name)

    def register(self, name: str):
        return self._find("register", self._registers, name)

    def action_name(self, action_id: int) -> str:
        return self._action_names[action_id]

    def match_fields(self, table: str) -> list[FieldInfo]:
        return [FieldInfo(m.id, m.name, m.bitwidth) for m in self.table(table).match_fields]

    def action_params(self, action: str) -> list[FieldInfo]:
        return [FieldInfo(p.id, p.name, p.bitwidth) for p in self.action(action).params]

    def names(self, kind: str) -> list[str]:
        return sorted({"table": self._tables, "action": self._actions,
                       "counter": self._counters, "register": self._registers}[kind])


def pipeline_signature(info: p4info_pb2.P4Info) -> list[tuple]:
    """What must be equal for two P4Infos to describe the same program (ids, names, widths)."""
    sig = []
    for t in info.tables:
        sig.append(("table", t.preamble.id, t.preamble.name, t.size,
                    tuple((m.id, m.name, m.bitwidth, m.match_type) for m in t.match_fields),
                    tuple((a.id, a.scope) for a in t.action_refs)))
    for a in info.actions:
        sig.append(("action", a.preamble.id, a.preamble.name,
                    tuple((p.id, p.name, p.bitwidth) for p in a.params)))
    for c in info.counters:
        sig.append(("counter", c.preamble.id, c.preamble.name, c.size, c.spec.unit))
    for r in info.registers:
        sig.append(("register", r.preamble.id, r.preamble.name, r.size))
    return sorted(sig)
