"""What a switch's slot allocator says to an operator: why it can grant what it can, and what
to ask for instead (controller.allocator's refusals and `common_window`'s)."""

from __future__ import annotations

from typing import Protocol

from controller.slot_range import SlotRange


class SlotAllocator(Protocol):
    """What is read here of controller.allocator.SlotAllocator (which imports this module)."""

    capacity: int
    shares: int
    max_jobs: int
    reserve: int

    def largest_grant(self, resizing: int | None = None, shrink: bool = False) -> int: ...
    def usable_block(self, shrink: bool = False) -> int: ...
    def largest_free(self) -> int: ...
    def fair_share(self) -> int: ...
    def free_ranges(self) -> list[SlotRange]: ...
    def allocations(self) -> dict[int, SlotRange]: ...
    def retiring(self) -> dict[int, SlotRange]: ...


def grant_limit(a: SlotAllocator, resizing: int | None = None, shrink: bool = False) -> str:
    """Why a.largest_grant(resizing, shrink) is what it is: free ranges, retiring pools (they
    free themselves) and the rule that bounds it."""
    grant, share = a.largest_grant(resizing, shrink), a.fair_share()
    largest = a.largest_free()
    pools, retiring = a.allocations(), a.retiring()
    free = ", ".join(str(r) for r in a.free_ranges()) or "none"
    if retiring:
        free += " (retiring, freed once their jobs' hosts all use their new pools: " + \
            ", ".join(f"job {j} {r}" for j, r in retiring.items()) + ")"
    if resizing is not None and resizing in retiring:
        why = f"job {resizing} still has a retiring pool here"
    elif resizing is not None and resizing not in pools:
        why = f"job {resizing} holds no pool here"
    elif resizing is None and len(pools) >= a.max_jobs:
        why = (f"no more jobs: {len(pools)} hold pools, the most it admits "
               f"(max_jobs {a.max_jobs})")
    elif largest == 0:
        why = "no free slot"
    elif _held_back(a, grant, shrink):
        why = (f"at most {grant}: {a.reserve} of its free slots are kept for shrinking running "
               "jobs (reserve)")
    elif grant == share:
        why = f"at most {grant}, the equal share ({basis(a)})"
    elif grant < largest:
        why = (f"at most {grant}: its largest free range holds {largest}, but a pool may not "
               f"cross a {share}-slot share segment")
    else:
        why = f"at most {grant}, its largest free range"
    return f"free {free}; {why}"


def _held_back(a: SlotAllocator, grant: int, shrink: bool) -> bool:
    """Whether the reserve, not the free ranges or the share segments, keeps `grant` as small
    as it is."""
    return bool(a.reserve) and not shrink and grant < min(a.largest_free(), a.fair_share())


def basis(a: SlotAllocator) -> str:
    return f"{a.capacity} slots / {a.shares} shares"


def ask_for_less(a: SlotAllocator, resizing: int | None = None, shrink: bool = False) -> str:
    grant = a.largest_grant(resizing, shrink)
    if grant == a.fair_share():
        return f"ask for at most {grant}, or give a minimum to accept the share"
    if grant:
        return (f"ask for at most {grant}, or give a minimum of at most {grant} to accept "
                f"{grant} ({grant_limit(a, resizing, shrink)})")
    return f"no pool fits here now ({grant_limit(a, resizing, shrink)})"


def describe_free(a: SlotAllocator, shrink: bool = False) -> str:
    free = a.free_ranges()
    text = f"free: {', '.join(str(r) for r in free) or 'none'}; largest {a.largest_free()}"
    usable = a.usable_block(shrink)
    if usable < a.largest_free():
        if _held_back(a, usable, shrink):
            text += (f", of which at most {usable} may go to one pool: {a.reserve} are kept "
                     "for shrinking running jobs (reserve)")
        else:
            text += (f", of which at most {usable} lie within one {a.fair_share()}-slot share "
                     "segment, which a pool may not cross")
    return text
