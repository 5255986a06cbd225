"""The TNA program's slot (p4src/tna/slot_state.p4, slot_status.p4, slot_values.p4) as Python,
for tests/p4/test_tna_slot.py: the register actions transcribed one by one, and the tables'
const entries read from the P4 sources themselves, as the C preprocessor (what p4c runs first)
expands them. No Tofino model runs here; this runs the TNA program's split state on the same
packets as the v1model program's one word (switch_model.slot_word)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

from switch_model.frame import FLAG_CLOSE, FLAG_CONGESTED, FLAG_CONTRIB, FLAG_RESULT, Header
from tests import REPO
from tests.p4 import CPP

TNA = REPO / "p4src" / "tna"
M32 = (1 << 32) - 1


def preprocessed(name: str) -> str:
    out = subprocess.run([CPP, "-P", "-DPASSING_K=64", f"-I{TNA}", str(TNA / name)],
                         check=True, capture_output=True, text=True).stdout
    return re.sub(r"/\*.*?\*/", "", out, flags=re.S)


def _constants(text: str) -> dict[str, int]:
    return {m[1]: int(m[2], 0) for m in
            re.finditer(r"const bit<\d+>\s+(\w+)\s*=\s*(?:\d+w)?(0x[0-9a-fA-F]+|\d+);", text)}


def _value(expr: str, names: dict[str, int]) -> int:
    expr = re.sub(r"\b\d+w(0x[0-9a-fA-F]+|\d+)", r"\1", expr.strip())
    expr = re.sub(r"\b[A-Z_][A-Z0-9_]*\b", lambda m: str(names[m[0]]), expr)
    if not re.fullmatch(r"[0-9a-fx()<>\s|&+-]+", expr):
        raise ValueError(f"unexpected key expression {expr!r}")
    return int(eval(expr))  # digits and operators only (checked above)


@dataclass(frozen=True)
class Entry:
    keys: tuple[tuple[int, int] | None, ...]  # (value, mask); None: don't care
    action: str
    args: tuple[int, ...]

    def matches(self, values: tuple[int, ...]) -> bool:
        return all(k is None or v & k[1] == k[0] & k[1]
                   for k, v in zip(self.keys, values, strict=True))


def const_entries(text: str, table: str) -> list[Entry]:
    """The const entries of `table`, in order (the first that matches wins)."""
    names = _constants(text)
    body = _braced(text, re.search(rf"\btable {table} \{{", text).end())
    block = _braced(body, body.index("const entries = {") + len("const entries = {"))
    entries = []
    for m in re.finditer(r"(\([^:]*\)|[\w]+)\s*:\s*(\w+)\(([^)]*)\);", block):
        keys_text = m[1][1:-1] if m[1].startswith("(") else m[1]
        keys = []
        for k in _split(keys_text):
            if k == "_":
                keys.append(None)
            elif "&&&" in k:
                v, mask = k.split("&&&")
                keys.append((_value(v, names), _value(mask, names)))
            else:
                keys.append((_value(k, names), (1 << 64) - 1))
        args = tuple(_value(a, names) for a in _split(m[3])) if m[3].strip() else ()
        entries.append(Entry(tuple(keys), m[2], args))
    return entries


def _braced(text: str, start: int) -> str:
    """The text from `start` (just after an opening brace) to its closing brace."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    raise ValueError("unbalanced braces")


def _split(text: str) -> list[str]:
    """Comma-separated, at the outer level of parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [*out, cur.strip()] if cur.strip() else out


def lookup(entries: list[Entry], *values: int) -> Entry | None:
    return next((e for e in entries if e.matches(values)), None)


@dataclass
class Version:
    owner: tuple[int, int] = (0, 0)
    round: int = 0
    bitmap: int = 0
    cnt: int = 0
    state: int = 0
    marked: int = 0
    exp: int = 0
    nsum: int = 0
    values: list[int] = field(default_factory=lambda: [0] * 64)


class TnaSlot:
    """Both versions of one slot, and the decisions of the TNA program on a packet."""

    def __init__(self) -> None:
        state, status, values = (preprocessed(f) for f in
                                 ("slot_state.p4", "slot_status.p4", "slot_values.p4"))
        self.c = _constants(status)
        self.bitmap_op = const_entries(state, "bitmap_op")
        self.mine_bit = const_entries(state, "mine_bit")
        self.status_op = const_entries(status, "status_op")
        self.decide = const_entries(status, "decide")
        self.values_op = const_entries(values, "values_0")
        self.mark_op = const_entries(values, "mark_op")
        self.versions = [Version(), Version()]

    def _inputs(self, h: Header, j: dict[str, int]) -> tuple[int, int]:
        """StatusInputs (slot_status.p4): the status register's (a, b)."""
        c, close = self.c, h.flags & FLAG_CLOSE != 0
        is_result = h.flags & 3 == FLAG_RESULT
        quorum_m1, fan_in_m1 = (j["quorum"] - 1) & 0xFF, (j["fan_in"] - 1) & 0xFF
        below = (j["quorum"] - j["fan_in"]) & 0xFF
        if j["quorum"] == 0:
            quorum_m1 = 0
        if is_result or (close and j["quorum"] == 0):
            a = 0
        elif close and below & 0x80:
            a = quorum_m1
        else:
            a = fan_in_m1
        b = c["ST_READY"] if is_result or j["is_root"] == 1 else c["ST_CLOSED"]
        return a, b

    def process(self, h: Header, values: list[int], j: dict[str, int]) -> tuple[int, Version]:
        """The packet's event, and its version after it (the packet leaves with its values)."""
        c = self.c
        v = self.versions[h.version & 1]
        is_contrib, is_result = int(h.flags & 3 == FLAG_CONTRIB), int(h.flags & 3 == FLAG_RESULT)
        # slot_owner, slot_owner_hi: always written with the packet's owner
        fresh = v.owner == (j["gen"], h.session)
        v.owner = (j["gen"], h.session)
        # slot_round
        d = (h.round - v.round) & M32
        if not fresh or (d != 0 and d < 1 << 31):
            v.round, rel = h.round, c["REL_RESTART"]
        else:
            rel = c["REL_SAME"] if d == 0 else c["REL_OLDER"]
        # slot_bitmap
        mybit = 1 << h.contributor
        bm_old = 0
        e = lookup(self.bitmap_op, rel, is_contrib, h.contributor)
        if e is not None and e.action == "bitmap_first":
            v.bitmap = mybit
        elif e is not None and e.action == "bitmap_clear":
            v.bitmap = 0
        elif e is not None and e.action == "bitmap_add_lo":
            bm_old = v.bitmap & M32
            v.bitmap |= mybit & M32
        elif e is not None and e.action == "bitmap_add_hi":
            bm_old = v.bitmap >> 32
            v.bitmap |= mybit & (M32 << 32)
        mine = int(lookup(self.mine_bit, h.contributor, bm_old) is not None)
        # slot_status
        a, b = self._inputs(h, j)
        cnt = old = new = 0
        e = lookup(self.status_op, rel, is_contrib, h.contributor, bm_old)
        action = e.action if e is not None else "NoAction"
        if action == "do_first":
            v.cnt, v.state = 1, b if a == 0 else c["ST_OPEN"]
            cnt, new = v.cnt, v.state
        elif action == "do_stored":
            v.cnt, v.state = 0, c["ST_READY"]
            cnt, new = v.cnt, v.state
        elif action == "do_count":
            old = v.state
            if v.state == c["ST_OPEN"]:
                if v.cnt >= a:
                    v.state = b
                v.cnt = (v.cnt + 1) & 0xFF
            cnt, new = v.cnt, v.state
        elif action == "do_settle":
            old = v.state
            if v.state != c["ST_READY"] and v.cnt > a:
                v.state = b
            cnt, new = v.cnt, v.state
        full = int(cnt == j["fan_in"])
        event = lookup(self.decide, is_result, rel, j["is_root"], mine, old, new, full).args[0]
        # slot_marked, slot_exp, slot_nsum, slot_values
        cong = int(h.flags & FLAG_CONGESTED != 0)
        op = lookup(self.values_op, is_result, rel, mine, old).action
        mark = lookup(self.mark_op, is_result, rel, mine, old).action
        if mark == "do_mark_set":
            v.marked = cong
        elif mark == "do_mark_or":
            v.marked |= cong
        if op.startswith("do_put"):
            v.exp, v.nsum, v.values = h.exp, h.num_contrib, list(values)
        elif op.startswith("do_add"):
            v.exp = max(v.exp, h.exp)
            v.nsum = (v.nsum + h.num_contrib) & 0xFFFF
            v.values = [(x + y) & M32 for x, y in zip(v.values, values, strict=True)]
        return event, v
