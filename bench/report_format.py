"""Number and table formatting shared by the report and the README's result block: both print
every number the same way, so tests/bench/test_readme_numbers.py can compare them as printed."""

from __future__ import annotations

import math


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def number(x: float, fmt: str) -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, fmt)


def millis(seconds: float) -> str:
    """Milliseconds to about four significant digits, never in exponent form."""
    ms = seconds * 1e3
    if not (math.isfinite(ms) and ms > 0):
        return number(ms, ".3f")
    return f"{ms:.{min(4, max(0, 3 - math.floor(math.log10(ms))))}f}"
