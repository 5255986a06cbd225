"""How a JobRecord is kept in the job store's tables: read back, written, and checked against
every other job's rows, inside a transaction the caller holds (controller.store_file)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from controller.errors import StoreError
from controller.records import JobRecord, PoolRecord, RetiringPool, slots

POOL_COLUMNS = "switch, base, size, gen, stat_idx, mcast_grp, fan_in, is_root, uplink_port"
RETIRING_COLUMNS = "switch, base, size, gen, bit"


def load_job(db: sqlite3.Connection, job_id: int) -> JobRecord | None:
    row = db.execute("SELECT spec, created_at, pool_epoch, installing FROM jobs "
                     "WHERE job_id = ?", (job_id,)).fetchone()
    if row is None:
        return None
    spec_text, created_at, epoch, installing = row
    pools = db.execute(f"SELECT {POOL_COLUMNS} FROM pools WHERE job_id = ? ORDER BY position",
                       (job_id,)).fetchall()
    retiring = db.execute(f"SELECT {RETIRING_COLUMNS} FROM retiring_pools WHERE job_id = ? "
                          "ORDER BY rowid", (job_id,)).fetchall()
    spec: Any = json.loads(spec_text)
    return JobRecord(job_id=job_id, spec=spec, pools=tuple(pool_from_row(p) for p in pools),
                     created_at=created_at, pool_epoch=epoch,
                     retiring=tuple(RetiringPool(*r) for r in retiring),
                     installing=bool(installing))


def pool_from_row(row: tuple[Any, ...]) -> PoolRecord:
    switch, base, size, gen, stat_idx, mcast_grp, fan_in, is_root, uplink_port = row
    return PoolRecord(switch=switch, base=base, size=size, gen=gen, stat_idx=stat_idx,
                      mcast_grp=mcast_grp, fan_in=fan_in, is_root=bool(is_root),
                      uplink_port=uplink_port)


def encode_spec(job: JobRecord) -> str:
    # A spec that JSON would change (tuples, non-string keys, NaN) would come back different after
    # a restart; better to refuse it now than to reconcile against something else later.
    try:
        text = json.dumps(job.spec, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise StoreError(f"job {job.job_id}: spec is not JSON data: {e}") from e
    if not isinstance(job.spec, dict) or json.loads(text) != job.spec:
        raise StoreError(f"job {job.job_id}: spec must be a dict that survives a JSON round trip "
                         "unchanged (use lists, not tuples, and string keys)")
    return text


def insert_pools(db: sqlite3.Connection, job: JobRecord) -> None:
    """The rows of the job's pools and retiring pools (none of them there yet)."""
    for position, pool in enumerate(job.pools):
        db.execute(f"INSERT INTO pools (job_id, position, {POOL_COLUMNS}) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (job.job_id, position, pool.switch, pool.base, pool.size, pool.gen,
                    pool.stat_idx, pool.mcast_grp, pool.fan_in, int(pool.is_root),
                    pool.uplink_port))
    for r in job.retiring:
        db.execute(f"INSERT INTO retiring_pools (job_id, {RETIRING_COLUMNS}) "
                   "VALUES (?, ?, ?, ?, ?, ?)", (job.job_id, r.switch, r.base, r.size, r.gen,
                                                 r.bit))
    for pool in (*job.pools, *job.retiring):
        # A generation the caller chose itself still counts as handed out, so that
        # next_generation never returns it again.
        db.execute("INSERT INTO generations (switch, last_gen) VALUES (?, ?) "
                   "ON CONFLICT (switch) DO UPDATE "
                   "SET last_gen = max(last_gen, excluded.last_gen)", (pool.switch, pool.gen))


def check_free_on_switch(db: sqlite3.Connection, job_id: int,
                         pool: PoolRecord | RetiringPool) -> None:
    """Refuse `pool` for job `job_id` where another job holds any of it, naming that job."""
    # The UNIQUE constraints would refuse these too, but without saying which job is in the
    # way; slot overlap has no constraint at all. Other jobs' retiring pools hold their
    # slots and generations as much as their current ones.
    where = f"job {job_id} on switch {pool.switch}"
    columns = [("gen", pool.gen)]
    if isinstance(pool, PoolRecord):
        columns += [("stat_idx", pool.stat_idx), ("mcast_grp", pool.mcast_grp)]
    for column, value in columns:
        row = db.execute(f"SELECT job_id FROM pools WHERE switch = ? AND {column} = ? "
                         "AND job_id != ?", (pool.switch, value, job_id)).fetchone()
        if row is None and column == "gen":
            row = db.execute("SELECT job_id FROM retiring_pools WHERE switch = ? AND "
                             "gen = ? AND job_id != ?",
                             (pool.switch, value, job_id)).fetchone()
        if row is not None:
            raise StoreError(f"{where}: {column} {value} is already used by job {row[0]}")
    for table, what in (("pools", "slots"), ("retiring_pools", "retiring slots")):
        row = db.execute(f"SELECT job_id, base, size FROM {table} WHERE switch = ? "
                         "AND base < ? AND ? < base + size AND job_id != ?",
                         (pool.switch, pool.base + pool.size, pool.base,
                          job_id)).fetchone()
        if row is not None:
            raise StoreError(f"{where}: slots {slots(pool.base, pool.size)} overlap job "
                             f"{row[0]}'s {what} {slots(row[1], row[2])}")


def replace_job(db: sqlite3.Connection, new: JobRecord, old: JobRecord) -> None:
    """Rewrite job `old` as `new` (same id), checking `new`'s pools against every other
    job's."""
    db.execute("DELETE FROM retiring_pools WHERE job_id = ?", (old.job_id,))
    db.execute("DELETE FROM pools WHERE job_id = ?", (old.job_id,))
    for pool in (*new.pools, *new.retiring):
        check_free_on_switch(db, new.job_id, pool)
    db.execute("UPDATE jobs SET spec = ?, pool_epoch = ?, installing = ? WHERE job_id = ?",
               (encode_spec(new), new.pool_epoch, int(new.installing), new.job_id))
    insert_pools(db, new)
