"""The controller-at-scale benchmark on a small fabric: real switch processes with real P4Runtime
servers, jobs created through `passing-ctl`'s code path, and what each switch holds read back.

What a user relies on when they read its numbers: every job it says was created is installed on
exactly the switches of its tree (one job_config and guard per job there, one membership row per
child), a refused job is refused with the controller's reason and installs nothing, and a fresh
controller finds nothing to repair."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.controller_scale import run, write_fabric
from bench.scale_jobs import place, racks_of, sizes
from topologies.fabric import FabricLayout


def test_sizes_are_powers_of_two_most_jobs_small() -> None:
    got = sizes(256, 8, 512)
    assert len(got) == 256
    assert got[0] == 512 and got == sorted(got, reverse=True)
    counts = Counter(got)
    assert set(counts) == {8, 16, 32, 64, 128, 256, 512}
    # Each halving of the size at least doubles the count: most jobs are small.
    assert all(counts[s // 2] >= 2 * counts[s] for s in (16, 32, 64, 128, 256, 512))
    with pytest.raises(ValueError):
        sizes(4, 64, 32)


def test_jobs_within_a_rack_stay_in_it_and_larger_ones_take_whole_racks(tmp_path) -> None:
    topo = write_fabric(FabricLayout(4, 8, 2, 2), tmp_path)
    jobs = place(topo, 12, seed=3, smallest=4, largest=16)
    racks = racks_of(topo)
    assert len(jobs) == 12 and len({j.job_id for j in jobs}) == 12
    for job in jobs:
        assert len(set(job.hosts)) == len(job.hosts)
        held = [r for r in racks if set(r) & set(job.hosts)]
        assert len(held) == job.racks
        if len(job.hosts) > 8:
            assert all(set(r) <= set(job.hosts) for r in held)


def _expected_rows(topo, jobs: dict) -> tuple[Counter, Counter]:
    """Per switch: jobs whose tree uses it, and membership rows (children of each job there)."""
    per_switch, members = Counter(), Counter()
    for job in jobs.values():
        tors = Counter(topo.hosts[h].rack for h in job["hosts"])
        for sw in job["switches"]:
            per_switch[sw] += 1
            members[sw] += tors[sw] if sw in tors else len(tors)
    return per_switch, members


def test_every_created_job_is_on_exactly_its_switches(tmp_path) -> None:
    layout = FabricLayout(4, 8, 2, 2)
    topo = write_fabric(layout, tmp_path)
    jobs = place(topo, 40, seed=1, smallest=4, largest=16)
    # The controller's defaults: more jobs on a ToR than equal shares, as long as slots are free.
    res = run(layout, jobs, tmp_path, window=64, min_window=8, max_jobs=None, cli_samples=2)

    assert res["refused"] == {}
    assert res["create"]["n"] == 40 and res["listed"] == 40
    assert max(e["job_config"] for e in res["entries"].values()) > res["shares"] == 8
    assert sorted(map(int, res["jobs"])) == [j.job_id for j in jobs]
    for job in jobs:
        assert set(res["jobs"][str(job.job_id)]["hosts"]) == set(job.hosts)
    spanning = [j for j in jobs if j.racks > 1]
    assert spanning, "the layout should give some jobs two racks"
    for j in spanning:  # a job over two racks is rooted on a spine
        assert any(s.startswith("spine") for s in res["jobs"][str(j.job_id)]["switches"])

    per_switch, members = _expected_rows(topo, res["jobs"])
    for sw, entries in res["entries"].items():
        assert entries["job_config"] == per_switch[sw], sw
        assert entries["result_guard"] == per_switch[sw], sw
        assert entries["membership"] == members[sw], sw
        assert entries["l2_forward"] >= len(topo.hosts), sw
        for table, n in entries.items():
            assert n <= res["table_sizes"].get(table, n), (sw, table)
    assert res["reconcile_repaired"] == 0 and res["reconcile_errors"] == []
    assert res["cli_create"]["n"] == 2 and res["switches_alive"]


def test_a_job_that_does_not_fit_waits_and_a_delete_moves_it_onto_its_switches(tmp_path
                                                                              ) -> None:
    layout = FabricLayout(2, 8, 1, 1)
    topo = write_fabric(layout, tmp_path)
    jobs = place(topo, 8, seed=2, smallest=4, largest=8)
    res = run(layout, jobs, tmp_path, window=64, min_window=8, max_jobs=2, cli_samples=0)

    assert res["refused"] == {}, "no job is refused for want of switch memory"
    assert res["waiting"], "8 jobs on 2 ToRs with max_jobs 2 must leave some waiting"
    assert res["create"]["n"] == res["listed"] == 8
    for job_id in res["waiting"]:
        assert res["jobs"][str(job_id)]["window"] == "waiting (64)"
    holding = {j: v for j, v in res["jobs"].items() if int(j) not in res["waiting"]}
    pooled, _ = _expected_rows(topo, holding)
    every, members = _expected_rows(topo, res["jobs"])
    for sw, entries in res["entries"].items():
        assert entries["job_config"] == pooled[sw] <= 2, sw  # pools: only the jobs holding some
        assert entries["membership"] == members[sw], sw  # ... the rest: every job's
        assert entries["result_guard"] == every[sw], sw
    assert res["reconcile_repaired"] == 0 and res["reconcile_errors"] == []
    # Deleting jobs beside each waiting one moved every waiting job onto its switches, each
    # in the very delete that made room for it.
    assert res["still_waiting"] == []
    assert {m["job"] for m in res["moved"]} <= set(res["waiting"]) and res["moved"]
    assert all(m["deletes"] >= 1 and m["window"] == 64 for m in res["moved"]), res["moved"]
