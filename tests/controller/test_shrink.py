"""Running jobs shrunk for jobs waiting for slots (controller.waiting's make_room), against
live switches (the model always, BMv2 when installed): a job that accepts less (--min-window)
and holds more than the fair share is resized down, live, into the slots kept free for that
(the reserve); once its hosts use the new pool its old one frees and the waiting job moves
onto the switch in the same call. A job that asked for an exact window is never shrunk. The
test that sends frames uses `make_controller` (switch processes, root)."""

from __future__ import annotations

import json

import pytest

from controller.cli import main
from controller.core import Controller, ControllerError, Endpoint
from controller.job_plan import JobSpec
from controller.topology import load
from tests import REPO
from tests.controller.test_resize import all_moved, entries, expect_results, send_round
from tests.controller.test_waiting import clean, cli

# s1: two share segments of 2048 slots, 512 kept for shrinks.
STAR = {"max_jobs": 8, "shares": 2, "reserve": 512}


def fill(ctl) -> None:
    """Job 1 (accepts 256) and job 2 (exactly 1536) on s1: 512 slots left, the reserve."""
    ctl.create_job(JobSpec(1, ("h1",), window=2048, min_window=256))
    ctl.create_job(JobSpec(2, ("h1",), window=1536))
    assert ctl.slots()["s1"].used() == 3584 and ctl.shrunk == []


def test_a_job_that_accepts_less_is_shrunk_and_its_old_pool_goes_to_the_waiting_job(
        make_control, monkeypatch):
    ctl, fabric = make_control("star", **STAR)
    fill(ctl)
    rec = ctl.create_job(JobSpec(3, ("h2",), window=1024, min_window=512))
    assert rec.waiting  # the 512 free slots are the reserve

    # Job 1, the only one that accepts less, moves into the reserve: the fair share of 3 jobs
    # would be 1194, the reserve holds 512. Job 2 keeps its pool.
    [shrunk] = ctl.shrunk
    assert (shrunk.job_id, shrunk.pool_epoch, shrunk.pools[0].size) == (1, 1, 512)
    assert shrunk.pools[0].base == 3584 and [r.size for r in shrunk.retiring] == [2048]
    assert set(entries(fabric, "s1", 1)) == {0, 1}
    assert (ctl.agent_params(1).window, ctl.agent_params(1).pool) == (512, 1)
    assert ctl.job(2).pool_epoch == 0 and ctl.job(2).pools[0].size == 1536
    assert ctl.job(3).waiting
    clean(ctl)

    # Nothing more while the old pool retires: no second shrink on s1.
    assert ctl.place_waiting() == [] and ctl.shrunk == [] and ctl.job(3).waiting

    # Job 1's hosts use the new pool: its old 2048 slots free, and job 3 takes its window.
    all_moved(monkeypatch)
    move = ctl.retire_pools(1)
    assert not move.pending and [r.size for r in move.retired] == [2048]
    [placed] = ctl.placed
    assert (placed.job_id, placed.pool_epoch, placed.pools[0].size) == (3, 1, 1024)
    assert (ctl.agent_params(3).window, ctl.agent_params(3).pool) == (1024, 1)
    assert ctl.waiting_jobs() == [] and ctl.shrunk == [] and ctl.grown == []
    assert ctl.slots()["s1"].used() == 512 + 1536 + 1024
    assert ctl.job(1).spec["asked_window"] == 2048
    clean(ctl)

    # Job 3 goes: job 1 grows back toward the 2048 it asked for, as far as the slots allow
    # beside the reserve (2048 free, 512 of them kept), and still remembers the rest.
    ctl.delete_job(3)
    [grown] = ctl.grown
    assert (grown.job_id, grown.pool_epoch, grown.pools[0].size) == (1, 2, 1536)
    assert grown.spec["asked_window"] == 2048 and grown.spec["min_window"] == 256
    ctl.retire_pools(1)  # its 512 slots in the reserve free; 1,024 free then, 512 usable
    assert ctl.grown == [] and ctl.job(1).pools[0].size == 1536
    clean(ctl)


@pytest.mark.parametrize("first, second", [
    (JobSpec(1, ("h1",), window=2048), JobSpec(2, ("h1",), window=1536, min_window=1536)),
    # Shrunk to its minimum, job 1 would free 248 slots net: too few for job 3's 512.
    (JobSpec(1, ("h1",), window=2048, min_window=1800), JobSpec(2, ("h1",), window=1536)),
])
def test_no_job_is_shrunk_below_its_minimum_or_for_too_little(make_control, first, second):
    """Not a job that asked for an exact window, nor one at its minimum, nor one whose shrink
    would not free what the waiting job needs."""
    ctl, _ = make_control("star", **STAR)
    ctl.create_job(first)
    ctl.create_job(second)
    assert ctl.create_job(JobSpec(3, ("h2",), window=1024, min_window=512)).waiting
    assert ctl.shrunk == []
    assert [ctl.job(j).pool_epoch for j in (1, 2)] == [0, 0]


def test_without_a_reserve_a_full_switch_shrinks_nobody(make_control):
    """A shrink needs slots beside the pool it leaves: with no reserve and no free slot, the
    waiting job waits for a job to go, as before."""
    ctl, _ = make_control("star", max_jobs=8, shares=2)
    ctl.create_job(JobSpec(1, ("h1",), window=2048, min_window=256))
    ctl.create_job(JobSpec(2, ("h1",), window=2048))
    assert ctl.create_job(JobSpec(3, ("h2",), window=1024, min_window=512)).waiting
    assert ctl.shrunk == [] and ctl.job(1).pool_epoch == 0


def test_the_reserve_is_never_given_to_a_new_job_or_a_growing_one(make_control):
    ctl, _ = make_control("star", **STAR)
    fill(ctl)
    with pytest.raises(ControllerError, match=r"512 of its free slots are kept for shrinking "
                                              r"running jobs \(reserve\)"):
        ctl.create_job(JobSpec(4, ("h3",), window=8, fallback=False))
    ctl.delete_job(2)  # 2048 free, 512 of them the reserve
    with pytest.raises(ControllerError, match="cannot be resized"):
        ctl.resize_job(1, 2048)  # no room beside its pool but the reserve
    assert ctl.create_job(JobSpec(4, ("h3",), window=1536)).pools[0].size == 1536


def test_the_cli_says_which_job_was_shrunk_and_when_the_waiting_one_moved(
        make_control, capsys, monkeypatch):
    ctl, _ = make_control("star", **STAR)
    fill(ctl)
    code, out, err = cli(ctl, capsys, "job", "create", "3", "--hosts", "h2", "--window", "1024",
                         "--min-window", "512")
    assert code == 0 and not err and "WAITING for slots" in out
    assert ("job 1 shrunk to a window of 512 (pool epoch 1) to make room for jobs waiting for "
            "slots; its old pool is freed once its hosts have moved") in out
    code, out, _ = cli(ctl, capsys, "stats")
    assert code == 0 and "shrunk" not in out and "moved onto" not in out  # nothing new
    # `stats` reads that job 1's hosts all count in the new pool: the old one retires and
    # job 3 moves onto s1 in that same command, which says so.
    all_moved(monkeypatch)
    code, out, _ = cli(ctl, capsys, "stats")
    assert code == 0 and "job 3 moved onto its switches: window 1024 (pool epoch 1)" in out
    code, out, _ = cli(ctl, capsys, "job", "show", "3", "--json")
    shown = json.loads(out)
    assert not shown["waiting"] and shown["placed"] == [] and shown["shrunk"] == []
    code, out, _ = cli(ctl, capsys, "job", "delete", "3")
    assert code == 0 and ("job 1 grown back to a window of 1536 (pool epoch 2), toward the "
                          "2048 it asked for") in out


def test_a_reserve_above_one_share_is_refused(tmp_path):
    with pytest.raises(ControllerError, match=r"reserve must be 0 to 2048 slots"):
        Controller(load(REPO / "topologies" / "star.json"),
                   {"s1": Endpoint("s1", "127.0.0.1:1", 0)}, tmp_path / "state.sqlite",
                   shares=2, reserve=4096)


def test_every_sum_is_exact_before_during_and_after_a_shrink(make_controller):
    """Through the switch (frames on its ports): job 1 sums in its first pool, is shrunk for
    job 3, sums in the new pool while the old one is held, then job 3 takes the old pool's
    slots and sums there; every host gets every sum."""
    ctl, fabric = make_controller("star", **STAR)
    a, b = ("h1", "h2"), ("h3", "h4")
    ctl.create_job(JobSpec(1, a, window=2048, min_window=256))
    ctl.create_job(JobSpec(2, a, window=1536))
    expect_results(ctl, fabric, 1, a, send_round(ctl, fabric, 1, a, slot=2047))
    assert ctl.create_job(JobSpec(3, b, window=1024, min_window=512)).waiting
    assert [r.job_id for r in ctl.shrunk] == [1]
    expect_results(ctl, fabric, 1, a, send_round(ctl, fabric, 1, a, slot=511, seed=1))
    # Every host counted in the new pool: `job show` retires the old one, job 3 moves.
    assert not ctl.retire_pools(1).pending
    assert [r.job_id for r in ctl.placed] == [3] and not ctl.job(1).retiring
    assert ctl.job(3).pools[0].base == 0  # job 1's old slots
    expect_results(ctl, fabric, 3, b, send_round(ctl, fabric, 3, b, slot=1023, seed=2))
    expect_results(ctl, fabric, 1, a, send_round(ctl, fabric, 1, a, slot=7, seed=3))
    clean(ctl)


@pytest.mark.parametrize("reserve, message", [
    ("512", "reserve must be an integer number of slots, not '512'"),
    (5000, "reserve must be 0 to 512 slots (one share of a switch's 4096), not 5000"),
])
def test_a_bad_reserve_in_the_configuration_is_refused_naming_it(tmp_path, capsys, reserve,
                                                                  message):
    cfg = {"topology": str(REPO / "topologies" / "star.json"), "state": "state.sqlite",
           "reserve": reserve,
           "switches": {"s1": {"address": "127.0.0.1:1", "device_id": 0}}}
    path = tmp_path / "controller.json"
    path.write_text(json.dumps(cfg))
    assert main(["--config", str(path), "switches"]) == 3
    assert message in capsys.readouterr().err
