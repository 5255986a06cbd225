"""The job store's SQLite file: opened at the current schema, every commit durable, and read
and write transactions that leave the file as it was when anything in them fails.

Several StoreFile objects, in one process or several, may share a file; each sees the others'
committed changes, and writers are serialised by SQLite's file lock."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator

from controller import store_schema
from controller.errors import StoreError

# How long a writer waits for another JobStore's transaction before giving up.
BUSY_TIMEOUT_S = 10.0


class StoreFile:
    """The SQLite file at `path` (created, with its schema, if missing)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        # Transactions are issued explicitly (isolation_level=None) so that each caller decides
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
            with self.write() as db:
                versions = store_schema.create_or_migrate(db, self.path)
        except sqlite3.DatabaseError as e:
            raise StoreError(f"cannot open job store {self.path}: {e}") from e
        store_schema.check_version(versions, self.path)

    def close(self) -> None:
        """Close the file; later calls raise StoreError. Closing twice is harmless."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"job store {self.path} is closed")
        return self._db

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A transaction that may write, committed when the block ends."""
        # IMMEDIATE takes the write lock before the first read, so a read-then-write (such as
        # next_generation) cannot interleave with another JobStore's.
        with self._transaction("BEGIN IMMEDIATE") as db:
            yield db

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A transaction that only reads."""
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
