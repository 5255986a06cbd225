"""Live pool resizing (`passing-ctl job resize`), against live switches (the model always, BMv2
when installed): the new pool goes under the other FLAG_POOL beside the old one, the old one is
freed only once every host has contributed to the new one, and delete, restart, reconcile, a
crash and a refusal all leave switches and state in line. Tests that send frames use
`make_controller` (switch processes, root); the others `make_control`."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from controller.cli import main
from controller.core import Controller, ControllerError, SwitchFailure
from controller.counters import StatsCounters
from controller.job_plan import JobSpec
from controller.switch import SwitchError, Update
from controller.tables.job_admission import JobAdmissionTables, JobConfig
from passing import packet
from passing import protocol as P
from passing.contract import JobParams
from tests.controller.test_controller_fabric import contribution, port_of


def entries(fabric, switch: str, job_id: int) -> dict[int, JobConfig]:
    """pool bit -> the job's job_config entry on the switch, as read back from it."""
    return {pool: cfg for (jid, pool), cfg in JobAdmissionTables(fabric[switch].conn)
            .jobs().items() if jid == job_id}


def span(cfg: JobConfig) -> range:
    return range(cfg.pool_base, cfg.pool_base + cfg.pool_size)


def send_round(ctl: Controller, fabric, job_id: int, hosts, slot: int = 0, seed: int = 0):
    """`hosts` contribute to `slot` of the pool their parameters name (FLAG_POOL from
    params.pool); returns what each sent."""
    params = ctl.agent_params(job_id)
    flags = int(P.Flag.CONTRIB) | (int(P.Flag.POOL) if params.pool & 1 else 0)
    rng = np.random.default_rng(seed)
    vals = {h: rng.integers(-(2**20), 2**20, size=P.K) for h in hosts}
    for h in hosts:
        port_of(ctl, fabric, h).send(contribution(ctl, job_id, h, vals[h], slot, flags=flags))
    return vals


def expect_results(ctl: Controller, fabric, job_id: int, hosts, vals) -> None:
    """Every host of `hosts` gets the sum of `vals`, in the pool its parameters name."""
    want = np.sum(list(vals.values()), axis=0).astype(np.int32)
    bit = ctl.agent_params(job_id).pool & 1
    for h in hosts:
        frames = port_of(ctl, fabric, h).recv(1, 3)
        assert frames, f"{h}: no result"
        rec = packet.unpack(bytes(Ether(frames[0])[UDP].payload))
        assert np.array_equal(rec["values"], want), h
        assert bool(rec["flags"] & P.Flag.POOL) == bool(bit), h


def wait_counted(ctl: Controller, switch: str, stat_idx: int, bit: int, n: int) -> None:
    """Until `n` contributors have a count in that pool at `switch` (frames from several ports
    are taken in any order and time)."""
    deadline = time.monotonic() + 5
    while len(StatsCounters(ctl.conn(switch)).pool_contribs(stat_idx, bit)) < n:
        assert time.monotonic() < deadline, f"{switch}: {n} contributors never counted"
        time.sleep(0.05)


def test_resize_on_one_switch_keeps_the_old_pool_until_every_host_moved(make_controller):
    ctl, fabric = make_controller("star")
    hosts = ["h1", "h2", "h3"]
    ctl.create_job(JobSpec(1, tuple(hosts), window=8))
    expect_results(ctl, fabric, 1, hosts, send_round(ctl, fabric, 1, hosts))
    old = entries(fabric, "s1", 1)[0]

    rec = ctl.resize_job(1, 16)
    assert (rec.pool_epoch, rec.pool_bit, rec.pools[0].size) == (1, 1, 16)
    on_switch = entries(fabric, "s1", 1)
    assert set(on_switch) == {0, 1} and on_switch[0] == old
    new = on_switch[1]
    assert new.pool_size == 16 and not set(span(new)) & set(span(old))
    assert new.gen > old.gen
    assert (new.stat_idx, new.mcast_grp, new.fan_in, new.quorum, new.is_root) == \
        (old.stat_idx, old.mcast_grp, old.fan_in, old.quorum, old.is_root)
    params = ctl.agent_params(1)
    assert (params.window, params.pool) == (16, 1)
    assert ctl.retire_pools(1).waiting == ("h1", "h2", "h3")

    # Two of three hosts moved: the third may still resend into the old pool, which stays.
    vals = send_round(ctl, fabric, 1, ["h1", "h2"], slot=15)
    wait_counted(ctl, "s1", new.stat_idx, 1, 2)
    move = ctl.retire_pools(1)
    assert move.pending and move.moved == ("h1", "h2") and move.waiting == ("h3",)
    assert set(entries(fabric, "s1", 1)) == {0, 1}
    with pytest.raises(ControllerError, match=r"job 1 not resized: its previous resize \(to "
                                              r"pool 1\) is still retiring the old pool, because "
                                              r"host h3 has not contributed"):
        ctl.resize_job(1, 32)
    assert ctl.job(1).pool_epoch == 1 and set(entries(fabric, "s1", 1)) == {0, 1}
    assert ctl.slots()["s1"].used() == 8 + 16

    # The last host moves; the new pool sums all three; `stats` retires the old pool.
    vals |= send_round(ctl, fabric, 1, ["h3"], slot=15, seed=1)
    expect_results(ctl, fabric, 1, hosts, vals)
    ctl.stats(1)
    assert set(entries(fabric, "s1", 1)) == {1}
    rec = ctl.job(1)
    assert rec.retiring == () and ctl.slots()["s1"].used() == 16
    assert ctl.retire_pools(1).pending is False
    # The freed slots go to the next job (first fit: the old pool's base).
    other = ctl.create_job(JobSpec(2, ("h4",), window=old.pool_size))
    assert other.pools[0].base == old.pool_base


def test_resize_across_racks_moves_every_switch_and_create_retires_first(make_controller):
    ctl, fabric = make_controller("leafspine")
    hosts = ["h1", "h2", "h3", "h4"]
    ctl.create_job(JobSpec(2, tuple(hosts), window=4))
    before = {s: entries(fabric, s, 2)[0] for s in ("tor1", "tor2", "spine")}
    rec = ctl.resize_job(2, 8)
    assert rec.pool_epoch == 1 and {p.size for p in rec.pools} == {8}
    for s, old in before.items():
        on_switch = entries(fabric, s, 2)
        assert on_switch[0] == old, s
        new = on_switch[1]
        assert new.pool_size == 8 and not set(span(new)) & set(span(old)), s
        assert (new.fan_in, new.is_root, new.uplink_port) == \
            (old.fan_in, old.is_root, old.uplink_port), s
    assert (ctl.agent_params(2).window, ctl.agent_params(2).pool) == (8, 1)

    vals = send_round(ctl, fabric, 2, ["h1", "h2", "h3"], slot=7)
    for s, n in (("tor1", 2), ("tor2", 1)):
        wait_counted(ctl, s, before[s].stat_idx, 1, n)
    move = ctl.retire_pools(2)
    assert move.waiting == ("h4",) and move.moved == ("h1", "h2", "h3")
    # While it waits, the old slots are not free: a job wanting them gets others.
    held = {s: set(span(before[s])) for s in before}
    third = ctl.create_job(JobSpec(3, ("h3", "h4"), window=4))
    assert not set(range(third.pools[0].base, third.pools[0].base + 4)) & held["tor2"]
    ctl.delete_job(3)

    vals |= send_round(ctl, fabric, 2, ["h4"], slot=7, seed=2)
    expect_results(ctl, fabric, 2, hosts, vals)  # through the spine's new pool
    # Creating a job first retires what can be: the old pools are gone from every switch and
    # the new job on tor2 gets the old pool's slots there.
    rec = ctl.create_job(JobSpec(4, ("h3", "h4"), window=4))
    assert rec.pools[0].base == before["tor2"].pool_base
    for s in before:
        assert set(entries(fabric, s, 2)) == {1}, s
    assert ctl.job(2).retiring == ()


def test_delete_during_a_resize_frees_both_pools(make_control):
    ctl, fabric = make_control("leafspine")
    ctl.create_job(JobSpec(5, ("h1", "h3"), window=4))
    # The same window is allowed: the job still moves to a new pool.
    rec = ctl.resize_job(5, 4)
    assert rec.pool_epoch == 1 and rec.retiring
    assert all(set(entries(fabric, s, 5)) == {0, 1} for s in ("tor1", "tor2", "spine"))
    gone = ctl.delete_job(5)
    assert gone.retiring == rec.retiring
    for s in ("tor1", "tor2", "spine"):
        assert entries(fabric, s, 5) == {}, s
        assert ctl.slots()[s].used() == 0, s
    assert ctl.store.retiring_on("tor1") == {}
    assert all(not r["stray"] for r in ctl.reconcile(fix=False).values())


def test_restart_keeps_a_pending_resize_and_reconcile_reinstalls_the_old_pool(make_control,
                                                                              tmp_path):
    ctl, fabric = make_control("leafspine")
    ctl.create_job(JobSpec(6, ("h1", "h2", "h3", "h4"), window=4))
    rec = ctl.resize_job(6, 8)
    params = ctl.agent_params(6)
    ctl.close()
    ctl2, _ = make_control("leafspine", state=tmp_path / "state.sqlite", fabric=fabric)
    assert ctl2.job(6) == rec and ctl2.agent_params(6) == params
    assert all(not r["repaired"] and not r["stray"] for r in ctl2.reconcile(fix=False).values())
    old = entries(fabric, "tor1", 6)[0]
    conn = ctl2.conn("tor1")
    conn.write([JobAdmissionTables(conn).job_delete(6, 0)])  # behind the controller's back
    dry = ctl2.reconcile(fix=False)
    assert dry["tor1"]["repaired"] == ["job 6: job_config[6]: missing (not fixed)"]
    report = ctl2.reconcile()
    assert report["tor1"]["repaired"] == ["job 6: job_config[6]: missing"]
    assert entries(fabric, "tor1", 6)[0] == old
    # Still retiring after the restart: a second resize is refused, naming every host.
    with pytest.raises(ControllerError, match="hosts h1, h2, h3, h4 have not contributed"):
        ctl2.resize_job(6, 16)


def test_a_resize_that_does_not_fit_changes_nothing(make_control):
    ctl, fabric = make_control("star")
    for jid in range(1, 8):
        ctl.create_job(JobSpec(jid, ("h1",), window=512))
    ctl.create_job(JobSpec(8, ("h2",), window=500))  # 12 slots left, at 4084
    before = (ctl.job(1), entries(fabric, "s1", 1), ctl.agent_params(1))
    with pytest.raises(ControllerError) as e:
        ctl.resize_job(1, 64)
    assert str(e.value) == (
        "job 1 cannot be resized: its new pool, held beside its current one until the hosts "
        "have moved, needs a window of 64 slots on each of its switches, and the largest "
        "window that fits on all of them now is 12 (s1: free 4084-4095 (12); at most 12, its "
        "largest free range); ask for a window of at most 12, or pass --min-window 12 or less")
    assert (ctl.job(1), entries(fabric, "s1", 1), ctl.agent_params(1)) == before
    # With a minimum it fits: the largest window there is, beside the old pool.
    rec = ctl.resize_job(1, 64, min_window=8)
    assert rec.pools[0].size == 12 and rec.pools[0].base == 4084
    assert ctl.agent_params(1).window == 12
    # Full now: nothing fits, and the refusal says where to make room.
    with pytest.raises(ControllerError, match=r"job 2 cannot be resized: .* no window fits "
                                              r"on all of them now .*delete a job on s1 first"):
        ctl.resize_job(2, 4)
    with pytest.raises(ControllerError, match="no job 9"):
        ctl.resize_job(9, 4)
    with pytest.raises(ControllerError, match="job 2 not resized: window must be at least 1"):
        ctl.resize_job(2, 0)


def test_a_failed_install_rolls_the_resize_back(make_control):
    ctl, fabric = make_control("leafspine")
    ctl.create_job(JobSpec(7, ("h1", "h3"), window=4))
    before = ctl.job(7), ctl.agent_params(7)
    # Behind the controller's back, the spine (written last) already holds job 7's pool 1.
    foreign = JobConfig(7, 3000, 4, 1, 77, 999, 1, 0, 5, pool=1, epoch=1)
    spine = ctl.conn("spine")
    spine.write([JobAdmissionTables(spine).job_update(Update.INSERT, foreign)])
    with pytest.raises(SwitchFailure, match="job 7 not resized, nothing changed"):
        ctl.resize_job(7, 8)
    assert (ctl.job(7), ctl.agent_params(7)) == before
    for s in ("tor1", "tor2"):
        assert set(entries(fabric, s, 7)) == {0}, s
    assert entries(fabric, "spine", 7)[1] == foreign  # what it collided with stays
    assert all(ctl.slots()[s].used() == 4 for s in ("tor1", "tor2", "spine"))


def test_a_resize_interrupted_mid_install_is_finished_by_reconcile(make_control, tmp_path,
                                                                    monkeypatch):
    """The process dies after the first switch got the new pool: agents are still handed the
    old pool (the new one is not on every switch), and reconcile installs the rest."""
    ctl, fabric = make_control("leafspine")
    ctl.create_job(JobSpec(8, ("h1", "h2", "h3", "h4"), window=4))
    real = StatsCounters.pool_reset_updates
    calls = []

    def dying(self, stat_idx, bit):
        if calls:
            raise KeyboardInterrupt  # the operator's Ctrl-C, or a crash, mid-way
        calls.append(self.sw.name)
        return real(self, stat_idx, bit)

    monkeypatch.setattr(StatsCounters, "pool_reset_updates", dying)
    with pytest.raises(KeyboardInterrupt):
        ctl.resize_job(8, 8)
    monkeypatch.setattr(StatsCounters, "pool_reset_updates", real)
    ctl.close()
    ctl2, _ = make_control("leafspine", state=tmp_path / "state.sqlite", fabric=fabric)
    assert ctl2.job(8).installing
    assert (ctl2.agent_params(8).window, ctl2.agent_params(8).pool) == (4, 0)
    with pytest.raises(ControllerError, match="interrupted before every switch had the new "
                                              "pool; run `passing-ctl reconcile`"):
        ctl2.resize_job(8, 16)
    assert set(entries(fabric, "tor1", 8)) == {0, 1} and set(entries(fabric, "tor2", 8)) == {0}
    report = ctl2.reconcile()
    assert report["tor2"]["repaired"] == ["job 8: job_config[8, pool 1]: missing"]
    assert not ctl2.job(8).installing
    assert (ctl2.agent_params(8).window, ctl2.agent_params(8).pool) == (8, 1)
    assert all(set(entries(fabric, s, 8)) == {0, 1} for s in ("tor1", "tor2", "spine"))


def all_moved(monkeypatch, before=None) -> None:
    """Every host counts as moved to the new pool (pool_contribs reports every contributor),
    for tests that send no frames; `before()`, if given, runs first at each read."""
    def counts(self, stat_idx, bit):
        if before is not None:
            before()
        return dict.fromkeys(range(P.MAX_FAN_IN), 1)
    monkeypatch.setattr(StatsCounters, "pool_contribs", counts)


@pytest.mark.parametrize("meanwhile", ["resize", "delete, create and resize"])
def test_a_retire_from_an_out_of_date_reading_changes_nothing(make_control, tmp_path,
                                                              monkeypatch, meanwhile):
    """Controller S (`job show`) has read job 3 and found every host moved; before it deletes
    the old pool, controller R on the same state file (`job resize` in another shell) retires
    that pool itself and installs the next one under the same pool bit, or deletes the job,
    creates it again and resizes it (the same epoch, other pools). S must delete none of R's
    entries and free none of R's slots."""
    s_ctl, fabric = make_control("leafspine")
    s_ctl.create_job(JobSpec(3, ("h1", "h3"), window=4))
    s_ctl.resize_job(3, 8)  # epoch 1: the epoch 0 pools retire under bit 0
    r_ctl, _ = make_control("leafspine", state=tmp_path / "state.sqlite", fabric=fabric)
    done = []

    def r_meanwhile() -> None:
        if done:
            return
        done.append(True)
        s_ctl.disconnect()  # one P4Runtime master at a time, as two processes in turn
        if meanwhile == "resize":
            rec = r_ctl.resize_job(3, 4)  # retires bit 0, installs epoch 2 under bit 0
            assert rec.pool_epoch == 2
        else:
            r_ctl.delete_job(3)
            r_ctl.create_job(JobSpec(3, ("h1", "h3"), window=4))
            rec = r_ctl.resize_job(3, 8)
            assert rec.pool_epoch == 1 and rec.retiring  # as S read it, but other pools
        r_ctl.disconnect()

    all_moved(monkeypatch, before=r_meanwhile)
    move = s_ctl.retire_pools(3)  # S reads the record, then R runs while S reads counters
    assert done and move.retired == ()
    rec = r_ctl.job(3)
    assert rec.retiring and rec.pool_bit == (0 if meanwhile == "resize" else 1)
    for s in ("tor1", "tor2", "spine"):
        on_switch = entries(fabric, s, 3)
        assert set(on_switch) == {0, 1}, s
        assert {c.gen for c in on_switch.values()} == \
            {p.gen for p in rec.pools + rec.retiring if p.switch == s}, s
    assert s_ctl.job(3) == rec
    assert all(not r["repaired"] and not r["stray"] for r in s_ctl.reconcile(fix=False).values())


def test_an_install_whose_answer_was_lost_is_cleaned_up(make_control, monkeypatch):
    """The spine applies the new pool's insert but the answer is lost (a connection error, not
    a refusal): the rollback deletes it there too, so the next resize can insert it again."""
    ctl, fabric = make_control("leafspine")
    ctl.create_job(JobSpec(7, ("h1", "h3"), window=4))
    before = ctl.job(7), ctl.agent_params(7)
    spine = ctl.conn("spine")
    real = spine.write
    refuse_delete = []

    def answer_lost(updates):
        updates = list(updates)
        if refuse_delete and updates[0].type == Update.DELETE:
            raise SwitchError("switch spine: write failed: UNAVAILABLE: connection reset")
        real(updates)
        if updates[0].type == Update.INSERT:
            raise SwitchError("switch spine: write failed: UNAVAILABLE: connection reset")

    monkeypatch.setattr(spine, "write", answer_lost)
    with pytest.raises(SwitchFailure, match="job 7 not resized, nothing changed: switch spine: "
                                            "write failed: UNAVAILABLE"):
        ctl.resize_job(7, 8)
    assert (ctl.job(7), ctl.agent_params(7)) == before
    for s in ("tor1", "tor2", "spine"):
        assert set(entries(fabric, s, 7)) == {0}, s
    assert all(ctl.slots()[s].used() == 4 for s in ("tor1", "tor2", "spine"))

    # The cleanup fails too: the error says what may be left, and where to see it.
    refuse_delete.append(True)
    with pytest.raises(SwitchFailure) as e:
        ctl.resize_job(7, 8)
    assert "nothing changed" not in str(e.value)
    assert str(e.value).endswith(
        "its record is as before, but its new pool's job_config entry (pool bit 1) may be left "
        "on spine, which could not be cleaned up: `passing-ctl reconcile` reports it as stray")
    assert (ctl.job(7), ctl.agent_params(7)) == before
    assert ctl.reconcile(fix=False)["spine"]["stray"] == ["job_config[7, pool 1]"]
    monkeypatch.setattr(spine, "write", real)
    spine.write([JobAdmissionTables(spine).job_delete(7, 1)])  # the operator removes it
    rec = ctl.resize_job(7, 8)
    assert rec.pool_epoch == 1
    assert all(set(entries(fabric, s, 7)) == {0, 1} for s in ("tor1", "tor2", "spine"))


def test_stats_reports_a_retire_it_could_not_check_and_keeps_the_counters(make_control,
                                                                          monkeypatch, capsys):
    """As `job show`: a ToR that does not answer whether the hosts have moved leaves the old
    pool retiring and is reported, and the counters are still there."""
    ctl, _ = make_control("leafspine")
    ctl.create_job(JobSpec(4, ("h1", "h3"), window=4))
    ctl.resize_job(4, 8)
    real = StatsCounters.pool_contribs

    def tor2_silent(self, stat_idx, bit):
        if self.sw.name == "tor2":
            raise SwitchError("switch tor2: read failed: UNAVAILABLE")
        return real(self, stat_idx, bit)

    monkeypatch.setattr(StatsCounters, "pool_contribs", tor2_silent)
    stats = ctl.stats(4)
    assert set(stats) == {"tor1", "tor2", "spine"}
    for s, counts in stats.items():
        assert counts["job_contributions"] == 0 and counts["fan_in"] >= 1, s
        assert counts["move_error"] == ("job 4: cannot tell whether its hosts use the new pool: "
                                        "switch tor2: read failed: UNAVAILABLE"), s
    assert ctl.job(4).retiring
    code, out, _ = cli(ctl, capsys, "stats", "4", "--json")
    assert code == 0 and "switch tor2: read failed" in json.loads(out)["4"]["tor1"]["move_error"]


def test_in_ina_mode_a_host_has_moved_when_every_one_of_its_gpus_has(make_controller):
    ctl, fabric = make_controller("star")
    ctl.create_job(JobSpec(9, ("h1", "h2"), window=4, mode="ina"))
    ctl.resize_job(9, 8)
    params = ctl.agent_params(9)
    flags = int(P.Flag.CONTRIB | P.Flag.POOL)

    def rank_sends(host: str, rank: int) -> None:
        hp, h = params.host(host), ctl.topo.hosts[host]
        payload = packet.pack(np.ones(P.K, dtype=np.int64), pool=params.pool, job_id=9, slot=0,
                              contributor=params.contributor_ids(host)[rank], flags=flags,
                              num_contrib=1)
        port_of(ctl, fabric, host).send(bytes(
            Ether(src=h.mac, dst=hp.switch_mac) / IP(src=h.ip, dst=hp.switch_ip)
            / UDP(sport=params.agent_udp_ports(host)[rank], dport=params.switch_udp_port)
            / payload))

    for host, rank in (("h1", 0), ("h2", 0), ("h2", 1)):
        rank_sends(host, rank)
    stat_idx = ctl.job(9).pools[0].stat_idx
    wait_counted(ctl, "s1", stat_idx, 1, 3)
    move = ctl.retire_pools(9)
    assert (move.moved, move.waiting) == (("h2",), ("h1",))  # h1's second GPU has not
    rank_sends("h1", 1)
    wait_counted(ctl, "s1", stat_idx, 1, 4)
    move = ctl.retire_pools(9)
    assert not move.pending and move.moved == ("h1", "h2") and len(move.retired) == 1
    assert set(entries(fabric, "s1", 9)) == {1}


def cli(ctl: Controller, capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv), ctl=ctl)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_job_resize_and_show(make_controller, tmp_path, capsys):
    ctl, fabric = make_controller("star")
    assert cli(ctl, capsys, "job", "create", "7", "--hosts", "h1,h2", "--window", "8")[0] == 0
    code, out, _ = cli(ctl, capsys, "job", "resize", "7", "--window", "16", "--json",
                       "--params-out", str(tmp_path / "job7.json"))
    assert code == 0
    res = json.loads(out)
    assert (res["job_id"], res["window"], res["pool_epoch"]) == (7, 16, 1)
    assert [(p["switch"], p["slots"], p["size"]) for p in res["pools"]] == [("s1", "8-23", 16)]
    assert res["retiring"] == [{"switch": "s1", "slots": "0-7", "size": 8, "generation": 1,
                                "pool_bit": 0}]
    assert (res["agent_params"]["window"], res["agent_params"]["pool"]) == (16, 1)
    assert JobParams.load(tmp_path / "job7.json") == JobParams.from_dict(res["agent_params"]) \
        == ctl.agent_params(7)

    code, out, _ = cli(ctl, capsys, "job", "show", "7")
    assert code == 0
    assert ("pool epoch 1 (FLAG_POOL 1); old pool retiring until every host has contributed "
            "to the new one; moved: none; not yet: h1, h2") in out
    assert "retiring:\nSWITCH  SLOTS  SIZE  GENERATION\ns1      0-7    8     1" in out
    code, out, _ = cli(ctl, capsys, "slots", "--json")
    assert json.loads(out)["s1"]["retiring"] == {"7": [0, 8]}
    assert json.loads(out)["s1"]["used"] == 24

    send_round(ctl, fabric, 7, ["h1"])
    wait_counted(ctl, "s1", ctl.job(7).pools[0].stat_idx, 1, 1)
    code, out, _ = cli(ctl, capsys, "job", "show", "7", "--json")
    shown = json.loads(out)
    assert shown["move"]["moved"] == ["h1"] and shown["move"]["waiting"] == ["h2"]
    code, out, err = cli(ctl, capsys, "job", "resize", "7", "--window", "32")
    assert code == 3 and out == "" and err.count("\n") == 1
    assert "job 7 not resized" in err and "host h2 has not contributed" in err

    send_round(ctl, fabric, 7, ["h2"], seed=1)
    wait_counted(ctl, "s1", ctl.job(7).pools[0].stat_idx, 1, 2)
    code, out, _ = cli(ctl, capsys, "job", "show", "7")
    assert code == 0 and "pool epoch 1 (FLAG_POOL 1)\n" in out and "retiring" not in out
    assert entries(fabric, "s1", 7).keys() == {1}
    code, out, _ = cli(ctl, capsys, "job", "resize", "7", "--window", "4")
    assert code == 0 and out.startswith(
        "job 7 resized to a window of 4 (pool epoch 2) on s1; its agents move at a call "
        "boundary, and the old pool is freed once every host has contributed to the new one:")
    assert "retiring:\nSWITCH  SLOTS  SIZE\ns1      8-23   16" in out
    assert entries(fabric, "s1", 7).keys() == {0, 1} and entries(fabric, "s1", 7)[0].pool_size \
        == 4


@pytest.mark.parametrize("argv", [["job", "resize", "7"], ["job", "resize", "7", "--window",
                                                           "0"],
                                  ["job", "resize", "7", "--window", "many"],
                                  ["job", "resize", "7", "--window", "8", "--min-window", "-1"],
                                  ["job", "resize", "--window", "8"]])
def test_cli_job_resize_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "usage: passing-ctl job resize" in capsys.readouterr().err


def test_cli_job_resize_refusals_exit_3(make_control, capsys):
    ctl, fabric = make_control("star")
    ctl.create_job(JobSpec(7, ("h1",), window=8))
    for argv, message in [
        (["job", "resize", "9", "--window", "8"], "no job 9 (jobs: 7)"),
        (["job", "resize", "7", "--window", "8", "--min-window", "9"],
         "job 7 not resized: --min-window 9 is larger than --window 8"),
        (["job", "resize", "7", "--window", "5000"],
         "at most 512, the equal share (4096 slots / 8 shares)); ask for a window of at most 512"),
    ]:
        code, out, err = cli(ctl, capsys, *argv)
        assert code == 3, argv
        assert message in err and "Traceback" not in err and err.count("\n") == 1, (argv, err)
    assert ctl.job(7).pool_epoch == 0 and set(entries(fabric, "s1", 7)) == {0}
