"""Registers slot_state and slot_values of the Aggregation control (p4src/include/aggregation.p4),
as the model holds them, and the layout of a slot_state word."""

from __future__ import annotations

import numpy as np

from passing import lanes
from passing import protocol as P

# One version's word of slot_state: round ++ flags ++ nsum ++ exp ++ count ++ bitmap, the
# field at bit <name>_AT (aggregation.p4); the slot's word is gen ++ session ++ v1 ++ v0.
BM_BITS = P.MAX_FAN_IN
CNT_AT, EXP_AT, NS_AT, FLAGS_AT, ROUND_AT = 64, 72, 80, 96, 104
WORD_BITS = 136
SESSION_AT, GEN_AT = 2 * WORD_BITS, 2 * WORD_BITS + 64
MASK_WORD = (1 << WORD_BITS) - 1
MASK_BM = (1 << BM_BITS) - 1
MASK64 = (1 << 64) - 1
MASK32 = (1 << 32) - 1
# The version word's flags; MARKED: a packet counted into the round carried FLAG_CONGESTED.
READY, CLOSED, MARKED = 1, 2, 4


class SlotStore:
    """Registers slot_state and slot_values of the Aggregation control.

    Held as arrays, one per field, so that the compiled PASSING path (switch_model/fastpath.c)
    reads and writes the same memory; `word` and `set_word` give the P4's slot_state word as
    one int, `row` and `set_row` a version's values as one row (passing.lanes).
    """

    def __init__(self, capacity: int = P.SLOT_CAPACITY):
        self.capacity = capacity
        # slot_state word: gen(32) ++ session(64) ++ v1(136) ++ v0(136); each version word:
        # round(32) ++ flags(8: ready, closed) ++ nsum(16) ++ exp(8) ++ count(8) ++ bitmap(64).
        # A version's fields at index 2*slot+version.
        self.gen = np.zeros(capacity, dtype=np.uint32)
        self.session = np.zeros(capacity, dtype=np.uint64)
        self.round = np.zeros(2 * capacity, dtype=np.uint32)
        self.flags = np.zeros(2 * capacity, dtype=np.uint8)
        self.nsum = np.zeros(2 * capacity, dtype=np.uint16)
        self.exp = np.zeros(2 * capacity, dtype=np.uint8)
        self.count = np.zeros(2 * capacity, dtype=np.uint8)
        self.bitmap = np.zeros(2 * capacity, dtype=np.uint64)
        # slot_values as one row of K lanes (uint32, the int32 bits) per slot and version
        # (row 2*slot+version): the P4's VALUE_WORDS register words at
        # (2*slot+version)*VALUE_WORDS + w, concatenated. read() and dump() give the words.
        self.values = np.zeros((2 * capacity, P.K), dtype=np.uint32)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.gen, self.session, self.round, self.flags, self.nsum, self.exp,
                self.count, self.bitmap, self.values)

    def reset(self) -> None:
        for a in self.arrays():
            a[...] = 0  # in place: the compiled path holds their addresses

    def _version_word(self, i: int) -> int:
        return ((int(self.round[i]) << ROUND_AT) | (int(self.flags[i]) << FLAGS_AT)
                | (int(self.nsum[i]) << NS_AT) | (int(self.exp[i]) << EXP_AT)
                | (int(self.count[i]) << CNT_AT) | int(self.bitmap[i]))

    def _set_version_word(self, i: int, w: int) -> None:
        self.round[i], self.flags[i] = w >> ROUND_AT, (w >> FLAGS_AT) & 0xFF
        self.nsum[i], self.exp[i] = (w >> NS_AT) & 0xFFFF, (w >> EXP_AT) & 0xFF
        self.count[i], self.bitmap[i] = (w >> CNT_AT) & 0xFF, w & MASK_BM

    def word(self, idx: int) -> int:
        """Slot `idx`'s slot_state word, as the P4 program holds it."""
        return ((int(self.gen[idx]) << GEN_AT) | (int(self.session[idx]) << SESSION_AT)
                | (self._version_word(2 * idx + 1) << WORD_BITS)
                | self._version_word(2 * idx))

    def set_word(self, idx: int, word: int) -> None:
        self.gen[idx], self.session[idx] = word >> GEN_AT, (word >> SESSION_AT) & MASK64
        self._set_version_word(2 * idx + 1, (word >> WORD_BITS) & MASK_WORD)
        self._set_version_word(2 * idx, word & MASK_WORD)

    def row(self, vidx: int) -> int:
        return lanes.row_from_bytes(self.values[vidx].astype(">u4").tobytes())

    def set_row(self, vidx: int, row: int) -> None:
        self.values[vidx] = np.frombuffer(lanes.row_to_bytes(row), dtype=">u4")

    def _check(self, register: str) -> None:
        if register not in ("slot_state", "slot_values"):
            raise KeyError(f"no register {register}")

    def size(self, register: str) -> int:
        """Cells of `register`, as the P4 program declares it."""
        self._check(register)
        return self.capacity if register == "slot_state" else \
            2 * self.capacity * P.VALUE_WORDS

    def dump(self, register: str) -> list[int]:
        """Every cell of `register`, in the P4 program's index order."""
        self._check(register)
        if register == "slot_state":
            return [self.word(i) for i in range(self.capacity)]
        return [w for r in range(2 * self.capacity) for w in lanes.row_words(self.row(r))]

    def read(self, register: str, index: int) -> int:
        if not 0 <= index < self.size(register):
            raise IndexError(f"{register}[{index}] out of range (size {self.size(register)})")
        if register == "slot_state":
            return self.word(index)
        row, word = divmod(index, P.VALUE_WORDS)
        return lanes.row_words(self.row(row))[word]
