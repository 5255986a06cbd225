"""Slot allocator: each rule of the module docstring, its error messages, and a stateful property
test against a slot-by-slot model."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from controller.allocator import AllocationError, SlotAllocator, SlotRange
from controller.common_window import common_window
from controller.occupancy_map import occupancy_map
from passing import protocol as P


def test_slot_range_end_and_text():
    r = SlotRange(100, 28)
    assert r.end == 128
    assert str(r) == "100-127 (28)"
    assert SlotRange(0, 5) < SlotRange(3, 1)


def test_fair_share_is_capacity_over_max_jobs():
    assert SlotAllocator("tor1", P.SLOT_CAPACITY).fair_share() == 512
    assert SlotAllocator("tor1", 100, max_jobs=8).fair_share() == 12
    assert SlotAllocator("tor1", P.SLOT_CAPACITY, max_jobs=P.MAX_JOBS).fair_share() == 16


@pytest.mark.parametrize("capacity, max_jobs, match", [
    (0, 1, "capacity must be at least 1"),
    (10, 0, "max_jobs must be at least 1"),
    (7, 8, "7 slots cannot give each of 8 jobs even one slot"),
])
def test_constructor_rejects_impossible_configurations(capacity, max_jobs, match):
    with pytest.raises(ValueError, match=match):
        SlotAllocator("tor1", capacity, max_jobs)


def test_first_fit_takes_exactly_want_at_lowest_block():
    a = SlotAllocator("tor1", 64, max_jobs=4)  # share 16
    assert a.allocate(1, 4) == SlotRange(0, 4)
    assert a.allocate(2, 8) == SlotRange(4, 8)
    a.free(1)
    # Neither the hole at 0-3 nor 12-15 (cut off by the segment boundary at 16) holds 5 slots.
    assert a.allocate(3, 5) == SlotRange(16, 5)
    assert a.allocate(4, 4) == SlotRange(0, 4)
    assert a.used() == 17


def test_pools_do_not_cross_share_segments():
    a = SlotAllocator("tor1", 64, max_jobs=4)
    assert a.allocate(1, 12) == SlotRange(0, 12)
    # 12-19 is free, but would straddle slot 16.
    assert a.allocate(2, 8) == SlotRange(16, 8)
    assert a.allocate(3, 4) == SlotRange(12, 4)


def test_equal_share_survives_fragmentation():
    # Plain first-fit would place job 2 at 3-6 and, once job 1 left, have no 4 contiguous slots
    # for job 3 although only two jobs are live.
    a = SlotAllocator("tor1", 8, max_jobs=2)
    a.allocate(1, 3)
    assert a.allocate(2, 4) == SlotRange(4, 4)
    a.free(1)
    assert a.allocate(3, 4) == SlotRange(0, 4)


def test_more_than_the_share_is_refused_without_minimum():
    a = SlotAllocator("tor1", P.SLOT_CAPACITY)
    with pytest.raises(AllocationError) as e:
        a.allocate(7, 600)
    assert str(e.value) == ("switch tor1: job 7 asked for 600 slots, more than the equal share of "
                            "512 (4096 slots / 8 shares); ask for at most 512, or give a minimum "
                            "to accept the share")
    assert a.allocations() == {}


def test_more_than_the_share_with_minimum_gets_the_share():
    a = SlotAllocator("tor1", P.SLOT_CAPACITY)
    assert a.allocate(7, 600, minimum=100) == SlotRange(0, 512)
    assert a.allocate(8, 512, minimum=512) == SlotRange(512, 512)


def test_minimum_above_the_share_is_refused():
    a = SlotAllocator("tor1", P.SLOT_CAPACITY)
    with pytest.raises(AllocationError) as e:
        a.allocate(7, 1000, minimum=600)
    assert str(e.value) == ("switch tor1: job 7 needs at least 600 slots, more than the equal "
                            "share of 512 (4096 slots / 8 shares)")


def _restored_with_two_holes() -> SlotAllocator:
    # Pools from a run with fewer jobs per switch: larger than today's share of 512.
    return SlotAllocator("tor1", P.SLOT_CAPACITY, allocations={
        1: SlotRange(100, 1948),
        2: SlotRange(2304, 1792),
    })


def test_shortage_without_minimum_lists_free_ranges():
    a = _restored_with_two_holes()
    with pytest.raises(AllocationError) as e:
        a.allocate(7, 512)
    assert str(e.value) == ("switch tor1: job 7 needs 512 contiguous slots; free: 0-99 (100), "
                            "2048-2303 (256); largest 256")
    assert 7 not in a.allocations()


def test_shortage_with_minimum_takes_largest_block():
    a = _restored_with_two_holes()
    assert a.allocate(7, 512, minimum=200) == SlotRange(2048, 256)
    assert a.allocate(8, 300, minimum=50) == SlotRange(0, 100)


def test_shortage_with_minimum_prefers_lowest_base_among_equal_blocks():
    a = SlotAllocator("tor1", 64, max_jobs=4, allocations={
        1: SlotRange(6, 26), 2: SlotRange(38, 26),
    })
    # Free: 0-5 and 32-37, six slots each.
    assert a.allocate(3, 10, minimum=4) == SlotRange(0, 6)


def test_shortage_with_minimum_too_large_names_minimum_and_largest():
    a = _restored_with_two_holes()
    with pytest.raises(AllocationError) as e:
        a.allocate(7, 1000, minimum=300)
    assert str(e.value) == ("switch tor1: job 7 needs at least 300 contiguous slots (asked for "
                            "1000); free: 0-99 (100), 2048-2303 (256); largest 256")


def test_shortage_message_explains_segment_boundary():
    a = SlotAllocator("s1", 64, max_jobs=4, allocations={
        1: SlotRange(0, 10), 2: SlotRange(20, 44),
    })
    with pytest.raises(AllocationError) as e:
        a.allocate(3, 8)
    assert str(e.value) == ("switch s1: job 3 needs 8 contiguous slots; free: 10-19 (10); largest "
                            "10, of which at most 6 lie within one 16-slot share segment, which a "
                            "pool may not cross")
    assert a.allocate(3, 8, minimum=5) == SlotRange(10, 6)


def test_shortage_when_full():
    a = SlotAllocator("s1", 16, max_jobs=2, allocations={1: SlotRange(0, 16)})
    with pytest.raises(AllocationError) as e:
        a.allocate(2, 1, minimum=1)
    assert str(e.value) == ("switch s1: job 2 needs at least 1 contiguous slots (asked for 1); "
                            "free: none; largest 0")


@pytest.mark.parametrize("want, minimum, message", [
    (0, None, "switch tor1: job 3 asked for 0 slots; a pool needs at least 1"),
    (-5, None, "switch tor1: job 3 asked for -5 slots; a pool needs at least 1"),
    (10, 0, "switch tor1: job 3 asked for a minimum of 0 slots; a pool needs at least 1"),
    (10, 11, "switch tor1: job 3 asked for 10 slots with a larger minimum of 11"),
])
def test_invalid_requests_are_refused(want, minimum, message):
    a = SlotAllocator("tor1", 64, max_jobs=4)
    with pytest.raises(AllocationError) as e:
        a.allocate(3, want, minimum)
    assert str(e.value) == message
    assert a.allocations() == {}


def test_job_cannot_allocate_twice():
    a = SlotAllocator("tor1", 64, max_jobs=4)
    a.allocate(3, 10)
    with pytest.raises(AllocationError) as e:
        a.allocate(3, 2)
    assert str(e.value) == ("switch tor1: job 3 already holds slots 0-9 (10); free them before "
                            "allocating again")
    assert a.allocations() == {3: SlotRange(0, 10)}


def test_no_more_than_max_jobs():
    a = SlotAllocator("tor1", 64, max_jobs=4)
    for job in range(4):
        a.allocate(job, 1)
    with pytest.raises(AllocationError) as e:
        a.allocate(9, 1)
    assert str(e.value) == ("switch tor1: job 9 refused: 4 jobs already hold pools, the most this "
                            "switch admits (max_jobs 4)")
    a.free(2)
    assert a.allocate(9, 16) == SlotRange(16, 16)


def test_more_jobs_than_shares_pack_into_the_shares():
    a = SlotAllocator("tor1", 64, max_jobs=16, shares=4)  # share 16
    assert a.fair_share() == 16
    pools = [a.allocate(j, 8) for j in range(8)]  # twice as many jobs as shares
    assert pools == [SlotRange(8 * j, 8) for j in range(8)]
    with pytest.raises(AllocationError, match="needs 8 contiguous slots; free: none"):
        a.allocate(8, 8)  # memory, not the job count, refuses the ninth
    a.free(3)
    assert a.allocate(9, 16, minimum=4) == SlotRange(24, 8)  # the hole, down to its minimum
    with pytest.raises(AllocationError, match="more than the equal share of 16"):
        a.allocate(10, 17)


def test_shares_default_to_max_jobs_and_cannot_exceed_it():
    assert SlotAllocator("tor1", 64, max_jobs=4).fair_share() == 16
    with pytest.raises(ValueError, match="shares must be 1..max_jobs"):
        SlotAllocator("tor1", 64, max_jobs=4, shares=5)


def test_free_unknown_job():
    a = SlotAllocator("tor1", 64, max_jobs=4)
    with pytest.raises(AllocationError) as e:
        a.free(5)
    assert str(e.value) == "switch tor1: job 5 holds no slots here (jobs holding slots: none)"
    a.allocate(2, 1)
    a.allocate(1, 1)
    with pytest.raises(AllocationError, match=r"holds no slots here \(jobs holding slots: 1, 2\)"):
        a.free(5)


def test_free_returns_the_pool():
    a = SlotAllocator("tor1", 64, max_jobs=4)
    pool = a.allocate(4, 7)
    assert a.free(4) == pool
    assert a.allocations() == {}
    assert a.free_ranges() == [SlotRange(0, 64)]


def _maximal_free_runs(capacity: int, pools: list[SlotRange]) -> list[SlotRange]:
    """The oracle for free_ranges: runs of free slots found by walking a slot array."""
    used = [False] * capacity
    for pool in pools:
        for s in range(pool.base, pool.end):
            used[s] = True
    runs = []
    for is_used, group in itertools.groupby(enumerate(used), key=lambda item: item[1]):
        slots = [s for s, _ in group]
        if not is_used:
            runs.append(SlotRange(slots[0], len(slots)))
    return runs


@pytest.mark.parametrize("order", list(itertools.permutations([1, 2, 3, 4])))
def test_free_coalesces_in_any_order(order):
    a = SlotAllocator("tor1", 64, max_jobs=4)
    for job in (1, 2, 3, 4):
        a.allocate(job, 16 if job != 3 else 10)  # job 3 leaves 42-47 free
    for job in order:
        a.free(job)
        left = list(a.allocations().values())
        assert a.free_ranges() == _maximal_free_runs(64, left)
    assert a.free_ranges() == [SlotRange(0, 64)]
    assert a.largest_free() == 64


def test_free_merges_both_neighbours():
    a = SlotAllocator("tor1", 48, max_jobs=4)
    for job in (1, 2, 3, 4):
        a.allocate(job, 12)
    a.free(1)
    a.free(3)
    assert a.free_ranges() == [SlotRange(0, 12), SlotRange(24, 12)]
    a.free(2)
    assert a.free_ranges() == [SlotRange(0, 36)]
    assert a.largest_free() == 36
    assert a.used() == 12


def test_restored_allocations_are_kept():
    pools = {5: SlotRange(512, 512), 9: SlotRange(0, 100)}
    a = SlotAllocator("tor1", P.SLOT_CAPACITY, allocations=pools)
    assert a.allocations() == {9: SlotRange(0, 100), 5: SlotRange(512, 512)}
    assert a.free_ranges() == [SlotRange(100, 412), SlotRange(1024, 3072)]
    assert a.allocate(1, 400) == SlotRange(100, 400)


@pytest.mark.parametrize("pools, match", [
    ({1: SlotRange(0, 0)}, "switch tor1: job 1 has an empty pool"),
    ({1: SlotRange(-1, 4)}, r"job 1 pool -1-2 \(4\) lies outside slots 0-63"),
    ({1: SlotRange(60, 5)}, r"job 1 pool 60-64 \(5\) lies outside slots 0-63"),
    ({1: SlotRange(0, 10), 2: SlotRange(9, 3)},
     r"pools of job 1 \(0-9 \(10\)\) and job 2 \(9-11 \(3\)\) overlap"),
])
def test_restored_allocations_are_validated(pools, match):
    with pytest.raises(ValueError, match=match):
        SlotAllocator("tor1", 64, max_jobs=4, allocations=pools)


def test_occupancy_map_one_slot_per_cell():
    a = SlotAllocator("t", 32, max_jobs=4)
    a.allocate(1, 3)
    a.allocate(2, 8)
    a.allocate(3, 1)
    assert occupancy_map(a, width=16).splitlines() == [
        "switch t: 32 slots, 12 used, 20 free, equal share 8; 1 char = 1 slot ('.' free, else "
        "the job holding it); lines start with their first slot",
        " 0 AAAB....CCCCCCCC",
        "16 ................",
        "legend: A = job 1 0-2 (3), B = job 3 3-3 (1), C = job 2 8-15 (8)",
    ]


def test_occupancy_map_scales_a_full_switch():
    a = SlotAllocator("tor1", P.SLOT_CAPACITY)
    a.allocate(7, 512)
    a.allocate(9, 100)
    a.allocate(4, 2)  # smaller than one cell: still shown, a tie goes to the job
    lines = occupancy_map(a).splitlines()
    assert "1 char = 4 slots ('.' mostly free, else the job holding most of them)" in lines[0]
    assert "4096 slots, 614 used, 3482 free" in lines[0]
    body = [line.split(" ")[-1] for line in lines[1:-1]]
    assert len(body) == 16 and all(len(row) == 64 for row in body)
    cells = "".join(body)
    assert cells.count("A") == 128  # 512 slots / 4
    assert cells.count("B") == 25  # 100 slots / 4
    assert cells[153] == "C"  # slots 612-613 are half of cell 153
    assert cells.count(".") == 1024 - 128 - 25 - 1
    assert lines[1].startswith("   0 A") and lines[2].startswith(" 256 A")
    assert lines[-1] == ("legend: A = job 7 0-511 (512), B = job 9 512-611 (100), "
                         "C = job 4 612-613 (2)")


def test_occupancy_map_empty_and_beyond_the_symbol_set():
    a = SlotAllocator("s", 128, max_jobs=64)
    assert occupancy_map(a).splitlines()[-1] == "legend: no jobs"
    for job in range(63):
        a.allocate(job, 2)
    text = occupancy_map(a)
    row = text.splitlines()[2].split(" ")[-1]
    assert row.endswith("99**..")  # the 62nd symbol is '9'; job 62 overflows to '*'
    assert "* = job 62 124-125 (2)" in text


def test_occupancy_map_rejects_zero_width():
    with pytest.raises(ValueError, match="width must be at least 1"):
        occupancy_map(SlotAllocator("s", 16), width=0)


def test_resize_holds_both_pools_until_the_old_one_is_released():
    a = SlotAllocator("tor1", 64, max_jobs=2)  # share 32
    a.allocate(1, 8)
    a.allocate(2, 32)  # max_jobs jobs: no new job, but a resize is no new job
    assert a.largest_grant() == 0 and a.largest_grant(resizing=1) == 24
    assert a.resize(1, 16) == SlotRange(8, 16)  # first fit beside the current pool
    assert a.allocations()[1] == SlotRange(8, 16) and a.retiring() == {1: SlotRange(0, 8)}
    assert a.used() == 56 and a.free_ranges() == [SlotRange(24, 8)]
    with pytest.raises(AllocationError, match=r"switch tor1: job 1 still has a retiring pool "
                                              r"0-7 \(8\); it must be released"):
        a.resize(1, 4)
    assert a.largest_grant(resizing=1) == 0
    assert "job 1 still has a retiring pool here" in a.grant_limit(resizing=1)
    assert "(retiring, freed once their jobs' hosts all use their new pools: job 1 0-7 (8))" \
        in a.grant_limit()
    legend = occupancy_map(a).splitlines()[-1]
    assert legend == "legend: A = job 1 8-23 (16) + retiring 0-7 (8), B = job 2 32-63 (32)"
    assert a.release_retiring(1) == SlotRange(0, 8)
    assert a.free_ranges() == [SlotRange(0, 8), SlotRange(24, 8)]
    with pytest.raises(AllocationError, match="switch tor1: job 3 holds no pool to resize"):
        a.resize(3, 4)


def test_resize_follows_the_share_and_minimum_rules_and_changes_nothing_when_refused():
    a = SlotAllocator("tor1", 64, max_jobs=4)  # share 16
    a.allocate(1, 16)
    a.allocate(2, 16)
    a.allocate(3, 16)
    a.allocate(4, 10)
    before = a.allocations()
    with pytest.raises(AllocationError, match="asked for 17 slots, more than the equal share "
                                              "of 16"):
        a.resize(1, 17)
    with pytest.raises(AllocationError, match=r"needs 8 contiguous slots; free: 58-63 \(6\)"):
        a.resize(1, 8)
    assert a.allocations() == before and a.retiring() == {}
    assert a.resize(1, 8, minimum=4) == SlotRange(58, 6)
    assert a.retiring() == {1: SlotRange(0, 16)}


def test_common_window_for_a_resize_says_so():
    allocs = {"tor1": SlotAllocator("tor1", 64, max_jobs=4)}
    allocs["tor1"].allocate(1, 16)
    for job in (2, 3, 4):
        allocs["tor1"].allocate(job, 16)
    with pytest.raises(AllocationError) as e:
        common_window(1, 8, None, allocs, resize=True)
    assert str(e.value) == (
        "job 1 cannot be resized: its new pool, held beside its current one until the hosts "
        "have moved, needs a window of 8 slots on each of its switches, and no window fits on "
        "all of them now (tor1: free none; no free slot); delete a job on tor1 first")


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate/resize/release/free sequences against a slot array, from empty or
    restored switches."""

    @initialize(capacity=st.one_of(st.integers(1, 200), st.just(P.SLOT_CAPACITY)),
                max_jobs=st.integers(1, 12), shares=st.integers(1, 12),
                restored=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 90)), max_size=6))
    def setup(self, capacity, max_jobs, shares, restored):
        self.capacity = capacity
        self.max_jobs = min(max_jobs, capacity)
        self.shares = min(shares, self.max_jobs)
        self.share = capacity // self.shares
        # Restored pools may break today's share rules, as they would after a config change.
        pools = {}
        cursor = 0
        for gap, size in restored:
            if cursor + gap + size > capacity:
                break
            pools[100 + len(pools)] = SlotRange(cursor + gap, size)
            cursor += gap + size
        self.restored = set(pools)
        self.model: dict[int, SlotRange] = dict(pools)
        self.retiring: dict[int, SlotRange] = {}
        self.a = SlotAllocator("sw", capacity, self.max_jobs, allocations=pools,
                               shares=self.shares)

    def _held(self) -> list[tuple[int, SlotRange]]:
        return [*self.model.items(), *self.retiring.items()]

    def _blocks(self) -> list[SlotRange]:
        """Free slots grouped into runs that stop at every multiple of the share."""
        owner = [None] * self.capacity
        for job, pool in self._held():
            for s in range(pool.base, pool.end):
                owner[s] = job
        blocks = []
        start = None
        for s in range(self.capacity + 1):
            free = s < self.capacity and owner[s] is None
            if start is not None and (not free or s % self.share == 0):
                blocks.append(SlotRange(start, s - start))
                start = None
            if free and start is None:
                start = s
        return blocks

    def _expected(self, job, want, minimum, resize=False):
        """The pool the rules give (a new job's, or with resize a new one for a job that holds
        one), or None for a refusal."""
        if want < 1 or (minimum is not None and not 1 <= minimum <= want):
            return None
        if resize and (job not in self.model or job in self.retiring):
            return None
        if not resize and (job in self.model or len(self.model) >= self.max_jobs):
            return None
        if want > self.share:
            if minimum is None or minimum > self.share:
                return None
            want = self.share
        blocks = self._blocks()
        for block in blocks:
            if block.size >= want:
                return SlotRange(block.base, want)
        # The segment rule promises a new job never ends here while fewer jobs than shares
        # hold pools, once restored pools are gone, while no pool is retiring (those hold
        # segments no job is counted for). A resize has no such promise: the job's own current
        # pool holds slots too.
        assert (resize or len(self.model) >= self.shares or self.restored & set(self.model)
                or self.retiring), "equal-share guarantee broken"
        if minimum is None or not blocks:
            return None
        largest = max(blocks, key=lambda b: (b.size, -b.base))
        return largest if largest.size >= minimum else None

    @rule(job=st.integers(0, 14), data=st.data())
    def allocate(self, job, data):
        want = data.draw(st.integers(-1, self.share + 1) | st.integers(-1, self.capacity + 2),
                         label="want")
        minimum = data.draw(st.none() | st.integers(-1, min(max(want, 0), self.share) + 1)
                            | st.integers(-1, max(want, 0) + 1), label="minimum")
        expected = self._expected(job, want, minimum)
        if expected is None:
            before = self.a.allocations()
            try:
                self.a.allocate(job, want, minimum)
            except AllocationError as e:
                assert "switch sw: job" in str(e)
            else:
                raise AssertionError(f"allocate({job}, {want}, {minimum}) should be refused")
            assert self.a.allocations() == before
        else:
            assert self.a.allocate(job, want, minimum) == expected
            self.model[job] = expected

    @rule(job=st.integers(0, 14), want=st.integers(-1, 40), minimum=st.none() |
          st.integers(-1, 40))
    def resize(self, job, want, minimum):
        expected = self._expected(job, want, minimum, resize=True)
        before = self.a.allocations(), self.a.retiring()
        if expected is None:
            with pytest.raises(AllocationError, match="switch sw: job"):
                self.a.resize(job, want, minimum)
            assert (self.a.allocations(), self.a.retiring()) == before
            return
        assert self.a.resize(job, want, minimum) == expected
        self.retiring[job] = self.model[job]
        self.model[job] = expected
        self.restored.discard(job)

    @rule(pick=st.integers(0, 100))
    def release_retiring(self, pick):
        if not self.retiring:
            return
        job = sorted(self.retiring)[pick % len(self.retiring)]
        assert self.a.release_retiring(job) == self.retiring.pop(job)
        with pytest.raises(AllocationError, match=f"job {job} has no retiring pool"):
            self.a.release_retiring(job)

    @rule(pick=st.integers(0, 100))
    def free_live(self, pick):
        if not self.model:
            return
        job = sorted(self.model)[pick % len(self.model)]
        assert self.a.free(job) == self.model.pop(job)
        self.retiring.pop(job, None)  # freeing a job frees its retiring pool too
        self.restored.discard(job)

    @rule(job=st.integers(0, 14))
    def free_unknown(self, job):
        if job in self.model:
            return
        try:
            self.a.free(job)
        except AllocationError as e:
            assert f"job {job} holds no slots here" in str(e)
        else:
            raise AssertionError(f"free({job}) of an unknown job succeeded")

    @invariant()
    def pools_are_disjoint_and_in_bounds(self):
        pools = sorted([*self.a.allocations().values(), *self.a.retiring().values()])
        assert self.a.allocations() == self.model and self.a.retiring() == self.retiring
        for pool in pools:
            assert 0 <= pool.base and pool.end <= self.capacity and pool.size >= 1
        for left, right in zip(pools, pools[1:], strict=False):
            assert left.end <= right.base

    @invariant()
    def free_space_accounts_for_everything(self):
        free = self.a.free_ranges()
        assert self.a.used() + sum(r.size for r in free) == self.capacity
        assert free == _maximal_free_runs(self.capacity, [r for _, r in self._held()])
        for left, right in zip(free, free[1:], strict=False):
            assert left.end < right.base  # sorted, and never two touching ranges
        assert self.a.largest_free() == max((r.size for r in free), default=0)

    @invariant()
    def new_pools_respect_the_share(self):
        for job, pool in self.a.allocations().items():
            if job not in self.restored:
                assert pool.size <= self.a.fair_share() == self.share
                assert pool.base // self.share == (pool.end - 1) // self.share

    @invariant()
    def largest_grant_is_what_a_request_can_get(self):
        grant = self.a.largest_grant()
        job = max(self.model, default=0) + 1  # holds no pool
        assert grant == 0 or self._expected(job, grant, None) is not None
        assert self._expected(job, grant + 1, None) is None
        with_minimum = self._expected(job, self.capacity, 1)
        assert (with_minimum.size if with_minimum else 0) == grant
        for job in self.model:  # and what a resize can get
            grant = self.a.largest_grant(resizing=job)
            assert grant == 0 or self._expected(job, grant, None, resize=True) is not None
            assert self._expected(job, grant + 1, None, resize=True) is None

    @invariant()
    def state_restores_identically(self):
        again = SlotAllocator("sw", self.capacity, self.max_jobs, self.a.allocations(),
                              self.a.retiring(), self.shares)
        assert again.free_ranges() == self.a.free_ranges()


AllocatorMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                              deadline=None)
TestAllocatorProperties = AllocatorMachine.TestCase


def test_the_reserve_is_left_free_by_new_pools_and_taken_only_by_a_shrink():
    a = SlotAllocator("tor1", 64, max_jobs=8, shares=4, reserve=8)  # share 16
    for job in (1, 2, 3):
        a.allocate(job, 16)
    assert a.largest_grant() == 8  # 16 free, 8 of them the reserve
    with pytest.raises(AllocationError, match=r"at least 12 contiguous slots .*at most 8 may "
                                              r"go to one pool: 8 are kept for shrinking"):
        a.allocate(4, 16, minimum=12)
    assert a.allocate(4, 16, minimum=4) == SlotRange(48, 8)
    assert a.largest_grant() == 0 and a.largest_grant(resizing=1) == 0 and a.free_ranges() == \
        [SlotRange(56, 8)]
    with pytest.raises(AllocationError, match=r"at most 0 may go to one pool: 8 are kept"):
        a.resize(2, 4)  # not marked a shrink: the reserve is not its
    assert a.largest_grant(resizing=2, shrink=True) == 8
    assert a.resize(2, 8, shrink=True) == SlotRange(56, 8)
    assert a.retiring() == {2: SlotRange(16, 16)} and a.free_ranges() == []
    a.release_retiring(2)
    assert a.largest_grant() == 8  # 16 free again: 8 for a pool, 8 the reserve


def test_a_shrink_must_shrink_and_the_reserve_is_at_most_one_share():
    a = SlotAllocator("tor1", 64, max_jobs=4, reserve=8)
    a.allocate(1, 8)
    with pytest.raises(AllocationError, match="a shrink needs fewer than its 8 slots, not 8"):
        a.resize(1, 8, shrink=True)
    with pytest.raises(ValueError, match=r"reserve must be 0\.\.16 \(one share\), got 17"):
        SlotAllocator("tor1", 64, max_jobs=4, reserve=17)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["allocate", "resize", "free"]),
                          st.integers(1, 6), st.integers(1, 20)), max_size=30),
       st.integers(0, 16))
def test_no_pool_but_a_shrink_s_ever_takes_the_reserve(ops, reserve):
    a = SlotAllocator("tor1", 64, max_jobs=6, shares=4, reserve=reserve)
    for op, job, size in ops:
        try:
            if op == "allocate":
                a.allocate(job, size, minimum=1)
            elif op == "resize":
                a.resize(job, size, minimum=1)
                a.release_retiring(job)
            else:
                a.free(job)
        except AllocationError:
            continue
        assert sum(r.size for r in a.free_ranges()) >= reserve, (op, job, size)
