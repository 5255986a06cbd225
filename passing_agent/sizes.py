"""Tensor sizes on the benchmarks' command lines: a number of float32 values with an optional
K or M suffix (passing-agent --size, bench.agent_pps --size)."""

from __future__ import annotations

import argparse
import re


def parse_size(text: str) -> int:
    """'4M' -> 4 * 2**20. An argparse type: a bad size raises ArgumentTypeError, whose message
    argparse prints as it is."""
    m = re.fullmatch(r"(\d+)([KkMm]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"size must be a number of float32 values with an "
                                         f"optional K or M suffix (e.g. 4M), got {text!r}")
    n = int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20}[m.group(2).lower()]
    if n < 1:
        raise argparse.ArgumentTypeError("size must be at least 1")
    return n
