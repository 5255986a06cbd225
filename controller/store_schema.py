"""The tables of the job store's file, and the upgrade of a file an older controller wrote.

Schema version 2 added the pool epoch and the retiring pools; a version 1 file is migrated when
opened (its jobs get epoch 0 and no retiring pool), and a controller that only knows version 1
refuses the migrated file instead of handing out the slots of retiring pools it cannot see.
"""

from __future__ import annotations

import sqlite3

from controller.errors import StoreError

SCHEMA_VERSION = 2
MIGRATABLE_VERSIONS = (1,)  # older versions this controller upgrades when it opens them

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


def create_or_migrate(db: sqlite3.Connection, path: str) -> list[int]:
    """Inside a write transaction on the file at `path`: the tables of a new file, or those a
    version 1 file lacks; the versions the file then says it has."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        # Statement by statement: executescript() would commit the open transaction first, and
        # a second JobStore could then see a half-created schema.
        for statement in _SCHEMA_V1.split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute("INSERT INTO schema_version (version) VALUES (1)")
    elif "schema_version" not in tables:
        raise StoreError(f"{path} is an SQLite database but not a PASSING job store (it has no "
                         "schema_version table)")
    versions = [row[0] for row in db.execute("SELECT version FROM schema_version")]
    if versions == [1]:
        # In the same transaction as the check: two stores opening an old file at once migrate
        # it once (the second sees version 2), and a failure leaves version 1 as it was.
        for statement in _V2_STATEMENTS:
            db.execute(statement)
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        versions = [SCHEMA_VERSION]
    return versions


def check_version(versions: list[int], path: str) -> None:
    """Refuse a file of any version but this controller's."""
    if versions != [SCHEMA_VERSION]:
        found = versions[0] if len(versions) == 1 else f"unreadable ({versions!r})"
        raise StoreError(f"job store {path} has schema version {found}; this controller "
                         f"understands only version {SCHEMA_VERSION} and migrates version "
                         f"{', '.join(map(str, MIGRATABLE_VERSIONS))} (a newer controller "
                         "wrote it, or it is damaged); use a matching controller or a fresh "
                         "file")
