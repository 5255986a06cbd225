"""A running job shrunk for a waiting one, end to end in Mininet (the model, and BMv2 when
installed): real agents on every host, their parameters as `passing-ctl job show --json`
writes them. Every call of both jobs is exact: job 1 before, on its old pool; job 2 while it
waits, over the host collective; job 1 after its shrink, on its new pool beside the old one;
job 2 once it took the old pool's slots, through the switch."""

from __future__ import annotations

import pytest

from controller.job_plan import JobSpec
from controller.topology import load
from tests import REPO
from topologies.network import PassingNetwork


@pytest.fixture
def star(target, tmp_path):
    path = REPO / "topologies" / "star.json"
    pnet = PassingNetwork(load(path), path, target, tmp_path / "run")
    try:
        pnet.start()
        yield pnet
    finally:
        pnet.stop()


def exact(res: dict, hosts: tuple[str, ...]) -> dict:
    assert set(res) == set(hosts), res
    assert all(r.get("ok") and r["correct"] for r in res.values()), res
    return res


def test_a_shrunk_job_and_the_job_it_made_room_for_sum_exactly_throughout(star):
    pnet, a, b = star, ("h1", "h2"), ("h3", "h4")
    # s1's eight 512-slot shares: job 1 (accepts 16) in the first, nine fillers in the rest
    # but 64 slots, so job 2 (128 slots) finds no room; the fillers asked for exact windows.
    pnet.ctl.create_job(JobSpec(1, a, window=512, min_window=16))
    for filler, window in zip(range(10, 19), [512] * 6 + [256, 96, 96], strict=True):
        pnet.ctl.create_job(JobSpec(filler, ("h4",), window=window))
    pnet.create_job(1)
    exact(pnet.allreduce("16K", job_id=1, iters=1), a)

    pnet.ctl.create_job(JobSpec(2, b, window=128))
    assert pnet.ctl.job(2).waiting
    # Into the 64 free slots: the fair share of 11 jobs (372) does not fit there.
    [shrunk] = pnet.ctl.shrunk
    assert (shrunk.job_id, shrunk.pools[0].size, shrunk.pool_epoch) == (1, 64, 1)
    pnet.create_job(2)  # its parameters: window 0, the host collective
    res = exact(pnet.allreduce("16K", job_id=2, iters=1), b)
    assert all(r["host_calls"] > 0 for r in res.values()), res

    pnet.create_job(1)  # its parameters rewritten: the new pool
    exact(pnet.allreduce("16K", job_id=1, iters=2), a)
    assert not pnet.ctl.retire_pools(1).pending  # every host of job 1 in the new pool
    [placed] = pnet.ctl.placed
    assert (placed.job_id, placed.pools[0].size) == (2, 128)
    assert placed.pools[0].base < 512  # job 1's old slots

    pnet.create_job(2)
    before = pnet.ctl.stats(2)["s1"]["job_results"]
    res = exact(pnet.allreduce("16K", job_id=2, iters=2), b)
    assert all(r["window"] == 128 for r in res.values()), res
    assert pnet.ctl.stats(2)["s1"]["job_results"] > before  # through the switch now
    exact(pnet.allreduce("16K", job_id=1, iters=1), a)
