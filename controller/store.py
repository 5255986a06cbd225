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

Schema version 2 added the pool epoch and the retiring pools; a version 1 file is migrated when
opened (its jobs get epoch 0 and no retiring pool), and a controller that only knows version 1
refuses the migrated file instead of handing out the slots of retiring pools it cannot see.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from passing import protocol as P

SCHEMA_VERSION = 2
MIGRATABLE_VERSIONS = (1,)  # older versions this controller upgrades when it opens them
# Multicast group 1 is the L2 flooding group, so jobs start at 2; the P4 field is 16 bits.
FIRST_JOB_MCAST_GROUP = 2
MAX_MCAST_GROUP = 2**16 - 1
# gen is a 32-bit action parameter, and registers start at 0, which therefore must never be a
# live job's generation.
MAX_GENERATION = 2**32 - 1
MAX_JOB_ID = 2**16 - 1  # job_id is 16 bits on the wire
MAX_PORT = 2**9 - 1  # v1model ports are 9 bits
# How long a writer waits for another JobStore's transaction before giving up.
BUSY_TIMEOUT_S = 10.0

# What version 2 added to version 1; run as they are when a version 1 file is migrated.
_V2_STATEMENTS = (
    "ALTER TABLE jobs ADD COLUMN pool_epoch INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN installing INTEGER NOT NULL DEFAULT 0",
    """CREATE TABLE retiring_pools (
    job_id INTEGER NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    switch TEXT    NOT NULL,
    base   INTEGER NOT NULL,
    size   INTEGER NOT NULL,
    gen    INTEGER NOT NULL,
    bit    INTEGER NOT NULL,
    PRIMARY KEY (job_id, switch),
    UNIQUE (switch, gen)
)""",
)

# Version 1, which a new file starts from before it is migrated like an old one: one path.
_SCHEMA_V1 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE jobs (
    job_id     INTEGER PRIMARY KEY,
    spec       TEXT    NOT NULL,
    created_at REAL    NOT NULL
);
CREATE TABLE pools (
    job_id      INTEGER NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    position    INTEGER NOT NULL,
    switch      TEXT    NOT NULL,
    base        INTEGER NOT NULL,
    size        INTEGER NOT NULL,
    gen         INTEGER NOT NULL,
    stat_idx    INTEGER NOT NULL,
    mcast_grp   INTEGER NOT NULL,
    fan_in      INTEGER NOT NULL,
    is_root     INTEGER NOT NULL,
    uplink_port INTEGER NOT NULL,
    PRIMARY KEY (job_id, switch),
    UNIQUE (switch, gen),
    UNIQUE (switch, stat_idx),
    UNIQUE (switch, mcast_grp)
);
CREATE TABLE generations (
    switch   TEXT    PRIMARY KEY,
    last_gen INTEGER NOT NULL
);
"""

_POOL_COLUMNS = "switch, base, size, gen, stat_idx, mcast_grp, fan_in, is_root, uplink_port"
_RETIRING_COLUMNS = "switch, base, size, gen, bit"


@dataclass(frozen=True)
class PoolRecord:
    """One job's resources on one switch, as written into its `job_config` entry."""

    switch: str
    base: int
    size: int  # the job's window (controller.job_plan.JobSpec); a column of the state file
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


class StoreError(Exception):
    """The store refused an operation, or the file is not a job store it can read."""


class JobStore:
    """The job table in the SQLite file at `path` (created, with its schema, if missing)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        # Transactions are issued explicitly (isolation_level=None) so that each method decides
        # where its transaction starts; the lock makes one object safe to share between threads.
        self._lock = threading.RLock()
        try:
            self._db: sqlite3.Connection | None = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open job store {self.path}: {e}") from e
        try:
            self._open()
        except BaseException:
            self._db.close()
            self._db = None
            raise

    @staticmethod
    def _set_wal(db: sqlite3.Connection) -> None:
        """Switching a new file to WAL takes an exclusive lock and, while another store races
        to create the same file, fails at once with "database is locked" instead of waiting
        on the busy timeout: retried here until that timeout."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _open(self) -> None:
        db = self._conn()
        try:
            # WAL lets readers in other JobStores proceed while one writes; FULL makes every
            # commit durable, which is the point of this store.
            self._set_wal(db)
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA foreign_keys=ON")
            with self._write() as db:
                tables = {row[0] for row in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'")}
                if not tables:
                    # Statement by statement: executescript() would commit the open transaction
                    # first, and a second JobStore could then see a half-created schema.
                    for statement in _SCHEMA_V1.split(";"):
                        if statement.strip():
                            db.execute(statement)
                    db.execute("INSERT INTO schema_version (version) VALUES (1)")
                elif "schema_version" not in tables:
                    raise StoreError(f"{self.path} is an SQLite database but not a PASSING job "
                                     "store (it has no schema_version table)")
                versions = [row[0] for row in db.execute("SELECT version FROM schema_version")]
                if versions == [1]:
                    # In the same transaction as the check: two stores opening an old file at
                    # once migrate it once (the second sees version 2), and a failure leaves
                    # version 1 as it was.
                    for statement in _V2_STATEMENTS:
                        db.execute(statement)
                    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
                    versions = [SCHEMA_VERSION]
        except sqlite3.DatabaseError as e:
            raise StoreError(f"cannot open job store {self.path}: {e}") from e
        if versions != [SCHEMA_VERSION]:
            found = versions[0] if len(versions) == 1 else f"unreadable ({versions!r})"
            raise StoreError(f"job store {self.path} has schema version {found}; this controller "
                             f"understands only version {SCHEMA_VERSION} and migrates version "
                             f"{', '.join(map(str, MIGRATABLE_VERSIONS))} (a newer controller "
                             "wrote it, or it is damaged); use a matching controller or a fresh "
                             "file")

    def close(self) -> None:
        """Close the file; later calls raise StoreError. Closing twice is harmless."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

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
        with self._write() as db:
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
        with self._read() as db:
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
        with self._read() as db:
            used = {row[0] for row in db.execute("SELECT mcast_grp FROM pools WHERE switch = ?",
                                                 (switch,))} | set(taken)
        for grp in range(FIRST_JOB_MCAST_GROUP, MAX_MCAST_GROUP + 1):
            if grp not in used:
                return grp
        raise StoreError(f"switch {switch}: all multicast groups are used by live jobs "
                         "or by the switch")

    def add_job(self, job: JobRecord) -> None:
        """Record a new job and its pools, all or nothing."""
        _check_job(job)
        spec_text = _encode_spec(job)
        with self._write() as db:
            if db.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job.job_id,)).fetchone():
                raise StoreError(f"job {job.job_id} already exists")
            for pool in (*job.pools, *job.retiring):
                self._check_free_on_switch(db, job.job_id, pool)
            db.execute("INSERT INTO jobs (job_id, spec, created_at, pool_epoch, installing) "
                       "VALUES (?, ?, ?, ?, ?)", (job.job_id, spec_text, job.created_at,
                                                  job.pool_epoch, int(job.installing)))
            _insert_pools(db, job)

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
        with self._write() as db:
            job = _load_job(db, job_id)
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
            retiring = tuple(RetiringPool(p.switch, p.base, p.size, p.gen, job.pool_bit)
                             for p in job.pools)
            new = JobRecord(job_id, _resized(job.spec, spec), pools, job.created_at, epoch + 1,
                            retiring, installing=True)
            _check_job(new)
            self._replace(db, new, job)
            return new

    def undo_resize(self, before: JobRecord) -> JobRecord:
        """Put back `before`, the job as it was before `begin_resize`, if that resize is still
        what is recorded (epoch before.pool_epoch + 1); the job as now recorded. Of the spec
        only the window and min_window go back: a `job set` made meanwhile is kept."""
        with self._write() as db:
            job = _load_job(db, before.job_id)
            if job is None:
                raise StoreError(f"no job {before.job_id}")
            if job.pool_epoch == before.pool_epoch + 1:
                restored = dataclasses.replace(before, spec=_resized(job.spec, before.spec))
                self._replace(db, restored, job)
                return restored
            return job

    def resize_installed(self, job_id: int, epoch: int) -> JobRecord | None:
        """The entries of job `job_id`'s resize to `epoch` are on every switch: agents are
        handed the new pool from now on. The job as now recorded (None if gone)."""
        with self._write() as db:
            db.execute("UPDATE jobs SET installing = 0 WHERE job_id = ? AND pool_epoch = ?",
                       (job_id, epoch))
            return _load_job(db, job_id)

    def finish_resize(self, job_id: int, epoch: int,
                      retiring: Iterable[RetiringPool] | None = None) -> tuple[RetiringPool, ...]:
        """Forget job `job_id`'s retiring pools, freeing their slots, if its epoch is still
        `epoch`, that resize is installed and (when given) its retiring pools are still
        `retiring`, the ones the caller deleted on the switches; the pools forgotten (none if
        the job is gone, at another epoch, still installing, or had none). A caller whose
        reading is out of date thus frees nothing another controller has since recorded."""
        with self._write() as db:
            job = _load_job(db, job_id)
            if job is None or job.pool_epoch != epoch or job.installing:
                return ()
            if retiring is not None and set(job.retiring) != set(retiring):
                return ()
            db.execute("DELETE FROM retiring_pools WHERE job_id = ?", (job_id,))
            return job.retiring

    def _replace(self, db: sqlite3.Connection, new: JobRecord, old: JobRecord) -> None:
        """Rewrite job `old` as `new` (same id), checking `new`'s pools against every other
        job's."""
        db.execute("DELETE FROM retiring_pools WHERE job_id = ?", (old.job_id,))
        db.execute("DELETE FROM pools WHERE job_id = ?", (old.job_id,))
        for pool in (*new.pools, *new.retiring):
            self._check_free_on_switch(db, new.job_id, pool)
        db.execute("UPDATE jobs SET spec = ?, pool_epoch = ?, installing = ? WHERE job_id = ?",
                   (_encode_spec(new), new.pool_epoch, int(new.installing), new.job_id))
        _insert_pools(db, new)

    def update_spec(self, job_id: int, change: Callable[[dict], dict]) -> JobRecord:
        """Replace a job's spec by `change(spec as recorded)`, in one write transaction, so two
        controllers changing it at once cannot both start from the same spec (the policy
        number `job set` raises must never name two policies); its pools stay as they are.
        The job as now recorded; what `change` raises leaves the job as it was."""
        with self._write() as db:
            job = _load_job(db, job_id)
            if job is None:
                raise StoreError(f"no job {job_id}")
            new = dataclasses.replace(job, spec=change(job.spec))
            db.execute("UPDATE jobs SET spec = ? WHERE job_id = ?", (_encode_spec(new), job_id))
            return new

    def remove_job(self, job_id: int) -> JobRecord:
        """Forget a job and return what was recorded; its generations stay used."""
        with self._write() as db:
            job = _load_job(db, job_id)
            if job is None:
                raise StoreError(f"no job {job_id}")
            db.execute("DELETE FROM retiring_pools WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM pools WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            return job

    def get_job(self, job_id: int) -> JobRecord | None:
        """The job, or None if there is none with this id."""
        with self._read() as db:
            return _load_job(db, job_id)

    def jobs(self) -> list[JobRecord]:
        """All jobs, by job_id."""
        with self._read() as db:
            ids = [row[0] for row in db.execute("SELECT job_id FROM jobs ORDER BY job_id")]
            jobs = [_load_job(db, job_id) for job_id in ids]
        return [job for job in jobs if job is not None]

    def pools_on(self, switch: str) -> dict[int, PoolRecord]:
        """job_id -> that job's pool on `switch`, by job_id."""
        with self._read() as db:
            rows = db.execute(f"SELECT job_id, {_POOL_COLUMNS} FROM pools WHERE switch = ? "
                              "ORDER BY job_id", (switch,)).fetchall()
        return {row[0]: _pool_from_row(row[1:]) for row in rows}

    def retiring_on(self, switch: str) -> dict[int, RetiringPool]:
        """job_id -> that job's retiring pool on `switch`, by job_id."""
        with self._read() as db:
            rows = db.execute(f"SELECT job_id, {_RETIRING_COLUMNS} FROM retiring_pools "
                              "WHERE switch = ? ORDER BY job_id", (switch,)).fetchall()
        return {row[0]: RetiringPool(*row[1:]) for row in rows}

    def _check_free_on_switch(self, db: sqlite3.Connection, job_id: int,
                              pool: PoolRecord | RetiringPool) -> None:
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
                raise StoreError(f"{where}: slots {_slots(pool.base, pool.size)} overlap job "
                                 f"{row[0]}'s {what} {_slots(row[1], row[2])}")

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"job store {self.path} is closed")
        return self._db

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock before the first read, so a read-then-write (such as
        # next_generation) cannot interleave with another JobStore's.
        with self._transaction("BEGIN IMMEDIATE") as db:
            yield db

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        # One read transaction gives a consistent snapshot across the several SELECTs of a job.
        with self._transaction("BEGIN") as db:
            yield db

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            db = self._conn()
            try:
                db.execute(begin)
            except sqlite3.Error as e:
                raise StoreError(f"job store {self.path}: cannot start a transaction: {e}") from e
            try:
                yield db
            except BaseException as e:
                # SQLite has already rolled back by itself after some errors (a full disk, say).
                if db.in_transaction:
                    db.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise StoreError(f"job store {self.path}: {e}") from e
                raise
            else:
                try:
                    db.execute("COMMIT")
                except sqlite3.Error as e:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise StoreError(f"job store {self.path}: commit failed: {e}") from e


def _check_job(job: JobRecord) -> None:
    """Refuse records that could not be written into the pipeline as they are."""
    if not 0 <= job.job_id <= MAX_JOB_ID:
        raise StoreError(f"job {job.job_id}: job_id must be in 0..{MAX_JOB_ID}")
    switches = [pool.switch for pool in job.pools]
    repeated = sorted({s for s in switches if switches.count(s) > 1})
    if repeated:
        raise StoreError(f"job {job.job_id} has more than one pool on switch {repeated[0]}")
    for pool in job.pools:
        where = f"job {job.job_id} on switch {pool.switch}"
        checks: list[tuple[bool, str]] = [
            (pool.size >= 1 and pool.base >= 0 and pool.base + pool.size <= P.SLOT_CAPACITY,
             f"slots {_slots(pool.base, pool.size)} must be a non-empty range within "
             f"0..{P.SLOT_CAPACITY - 1}"),
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
    if job.installing and not job.retiring:
        raise StoreError(f"job {job.job_id}: a resize being installed keeps its old pools")
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
             f"retiring slots {_slots(r.base, r.size)} must be a non-empty range within "
             f"0..{P.SLOT_CAPACITY - 1}"),
            (1 <= r.gen <= MAX_GENERATION, f"gen {r.gen} must be in 1..{MAX_GENERATION}"),
        ]
        if pool is not None:
            checks += [(r.gen != pool.gen, f"retiring pool and pool share gen {r.gen}"),
                       (r.base + r.size <= pool.base or pool.base + pool.size <= r.base,
                        f"retiring slots {_slots(r.base, r.size)} overlap the job's slots "
                        f"{_slots(pool.base, pool.size)}")]
        seen.add(r.switch)
        for ok, problem in checks:
            if not ok:
                raise StoreError(f"{where}: {problem}")


_RESIZED = ("window", "min_window")  # what a resize changes in a job's spec


def _resized(now: dict, resize: dict) -> dict:
    """Spec `now` with the window and min_window of `resize` (absent where it has none)."""
    out = {k: v for k, v in now.items() if k not in _RESIZED}
    return out | {k: resize[k] for k in _RESIZED if k in resize}


def _encode_spec(job: JobRecord) -> str:
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


def _load_job(db: sqlite3.Connection, job_id: int) -> JobRecord | None:
    row = db.execute("SELECT spec, created_at, pool_epoch, installing FROM jobs "
                     "WHERE job_id = ?", (job_id,)).fetchone()
    if row is None:
        return None
    spec_text, created_at, epoch, installing = row
    pools = db.execute(f"SELECT {_POOL_COLUMNS} FROM pools WHERE job_id = ? ORDER BY position",
                       (job_id,)).fetchall()
    retiring = db.execute(f"SELECT {_RETIRING_COLUMNS} FROM retiring_pools WHERE job_id = ? "
                          "ORDER BY rowid", (job_id,)).fetchall()
    spec: Any = json.loads(spec_text)
    return JobRecord(job_id=job_id, spec=spec, pools=tuple(_pool_from_row(p) for p in pools),
                     created_at=created_at, pool_epoch=epoch,
                     retiring=tuple(RetiringPool(*r) for r in retiring),
                     installing=bool(installing))


def _insert_pools(db: sqlite3.Connection, job: JobRecord) -> None:
    """The rows of the job's pools and retiring pools (none of them there yet)."""
    for position, pool in enumerate(job.pools):
        db.execute(f"INSERT INTO pools (job_id, position, {_POOL_COLUMNS}) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (job.job_id, position, pool.switch, pool.base, pool.size, pool.gen,
                    pool.stat_idx, pool.mcast_grp, pool.fan_in, int(pool.is_root),
                    pool.uplink_port))
    for r in job.retiring:
        db.execute(f"INSERT INTO retiring_pools (job_id, {_RETIRING_COLUMNS}) "
                   "VALUES (?, ?, ?, ?, ?, ?)", (job.job_id, r.switch, r.base, r.size, r.gen,
                                                 r.bit))
    for pool in (*job.pools, *job.retiring):
        # A generation the caller chose itself still counts as handed out, so that
        # next_generation never returns it again.
        db.execute("INSERT INTO generations (switch, last_gen) VALUES (?, ?) "
                   "ON CONFLICT (switch) DO UPDATE "
                   "SET last_gen = max(last_gen, excluded.last_gen)", (pool.switch, pool.gen))


def _pool_from_row(row: tuple[Any, ...]) -> PoolRecord:
    switch, base, size, gen, stat_idx, mcast_grp, fan_in, is_root, uplink_port = row
    return PoolRecord(switch=switch, base=base, size=size, gen=gen, stat_idx=stat_idx,
                      mcast_grp=mcast_grp, fan_in=fan_in, is_root=bool(is_root),
                      uplink_port=uplink_port)


def _slots(base: int, size: int) -> str:
    return f"{base}-{base + size - 1} ({size})"
