"""The durable job table: round trips, restarts, per-switch uniqueness, atomicity, sharing."""

import dataclasses
import sqlite3
import threading

import pytest

from controller import store_rows
from controller.store import JobRecord, JobStore, PoolRecord, RetiringPool, StoreError
from passing import protocol as P


def pool(switch: str = "tor1", **fields) -> PoolRecord:
    values = dict(base=0, size=64, gen=1, stat_idx=0, mcast_grp=2, fan_in=4, is_root=False,
                  uplink_port=5)
    values.update(fields)
    return PoolRecord(switch=switch, **values)


def job(job_id: int = 7, *pools: PoolRecord, spec: dict | None = None) -> JobRecord:
    return JobRecord(job_id=job_id,
                     spec=spec if spec is not None else {"hosts": {"tor1": ["h1", "h2"]}},
                     pools=pools or (pool(),), created_at=1_700_000_000.125)


def two_level_job(job_id: int = 7) -> JobRecord:
    return job(job_id,
               pool("spine", base=512, size=128, gen=3, stat_idx=1, mcast_grp=4, fan_in=2,
                    is_root=True, uplink_port=0),
               pool("tor1", base=0, size=128, gen=1, stat_idx=0, mcast_grp=2, fan_in=3,
                    uplink_port=9),
               spec={"hosts": {"tor1": ["h1", "h2", "h3"], "tor2": ["h4"]}, "window": 16,
                     "K": P.K, "scale": {"exp_bias": 130, "clip": 1.5}, "note": None})


@pytest.fixture
def path(tmp_path):
    return tmp_path / "jobs.sqlite"


@pytest.fixture
def store(path):
    s = JobStore(path)
    yield s
    s.close()


def test_round_trip_of_a_job_with_two_pools(store):
    j = two_level_job()
    store.add_job(j)
    assert store.get_job(7) == j
    assert store.get_job(7).pools[0].is_root is True  # a bool again, not SQLite's 1
    assert store.jobs() == [j]
    assert store.pools_on("tor1") == {7: j.pools[1]}
    assert store.pools_on("spine") == {7: j.pools[0]}
    assert store.pools_on("tor2") == {}
    assert store.get_job(8) is None


def test_file_is_in_wal_mode(store, path):
    store.add_job(job())
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_restart_keeps_everything(path):
    first = JobStore(path)
    jobs = [two_level_job(7), job(3, pool("tor2", gen=2, stat_idx=5, mcast_grp=9))]
    for j in jobs:
        first.add_job(j)
    assert first.next_generation("tor2") == 3
    first.close()

    again = JobStore(path)
    assert again.jobs() == sorted(jobs, key=lambda j: j.job_id)
    assert again.pools_on("tor2") == {3: jobs[1].pools[0]}
    assert again.next_generation("tor2") == 4
    again.close()


def test_generations_are_monotonic_and_never_reused(path):
    s = JobStore(path)
    assert [s.next_generation("tor1") for _ in range(3)] == [1, 2, 3]
    assert s.next_generation("spine") == 1
    s.add_job(job(7, pool("tor1", gen=3)))
    s.remove_job(7)
    s.close()

    s = JobStore(path)
    assert s.next_generation("tor1") == 4
    # A generation the caller picked itself is taken into account as well.
    s.add_job(job(8, pool("tor1", gen=40)))
    s.close()
    s = JobStore(path)
    assert s.next_generation("tor1") == 41
    assert s.next_generation("spine") == 2
    s.close()


def test_stat_idx_and_mcast_group_are_lowest_free_and_reused_after_remove(store):
    assert store.free_stat_idx("tor1") == 0
    assert store.free_mcast_group("tor1") == 2
    store.add_job(job(1, pool(gen=1, stat_idx=0, mcast_grp=2, base=0)))
    store.add_job(job(2, pool(gen=2, stat_idx=1, mcast_grp=3, base=64)))
    store.add_job(job(3, pool(gen=3, stat_idx=2, mcast_grp=4, base=128)))
    assert (store.free_stat_idx("tor1"), store.free_mcast_group("tor1")) == (3, 5)
    store.remove_job(2)
    assert (store.free_stat_idx("tor1"), store.free_mcast_group("tor1")) == (1, 3)
    # Other switches are independent.
    assert (store.free_stat_idx("tor2"), store.free_mcast_group("tor2")) == (0, 2)
    store.add_job(job(4, pool(gen=4, stat_idx=1, mcast_grp=3, base=64)))
    assert store.free_stat_idx("tor1") == 3


def test_generation_floor_keeps_a_new_file_above_what_the_switch_holds(store):
    # A fresh file would hand out 1; the switch still holds a job under generation 7.
    assert store.next_generation("tor1", floor=7) == 8
    assert store.next_generation("tor1") == 9  # the floor's effect is remembered
    assert store.next_generation("tor1", floor=3) == 10  # a lower floor changes nothing
    assert store.next_generation("tor2", floor=0) == 1
    with pytest.raises(StoreError, match="floor"):
        store.next_generation("tor1", floor=2**32 - 1)
    assert store.next_generation("tor1") == 11  # a refused call used nothing up


def test_rows_and_groups_the_switch_holds_are_not_handed_out(store):
    store.add_job(job(1, pool(gen=1, stat_idx=0, mcast_grp=2)))
    assert store.free_stat_idx("tor1", taken={1, 2}) == 3
    assert store.free_mcast_group("tor1", taken=[1, 3]) == 4


def test_all_counter_rows_used(store):
    for i in range(P.MAX_JOBS):
        store.add_job(job(i, pool(gen=i + 1, stat_idx=i, mcast_grp=i + 2, base=i, size=1)))
    with pytest.raises(StoreError, match=r"switch tor1: all 256 counter rows \(stat_idx\) are "
                                         "used by live jobs"):
        store.free_stat_idx("tor1")
    assert store.free_mcast_group("tor1") == P.MAX_JOBS + 2


def test_duplicate_id_leaves_store_intact(store):
    original = two_level_job(7)
    store.add_job(original)
    gen_before = store.next_generation("tor9")
    duplicate = job(7, pool("tor9", gen=500, stat_idx=9, mcast_grp=99), spec={"other": 1})
    with pytest.raises(StoreError) as e:
        store.add_job(duplicate)
    assert str(e.value) == "job 7 already exists"
    assert store.jobs() == [original]
    assert store.pools_on("tor9") == {}
    assert store.next_generation("tor9") == gen_before + 1  # gen 500 was not recorded


def test_failure_in_the_middle_of_add_rolls_back(store, monkeypatch):
    store.add_job(job(1, pool("spine", stat_idx=3, mcast_grp=2, gen=1)))
    # Skip the friendly checks so that the second pool fails on the UNIQUE constraint after the
    # job row and the first pool have been written.
    monkeypatch.setattr(store_rows, "check_free_on_switch", lambda *args: None)
    clash = job(2, pool("tor1", gen=7, stat_idx=0, mcast_grp=2),
                pool("spine", gen=8, stat_idx=3, mcast_grp=5, base=100))
    with pytest.raises(StoreError, match="UNIQUE constraint failed"):
        store.add_job(clash)
    assert store.get_job(2) is None
    assert store.pools_on("tor1") == {}
    assert store.next_generation("tor1") == 1


@pytest.mark.parametrize("fields, message", [
    (dict(gen=1, base=100), "job 8 on switch tor1: gen 1 is already used by job 7"),
    (dict(stat_idx=0, base=100), "job 8 on switch tor1: stat_idx 0 is already used by job 7"),
    (dict(mcast_grp=2, base=100), "job 8 on switch tor1: mcast_grp 2 is already used by job 7"),
    (dict(base=63, size=10), "job 8 on switch tor1: slots 63-72 (10) overlap job 7's slots "
                             "0-63 (64)"),
])
def test_collision_with_a_live_job_on_the_same_switch(store, fields, message):
    store.add_job(job(7, pool()))
    values = dict(gen=2, stat_idx=1, mcast_grp=3, base=64)
    values.update(fields)
    with pytest.raises(StoreError) as e:
        store.add_job(job(8, pool(**values)))
    assert str(e.value) == message
    assert [j.job_id for j in store.jobs()] == [7]
    # The same values on another switch are fine.
    store.add_job(job(8, pool("tor2", **values)))


@pytest.mark.parametrize("fields, problem", [
    (dict(base=8, size=0), "slots 8-7 (0) must be a non-empty range within 0..4095 (or none, "
     "base 0, while the job waits)"),
    (dict(base=4090, size=7), "slots 4090-4096 (7) must be a non-empty range within 0..4095 (or "
     "none, base 0, while the job waits)"),
    (dict(gen=0), "gen 0 must be in 1..4294967295"),
    (dict(stat_idx=256), "stat_idx 256 must be in 0..255"),
    (dict(mcast_grp=1), "mcast_grp 1 must be in 2..65535 (group 1 is L2 flooding)"),
    (dict(fan_in=65), "fan_in 65 must be in 1..64"),
    (dict(uplink_port=512), "uplink_port 512 must be in 0..511"),
    (dict(is_root=True, uplink_port=3), "a root has no uplink, but uplink_port is 3"),
])
def test_invalid_pools_are_refused(store, fields, problem):
    with pytest.raises(StoreError) as e:
        store.add_job(job(7, pool(**fields)))
    assert str(e.value) == f"job 7 on switch tor1: {problem}"
    assert store.jobs() == []


def test_one_pool_per_switch_and_job_id_range(store):
    with pytest.raises(StoreError, match="job 7 has more than one pool on switch tor1"):
        store.add_job(job(7, pool(), pool(base=100, gen=2, stat_idx=1, mcast_grp=3)))
    with pytest.raises(StoreError, match=r"job 65536: job_id must be in 0..65535"):
        store.add_job(job(65536))
    assert store.jobs() == []


@pytest.mark.parametrize("spec", [
    {"hosts": ("h1", "h2")},  # would come back as a list
    {1: "rack"},  # would come back with the key "1"
    {"window": float("nan")},
    {"hosts": {"h1"}},
])
def test_spec_must_survive_json(store, spec):
    with pytest.raises(StoreError, match="job 7: spec"):
        store.add_job(job(7, spec=spec))
    assert store.jobs() == []


def test_remove_returns_the_record(store):
    j = two_level_job(7)
    store.add_job(j)
    assert store.remove_job(7) == j
    assert store.get_job(7) is None
    assert store.pools_on("tor1") == {}
    with pytest.raises(StoreError) as e:
        store.remove_job(7)
    assert str(e.value) == "no job 7"


def test_jobs_are_sorted_by_id(store):
    for job_id, base in ((9, 0), (2, 64), (5, 128)):
        store.add_job(job(job_id, pool(base=base, gen=job_id, stat_idx=job_id,
                                       mcast_grp=job_id + 2)))
    assert [j.job_id for j in store.jobs()] == [2, 5, 9]
    assert list(store.pools_on("tor1")) == [2, 5, 9]


def test_unknown_schema_version_is_refused(path):
    JobStore(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE schema_version SET version = 3")
    raw.close()
    with pytest.raises(StoreError, match=r"has schema version 3; this controller understands "
                                         r"only version 2 and migrates version 1"):
        JobStore(path)


def test_foreign_files_are_refused(tmp_path):
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as raw:
        raw.execute("CREATE TABLE t (x)")
    raw.close()
    with pytest.raises(StoreError, match="not a PASSING job store"):
        JobStore(other)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open job store"):
        JobStore(garbage)


def test_closed_store_refuses_use(path):
    with JobStore(path) as s:
        s.add_job(job())
    with pytest.raises(StoreError, match="is closed"):
        s.jobs()
    s.close()  # closing again is harmless


def test_two_stores_on_one_file_see_each_others_commits(path):
    a, b = JobStore(path), JobStore(path)
    try:
        a.add_job(two_level_job(7))
        assert b.get_job(7) == two_level_job(7)
        assert b.free_stat_idx("tor1") == 1
        assert [a.next_generation("tor1"), b.next_generation("tor1"),
                a.next_generation("tor1")] == [2, 3, 4]
        b.add_job(job(8, pool("tor1", base=200, gen=4, stat_idx=1, mcast_grp=3)))
        with pytest.raises(StoreError, match="stat_idx 1 is already used by job 8"):
            a.add_job(job(9, pool("tor1", base=300, gen=5, stat_idx=1, mcast_grp=4)))
        b.remove_job(7)
        assert a.get_job(7) is None
        assert [j.job_id for j in a.jobs()] == [8]
    finally:
        a.close()
        b.close()


def test_generations_are_unique_under_concurrent_writers(path):
    # The stores also race to create the schema of the new file.
    results: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker():
        try:
            with JobStore(path) as s:
                gens = [s.next_generation("tor1") for _ in range(20)]
            with lock:
                results.extend(gens)
        except BaseException as e:  # reported below; a thread cannot fail the test itself
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results) == list(range(1, 161))


def test_records_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        pool().gen = 5  # type: ignore[misc]


# The schema of version 1 files, as controllers before live resizing wrote them.
V1_SCHEMA = [
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    "CREATE TABLE jobs (job_id INTEGER PRIMARY KEY, spec TEXT NOT NULL, "
    "created_at REAL NOT NULL)",
    "CREATE TABLE pools (job_id INTEGER NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE, "
    "position INTEGER NOT NULL, switch TEXT NOT NULL, base INTEGER NOT NULL, "
    "size INTEGER NOT NULL, gen INTEGER NOT NULL, stat_idx INTEGER NOT NULL, "
    "mcast_grp INTEGER NOT NULL, fan_in INTEGER NOT NULL, is_root INTEGER NOT NULL, "
    "uplink_port INTEGER NOT NULL, PRIMARY KEY (job_id, switch), UNIQUE (switch, gen), "
    "UNIQUE (switch, stat_idx), UNIQUE (switch, mcast_grp))",
    "CREATE TABLE generations (switch TEXT PRIMARY KEY, last_gen INTEGER NOT NULL)",
    "INSERT INTO schema_version (version) VALUES (1)",
    """INSERT INTO jobs VALUES (7, '{"hosts": ["h1"]}', 1700000000.5)""",
    "INSERT INTO pools VALUES (7, 0, 'tor1', 0, 64, 3, 0, 2, 1, 1, 0)",
    "INSERT INTO generations VALUES ('tor1', 3)",
]


def test_a_version_1_file_is_migrated_with_no_resize_pending(path):
    with sqlite3.connect(path) as raw:
        for statement in V1_SCHEMA:
            raw.execute(statement)
    raw.close()
    with JobStore(path) as s:
        rec = s.get_job(7)
        assert (rec.pool_epoch, rec.retiring, rec.installing) == (0, (), False)
        assert rec.pools == (pool(gen=3, fan_in=1, is_root=True, uplink_port=0),)
        assert s.next_generation("tor1") == 4
        s.begin_resize(7, 0, rec.spec, [pool(base=64, gen=4, fan_in=1, is_root=True,
                                             uplink_port=0)])
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [(2,)]
    raw.close()
    with JobStore(path) as s:  # opening a migrated file again changes nothing
        assert s.get_job(7).pool_epoch == 1


def resized(store, job_id=7, base=64, gen=2, epoch=0):
    """Resize the job of `job()` (one pool on tor1) to slots base..base+63."""
    rec = store.get_job(job_id)
    return store.begin_resize(job_id, epoch, {**rec.spec, "window": 64},
                              [dataclasses.replace(rec.pools[0], base=base, gen=gen)])


def test_a_resize_keeps_the_old_pool_until_it_is_finished(store):
    store.add_job(job())
    new = resized(store)
    assert (new.pool_epoch, new.pool_bit, new.installing) == (1, 1, True)
    assert new.retiring == (RetiringPool("tor1", 0, 64, 1, 0),)
    assert new.spec["window"] == 64 and new.pools[0].base == 64
    assert store.get_job(7) == new
    assert store.retiring_on("tor1") == {7: new.retiring[0]}
    assert store.finish_resize(7, 1) == ()  # not while installing
    installed = store.resize_installed(7, 1)
    assert installed == dataclasses.replace(new, installing=False)
    # Held slots and generations: another job can have neither.
    with pytest.raises(StoreError, match=r"job 8 on switch tor1: slots 16-47 \(32\) overlap "
                                         r"job 7's retiring slots 0-63 \(64\)"):
        store.add_job(job(8, pool(base=16, size=32, gen=9, stat_idx=1, mcast_grp=3)))
    with pytest.raises(StoreError, match="job 8 on switch tor1: gen 1 is already used by job 7"):
        store.add_job(job(8, pool(base=128, gen=1, stat_idx=1, mcast_grp=3)))
    with pytest.raises(StoreError, match="job 7 still has retiring pools on tor1"):
        resized(store, base=256, gen=5, epoch=1)
    assert store.finish_resize(7, 0) == ()  # another epoch: nothing
    assert store.finish_resize(7, 1) == new.retiring
    assert store.get_job(7).retiring == () and store.retiring_on("tor1") == {}
    store.add_job(job(8, pool(base=0, gen=9, stat_idx=1, mcast_grp=3)))  # the freed slots
    # The next resize goes back to bit 0; removing the job forgets its retiring pool too.
    again = resized(store, base=256, gen=10, epoch=1)
    assert again.pool_bit == 0 and again.retiring[0].bit == 1
    assert store.remove_job(7) == again
    assert store.retiring_on("tor1") == {}


def test_a_resize_is_refused_when_it_cannot_be_recorded(store):
    store.add_job(job())
    store.add_job(job(8, pool(base=128, gen=2, stat_idx=1, mcast_grp=3)))
    before = store.get_job(7)
    for kwargs, message in [
        (dict(base=32, gen=5), r"retiring slots 0-63 \(64\) overlap the job's slots 32-95"),
        (dict(base=100, gen=5), r"slots 100-163 \(64\) overlap job 8's slots 128-191"),
        (dict(base=64, gen=1), "retiring pool and pool share gen 1"),
        (dict(base=64, gen=5, epoch=3), r"job 7 was resized meanwhile \(pool epoch 3 is now "
                                        r"0\)"),
    ]:
        with pytest.raises(StoreError, match=message):
            resized(store, **kwargs)
        assert store.get_job(7) == before
    with pytest.raises(StoreError, match="a resize keeps the job's switches"):
        store.begin_resize(7, 0, before.spec, [pool("tor2", base=64, gen=5)])
    with pytest.raises(StoreError, match="no job 9"):
        store.begin_resize(9, 0, {}, [pool(base=256, gen=5)])


def test_a_resize_and_its_undo_keep_a_policy_set_meanwhile(store):
    """`job set` while a resize is being planned or installed: the resize takes only its
    window from the spec it planned with, and an undo puts back only the window, so the
    agents' policy number never goes back (agents refuse parameters below theirs)."""
    store.add_job(job())
    before = store.update_spec(7, lambda spec: {**spec, "window": 32, "min_window": None})
    planned = {**before.spec, "window": 64}  # what a resize read, then planned with
    store.update_spec(7, lambda spec: {**spec, "policy": 1, "staleness": 3})
    new = store.begin_resize(7, 0, planned,
                             [dataclasses.replace(before.pools[0], base=64, gen=2)])
    assert (new.spec["window"], new.spec["policy"], new.spec["staleness"]) == (64, 1, 3)
    store.update_spec(7, lambda spec: {**spec, "policy": 2})
    undone = store.undo_resize(before)
    assert undone.spec == {**before.spec, "policy": 2, "staleness": 3} == store.get_job(7).spec


def test_a_spec_change_that_fails_leaves_the_job_as_it_was(store):
    store.add_job(job())
    before = store.get_job(7)

    def refuse(spec: dict) -> dict:
        raise ValueError("no")

    with pytest.raises(ValueError):
        store.update_spec(7, refuse)
    assert store.get_job(7) == before
    with pytest.raises(StoreError, match="no job 9"):
        store.update_spec(9, lambda spec: spec)


def test_undo_puts_back_the_job_as_it_was(store):
    store.add_job(job())
    before = store.get_job(7)
    resized(store)
    assert store.undo_resize(before) == before == store.get_job(7)
    assert store.retiring_on("tor1") == {}
    assert store.next_generation("tor1") == 3  # the new pool's generation stays handed out
    # A job resized again since is left alone.
    resized(store, gen=4)
    store.resize_installed(7, 1)
    store.finish_resize(7, 1)
    now = resized(store, base=128, gen=5, epoch=1)
    assert store.undo_resize(before) == now == store.get_job(7)
