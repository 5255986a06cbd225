"""The switch's lane-parallel arithmetic, in Python.

The P4 program keeps a slot's K 32-bit lanes in VALUE_WORDS register words of 2048 bits (64
lanes each; word 0 holds values 0..63, value 0 in its most significant bits, exactly as on the
wire) and adds two words with

    ((a & LOW) + (b & LOW)) ^ ((a ^ b) & MSB)

where MSB has the top bit of every lane set and LOW is its complement: the low 31 bits of each
lane are added without any carry leaving the lane, and the top bit is XOR-ed back in. The result
is the per-lane int32 wrap-around sum.

The software switch model holds a slot's K lanes as one integer, a *row* (the words
concatenated, word 0 most significant), and adds rows with the same expression over all K lanes.
Since no carry ever leaves a lane, it cannot leave a word either: adding a row equals adding each
of its words (`swar_add_word`, the P4 expression on one register word), which
tests/unit/test_lanes.py checks. One big-int operation per packet keeps the model fast, and
`row_words` gives the register words the P4 program holds, for register inspection.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from passing import protocol as P

WORD_BITS = P.WORD_BITS
ROW_BITS = P.K * P.VALUE_BITS
# One register word's masks (the P4's LANE_MSB / LANE_LOW), and the same over a row's K lanes.
WORD_MSB = int("80000000" * P.LANES_PER_WORD, 16)
WORD_LOW = ((1 << WORD_BITS) - 1) ^ WORD_MSB
LANE_MSB = int("80000000" * P.K, 16)
LANE_LOW = ((1 << ROW_BITS) - 1) ^ LANE_MSB
_WORD_MASK = (1 << WORD_BITS) - 1


def swar_add_word(a: int, b: int) -> int:
    """One 2048-bit register word plus another, as aggregation.p4 adds them."""
    return ((a & WORD_LOW) + (b & WORD_LOW)) ^ ((a ^ b) & WORD_MSB)


def swar_add(a: int, b: int) -> int:
    """Two rows of K lanes added lane by lane (= word by word, see the module doc)."""
    return ((a & LANE_LOW) + (b & LANE_LOW)) ^ ((a ^ b) & LANE_MSB)


def row_words(row: int) -> list[int]:
    """The VALUE_WORDS register words of a row, word 0 (values 0..63) first."""
    return [(row >> (WORD_BITS * (P.VALUE_WORDS - 1 - w))) & _WORD_MASK
            for w in range(P.VALUE_WORDS)]


def row_from_words(words: Sequence[int]) -> int:
    if len(words) != P.VALUE_WORDS:
        raise ValueError(f"a row is {P.VALUE_WORDS} register words, got {len(words)}")
    row = 0
    for word in words:
        row = (row << WORD_BITS) | word
    return row


def row_from_bytes(values_be: bytes) -> int:
    """The K values as they appear on the wire -> one row."""
    return int.from_bytes(values_be, "big")


def row_to_bytes(row: int) -> bytes:
    return row.to_bytes(P.VALUES_BYTES, "big")


def row_from_values(values: np.ndarray) -> int:
    return row_from_bytes(np.asarray(values, dtype=">i4").tobytes())


def values_from_row(row: int) -> np.ndarray:
    return np.frombuffer(row_to_bytes(row), dtype=">i4").astype(np.int32)
