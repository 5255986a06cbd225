"""A contiguous range of one switch's aggregation slots: a job's pool, or free space."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class SlotRange:
    """Slots base .. base + size - 1 of one switch."""

    base: int
    size: int

    @property
    def end(self) -> int:
        """One past the last slot."""
        return self.base + self.size

    def __str__(self) -> str:
        # Inclusive bounds: an operator compares them with register indices, which are inclusive.
        return f"{self.base}-{self.end - 1} ({self.size})"
