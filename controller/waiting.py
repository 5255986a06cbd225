"""Jobs that wait for slots: created when their switches could not hold them, their hosts
summing with a host collective meanwhile (host_agent.host_collective), and moved onto the
switches as soon as slots free.

A waiting job has every entry of its switches but its pools (records.JobRecord.waiting): its
membership, peers, multicast group and guards are installed at `job create`, so giving it
pools is a live resize from "no pool" (pool epoch 0, window 0 in its agents' parameters) to
pool epoch 1: new job_config entries, the agents' vote, the move at a call boundary they
agree on (docs/controller.md, "Jobs waiting for slots"). Nothing runs in the background: the
controller places waiting jobs whenever a call may have freed slots or asks about jobs
(create, delete, resize, retire, reconcile), oldest job first; one that does not fit yet
does not hold back a younger one that does.

A waiting job also makes room (`make_room`): on each switch where it finds too few slots, the
running job with the largest pool above the fair share there, among those that accept less
(a --min-window), is shrunk by a live resize to that share (at least its --min-window). Its new
pool may take the slots kept free for shrinks (the allocator's reserve); its old, larger pool
retires once its hosts have moved, and then the waiting job fits. One shrink at a time per
switch: none where a pool still retires. A shrunk job remembers the window it asked for and
grows back toward it (`grow_back`) when slots free and no job waits on its switches.
"""

from __future__ import annotations

from controller.allocator import SlotAllocator
from controller.errors import ControllerError
from controller.job_plan import JobSpec
from controller.recorded_jobs import RecordedJobs
from controller.records import JobRecord
from controller.resize import PoolResizer
from controller.retire import PoolRetirement


class WaitingJobs:
    """Places the waiting jobs of `jobs` with `resizer`, once `retirement` has freed the old
    pools it can on their switches."""

    def __init__(self, jobs: RecordedJobs, resizer: PoolResizer,
                 retirement: PoolRetirement) -> None:
        self.jobs = jobs
        self.resizer = resizer
        self.retirement = retirement

    def waiting(self) -> list[JobRecord]:
        """The jobs waiting for slots, oldest first."""
        return sorted((r for r in self.jobs.store.jobs() if r.waiting),
                      key=lambda r: (r.created_at, r.job_id))

    def place(self) -> list[JobRecord]:
        """Give pools to every waiting job that fits now (its window, or at least its
        --min-window, on every one of its switches), oldest first; the jobs placed, as now
        recorded. A job whose switches fail stays waiting, and is tried again next time."""
        waiting = self.waiting()
        if not waiting:
            return []
        self.retirement.retire_where({p.switch for rec in waiting for p in rec.pools})
        placed = []
        for rec in waiting:
            spec = JobSpec.from_dict(rec.spec)
            need = spec.min_window or spec.window
            allocs = self.jobs.allocators([p.switch for p in rec.pools])
            if min(a.largest_grant() for a in allocs.values()) < need:
                continue
            try:
                placed.append(self.resizer.resize_job(rec.job_id, spec.window,
                                                      spec.min_window))
            except ControllerError:
                continue  # a switch failed, or another controller took the slots meanwhile
        return placed

    def make_room(self) -> list[JobRecord]:
        """Shrink running jobs for the waiting ones that do not fit (the module's rules); the
        jobs shrunk, as now recorded. A shrink a switch refuses is left for the next call."""
        waiting = self.waiting()
        shrunk: list[JobRecord] = []
        busy: set[str] = set()  # one shrink at a time per switch
        for rec in waiting:
            spec = JobSpec.from_dict(rec.spec)
            need = spec.min_window or spec.window
            allocs = self.jobs.allocators([p.switch for p in rec.pools])
            for name, alloc in allocs.items():
                if name in busy or alloc.largest_grant() >= need:
                    continue
                if alloc.retiring() or len(alloc.allocations()) >= alloc.max_jobs:
                    busy.add(name)  # slots are on their way back, or the count of jobs is full
                    continue
                wanting = sum(1 for r in waiting if any(p.switch == name for p in r.pools))
                victim = self._victim(alloc, need, len(alloc.allocations()) + wanting)
                if victim is None:
                    continue
                busy.add(name)
                try:
                    shrunk.append(self.resizer.resize_job(*victim))
                except ControllerError:
                    continue  # its other switches have no block for it now
        return shrunk

    def _victim(self, alloc: SlotAllocator, need: int,
                jobs_here: int) -> tuple[int, int, int, int] | None:
        """(job, window, min_window, asked window) of the shrink that makes room on `alloc`'s
        switch for a waiting job of `need` slots among `jobs_here` jobs, or None: the largest
        pool above the fair share there whose job accepts less; ties go to the youngest job.
        The asked window is what the job asked for before any shrink."""
        share = max(1, (alloc.capacity - alloc.reserve) // jobs_here)
        best = None
        for job_id, pool in alloc.allocations().items():
            rec = self.jobs.job(job_id)
            spec = JobSpec.from_dict(rec.spec)
            minimum = spec.min_window
            if minimum is None or rec.retiring or rec.installing:
                continue
            window = max(minimum, share)
            # What its old pool frees, less what its new one takes (from free slots or the
            # reserve), must hold the waiting job: then it fits once the old pool retires.
            if pool.size - window < need:
                continue
            key = (pool.size, rec.created_at, job_id)
            if best is None or key > best[0]:
                best = (key, (job_id, window, minimum, spec.asked_window or spec.window))
        return best[1] if best else None

    def grow_back(self) -> list[JobRecord]:
        """Give the jobs shrunk for waiting ones (their spec's asked_window) as much of what
        they asked for as their switches give now, where no job waits on any of them and no
        pool of theirs retires; the jobs grown, as now recorded. A growth is a live resize,
        so the reserve is not its to take."""
        waiting = self.waiting()
        crowded = {p.switch for r in waiting for p in r.pools}
        grown = []
        for rec in self.jobs.store.jobs():
            spec = JobSpec.from_dict(rec.spec)
            if (spec.asked_window is None or rec.waiting or rec.retiring or rec.installing
                    or crowded & {p.switch for p in rec.pools}):
                continue
            allocs = self.jobs.allocators([p.switch for p in rec.pools])
            fits = min(a.largest_grant(resizing=rec.job_id) for a in allocs.values())
            now = rec.pools[0].size
            if fits <= now:
                continue
            window = min(fits, spec.asked_window)
            asked = spec.asked_window if window < spec.asked_window else None
            try:
                grown.append(self.resizer.resize_job(rec.job_id, window,
                                                     spec.min_window, asked))
            except ControllerError:
                continue  # a switch failed, or another controller took the slots meanwhile
        return grown
