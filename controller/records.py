"""What the job store records: a job, its pool on each of its switches and, during a live
resize, the pools it is moving from; and the limits a record must keep to be written into the
pipeline as it is."""

from __future__ import annotations

from dataclasses import dataclass

from controller.errors import StoreError
from passing import protocol as P

# Multicast group 1 is the L2 flooding group, so jobs start at 2; the P4 field is 16 bits.
FIRST_JOB_MCAST_GROUP = 2
MAX_MCAST_GROUP = 2**16 - 1
# gen is a 32-bit action parameter, and registers start at 0, which therefore must never be a
# live job's generation.
MAX_GENERATION = 2**32 - 1
MAX_JOB_ID = 2**16 - 1  # job_id is 16 bits on the wire
MAX_PORT = 2**9 - 1  # v1model ports are 9 bits


@dataclass(frozen=True)
class PoolRecord:
    """One job's resources on one switch, as written into its `job_config` entry."""

    switch: str
    base: int
    # The job's window (controller.job_plan.JobSpec); a column of the state file. 0 (base 0)
    # on every switch of a job that waits for slots: its hosts sum with a host collective, and
    # the switch has every entry of the job but its job_config (docs/controller.md).
    size: int
    gen: int
    stat_idx: int
    mcast_grp: int
    fan_in: int
    is_root: bool
    uplink_port: int


@dataclass(frozen=True)
class RetiringPool:
    """The pool a live resize moved a job from, on one switch: its `job_config` entry (keyed by
    `bit`, the pool's FLAG_POOL) stays installed, and its slots held, until the controller sees
    every host of the job use the new pool. Everything else (counter row, multicast group,
    fan-in, role) is the job's current PoolRecord's on the same switch."""

    switch: str
    base: int
    size: int
    gen: int
    bit: int


@dataclass(frozen=True)
class JobRecord:
    """A job: its description, as JSON-compatible data, and its pools (at most one per switch).

    pool_epoch: how many times the job was resized; its current pools are under FLAG_POOL
    `pool_epoch & 1`. retiring: the pools of the previous epoch not freed yet (none, or one per
    switch of the job). installing: the last resize is recorded but its entries are not known
    to be on every switch yet, so agents are still handed the previous pool."""

    job_id: int
    spec: dict
    pools: tuple[PoolRecord, ...]
    created_at: float
    pool_epoch: int = 0
    retiring: tuple[RetiringPool, ...] = ()
    installing: bool = False

    @property
    def pool_bit(self) -> int:
        """The FLAG_POOL of the current pools."""
        return self.pool_epoch & 1

    @property
    def waiting(self) -> bool:
        """The job holds no slots (its pools are empty): it waits for them, its hosts summing
        with a host collective meanwhile."""
        return all(pool.size == 0 for pool in self.pools)


def check_job(job: JobRecord) -> None:
    """Refuse records that could not be written into the pipeline as they are."""
    if not 0 <= job.job_id <= MAX_JOB_ID:
        raise StoreError(f"job {job.job_id}: job_id must be in 0..{MAX_JOB_ID}")
    switches = [pool.switch for pool in job.pools]
    repeated = sorted({s for s in switches if switches.count(s) > 1})
    if repeated:
        raise StoreError(f"job {job.job_id} has more than one pool on switch {repeated[0]}")
    empty = [pool.switch for pool in job.pools if pool.size == 0]
    if empty and len(empty) != len(job.pools):
        raise StoreError(f"job {job.job_id} has slots on some switches but none on "
                         f"{', '.join(empty)} (a job waits for slots on all or none)")
    for pool in job.pools:
        where = f"job {job.job_id} on switch {pool.switch}"
        checks: list[tuple[bool, str]] = [
            ((pool.size >= 1 and pool.base >= 0 and pool.base + pool.size <= P.SLOT_CAPACITY)
             or (pool.size, pool.base) == (0, 0),
             f"slots {slots(pool.base, pool.size)} must be a non-empty range within "
             f"0..{P.SLOT_CAPACITY - 1} (or none, base 0, while the job waits)"),
            (1 <= pool.gen <= MAX_GENERATION, f"gen {pool.gen} must be in 1..{MAX_GENERATION}"),
            (0 <= pool.stat_idx < P.MAX_JOBS,
             f"stat_idx {pool.stat_idx} must be in 0..{P.MAX_JOBS - 1}"),
            (FIRST_JOB_MCAST_GROUP <= pool.mcast_grp <= MAX_MCAST_GROUP,
             f"mcast_grp {pool.mcast_grp} must be in {FIRST_JOB_MCAST_GROUP}..{MAX_MCAST_GROUP} "
             "(group 1 is L2 flooding)"),
            (1 <= pool.fan_in <= P.MAX_FAN_IN, f"fan_in {pool.fan_in} must be in "
             f"1..{P.MAX_FAN_IN}"),
            (0 <= pool.uplink_port <= MAX_PORT,
             f"uplink_port {pool.uplink_port} must be in 0..{MAX_PORT}"),
            (not pool.is_root or pool.uplink_port == 0,
             f"a root has no uplink, but uplink_port is {pool.uplink_port}"),
        ]
        for ok, problem in checks:
            if not ok:
                raise StoreError(f"{where}: {problem}")
    _check_retiring(job)


def _check_retiring(job: JobRecord) -> None:
    """A job's retiring pools: only after a resize, under the other pool bit than its current
    pools, at most one per switch of the job, disjoint from its current pool there and with
    another generation."""
    if job.pool_epoch < 0:
        raise StoreError(f"job {job.job_id}: pool epoch {job.pool_epoch} is negative")
    if job.retiring and job.pool_epoch == 0:
        raise StoreError(f"job {job.job_id}: retiring pools but never resized (pool epoch 0)")
    if job.installing and not job.retiring and job.pool_epoch != 1:
        # Only the move of a job that waited for slots (pool epoch 0, empty pools) onto its
        # first pools has nothing to retire.
        raise StoreError(f"job {job.job_id}: a resize being installed keeps its old pools")
    if job.retiring and job.waiting:
        raise StoreError(f"job {job.job_id}: waits for slots but has retiring pools")
    current = {pool.switch: pool for pool in job.pools}
    seen = set()
    for r in job.retiring:
        where = f"job {job.job_id} on switch {r.switch}"
        pool = current.get(r.switch)
        checks: list[tuple[bool, str]] = [
            (pool is not None, "a retiring pool on a switch where the job has no pool"),
            (r.switch not in seen, "more than one retiring pool"),
            (r.bit == 1 - job.pool_bit, f"retiring pool bit {r.bit} must be the other than the "
             f"current pools' ({job.pool_bit})"),
            (r.size >= 1 and r.base >= 0 and r.base + r.size <= P.SLOT_CAPACITY,
             f"retiring slots {slots(r.base, r.size)} must be a non-empty range within "
             f"0..{P.SLOT_CAPACITY - 1}"),
            (1 <= r.gen <= MAX_GENERATION, f"gen {r.gen} must be in 1..{MAX_GENERATION}"),
        ]
        if pool is not None:
            checks += [(r.gen != pool.gen, f"retiring pool and pool share gen {r.gen}"),
                       (r.base + r.size <= pool.base or pool.base + pool.size <= r.base,
                        f"retiring slots {slots(r.base, r.size)} overlap the job's slots "
                        f"{slots(pool.base, pool.size)}")]
        seen.add(r.switch)
        for ok, problem in checks:
            if not ok:
                raise StoreError(f"{where}: {problem}")


def slots(base: int, size: int) -> str:
    """`0-63 (64)`: a slot range as messages name it."""
    return f"{base}-{base + size - 1} ({size})"
