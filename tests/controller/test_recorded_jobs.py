"""The recorded jobs as the controller reads them (controller.recorded_jobs.RecordedJobs), from
a state file alone: no switch is asked."""

from __future__ import annotations

import pytest

from controller.agent_ports import AgentPorts
from controller.errors import ControllerError
from controller.job_plan import JobSpec, plan
from controller.recorded_jobs import RecordedJobs
from controller.records import JobRecord, PoolRecord, RetiringPool
from controller.store import JobStore
from controller.topology import load
from tests import REPO

TOPO = load(REPO / "topologies" / "star.json")  # one switch s1; 4 hosts of 2 GPUs


@pytest.fixture
def store(tmp_path):
    with JobStore(tmp_path / "state.sqlite") as s:
        yield s


def add(store: JobStore, job_id: int, base: int, hosts=("h1", "h2"), agent_port: int = 0,
        stat_idx: int = 0, epoch: int = 0, retiring: tuple[RetiringPool, ...] = ()) -> None:
    spec = JobSpec(job_id, hosts, window=8, agent_port=agent_port)
    store.add_job(JobRecord(job_id, spec.to_dict(),
                            (PoolRecord("s1", base, 8, 10 + stat_idx, stat_idx, 2 + stat_idx,
                                        len(hosts), True, 0),), 0.0, epoch, retiring))


def test_an_unknown_job_is_refused_naming_the_jobs_there_are(store):
    jobs = RecordedJobs(TOPO, store, max_jobs=8)
    with pytest.raises(ControllerError, match=r"^no job 3 \(jobs: none\)$"):
        jobs.job(3)
    add(store, 1, 0)
    add(store, 2, 8, hosts=("h3",), stat_idx=1)
    with pytest.raises(ControllerError, match=r"^no job 3 \(jobs: 1, 2\)$"):
        jobs.job(3)
    assert jobs.job(2).pools[0].base == 8


def test_a_retiring_pool_holds_its_slots_until_it_is_freed(store):
    add(store, 1, 16, epoch=1, retiring=(RetiringPool("s1", 0, 8, 5, 0),))
    alloc = RecordedJobs(TOPO, store, max_jobs=4).allocators(["s1"])["s1"]
    assert (alloc.fair_share(), alloc.used()) == (1024, 16)
    assert alloc.allocate(2, 8).base == 8  # not 0: the old pool is still there


def test_a_port_another_job_guards_first_is_left_to_it(store):
    # Two old records (agent_port 0) on one port: only the lower job id guards it.
    add(store, 1, 0, hosts=("h1",))
    add(store, 20001, 8, hosts=("h2",), stat_idx=1)
    jobs, claims = RecordedJobs(TOPO, store, 8), AgentPorts(TOPO, store).guard_claims()
    wants = {}
    for rec in store.jobs():
        d = jobs.desired(plan(JobSpec.from_dict(rec.spec), TOPO), rec, rec.pools[0], claims)
        wants[rec.job_id] = d.guards
    assert wants == {1: {40001: 0}, 20001: {}}


def test_the_entries_of_a_resized_job_keep_its_old_pool_beside_the_new(store):
    add(store, 1, 16, epoch=3, retiring=(RetiringPool("s1", 0, 8, 5, 0),))
    rec = store.get_job(1)
    d = RecordedJobs(TOPO, store, 8).desired(plan(JobSpec.from_dict(rec.spec), TOPO), rec,
                                             rec.pools[0], {})
    assert (d.job.pool_base, d.job.pool, d.job.epoch) == (16, 1, 3)
    assert (d.retiring.pool_base, d.retiring.gen, d.retiring.pool, d.retiring.epoch) == \
        (0, 5, 0, 2)
