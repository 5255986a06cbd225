"""A switch's slot pools drawn as text for an operator (`passing-ctl switch show`): which job
holds which slots, one character per slot or per a few, and a legend with each pool's range."""

from __future__ import annotations

import math
from collections import Counter

from controller.allocator import SlotAllocator

# The occupancy map grows to at most this many lines before cells start standing for several
# slots, so a whole switch fits on one terminal screen.
MAP_MAX_LINES = 16
# Job symbols in the occupancy map; jobs beyond these share MAP_OVERFLOW_SYMBOL (the legend still
# lists each of them with its range).
MAP_SYMBOLS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
MAP_OVERFLOW_SYMBOL = "*"
MAP_FREE_SYMBOL = "."


def occupancy_map(alloc: SlotAllocator, width: int = 64) -> str:
    """A switch's slots as text (`passing-ctl switch show`): a scale line, map lines of
    `width` cells, a legend line."""
    if width < 1:
        raise ValueError(f"occupancy map width must be at least 1, got {width}")
    per_cell = max(1, math.ceil(alloc.capacity / (width * MAP_MAX_LINES)))
    owners = [MAP_FREE_SYMBOL] * alloc.capacity
    legend = []
    for i, (job_id, pool) in enumerate(alloc.allocations().items()):
        symbol = MAP_SYMBOLS[i] if i < len(MAP_SYMBOLS) else MAP_OVERFLOW_SYMBOL
        owners[pool.base:pool.end] = [symbol] * pool.size
        legend.append(f"{symbol} = job {job_id} {pool}")
        old = alloc.retiring().get(job_id)
        if old is not None:  # the job's symbol too: its slots until it is released
            owners[old.base:old.end] = [symbol] * old.size
            legend[-1] += f" + retiring {old}"

    cells = []
    for start in range(0, alloc.capacity, per_cell):
        cells.append(_cell_symbol(owners[start:start + per_cell]))
    label = len(str(alloc.capacity - 1))
    lines = [_map_header(alloc, per_cell)]
    for i in range(0, len(cells), width):
        lines.append(f"{i * per_cell:>{label}} {''.join(cells[i:i + width])}")
    lines.append("legend: " + (", ".join(legend) if legend else "no jobs"))
    return "\n".join(lines)

def _map_header(alloc: SlotAllocator, per_cell: int) -> str:
    if per_cell == 1:
        scale = f"1 char = 1 slot ('{MAP_FREE_SYMBOL}' free, else the job holding it)"
    else:
        scale = (f"1 char = {per_cell} slots ('{MAP_FREE_SYMBOL}' mostly free, else the job "
                 "holding most of them)")
    return (f"switch {alloc.switch}: {alloc.capacity} slots, {alloc.used()} used, "
            f"{alloc.capacity - alloc.used()} free, equal share {alloc.fair_share()}; {scale}; "
            "lines start with their first slot")


def _cell_symbol(owners: list[str]) -> str:
    """The symbol of the most slots in one map cell."""
    counts = Counter(owners)
    # Ties go to a job rather than to free space, so that a pool smaller than a cell still shows
    # where it can; Counter keeps first-seen order and max() the first maximum, so among jobs the
    # lower base wins.
    return max(counts, key=lambda s: (counts[s], s != MAP_FREE_SYMBOL))
