"""Jobs waiting for slots (controller.waiting), against live switches (the model always, BMv2
when installed): a `passing` job its switches cannot hold now is created with every entry but
its pools, its agents told window 0 (the host collective); it moves onto the switches, as a
live resize to pool epoch 1, in the very call that frees room for it; a request that could
never fit, an `ina` job and --no-fallback are refused as before. The test that sends frames
uses `make_controller` (switch processes, root)."""

from __future__ import annotations

import json

import pytest

from controller.cli import main
from controller.core import ControllerError
from controller.installer import SwitchSnapshot
from controller.job_plan import JobSpec
from tests.controller.test_resize import entries, expect_results, send_round

HOSTS = ("h1", "h2", "h3", "h4")


def cli(ctl, capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv), ctl=ctl)
    out, err = capsys.readouterr()
    return code, out, err


def clean(ctl) -> None:
    """Every switch holds exactly what the job table says: nothing to repair, nothing stray."""
    report = ctl.reconcile(fix=False)
    assert all(not e["repaired"] and not e["stray"] and not e["errors"]
               for e in report.values()), report


def test_a_job_that_does_not_fit_waits_and_takes_the_slots_freed_in_the_same_call(make_control):
    ctl, fabric = make_control("leafspine", max_jobs=1)
    ctl.create_job(JobSpec(1, HOSTS, window=8))
    rec = ctl.create_job(JobSpec(2, ("h1", "h3"), window=16, min_window=4))
    assert rec.waiting and rec.pool_epoch == 0
    assert sorted(p.switch for p in rec.pools) == ["spine", "tor1", "tor2"]
    for s in ("tor1", "tor2", "spine"):
        assert entries(fabric, s, 2) == {}  # no pool on any switch
        snap = SwitchSnapshot.read(fabric[s].conn)
        assert any(j == 2 for j, _ in snap.members), s  # ... but every other entry
    params = ctl.agent_params(2)
    assert (params.window, params.pool) == (0, 0)
    assert [r.job_id for r in ctl.waiting_jobs()] == [2]
    clean(ctl)
    # Asking again changes nothing while job 1 holds the switches.
    assert ctl.place_waiting() == [] and ctl.job(2).waiting

    ctl.delete_job(1)
    [placed] = ctl.placed
    assert placed.job_id == 2 and not placed.waiting and not placed.installing
    assert placed.pool_epoch == 1 and {p.size for p in placed.pools} == {16}
    assert not placed.retiring  # nothing to retire
    for s in ("tor1", "tor2", "spine"):
        assert set(entries(fabric, s, 2)) == {1}  # its first pool, under FLAG_POOL 1
    params = ctl.agent_params(2)
    assert (params.window, params.pool) == (16, 1)
    assert ctl.waiting_jobs() == []
    clean(ctl)


def test_waiting_jobs_are_placed_oldest_first_and_a_large_one_holds_back_no_small_one(
        make_control):
    ctl, _ = make_control("star", max_jobs=8, shares=2)  # two share segments of 2048 slots
    for job_id, window in ((1, 2048), (2, 1024), (3, 1024)):  # s1 full
        ctl.create_job(JobSpec(job_id, ("h1",), window=window))
    for job_id, window in ((4, 2048), (5, 1024), (6, 1024)):
        assert ctl.create_job(JobSpec(job_id, ("h2",), window=window)).waiting
    ctl.delete_job(2)  # 1024 free: too few for job 4, enough for job 5, then none for 6
    assert [(r.job_id, r.pools[0].size) for r in ctl.placed] == [(5, 1024)]
    ctl.delete_job(1)  # a whole segment: job 4, the oldest, takes it
    assert [(r.job_id, r.pools[0].size) for r in ctl.placed] == [(4, 2048)]
    assert [r.job_id for r in ctl.waiting_jobs()] == [6]


def test_a_waiting_job_deleted_leaves_nothing_and_is_never_placed(make_control):
    ctl, fabric = make_control("leafspine", max_jobs=1)
    ctl.create_job(JobSpec(1, ("h1",), window=8))
    assert ctl.create_job(JobSpec(2, HOSTS, window=8)).waiting
    rec = ctl.delete_job(2)
    assert rec.waiting and ctl.placed == []
    for s in ("tor1", "tor2", "spine"):
        snap = SwitchSnapshot.read(fabric[s].conn)
        assert not any(j == 2 for j, _ in snap.members) and not any(
            j == 2 for j, _, _ in snap.peers), s
    clean(ctl)
    ctl.delete_job(1)
    assert ctl.placed == [] and ctl.waiting_jobs() == []


@pytest.mark.parametrize("spec, message", [
    (JobSpec(2, ("h2",), window=5000), "cannot wait for slots either: no switch ever gives "
     "a job more than the equal share of 4096 slots"),
    (JobSpec(2, ("h2",), window=8, mode="ina"), "no window fits on all of them now"),
    (JobSpec(2, ("h2",), window=8, fallback=False), "no window fits on all of them now"),
])
def test_what_cannot_wait_is_refused_and_leaves_nothing(make_control, spec, message):
    ctl, fabric = make_control("star", max_jobs=1)
    ctl.create_job(JobSpec(1, ("h1",), window=8))
    with pytest.raises(ControllerError, match=message):
        ctl.create_job(spec)
    assert [r.job_id for r in ctl.store.jobs()] == [1]
    clean(ctl)


def test_the_cli_says_a_job_waits_and_when_it_moved(make_control, capsys):
    ctl, _ = make_control("star", max_jobs=1)
    assert cli(ctl, capsys, "job", "create", "1", "--hosts", "h1", "--window", "8")[0] == 0
    code, out, err = cli(ctl, capsys, "job", "create", "2", "--hosts", "h2,h3", "--window", "32")
    assert code == 0 and not err
    assert "job 2 created on s1" in out and "WAITING for slots" in out
    assert "host collective" in out
    code, out, _ = cli(ctl, capsys, "job", "list")
    assert "waiting (32)" in out
    code, out, _ = cli(ctl, capsys, "job", "show", "2", "--json")
    shown = json.loads(out)
    assert shown["waiting"] and shown["agent_params"]["window"] == 0
    code, out, _ = cli(ctl, capsys, "job", "create", "3", "--hosts", "h4", "--window", "8",
                       "--no-fallback")
    assert code == 3
    code, out, err = cli(ctl, capsys, "job", "delete", "1")
    assert code == 0 and "job 2 moved onto its switches: window 32 (pool epoch 1)" in out
    code, out, _ = cli(ctl, capsys, "job", "show", "2")
    assert "WAITING" not in out and "pool epoch 1" in out


def test_a_placed_job_sums_on_the_switch_in_its_first_pool(make_controller):
    ctl, fabric = make_controller("leafspine", max_jobs=1)
    ctl.create_job(JobSpec(1, ("h1",), window=8))
    ctl.create_job(JobSpec(2, HOSTS, window=8))
    assert ctl.job(2).waiting
    ctl.delete_job(1)
    assert [r.job_id for r in ctl.placed] == [2]
    # The agents' parameters now name pool 1 (FLAG_POOL 1): a round through both racks and
    # the spine comes back to every host, summed.
    expect_results(ctl, fabric, 2, HOSTS, send_round(ctl, fabric, 2, HOSTS))
