"""Retiring the old pool of a live resize (controller.resize), once nobody needs it.

The old pool cannot be freed at once: a host that has not yet received the result of the call
at which the hosts agreed to move may still resend into it, and must get that result from
there. A host that has contributed to the new pool has every result of the old one (it moved
after its last call there), so once every host of the job has a contribution counted in the new
pool at its own switch (`pool_contribs`, zeroed before the pool was installed), nobody needs
the old pool: `PoolRetirement.retire_pools` deletes its entries and frees its slots. The spine
is not checked: a ToR sends its rack's sums up only after its hosts' contributions, under the
same bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from controller.connections import SwitchConnections
from controller.counters import StatsCounters
from controller.errors import ControllerError, SwitchFailure
from controller.job_plan import JobSpec, plan
from controller.recorded_jobs import RecordedJobs
from controller.records import JobRecord, PoolRecord, RetiringPool
from controller.switch import SwitchConnection, SwitchError, WriteError
from controller.tables.job_admission import JobAdmissionTables


@dataclass(frozen=True)
class PoolMove:
    """Where a job's move to its current pool stands (`retire_pools`)."""

    job_id: int
    pool_epoch: int
    # True while the job still has retiring pools after the call.
    pending: bool
    # The job's hosts that have (not) yet contributed to the current pool; both empty when no
    # resize was pending.
    moved: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    # The old pools this call freed.
    retired: tuple[RetiringPool, ...] = ()

    def to_dict(self) -> dict:
        return {"pool_epoch": self.pool_epoch, "pending": self.pending,
                "moved": list(self.moved), "waiting": list(self.waiting),
                "retired": [dataclasses.asdict(r) for r in self.retired]}


class PoolRetirement:
    """Retires the old pools of the jobs recorded in `jobs`, on the switches reached through
    `connections`."""

    def __init__(self, jobs: RecordedJobs, connections: SwitchConnections) -> None:
        self.jobs = jobs
        self.connections = connections

    def retire_pools(self, job_id: int) -> PoolMove:
        """If job `job_id` has retiring pools: read, at every switch its hosts are on, which of
        them have contributed to the current pool; when all have, delete the old pools' entries on
        every switch of the job and free their slots."""
        rec = self.jobs.job(job_id)
        if not rec.retiring:
            return PoolMove(job_id, rec.pool_epoch, False)
        job_plan = plan(JobSpec.from_dict(rec.spec), self.jobs.topo)
        moved, waiting = [], []
        for pool in rec.pools:
            if job_plan.level(pool.switch) != 0:
                continue  # the spine: its counts follow the ToRs'
            role = job_plan.roles[pool.switch]
            if rec.installing:  # agents are not handed the new pool yet
                waiting += [m.name for m in role.members]
                continue
            try:
                conn = self.connections.conn(pool.switch)
                counts = StatsCounters(conn).pool_contribs(pool.stat_idx, rec.pool_bit)
            except SwitchError as e:
                raise SwitchFailure(f"job {job_id}: cannot tell whether its hosts use the new "
                                    f"pool: {e}") from None
            for m in role.members:
                # In `ina` a host streams as several contributors: moved when each of them has.
                (moved if all(counts.get(c, 0) for c in m.ids) else waiting).append(m.name)
        if waiting:
            return PoolMove(job_id, rec.pool_epoch, True, tuple(sorted(moved)),
                            tuple(sorted(waiting)))
        return PoolMove(job_id, rec.pool_epoch, False, tuple(sorted(moved)), (),
                        self._retire(rec))

    def retire_where(self, switches: Iterable[str]) -> None:
        """retire_pools for every job with a retiring pool on one of `switches`, before their
        slots are allocated; a job whose hosts cannot be checked now keeps its old pool (the
        allocation then names it as retiring)."""
        jobs = {jid for s in switches for jid in self.jobs.store.retiring_on(s)}
        for jid in sorted(jobs):
            try:
                self.retire_pools(jid)
            except ControllerError:
                pass

    def _retire(self, rec: JobRecord) -> tuple[RetiringPool, ...]:
        """Delete the entries of `rec`'s retiring pools and forget them, freeing their slots; the
        pools freed. `rec` may be out of date: another controller sharing the state file (`job
        show` racing `job resize`) may have retired these pools meanwhile and installed a later
        pool under the same bit, which must not be deleted. So a switch's entry is deleted only if
        it is still the retiring pool's, and the store forgets the pools only if they are still
        the ones `rec` has; otherwise this call changes nothing."""
        for old in rec.retiring:
            try:
                delete_if_ours(self.connections.conn(old.switch), rec.job_id, old.bit, old)
            except SwitchError as e:
                # Those deleted already are reinstalled by reconcile or deleted again next time.
                raise SwitchFailure(f"job {rec.job_id}: old pool on {old.switch} not retired: "
                                    f"{e}") from None
        return self.jobs.store.finish_resize(rec.job_id, rec.pool_epoch, rec.retiring)


def delete_if_ours(conn: SwitchConnection, job_id: int, bit: int,
                   pool: PoolRecord | RetiringPool) -> None:
    """Delete job `job_id`'s job_config entry under `bit` on this switch if it is `pool`'s: its
    generation (never handed out twice on a switch) and slots. Another entry under that key
    is left alone: a later pool installed by another controller sharing the state file, or
    an entry someone else owns. SwitchError if the switch cannot be read or written."""
    adm = JobAdmissionTables(conn)
    have = adm.jobs().get((job_id, bit))
    if have is None or (have.gen, have.pool_base, have.pool_size) != (pool.gen, pool.base,
                                                                       pool.size):
        return
    try:
        conn.write([adm.job_delete(job_id, bit)])
    except WriteError as e:
        if any(code != "NOT_FOUND" for _, code, _ in e.failures):
            raise  # NOT_FOUND: deleted meanwhile, which is what was wanted
