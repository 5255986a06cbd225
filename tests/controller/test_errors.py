"""A job that does not fit is refused with what is free on each of its switches and the largest
window that fits, and any hint to ask for less or pass --min-window is one that then succeeds.

`common_window` is where the controller decides a job's window (Controller.create_job calls it
before writing anything), so these run on allocators alone, without switches."""

from __future__ import annotations

import pytest

from controller.allocator import AllocationError, SlotAllocator, SlotRange
from controller.common_window import common_window
from passing import protocol as P


def _leafspine(tor1: dict[int, SlotRange], max_jobs: int = 4) -> dict[str, SlotAllocator]:
    """A job's three switches of 64 slots (share 16 with 4 jobs); tor1 holds `tor1`."""
    return {"tor1": SlotAllocator("tor1", 64, max_jobs, tor1),
            "tor2": SlotAllocator("tor2", 64, max_jobs),
            "spine": SlotAllocator("spine", 64, max_jobs)}


def _refusal(job_id: int, window: int, min_window: int | None,
             allocs: dict[str, SlotAllocator]) -> str:
    with pytest.raises(AllocationError) as e:
        common_window(job_id, window, min_window, allocs)
    return str(e.value)


# tor1 with free 0-5 and 32-63: a pool of 16 fits in 32-47.
SHORT = {1: SlotRange(6, 26)}
# tor1 with only 0-5 free.
SHORTER = {1: SlotRange(6, 58)}


def test_a_window_that_fits_everywhere_is_granted_as_asked():
    assert common_window(7, 16, None, _leafspine(SHORT)) == 16
    assert common_window(7, 6, 2, _leafspine(SHORTER)) == 6


def test_refusal_names_free_ranges_per_switch_and_the_largest_window():
    allocs = _leafspine(SHORTER)
    assert _refusal(7, 10, None, allocs) == (
        "job 7 does not fit: it wants a window of 10 slots on each of its switches, and the "
        "largest window that fits on all of them now is 6 (tor1: free 0-5 (6); at most 6, its "
        "largest free range; tor2: free 0-63 (64); at most 16, the equal share (64 slots / 4 "
        "shares); spine: free 0-63 (64); at most 16, the equal share (64 slots / 4 shares)); ask "
        "for a window of at most 6, or pass --min-window 6 or less")
    # Both ways out of the hint work.
    assert common_window(7, 6, None, allocs) == 6
    assert common_window(7, 10, 6, allocs) == 6


def test_a_minimum_above_what_fits_is_refused_with_a_minimum_that_works():
    allocs = _leafspine(SHORTER)
    msg = _refusal(7, 12, 8, allocs)
    assert msg.startswith("job 7 does not fit: it wants a window of 12 slots on each of its "
                          "switches (at least 8), and the largest window that fits on all of "
                          "them now is 6 (tor1: free 0-5 (6)")
    assert msg.endswith("); pass --min-window 6 or less to accept a window of 6")
    assert common_window(7, 12, 6, allocs) == 6
    with pytest.raises(AllocationError):
        common_window(7, 12, 7, allocs)


@pytest.mark.parametrize("tor1, why", [
    ({1: SlotRange(0, 64)}, "tor1: free none; no free slot"),
    ({j: SlotRange(16 * j, 4) for j in range(4)},
     "tor1: free 4-15 (12), 20-31 (12), 36-47 (12), 52-63 (12); no more jobs: 4 hold pools, the "
     "most it admits (max_jobs 4)"),
])
def test_a_full_switch_gets_no_min_window_hint(tor1, why):
    allocs = _leafspine(tor1)
    for min_window in (None, 1):
        msg = _refusal(7, 4, min_window, allocs)
        assert "no window fits on all of them now" in msg and why in msg
        assert "--min-window" not in msg
        assert msg.endswith("; delete a job on tor1 first")
        with pytest.raises(AllocationError):
            common_window(7, 1, 1, allocs)


def test_share_segments_bound_the_window_and_the_message_says_so():
    # tor1's largest free range is 32-63 (32 slots) but a pool stays within 32-47 or 48-63.
    allocs = _leafspine({1: SlotRange(0, 32)}, max_jobs=4)
    msg = _refusal(7, 20, None, allocs)
    assert "the largest window that fits on all of them now is 16" in msg
    assert "tor1: free 32-63 (32); at most 16, the equal share (64 slots / 4 shares)" in msg
    # A restored run's pools: free 0-5 and 26-39, which slot 32 cuts into 26-31 and 32-39.
    restored = _leafspine({1: SlotRange(6, 20), 2: SlotRange(40, 24)})
    msg = _refusal(7, 16, None, restored)
    assert ("tor1: free 0-5 (6), 26-39 (14); at most 8: its largest free range holds 14, but "
            "a pool may not cross a 16-slot share segment") in msg
    assert msg.endswith("ask for a window of at most 8, or pass --min-window 8 or less")
    # The window granted is one every switch can then allocate.
    window = common_window(7, 16, 8, restored)
    assert window == 8
    assert {s: a.allocate(7, window) for s, a in restored.items()} == {
        "tor1": SlotRange(32, 8), "tor2": SlotRange(0, 8), "spine": SlotRange(0, 8)}


def test_the_equal_share_hint_is_given_only_when_the_share_is_free():
    a = SlotAllocator("tor1", P.SLOT_CAPACITY)
    with pytest.raises(AllocationError, match="ask for at most 512, or give a minimum to "
                                              "accept the share$"):
        a.allocate(7, 600)
    # Restored pools leave at most 256 contiguous slots: the share itself would not fit.
    a = SlotAllocator("tor1", P.SLOT_CAPACITY, allocations={
        1: SlotRange(100, 1948), 2: SlotRange(2304, 1792)})
    with pytest.raises(AllocationError) as e:
        a.allocate(7, 600)
    assert str(e.value) == (
        "switch tor1: job 7 asked for 600 slots, more than the equal share of 512 (4096 slots / "
        "8 shares); ask for at most 256, or give a minimum of at most 256 to accept 256 (free "
        "0-99 (100), 2048-2303 (256); at most 256, its largest free range)")
    assert a.allocate(7, 600, minimum=256) == SlotRange(2048, 256)
    full = SlotAllocator("tor1", 16, 2, {1: SlotRange(0, 16)})
    with pytest.raises(AllocationError) as e:
        full.allocate(7, 9)
    assert str(e.value).endswith("; no pool fits here now (free none; no free slot)")
