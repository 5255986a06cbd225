"""Per-job counters read from the switches, with every drop of a job's switches accounted for
either in the job's row or in the switch's drops that belong to no job."""

from __future__ import annotations

from controller.connections import SwitchConnections
from controller.counters import StatsCounters
from controller.errors import ControllerError, SwitchFailure
from controller.job_plan import JobSpec, plan
from controller.recorded_jobs import RecordedJobs
from controller.retire import PoolRetirement
from controller.switch import SwitchError


class JobStats:
    """The counters of the jobs recorded in `jobs`, on switches reached through
    `connections`; asking frees an old pool every host has left (`retirement`)."""

    def __init__(self, jobs: RecordedJobs, connections: SwitchConnections,
                 retirement: PoolRetirement) -> None:
        self.jobs = jobs
        self.connections = connections
        self.retirement = retirement

    def stats(self, job_id: int, unread: dict[str, str] | None = None
              ) -> dict[str, dict[str, int | str | dict[str, int]]]:
        """Per switch of the job: its counters (StatsCounters.job), its fan-in and quorum, its
        late contributions by member ("late_by") and, under "switch_drops", that switch's
        drops counted for no job, so that every packet the switch dropped is accounted for in
        one place or the other. During a resize, "move_error" when whether the hosts have
        moved could not be told (as in `job show`). A switch that cannot be reached or read
        has only its fan-in, its quorum, "error" (and "move_error"): the others' counters
        are still read. `unread` (switch -> why), shared by the calls of one command, names
        the switches already found unreadable, which are not asked again (each costs the
        connection's retries), and gains those found now."""
        unread = {} if unread is None else unread
        move_error = None
        try:
            self.retirement.retire_pools(job_id)  # frees an old pool every host has left
        except ControllerError as e:
            # Freeing the old pool is a side task here, as in `job show`: its failing (a ToR
            # not answering the pool_contribs read, a delete refused) must not cost the
            # counters.
            move_error = str(e)
        rec = self.jobs.job(job_id)
        job_plan = plan(JobSpec.from_dict(rec.spec), self.jobs.topo)
        out: dict[str, dict[str, int | str | dict[str, int]]] = {}
        for p in rec.pools:
            plan_part = {"quorum": job_plan.quorum_at(p.switch), "fan_in": p.fan_in}
            if move_error is not None:
                plan_part["move_error"] = move_error
            if p.switch in unread:
                out[p.switch] = {**plan_part, "error": unread[p.switch]}
                continue
            try:
                counters = StatsCounters(self.connections.conn(p.switch))
                late = counters.late(p.stat_idx)
                read = {**counters.job(p.stat_idx), "switch_drops": counters.global_drops()}
            except (SwitchFailure, SwitchError) as e:
                # A switch that is down is when an operator most needs the others' counters:
                # they are given, and this one's row says why it has none.
                unread[p.switch] = str(e)
                out[p.switch] = {**plan_part, "error": str(e)}
                continue
            # Late contributions by the member that sent them (a host, or a ToR at the spine).
            late_by = {m.name: n for m in job_plan.roles[p.switch].members
                       if (n := sum(late.get(c, 0) for c in m.ids))}
            out[p.switch] = {**read, **plan_part, "late_by": late_by}
        return out
