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
"""

from __future__ import annotations

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
