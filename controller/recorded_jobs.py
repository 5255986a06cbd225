"""The jobs of the state file as the rest of the controller uses them: one by its id, the slots
each switch has handed out, and the entries a job's pool stands for on its switch."""

from __future__ import annotations

from controller import installer
from controller.agent_ports import GuardClaims
from controller.allocator import SlotAllocator, SlotRange
from controller.errors import ControllerError
from controller.job_plan import JobPlan
from controller.records import JobRecord, PoolRecord
from controller.store import JobStore
from controller.topology import Topology
from passing import protocol as P


class RecordedJobs:
    """The jobs recorded in `store`, on the switches of `topo`, each switch admitting at most
    `max_jobs` of them, its slots cut into `shares` equal shares (default: max_jobs), `reserve`
    of them kept free for shrinking running jobs (controller.allocator)."""

    def __init__(self, topo: Topology, store: JobStore, max_jobs: int,
                 shares: int | None = None, reserve: int = 0) -> None:
        most = P.SLOT_CAPACITY // (shares or max_jobs)
        if not 0 <= reserve <= most:
            raise ControllerError(f"reserve must be 0 to {most} slots (one share of a switch's "
                                  f"{P.SLOT_CAPACITY}), not {reserve}")
        self.topo = topo
        self.store = store
        self.max_jobs = max_jobs
        self.shares = shares
        self.reserve = reserve

    def job(self, job_id: int) -> JobRecord:
        """The job; an unknown one is refused naming the jobs there are."""
        rec = self.store.get_job(job_id)
        if rec is None:
            known = ", ".join(str(j.job_id) for j in self.store.jobs()) or "none"
            raise ControllerError(f"no job {job_id} (jobs: {known})")
        return rec

    def allocators(self, switches: list[str]) -> dict[str, SlotAllocator]:
        """Per switch, its slots as the live jobs' pools and retiring pools hold them."""
        return {s: SlotAllocator(s, P.SLOT_CAPACITY, self.max_jobs,
                                 {jid: SlotRange(p.base, p.size)
                                  for jid, p in self.store.pools_on(s).items() if p.size},
                                 {jid: SlotRange(r.base, r.size)
                                  for jid, r in self.store.retiring_on(s).items()},
                                 self.shares, self.reserve)
                for s in switches}

    def desired(self, job_plan: JobPlan, rec: JobRecord, pool: PoolRecord,
                claims: GuardClaims) -> installer.Desired:
        """What job `rec` should have on pool.switch: its pool's entries under the job's pool
        bit, and the job_config entry of its retiring pool there, if any."""
        params = installer.PoolParams(pool.base, pool.size, pool.gen, pool.stat_idx,
                                      pool.mcast_grp, P.pool_epoch(rec.pool_epoch))
        # The retiring pool is always the one before (a resize waits for it to retire).
        old = next((installer.OldPool(r.base, r.size, r.gen, P.pool_epoch(rec.pool_epoch - 1))
                    for r in rec.retiring
                    if r.switch == pool.switch), None)
        jid = job_plan.spec.job_id
        guard_ports = [port for port in job_plan.spec.agent_ports(self.topo)
                       if claims.get((pool.switch, port), [(jid, 0)])[0][0] == jid]
        return installer.desired(job_plan.roles[pool.switch], params, jid,
                                 self.topo.switches[pool.switch], guard_ports,
                                 job_plan.quorum_at(pool.switch), old)
