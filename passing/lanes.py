"""The switch's lane-parallel arithmetic, in Python.

The P4 program keeps a slot's K 32-bit lanes in one big word (value 0 in the most significant
bits, exactly as on the wire) and adds two words with

    ((a & LOW) + (b & LOW)) ^ ((a ^ b) & MSB)

where MSB has the top bit of every lane set and LOW is its complement: the low 31 bits of each
lane are added without any carry leaving the lane, and the top bit is XOR-ed back in. The result
is the per-lane int32 wrap-around sum. The software switch model uses these functions so that its
arithmetic is the P4 program's, not an approximation of it.
"""

from __future__ import annotations

import numpy as np

from passing import protocol as P

WORD_BITS = P.K * P.VALUE_BITS
LANE_MSB = int("80000000" * P.K, 16)
LANE_LOW = ((1 << WORD_BITS) - 1) ^ LANE_MSB


def swar_add(a: int, b: int) -> int:
    return ((a & LANE_LOW) + (b & LANE_LOW)) ^ ((a ^ b) & LANE_MSB)


def word_from_bytes(values_be: bytes) -> int:
    """The K values as they appear on the wire -> one word."""
    return int.from_bytes(values_be, "big")


def word_to_bytes(word: int) -> bytes:
    return word.to_bytes(P.VALUES_BYTES, "big")


def word_from_values(values: np.ndarray) -> int:
    return word_from_bytes(np.asarray(values, dtype=">i4").tobytes())


def values_from_word(word: int) -> np.ndarray:
    return np.frombuffer(word_to_bytes(word), dtype=">i4").astype(np.int32)
