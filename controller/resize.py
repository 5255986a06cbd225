"""Live pool resizing: moving a running job to a new pool, and retiring the old one.

A job's packets carry FLAG_POOL, and `job_config` is keyed by (job, pool bit), so a switch can
hold two pools of one job at once. `resize_job` installs a new pool under the bit the job does
not use, disjoint from the current one, with a fresh generation; the job's pool epoch goes up by
one (its low bit is the new pool's FLAG_POOL) and the agents, polling their parameters, move to
it at a call boundary they agree on among themselves.

The old pool cannot be freed at once: a host that has not yet received the result of the call
at which the hosts agreed to move may still resend into it, and must get that result from
there. A host that has contributed to the new pool has every result of the old one (it moved
after its last call there), so once every host of the job has a contribution counted in the new
pool at its own switch (`pool_contribs`, zeroed before the pool was installed), nobody needs
the old pool: `retire_pools` deletes its entries and frees its slots. The spine is not checked:
a ToR sends its rack's sums up only after its hosts' contributions, under the same bit.

Every step is recorded before the switches are told (controller.store), so `reconcile` can
finish what a crash interrupted: a resize recorded but not installed everywhere is installed
(agents are handed the old pool until it is), a retiring pool is reinstalled if missing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from controller.allocator import AllocationError, common_window
from controller.counters import StatsCounters
from controller.errors import ControllerError, SwitchFailure
from controller.installer import SwitchSnapshot
from controller.job_plan import JobError, JobPlan, JobSpec, plan
from controller.store import JobRecord, PoolRecord, RetiringPool, StoreError
from controller.switch import SwitchConnection, SwitchError, Update, WriteError
from controller.tables.job_admission import JobAdmissionTables

if TYPE_CHECKING:
    from controller.core import Controller


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


def resize_job(ctl: Controller, job_id: int, window: int,
               min_window: int | None = None) -> JobRecord:
    """Give job `job_id` new pools of `window` slots (at least `min_window` when short) on
    every one of its switches, disjoint from its current ones, which become retiring; the job
    as now recorded. All or nothing: refused, with nothing changed, when the previous resize
    is still retiring, the new pools do not fit, or a switch fails."""
    rec = ctl.job(job_id)
    try:
        spec = dataclasses.replace(JobSpec.from_dict(rec.spec), window=window,
                                   min_window=min_window)
        job_plan = plan(spec, ctl.topo)
    except JobError as e:
        raise ControllerError(f"job {job_id} not resized: {e}") from None
    if rec.installing:
        raise ControllerError(
            f"job {job_id} not resized: its previous resize (to pool {rec.pool_epoch}) was "
            "interrupted before every switch had the new pool; run `passing-ctl reconcile` to "
            "finish it")
    move = retire_pools(ctl, job_id)
    if move.pending:
        raise ControllerError(
            f"job {job_id} not resized: its previous resize (to pool {move.pool_epoch}) is "
            f"still retiring the old pool, because {_hosts(move.waiting)} not contributed to "
            f"the new one yet; resize again once every host has (`passing-ctl job show "
            f"{job_id}` lists who has not)")
    rec = ctl.job(job_id)
    pools = _new_pools(ctl, rec, job_plan, window, min_window)
    try:
        new = ctl.store.begin_resize(job_id, rec.pool_epoch, spec.to_dict(), pools)
    except StoreError as e:
        raise ControllerError(f"job {job_id} not resized: {e}") from None
    _install(ctl, rec, new, job_plan)
    return ctl.store.resize_installed(job_id, new.pool_epoch) or new


def _new_pools(ctl: Controller, rec: JobRecord, job_plan: JobPlan, window: int,
               min_window: int | None) -> list[PoolRecord]:
    """The job's new pool on each of its switches: slots beside everything held there, a
    fresh generation, the rest as the current pool's."""
    job_id = rec.job_id
    snaps = {}
    for s in job_plan.switches:
        try:
            snaps[s] = SwitchSnapshot.read(ctl.conn(s))
        except SwitchError as e:
            raise SwitchFailure(f"job {job_id} not resized: {e}") from None
    allocs = ctl._allocators(job_plan.switches)
    try:
        size = common_window(job_id, window, min_window, allocs, resize=True)
        ranges = {s: allocs[s].resize(job_id, size) for s in job_plan.switches}
    except AllocationError as e:
        raise ControllerError(str(e)) from None
    pools = []
    for old in rec.pools:
        # Above every generation the switch holds, as for a new job: slot state written under
        # an earlier generation must read as empty in the new pool.
        floor = max((c.gen for c in snaps[old.switch].jobs.values()), default=0)
        pools.append(dataclasses.replace(old, base=ranges[old.switch].base, size=size,
                                         gen=ctl.store.next_generation(old.switch, floor)))
    return pools


def _install(ctl: Controller, before: JobRecord, new: JobRecord, job_plan: JobPlan) -> None:
    """The new pools' job_config entries on every switch of the job, or none of them and the
    record put back as `before`."""
    by_switch = {p.switch: p for p in new.pools}
    done: list[str] = []  # switches whose new entry is (or, for the last, may be) there
    try:
        for s in job_plan.switches:
            conn = ctl.conn(s)
            # The new pool's entry as reconcile would want it (claims only affect guards).
            cfg = ctl._desired(job_plan, new, by_switch[s], {}).job
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
                _delete_if_ours(ctl.conn(s), new.job_id, new.pool_bit, by_switch[s])
            except (SwitchError, ControllerError):
                left.append(s)
        ctl.store.undo_resize(before)
        if not left:
            raise SwitchFailure(f"job {new.job_id} not resized, nothing changed: {e}") from None
        raise SwitchFailure(
            f"job {new.job_id} not resized: {e}; its record is as before, but its new pool's "
            f"job_config entry (pool bit {new.pool_bit}) may be left on {', '.join(left)}, "
            "which could not be cleaned up: `passing-ctl reconcile` reports it as stray") \
            from None


def _delete_if_ours(conn: SwitchConnection, job_id: int, bit: int,
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


def retire_pools(ctl: Controller, job_id: int) -> PoolMove:
    """If job `job_id` has retiring pools: read, at every switch its hosts are on, which of
    them have contributed to the current pool; when all have, delete the old pools' entries on
    every switch of the job and free their slots."""
    rec = ctl.job(job_id)
    if not rec.retiring:
        return PoolMove(job_id, rec.pool_epoch, False)
    job_plan = plan(JobSpec.from_dict(rec.spec), ctl.topo)
    moved, waiting = [], []
    for pool in rec.pools:
        if job_plan.level(pool.switch) != 0:
            continue  # the spine: its counts follow the ToRs'
        role = job_plan.roles[pool.switch]
        if rec.installing:  # agents are not handed the new pool yet
            waiting += [m.name for m in role.members]
            continue
        try:
            counts = StatsCounters(ctl.conn(pool.switch)).pool_contribs(pool.stat_idx,
                                                                        rec.pool_bit)
        except SwitchError as e:
            raise SwitchFailure(f"job {job_id}: cannot tell whether its hosts use the new "
                                f"pool: {e}") from None
        for m in role.members:
            # In `ina` a host streams as several contributors: moved when each of them has.
            (moved if all(counts.get(c, 0) for c in m.ids) else waiting).append(m.name)
    if waiting:
        return PoolMove(job_id, rec.pool_epoch, True, tuple(sorted(moved)),
                        tuple(sorted(waiting)))
    return PoolMove(job_id, rec.pool_epoch, False, tuple(sorted(moved)), (), _retire(ctl, rec))


def _retire(ctl: Controller, rec: JobRecord) -> tuple[RetiringPool, ...]:
    """Delete the entries of `rec`'s retiring pools and forget them, freeing their slots; the
    pools freed. `rec` may be out of date: another controller sharing the state file (`job
    show` racing `job resize`) may have retired these pools meanwhile and installed a later
    pool under the same bit, which must not be deleted. So a switch's entry is deleted only if
    it is still the retiring pool's, and the store forgets the pools only if they are still
    the ones `rec` has; otherwise this call changes nothing."""
    for old in rec.retiring:
        try:
            _delete_if_ours(ctl.conn(old.switch), rec.job_id, old.bit, old)
        except SwitchError as e:
            # Those deleted already are reinstalled by reconcile or deleted again next time.
            raise SwitchFailure(f"job {rec.job_id}: old pool on {old.switch} not retired: "
                                f"{e}") from None
    return ctl.store.finish_resize(rec.job_id, rec.pool_epoch, rec.retiring)


def retire_where(ctl: Controller, switches: Iterable[str]) -> None:
    """retire_pools for every job with a retiring pool on one of `switches`, before their
    slots are allocated; a job whose hosts cannot be checked now keeps its old pool (the
    allocation then names it as retiring)."""
    jobs = {jid for s in switches for jid in ctl.store.retiring_on(s)}
    for jid in sorted(jobs):
        try:
            retire_pools(ctl, jid)
        except ControllerError:
            pass


def _hosts(names: tuple[str, ...]) -> str:
    return (f"host {names[0]} has" if len(names) == 1
            else f"hosts {', '.join(names)} have")
