"""Live pool resizing: moving a running job to a new pool, and retiring the old one.

A job's packets carry FLAG_POOL, and `job_config` is keyed by (job, pool bit), so a switch can
hold two pools of one job at once. `resize_job` installs a new pool under the bit the job does
not use, disjoint from the current one, with a fresh generation; the job's pool epoch goes up by
one (its low bit is the new pool's FLAG_POOL) and the agents, polling their parameters, move to
it at a call boundary they agree on among themselves. The old pool retires once every host has
left it (controller.retire).

Every step is recorded before the switches are told (controller.store), so `reconcile` can
finish what a crash interrupted: a resize recorded but not installed everywhere is installed
(agents are handed the old pool until it is), a retiring pool is reinstalled if missing.
"""

from __future__ import annotations

import dataclasses

from controller.allocator import AllocationError
from controller.common_window import common_window
from controller.connections import SwitchConnections
from controller.counters import StatsCounters
from controller.errors import ControllerError, SwitchFailure
from controller.installer import SwitchSnapshot
from controller.job_plan import JobError, JobPlan, JobSpec, plan
from controller.recorded_jobs import RecordedJobs
from controller.retire import PoolMove as PoolMove
from controller.retire import PoolRetirement, delete_if_ours
from controller.store import JobRecord, PoolRecord, StoreError
from controller.switch import SwitchError, Update, WriteError
from controller.tables.job_admission import JobAdmissionTables


class PoolResizer:
    """Resizes the jobs recorded in `jobs` on the switches reached through `connections`, once
    `retirement` has freed the pools of their previous resize."""

    def __init__(self, jobs: RecordedJobs, connections: SwitchConnections,
                 retirement: PoolRetirement) -> None:
        self.jobs = jobs
        self.connections = connections
        self.retirement = retirement

    def resize_job(self, job_id: int, window: int, min_window: int | None = None,
                   asked: int | None = None) -> JobRecord:
        """Give job `job_id` new pools of `window` slots (at least `min_window` when short) on
        every one of its switches, disjoint from its current ones, which become retiring; the job
        as now recorded. All or nothing: refused, with nothing changed, when the previous resize
        is still retiring, the new pools do not fit, or a switch fails. asked: the larger window
        the job had asked for, kept in its spec (a shrink for waiting jobs, or a partial
        growth back); None for a resize the operator asked for."""
        rec = self.jobs.job(job_id)
        try:
            spec = dataclasses.replace(JobSpec.from_dict(rec.spec), window=window,
                                       min_window=min_window, asked_window=asked)
            job_plan = plan(spec, self.jobs.topo)
        except JobError as e:
            raise ControllerError(f"job {job_id} not resized: {e}") from None
        if rec.installing:
            raise ControllerError(
                f"job {job_id} not resized: its previous resize (to pool {rec.pool_epoch}) was "
                "interrupted before every switch had the new pool; run `passing-ctl reconcile` to "
                "finish it")
        move = self.retirement.retire_pools(job_id)
        if move.pending:
            raise ControllerError(
                f"job {job_id} not resized: its previous resize (to pool {move.pool_epoch}) is "
                f"still retiring the old pool, because {_hosts(move.waiting)} not contributed to "
                f"the new one yet; resize again once every host has (`passing-ctl job show "
                f"{job_id}` lists who has not)")
        rec = self.jobs.job(job_id)
        pools = self._new_pools(rec, job_plan, window, min_window)
        try:
            new = self.jobs.store.begin_resize(job_id, rec.pool_epoch, spec.to_dict(), pools)
        except StoreError as e:
            raise ControllerError(f"job {job_id} not resized: {e}") from None
        self._install(rec, new, job_plan)
        return self.jobs.store.resize_installed(job_id, new.pool_epoch) or new

    def _new_pools(self, rec: JobRecord, job_plan: JobPlan, window: int,
                   min_window: int | None) -> list[PoolRecord]:
        """The job's new pool on each of its switches: slots beside everything held there, a
        fresh generation, the rest as the current pool's."""
        job_id = rec.job_id
        snaps = {}
        for s in job_plan.switches:
            try:
                snaps[s] = SwitchSnapshot.read(self.connections.conn(s))
            except SwitchError as e:
                raise SwitchFailure(f"job {job_id} not resized: {e}") from None
        allocs = self.jobs.allocators(job_plan.switches)
        # A job waiting for slots holds none: its first pools are allocated as a new job's
        # (max_jobs counts), with nothing to retire.
        waiting = rec.waiting
        # A shrink may take the slots kept free for shrinks (allocator's reserve): its old
        # pool, once retired, gives back more.
        shrink = not waiting and all(window < p.size for p in rec.pools)
        try:
            size = common_window(job_id, window, min_window, allocs, resize=not waiting,
                                 shrink=shrink)
            ranges = {s: allocs[s].allocate(job_id, size) if waiting
                      else allocs[s].resize(job_id, size, shrink=shrink)
                      for s in job_plan.switches}
        except AllocationError as e:
            raise ControllerError(str(e)) from None
        pools = []
        for old in rec.pools:
            # Above every generation the switch holds, as for a new job: slot state written
            # under an earlier generation must read as empty in the new pool.
            floor = max((c.gen for c in snaps[old.switch].jobs.values()), default=0)
            gen = self.jobs.store.next_generation(old.switch, floor)
            pools.append(dataclasses.replace(old, base=ranges[old.switch].base, size=size,
                                             gen=gen))
        return pools

    def _install(self, before: JobRecord, new: JobRecord, job_plan: JobPlan) -> None:
        """The new pools' job_config entries on every switch of the job, or none of them and the
        record put back as `before`."""
        by_switch = {p.switch: p for p in new.pools}
        done: list[str] = []  # switches whose new entry is (or, for the last, may be) there
        try:
            for s in job_plan.switches:
                conn = self.connections.conn(s)
                # The new pool's entry as reconcile would want it (claims only affect guards).
                cfg = self.jobs.desired(job_plan, new, by_switch[s], {}).job
                # Zeroed before the entry exists, so that every count in it is this pool's.
                conn.write(StatsCounters(conn).pool_reset_updates(cfg.stat_idx, cfg.pool))
                try:
                    conn.write([JobAdmissionTables(conn).job_update(Update.INSERT, cfg)])
                except WriteError:
                    # Refused, so not applied: what it collided with (ALREADY_EXISTS) is someone
                    # else's entry and stays.
                    raise
                except SwitchError:
                    # No answer (a connection lost, a timeout): the insert may have been applied.
                    done.append(s)
                    raise
                done.append(s)
        except (SwitchError, ControllerError) as e:
            # The store frees the new pools' slots below: an entry left behind would make the next
            # resize's INSERT under this bit fail with ALREADY_EXISTS, and point at slots that may
            # be handed to another job.
            left = []
            for s in reversed(done):
                try:
                    delete_if_ours(self.connections.conn(s), new.job_id, new.pool_bit,
                                   by_switch[s])
                except (SwitchError, ControllerError):
                    left.append(s)
            self.jobs.store.undo_resize(before)
            if not left:
                raise SwitchFailure(f"job {new.job_id} not resized, nothing changed: {e}") \
                    from None
            raise SwitchFailure(
                f"job {new.job_id} not resized: {e}; its record is as before, but its new pool's "
                f"job_config entry (pool bit {new.pool_bit}) may be left on {', '.join(left)}, "
                "which could not be cleaned up: `passing-ctl reconcile` reports it as stray") \
                from None





def _hosts(names: tuple[str, ...]) -> str:
    return (f"host {names[0]} has" if len(names) == 1
            else f"hosts {', '.join(names)} have")
