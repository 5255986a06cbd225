"""The job store's record of live resizes: a job moved to new pools while its old ones retire,
the move put back when it could not be installed, and the old pools forgotten once every host
has left them (controller.resize does the switches' side)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from controller import store_rows
from controller.errors import StoreError
from controller.records import JobRecord, PoolRecord, RetiringPool, check_job
from controller.store_file import StoreFile

# What a resize changes in a job's spec: a shrink for waiting jobs records what the job had
# asked for (asked_window), any other resize forgets it.
_RESIZED = ("window", "min_window", "asked_window")


def _resized(now: dict, resize: dict) -> dict:
    """Spec `now` with the window, min_window and asked_window of `resize` (absent where it
    has none)."""
    out = {k: v for k, v in now.items() if k not in _RESIZED}
    return out | {k: resize[k] for k in _RESIZED if k in resize}


class ResizeRecords:
    """The resizes of the jobs in `file`, each step one write transaction."""

    def __init__(self, file: StoreFile) -> None:
        self._file = file

    def begin_resize(self, job_id: int, epoch: int, spec: dict,
                     pools: Iterable[PoolRecord]) -> JobRecord:
        """Move job `job_id`, found at pool epoch `epoch`, to `pools` (one per switch it has):
        its current pools become retiring (under FLAG_POOL epoch & 1), the epoch goes up by one,
        its spec takes `spec`'s window and min_window (the rest stays as recorded now: a `job
        set` made while the caller planned is kept), and the job is marked installing until
        `resize_installed`; the job as now recorded. Refused when the job has
        retiring pools, was resized meanwhile (its epoch is no longer `epoch`), or when a new
        pool is on another switch, overlaps any pool of its switch (the job's own current one
        included) or reuses a generation."""
        pools = tuple(pools)
        with self._file.write() as db:
            job = store_rows.load_job(db, job_id)
            if job is None:
                raise StoreError(f"no job {job_id}")
            if job.pool_epoch != epoch:
                raise StoreError(f"job {job_id} was resized meanwhile (pool epoch {epoch} is "
                                 f"now {job.pool_epoch}); look again and repeat")
            if job.retiring:
                raise StoreError(f"job {job_id} still has retiring pools on "
                                 f"{', '.join(r.switch for r in job.retiring)}")
            if sorted(p.switch for p in pools) != sorted(p.switch for p in job.pools):
                raise StoreError(f"job {job_id}: a resize keeps the job's switches "
                                 f"({', '.join(p.switch for p in job.pools)})")
            # A job that waited for slots has none to retire.
            retiring = tuple(RetiringPool(p.switch, p.base, p.size, p.gen, job.pool_bit)
                             for p in job.pools if p.size)
            new = JobRecord(job_id, _resized(job.spec, spec), pools, job.created_at, epoch + 1,
                            retiring, installing=True)
            check_job(new)
            store_rows.replace_job(db, new, job)
            return new

    def undo_resize(self, before: JobRecord) -> JobRecord:
        """Put back `before`, the job as it was before `begin_resize`, if that resize is still
        what is recorded (epoch before.pool_epoch + 1); the job as now recorded. Of the spec
        only the window and min_window go back: a `job set` made meanwhile is kept."""
        with self._file.write() as db:
            job = store_rows.load_job(db, before.job_id)
            if job is None:
                raise StoreError(f"no job {before.job_id}")
            if job.pool_epoch == before.pool_epoch + 1:
                restored = dataclasses.replace(before, spec=_resized(job.spec, before.spec))
                store_rows.replace_job(db, restored, job)
                return restored
            return job

    def resize_installed(self, job_id: int, epoch: int) -> JobRecord | None:
        """The entries of job `job_id`'s resize to `epoch` are on every switch: agents are
        handed the new pool from now on. The job as now recorded (None if gone)."""
        with self._file.write() as db:
            db.execute("UPDATE jobs SET installing = 0 WHERE job_id = ? AND pool_epoch = ?",
                       (job_id, epoch))
            return store_rows.load_job(db, job_id)

    def finish_resize(self, job_id: int, epoch: int,
                      retiring: Iterable[RetiringPool] | None = None) -> tuple[RetiringPool, ...]:
        """Forget job `job_id`'s retiring pools, freeing their slots, if its epoch is still
        `epoch`, that resize is installed and (when given) its retiring pools are still
        `retiring`, the ones the caller deleted on the switches; the pools forgotten (none if
        the job is gone, at another epoch, still installing, or had none). A caller whose
        reading is out of date thus frees nothing another controller has since recorded."""
        with self._file.write() as db:
            job = store_rows.load_job(db, job_id)
            if job is None or job.pool_epoch != epoch or job.installing:
                return ()
            if retiring is not None and set(job.retiring) != set(retiring):
                return ()
            db.execute("DELETE FROM retiring_pools WHERE job_id = ?", (job_id,))
            return job.retiring
