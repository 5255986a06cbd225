"""Slot pools on one switch: which job owns which contiguous range of aggregation slots.

A switch has `capacity` aggregation slots (`passing.protocol.SLOT_CAPACITY` on the real pipeline)
and admits at most `max_jobs` jobs. A job holds one contiguous range of slots, its pool, per
switch; the pipeline range-checks every packet against it, so pools must never overlap. The
slots are cut into `shares` equal shares (by default as many as max_jobs): how many jobs get
everything they may ask for whatever else came and went; more jobs than shares are admitted
while slots are free, small pools packing into the shares.

The rules below are the contract an operator can rely on.

* Equal share: no job holds more than `fair_share()` = capacity // shares slots. A request for
  more is refused, unless the caller gives a `minimum`: then the request counts as one for exactly
  the equal share (and is refused if `minimum` itself exceeds the share).
* Share segments: the slots are cut into segments of `fair_share()` slots starting at slot 0
  (the last one shorter when shares does not divide capacity), and a pool never crosses a
  segment boundary. Every pool therefore lies in one segment, so while fewer than `shares` jobs
  hold pools, and none has a retiring pool (see Resizing), at least one whole segment is empty:
  every request of at most the equal share succeeds in full, whatever sizes came and went
  before. (Plain first-fit cannot promise this: freed holes between pools can leave the space
  split into pieces that are each too small.)
* First fit: a block is a maximal run of free slots inside one segment. The block with the lowest
  base whose size is at least `want` gets the job: exactly `want` slots at the block's start.
* Shortage: with `shares` or more jobs (or pools restored from an earlier run under a different
  capacity or shares, which may cross a segment or exceed the share) there may be no block of
  `want` slots. Then,
  without `minimum` the request is refused with a list of the free ranges; with `minimum` the
  job gets the largest block (lowest base among equals), min(want, its size) slots, provided that
  is at least `minimum`, else the request is refused naming the minimum and the largest block.
* Also refused: want < 1, minimum < 1, minimum > want, a job that already holds a pool here, and
  a new job when max_jobs jobs already hold pools.
* What a switch can give: `largest_grant()`. A request of want slots succeeds without a minimum
  exactly when want <= largest_grant(), and with one exactly when minimum <= largest_grant(),
  getting min(want, largest_grant()) slots. A job spanning switches gets one pool size on all of
  them (`common_window`).
* Resizing (`resize`): a job that holds a pool gets a new one under the same rules (equal share,
  segments, first fit, minimum), disjoint from its current pool, which becomes *retiring*: it
  keeps its slots (the job's agents may still use it) until `release_retiring`. The max_jobs
  rule does not apply (the job is already counted; retiring pools never count as jobs), and a
  job holds at most one retiring pool.
* Reserve: `reserve` slots (default 0) are kept free for shrinking running jobs. A new pool,
  and a resize that grows a job's pool, may take only what leaves `reserve` slots free in all;
  a resize that shrinks it (`shrink=True`) may take any block. The shrunk job's old pool, once
  retired, gives back more than its new one took. With a reserve, the equal-share promise
  above holds for requests of at most the share less the reserve.
* Freeing a pool returns its slots at once; free space next to it merges into one free range.
* Pools never overlap and always lie in [0, capacity).

Errors are `AllocationError`s whose message names the switch, the request and the free space, so
it can go to the operator as it is; a hint to ask for less or to give a minimum appears only where
following it would succeed.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller import allocator_text as text
from controller.slot_range import SlotRange


class AllocationError(Exception):
    """A pool request or release that the rules in this module refuse."""


class SlotAllocator:
    """The pools of one switch. Not thread-safe: the controller owns one per switch."""

    def __init__(self, switch: str, capacity: int, max_jobs: int = 8,
                 allocations: Mapping[int, SlotRange] | None = None,
                 retiring: Mapping[int, SlotRange] | None = None,
                 shares: int | None = None, reserve: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"switch {switch}: capacity must be at least 1, got {capacity}")
        if max_jobs < 1:
            raise ValueError(f"switch {switch}: max_jobs must be at least 1, got {max_jobs}")
        shares = max_jobs if shares is None else shares
        if not 1 <= shares <= max_jobs:
            raise ValueError(f"switch {switch}: shares must be 1..max_jobs ({max_jobs}), got "
                             f"{shares}")
        if capacity < max_jobs:
            raise ValueError(f"switch {switch}: {capacity} slots cannot give each of {max_jobs} "
                             "jobs even one slot")
        if not 0 <= reserve <= capacity // shares:
            raise ValueError(f"switch {switch}: reserve must be 0..{capacity // shares} (one "
                             f"share), got {reserve}")
        self.switch = switch
        self.capacity = capacity
        self.max_jobs = max_jobs
        self.shares = shares
        self.reserve = reserve
        self._pools: dict[int, SlotRange] = {}
        self._retiring: dict[int, SlotRange] = {}
        # Restored pools are what the switch holds right now, so they are accepted even where they
        # break the share rules of the current configuration (the jobs are live); only states that
        # cannot exist on a switch are rejected.
        for held, restored in ((self._pools, allocations), (self._retiring, retiring)):
            for job_id, pool in (restored or {}).items():
                if pool.size < 1:
                    raise ValueError(f"switch {switch}: job {job_id} has an empty pool {pool!r}")
                if pool.base < 0 or pool.end > capacity:
                    raise ValueError(f"switch {switch}: job {job_id} pool {pool} lies outside "
                                     f"slots 0-{capacity - 1}")
                held[job_id] = pool
        stray = sorted(set(self._retiring) - set(self._pools))
        if stray:
            raise ValueError(f"switch {switch}: job {stray[0]} has a retiring pool but no pool")
        by_base = sorted(self._held(), key=lambda item: item[1])
        for (job_a, pool_a), (job_b, pool_b) in zip(by_base, by_base[1:], strict=False):
            if pool_b.base < pool_a.end:
                raise ValueError(f"switch {switch}: pools of job {job_a} ({pool_a}) and job "
                                 f"{job_b} ({pool_b}) overlap")

    def _held(self) -> list[tuple[int, SlotRange]]:
        """Every range that holds slots: pools and retiring pools, with their job."""
        return [*self._pools.items(), *self._retiring.items()]

    def fair_share(self) -> int:
        """The most slots one job may hold, and the size of a share segment."""
        return self.capacity // self.shares

    def allocate(self, job_id: int, want: int, minimum: int | None = None) -> SlotRange:
        """Give `job_id` a pool of `want` slots (or at least `minimum`), by the module's rules."""
        who = f"switch {self.switch}: job {job_id}"
        _check_request(who, want, minimum)
        if job_id in self._pools:
            raise AllocationError(f"{who} already holds slots {self._pools[job_id]}; free them "
                                  "before allocating again")
        if len(self._pools) >= self.max_jobs:
            raise AllocationError(f"{who} refused: {len(self._pools)} jobs already hold pools, "
                                  f"the most this switch admits (max_jobs {self.max_jobs})")
        self._pools[job_id] = self._place(who, want, minimum)
        return self._pools[job_id]

    def resize(self, job_id: int, want: int, minimum: int | None = None,
               shrink: bool = False) -> SlotRange:
        """Give `job_id`, which holds a pool, a new pool of `want` slots (or at least `minimum`)
        disjoint from its current one, which becomes its retiring pool; refused, with nothing
        changed, when the job holds no pool, already has a retiring one, or the new one does
        not fit (the module's rules, but for max_jobs). shrink: a smaller pool than the
        current one, which may take the reserve."""
        who = f"switch {self.switch}: job {job_id}"
        if job_id not in self._pools:
            raise AllocationError(f"{who} holds no pool to resize")
        if job_id in self._retiring:
            raise AllocationError(f"{who} still has a retiring pool {self._retiring[job_id]}; "
                                  "it must be released before another resize")
        _check_request(who, want, minimum)
        # The current pool stays held while the new one is placed: both are in use for a while.
        if shrink and want >= self._pools[job_id].size:
            raise AllocationError(f"{who}: a shrink needs fewer than its {self._pools[job_id].size}"
                                  f" slots, not {want}")
        new = self._place(who, want, minimum, job_id, shrink)
        self._retiring[job_id] = self._pools[job_id]
        self._pools[job_id] = new
        return new

    def release_retiring(self, job_id: int) -> SlotRange:
        """Free the retiring pool of `job_id` and return it."""
        try:
            return self._retiring.pop(job_id)
        except KeyError:
            raise AllocationError(f"switch {self.switch}: job {job_id} has no retiring pool "
                                  "here") from None

    def retiring(self) -> dict[int, SlotRange]:
        """job_id -> retiring pool, in order of base (a copy)."""
        return dict(sorted(self._retiring.items(), key=lambda item: item[1]))

    def _place(self, who: str, want: int, minimum: int | None,
               resizing: int | None = None, shrink: bool = False) -> SlotRange:
        """Where a pool of `want` slots (or at least `minimum`) goes now, by the share, segment,
        first-fit and shortage rules; the request itself is valid."""
        share = self.fair_share()
        asked = want
        if want > share:
            basis = text.basis(self)
            if minimum is None:
                hint = text.ask_for_less(self, resizing, shrink)
                raise AllocationError(f"{who} asked for {want} slots, more than the equal share "
                                      f"of {share} ({basis}); {hint}")
            if minimum > share:
                raise AllocationError(f"{who} needs at least {minimum} slots, more than the "
                                      f"equal share of {share} ({basis})")
            want = share

        blocks = self._blocks(shrink)
        fit = next((block for block in blocks if block.size >= want), None)
        if fit is not None:
            return SlotRange(fit.base, want)
        # max() keeps the first of equal keys, and blocks are sorted by base.
        largest = max(blocks, key=lambda block: block.size, default=None)
        if minimum is None or largest is None or largest.size < minimum:
            need = f"{want} contiguous slots"
            if minimum is not None:
                need = f"at least {minimum} contiguous slots (asked for {asked})"
            raise AllocationError(f"{who} needs {need}; {text.describe_free(self, shrink)}")
        return largest  # smaller than want, since no block holds want

    def free(self, job_id: int) -> SlotRange:
        """Release the pool of `job_id` (and its retiring pool, if any) and return the pool."""
        self._retiring.pop(job_id, None)
        try:
            return self._pools.pop(job_id)
        except KeyError:
            holders = ", ".join(str(j) for j in sorted(self._pools)) or "none"
            raise AllocationError(f"switch {self.switch}: job {job_id} holds no slots here "
                                  f"(jobs holding slots: {holders})") from None

    def allocations(self) -> dict[int, SlotRange]:
        """job_id -> pool, in order of base (a copy)."""
        return dict(sorted(self._pools.items(), key=lambda item: item[1]))

    def free_ranges(self) -> list[SlotRange]:
        """The free space as maximal ranges, sorted by base."""
        ranges = []
        cursor = 0
        for pool in sorted(r for _, r in self._held()):
            if pool.base > cursor:
                ranges.append(SlotRange(cursor, pool.base - cursor))
            cursor = pool.end
        if cursor < self.capacity:
            ranges.append(SlotRange(cursor, self.capacity - cursor))
        return ranges

    def largest_free(self) -> int:
        """Size of the largest free range (0 when full). A pool may get less: see _blocks."""
        return max((r.size for r in self.free_ranges()), default=0)

    def largest_grant(self, resizing: int | None = None, shrink: bool = False) -> int:
        """The most slots a new job can get here now (0: none): the largest free block within
        one share segment, unless max_jobs jobs already hold pools, less the reserve.
        resizing: a job id; what a `resize` of that job can get instead (0 where it may not
        resize); shrink: what its shrink can get (the reserve too)."""
        if resizing is not None:
            if resizing not in self._pools or resizing in self._retiring:
                return 0
        elif len(self._pools) >= self.max_jobs:
            return 0
        return self.usable_block(shrink)

    def usable_block(self, shrink: bool = False) -> int:
        """The largest block one pool may take now (max_jobs aside): within a share segment,
        and leaving the reserve free unless for a shrink."""
        return max((block.size for block in self._blocks(shrink)), default=0)

    def grant_limit(self, resizing: int | None = None, shrink: bool = False) -> str:
        """Why largest_grant(resizing, shrink) is what it is, for an operator
        (controller.allocator_text)."""
        return text.grant_limit(self, resizing, shrink)

    def used(self) -> int:
        """Slots held by pools and retiring pools."""
        return sum(pool.size for _, pool in self._held())

    def _blocks(self, shrink: bool = False) -> list[SlotRange]:
        """The free ranges cut at share-segment boundaries: where a new pool may go, by base;
        each at most what leaves the reserve free, unless for a shrink."""
        share = self.fair_share()
        free_ranges = self.free_ranges()
        limit = self.capacity if shrink else sum(r.size for r in free_ranges) - self.reserve
        blocks = []
        for free in free_ranges:
            base = free.base
            while base < free.end:
                stop = min(free.end, (base // share + 1) * share)
                if min(stop - base, limit) > 0:
                    blocks.append(SlotRange(base, min(stop - base, limit)))
                base = stop
        return blocks



def _check_request(who: str, want: int, minimum: int | None) -> None:
    if want < 1:
        raise AllocationError(f"{who} asked for {want} slots; a pool needs at least 1")
    if minimum is not None:
        if minimum < 1:
            raise AllocationError(f"{who} asked for a minimum of {minimum} slots; a pool "
                                  "needs at least 1")
        if minimum > want:
            raise AllocationError(f"{who} asked for {want} slots with a larger minimum of "
                                  f"{minimum}")
