"""The controller's durable job table, in one SQLite file.

Whatever the controller writes into a switch for a job (pool, generation, counter row, multicast
group, role) is recorded here first, so that a restarted controller knows which jobs exist and
can reconcile each switch with them. Every method is one transaction: a failure leaves the file
as it was. Several `JobStore` objects, in one process or several, may share a file; each sees
the others' committed changes, and writers are serialised by SQLite's file lock.

Invariants the store keeps per switch, because the pipeline depends on them:

* generations are never handed out twice, even after the job holding one is gone and the
  controller restarted (slot state from an earlier job must never look like the new job's);
* live jobs have distinct counter rows (`stat_idx`), multicast groups, generations, and
  non-overlapping slot ranges;
* a job has at most one pool per switch, and at most one retiring pool per switch: the pool a
  live resize moved it from (`begin_resize`), still installed and holding its slots until the
  controller sees that every host uses the new one (`finish_resize`); a retiring pool never
  overlaps any other pool or retiring pool of its switch, and keeps its own generation.

The store is put together from smaller pieces: the file and its transactions
(controller.store_file) at the schema of controller.store_schema, the records and their limits
(controller.records) kept as rows by controller.store_rows, and the record of live resizes
(controller.store_resize).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable

from controller import store_rows
from controller.errors import StoreError as StoreError
from controller.records import FIRST_JOB_MCAST_GROUP as FIRST_JOB_MCAST_GROUP
from controller.records import MAX_GENERATION as MAX_GENERATION
from controller.records import MAX_JOB_ID as MAX_JOB_ID
from controller.records import MAX_MCAST_GROUP, check_job
from controller.records import MAX_PORT as MAX_PORT
from controller.records import JobRecord as JobRecord
from controller.records import PoolRecord as PoolRecord
from controller.records import RetiringPool as RetiringPool
from controller.store_file import BUSY_TIMEOUT_S as BUSY_TIMEOUT_S
from controller.store_file import StoreFile
from controller.store_resize import ResizeRecords
from controller.store_schema import MIGRATABLE_VERSIONS as MIGRATABLE_VERSIONS
from controller.store_schema import SCHEMA_VERSION as SCHEMA_VERSION
from passing import protocol as P


class JobStore:
    """The job table in the SQLite file at `path` (created, with its schema, if missing)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._file = StoreFile(path)
        self._resizes = ResizeRecords(self._file)

    @property
    def path(self) -> str:
        return self._file.path

    def close(self) -> None:
        """Close the file; later calls raise StoreError. Closing twice is harmless."""
        self._file.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_generation(self, switch: str, floor: int = 0) -> int:
        """A generation for a new job on `switch`: larger than any this store handed out before
        and than `floor`.

        floor: the largest generation the switch itself is known to hold (its `job_config`
        entries). Slot state written under a generation must never look like a new job's, and
        this file is not the only memory of which generations were used: a lost or replaced
        state file restarts at 1 while the switch still holds entries, and slot state, under
        the old numbers.
        """
        if not 0 <= floor < MAX_GENERATION:
            raise StoreError(f"switch {switch}: generation floor {floor} outside "
                             f"0..{MAX_GENERATION - 1}")
        with self._file.write() as db:
            row = db.execute("SELECT last_gen FROM generations WHERE switch = ?",
                             (switch,)).fetchone()
            gen = max(0 if row is None else row[0], floor) + 1
            if gen > MAX_GENERATION:
                raise StoreError(f"switch {switch}: all {MAX_GENERATION} generations are used up")
            db.execute("INSERT INTO generations (switch, last_gen) VALUES (?, ?) "
                       "ON CONFLICT (switch) DO UPDATE SET last_gen = excluded.last_gen",
                       (switch, gen))
            return gen

    def free_stat_idx(self, switch: str, taken: Iterable[int] = ()) -> int:
        """The lowest counter row no live job uses on `switch`, and not in `taken` (rows the
        switch's own entries use, which this file may not know about).

        Nothing is reserved: two controllers asking at once get the same row, and add_job then
        refuses the second of them.
        """
        with self._file.read() as db:
            used = {row[0] for row in db.execute("SELECT stat_idx FROM pools WHERE switch = ?",
                                                 (switch,))} | set(taken)
        for idx in range(P.MAX_JOBS):
            if idx not in used:
                return idx
        raise StoreError(f"switch {switch}: all {P.MAX_JOBS} counter rows (stat_idx) are used by "
                         "live jobs or by entries on the switch")

    def free_mcast_group(self, switch: str, taken: Iterable[int] = ()) -> int:
        """The lowest multicast group id (from 2) no live job uses on `switch` and not in `taken`
        (groups the switch holds); nothing reserved."""
        with self._file.read() as db:
            used = {row[0] for row in db.execute("SELECT mcast_grp FROM pools WHERE switch = ?",
                                                 (switch,))} | set(taken)
        for grp in range(FIRST_JOB_MCAST_GROUP, MAX_MCAST_GROUP + 1):
            if grp not in used:
                return grp
        raise StoreError(f"switch {switch}: all multicast groups are used by live jobs "
                         "or by the switch")

    def add_job(self, job: JobRecord) -> None:
        """Record a new job and its pools, all or nothing."""
        check_job(job)
        spec_text = store_rows.encode_spec(job)
        with self._file.write() as db:
            if db.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job.job_id,)).fetchone():
                raise StoreError(f"job {job.job_id} already exists")
            for pool in (*job.pools, *job.retiring):
                store_rows.check_free_on_switch(db, job.job_id, pool)
            db.execute("INSERT INTO jobs (job_id, spec, created_at, pool_epoch, installing) "
                       "VALUES (?, ?, ?, ?, ?)", (job.job_id, spec_text, job.created_at,
                                                  job.pool_epoch, int(job.installing)))
            store_rows.insert_pools(db, job)

    # Live resizes, recorded step by step (controller.store_resize).
    def begin_resize(self, job_id: int, epoch: int, spec: dict,
                     pools: Iterable[PoolRecord]) -> JobRecord:
        """Move job `job_id`, found at pool epoch `epoch`, to `pools`: its current pools become
        retiring and it is marked installing (ResizeRecords.begin_resize)."""
        return self._resizes.begin_resize(job_id, epoch, spec, pools)

    def undo_resize(self, before: JobRecord) -> JobRecord:
        """Put back `before` if its resize is still what is recorded (ResizeRecords)."""
        return self._resizes.undo_resize(before)

    def resize_installed(self, job_id: int, epoch: int) -> JobRecord | None:
        """The resize to `epoch` is on every switch (ResizeRecords.resize_installed)."""
        return self._resizes.resize_installed(job_id, epoch)

    def finish_resize(self, job_id: int, epoch: int,
                      retiring: Iterable[RetiringPool] | None = None) -> tuple[RetiringPool, ...]:
        """Forget the job's retiring pools if still as read (ResizeRecords.finish_resize)."""
        return self._resizes.finish_resize(job_id, epoch, retiring)

    def update_spec(self, job_id: int, change: Callable[[dict], dict]) -> JobRecord:
        """Replace a job's spec by `change(spec as recorded)`, in one write transaction, so two
        controllers changing it at once cannot both start from the same spec (the policy
        number `job set` raises must never name two policies); its pools stay as they are.
        The job as now recorded; what `change` raises leaves the job as it was."""
        with self._file.write() as db:
            job = store_rows.load_job(db, job_id)
            if job is None:
                raise StoreError(f"no job {job_id}")
            new = dataclasses.replace(job, spec=change(job.spec))
            db.execute("UPDATE jobs SET spec = ? WHERE job_id = ?",
                       (store_rows.encode_spec(new), job_id))
            return new

    def remove_job(self, job_id: int) -> JobRecord:
        """Forget a job and return what was recorded; its generations stay used."""
        with self._file.write() as db:
            job = store_rows.load_job(db, job_id)
            if job is None:
                raise StoreError(f"no job {job_id}")
            db.execute("DELETE FROM retiring_pools WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM pools WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            return job

    def get_job(self, job_id: int) -> JobRecord | None:
        """The job, or None if there is none with this id."""
        with self._file.read() as db:
            return store_rows.load_job(db, job_id)

    def jobs(self) -> list[JobRecord]:
        """All jobs, by job_id."""
        with self._file.read() as db:
            ids = [row[0] for row in db.execute("SELECT job_id FROM jobs ORDER BY job_id")]
            jobs = [store_rows.load_job(db, job_id) for job_id in ids]
        return [job for job in jobs if job is not None]

    def pools_on(self, switch: str) -> dict[int, PoolRecord]:
        """job_id -> that job's pool on `switch`, by job_id."""
        with self._file.read() as db:
            rows = db.execute(f"SELECT job_id, {store_rows.POOL_COLUMNS} FROM pools "
                              "WHERE switch = ? ORDER BY job_id", (switch,)).fetchall()
        return {row[0]: store_rows.pool_from_row(row[1:]) for row in rows}

    def retiring_on(self, switch: str) -> dict[int, RetiringPool]:
        """job_id -> that job's retiring pool on `switch`, by job_id."""
        with self._file.read() as db:
            rows = db.execute(f"SELECT job_id, {store_rows.RETIRING_COLUMNS} FROM retiring_pools "
                              "WHERE switch = ? ORDER BY job_id", (switch,)).fetchall()
        return {row[0]: RetiringPool(*row[1:]) for row in rows}
