"""The controller against live switches (the model always, BMv2 when installed) over gRPC:
forwarding, jobs in one rack and across racks, many jobs, rollback, restart and reconcile.
Tests that send frames use `make_controller` (switch processes, root); the others
`make_control` (the model in-process, no root; BMv2 processes)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import Ether

from controller.core import Controller, ControllerError, Endpoint
from controller.job_plan import JobSpec
from controller.switch import Update
from controller.tables.guard import ResultGuardTables
from controller.tables.job_admission import JobAdmissionTables, JobConfig
from controller.topology import load
from passing import packet
from passing import protocol as P
from passing.pipeline_files import K_STAMP
from testbed.scapy_layer import Passing  # noqa: F401  (decodes results)
from tests import REPO


def contribution(ctl: Controller, job_id: int, host: str, values, slot=0, version=0,
                 flags=int(P.Flag.CONTRIB), pool: int | None = None) -> bytes:
    """`host`'s contribution to round `version` (0 or 1) of `slot`, in pool number `pool`
    (default: the one the job's parameters name); the flags as given."""
    params = ctl.agent_params(job_id)
    hp = params.host(host)
    h = ctl.topo.hosts[host]
    payload = packet.pack(np.asarray(values), pool=params.pool if pool is None else pool,
                          job_id=job_id, slot=slot, round=version,
                          contributor=hp.contributor_id, flags=flags, num_contrib=h.gpus)
    return bytes(Ether(src=h.mac, dst=hp.switch_mac) / IP(src=h.ip, dst=hp.switch_ip)
                 / UDP(sport=params.agent_udp_port, dport=params.switch_udp_port) / payload)


def port_of(ctl: Controller, fabric, host: str):
    h = ctl.topo.hosts[host]
    return fabric[h.rack].test_ports[h.port]


def allreduce(ctl, fabric, job_id, hosts, slot=0, version=0, seed=0):
    rng = np.random.default_rng(seed)
    vals = {h: rng.integers(-(2**20), 2**20, size=P.K) for h in hosts}
    for h in hosts:
        port_of(ctl, fabric, h).send(contribution(ctl, job_id, h, vals[h], slot, version))
    expected = np.sum(list(vals.values()), axis=0).astype(np.int32)
    params = ctl.agent_params(job_id)
    for h in hosts:
        frames = port_of(ctl, fabric, h).recv(1, 3)
        assert frames, f"{h}: no result"
        pkt = Ether(frames[0])
        assert pkt[IP].dst == ctl.topo.hosts[h].ip and pkt[UDP].dport == params.agent_udp_port
        rec = packet.unpack(bytes(pkt[UDP].payload))
        assert np.array_equal(rec["values"], expected), h
        assert rec["num_contrib"] == sum(ctl.topo.hosts[x].gpus for x in hosts)


def test_prepare_keeps_a_loaded_pipeline_and_installs_forwarding(make_controller):
    ctl, fabric = make_controller("star")
    assert ctl.prepare("s1") == "kept"
    assert ctl.prepare("s1") == "kept"  # safe to repeat
    h1, h3 = ctl.topo.hosts["h1"], ctl.topo.hosts["h3"]
    ping = bytes(Ether(src=h1.mac, dst=h3.mac) / IP(src=h1.ip, dst=h3.ip) / ICMP())
    port_of(ctl, fabric, "h1").send(ping)
    assert port_of(ctl, fabric, "h3").recv(1, 2) == [ping]
    assert [r["pipeline"] for r in ctl.switch_status()] == ["ours"]


def test_job_on_one_switch_sums_all_hosts(make_controller):
    ctl, fabric = make_controller("star")
    rec = ctl.create_job(JobSpec(1, ("h1", "h2", "h3", "h4"), window=16))
    assert [(p.switch, p.size, p.fan_in, p.is_root) for p in rec.pools] == [("s1", 16, 4, True)]
    allreduce(ctl, fabric, 1, ["h1", "h2", "h3", "h4"])
    stats = ctl.stats(1)["s1"]
    assert stats["job_contributions"] == 4 and stats["job_results"] == 1


def test_a_quorum_set_live_closes_rounds_and_stats_name_the_late_host(make_controller):
    """job set --quorum on a running job: a CLOSE completes a round with 2 of 3 hosts, the
    third's late contribution gets that result and is never added, stats name it; back to
    'all', a CLOSE completes nothing until the last host."""
    ctl, fabric = make_controller("star")
    hosts = ["h1", "h2", "h3"]
    ctl.create_job(JobSpec(3, tuple(hosts), window=4))
    assert ctl.quorums(3) == {"s1": {"fan_in": 3, "quorum": 3}}
    ctl.set_quorum(3, (2,))
    assert ctl.quorums(3) == {"s1": {"fan_in": 3, "quorum": 2}}
    assert JobSpec.from_dict(ctl.job(3).spec).quorum == (2,)
    rng = np.random.default_rng(4)
    vals = {h: rng.integers(-(2**20), 2**20, size=P.K) for h in hosts}
    close = int(P.Flag.CONTRIB | P.Flag.RETRANS | P.Flag.CLOSE)

    def result(host):
        frames = port_of(ctl, fabric, host).recv(1, 3)
        assert frames, f"{host}: no result"
        return packet.unpack(bytes(Ether(frames[0])[UDP].payload))

    for h in ("h1", "h2"):
        port_of(ctl, fabric, h).send(contribution(ctl, 3, h, vals[h]))
    # Frames from two ports may be taken in either order: CLOSE only once both are counted.
    deadline = time.monotonic() + 5
    while ctl.stats(3)["s1"]["job_contributions"] < 2:
        assert time.monotonic() < deadline, "the two contributions were not counted"
        time.sleep(0.05)
    port_of(ctl, fabric, "h1").send(contribution(ctl, 3, "h1", vals["h1"], flags=close))
    two = (vals["h1"] + vals["h2"]).astype(np.int32)
    for h in hosts:
        assert np.array_equal(result(h)["values"], two), h
    port_of(ctl, fabric, "h3").send(contribution(ctl, 3, "h3", vals["h3"]))
    assert np.array_equal(result("h3")["values"], two)
    stats = ctl.stats(3)["s1"]
    assert stats["job_quorum_rounds"] == 1 and stats["job_late"] == 1
    assert stats["late_by"] == {"h3": 1} and stats["quorum"] == 2

    ctl.set_quorum(3, ())
    assert ctl.quorums(3) == {"s1": {"fan_in": 3, "quorum": 3}}
    for h in ("h1", "h2"):
        port_of(ctl, fabric, h).send(contribution(ctl, 3, h, vals[h], slot=1))
    port_of(ctl, fabric, "h1").send(contribution(ctl, 3, "h1", vals["h1"], slot=1, flags=close))
    assert port_of(ctl, fabric, "h1").recv(1, 0.5) == []
    port_of(ctl, fabric, "h3").send(contribution(ctl, 3, "h3", vals["h3"], slot=1))
    total = sum(vals.values()).astype(np.int32)
    for h in hosts:
        assert np.array_equal(result(h)["values"], total), h


@pytest.mark.parametrize("quorum,expected", [
    ((), {"tor1": 2, "tor2": 2, "spine": 2}),
    ((1, 2), {"tor1": 1, "tor2": 1, "spine": 2}),
    ((1,), {"tor1": 1, "tor2": 1, "spine": 2}),  # no level 1: the spine waits for both racks
    ((5, 1), {"tor1": 2, "tor2": 2, "spine": 1}),  # above a fan-in: that switch's fan-in
])
def test_quorum_per_level_is_installed_on_each_switch(make_control, quorum, expected):
    ctl, _ = make_control("leafspine")
    ctl.create_job(JobSpec(4, ("h1", "h2", "h3", "h4"), window=4, quorum=quorum))
    assert {s: q["quorum"] for s, q in ctl.quorums(4).items()} == expected
    for name, q in expected.items():
        cfg = JobAdmissionTables(ctl.conn(name)).jobs()[4, 0]
        assert (cfg.fan_in, cfg.quorum) == (2, q), name
    assert all(not e["repaired"] for e in ctl.reconcile(fix=False).values())


def test_a_job_stored_before_quorums_existed_waits_for_everyone():
    spec = JobSpec(4, ("h1", "h2"), window=4).to_dict()
    del spec["quorum"]
    assert JobSpec.from_dict(spec).quorum == ()


def test_job_spanning_racks_gets_pools_on_both_tors_and_the_spine(make_controller):
    ctl, fabric = make_controller("leafspine")
    rec = ctl.create_job(JobSpec(2, ("h1", "h2", "h3", "h4"), window=8))
    pools = {p.switch: p for p in rec.pools}
    assert set(pools) == {"tor1", "tor2", "spine"}
    assert (pools["tor1"].fan_in, pools["tor1"].is_root, pools["tor1"].uplink_port) == (2, False, 3)
    assert (pools["spine"].fan_in, pools["spine"].is_root) == (2, True)
    assert len({p.size for p in pools.values()}) == 1
    allreduce(ctl, fabric, 2, ["h1", "h2", "h3", "h4"], slot=5, version=1)
    # A job inside one rack of the same fabric uses its ToR alone, as root.
    rec = ctl.create_job(JobSpec(3, ("h3", "h4"), window=8))
    assert [(p.switch, p.is_root) for p in rec.pools] == [("tor2", True)]
    allreduce(ctl, fabric, 3, ["h3", "h4"], seed=3)


def test_many_jobs_never_overlap_and_deleting_frees(make_control):
    ctl, fabric = make_control("star")
    rng = np.random.default_rng(7)
    live = {}
    for jid in range(1, 30):
        if len(live) == 8 or (live and rng.random() < 0.35):
            victim = int(rng.choice(sorted(live)))
            ctl.delete_job(victim)
            del live[victim]
        hosts = tuple(sorted(rng.choice(["h1", "h2", "h3", "h4"], size=2, replace=False)))
        live[jid] = ctl.create_job(JobSpec(jid, hosts, window=int(rng.integers(1, 513))))
        on_switch = JobAdmissionTables(fabric["s1"].conn).jobs()
        assert set(on_switch) == {(j, 0) for j in live}
        spans = sorted((c.pool_base, c.pool_base + c.pool_size) for c in on_switch.values())
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
        assert len({c.gen for c in on_switch.values()}) == len(on_switch)
    with pytest.raises(ControllerError, match="job 29 already exists"):
        ctl.create_job(JobSpec(29, ("h1",), window=1))


def test_job_that_does_not_fit(make_control):
    ctl, _ = make_control("star")
    with pytest.raises(ControllerError, match="equal share|share"):
        ctl.create_job(JobSpec(4, ("h1", "h2"), window=4000))
    rec = ctl.create_job(JobSpec(4, ("h1", "h2"), window=4000, min_window=100))
    assert rec.pools[0].size == P.SLOT_CAPACITY // 8
    with pytest.raises(ControllerError, match="not in topology"):
        ctl.create_job(JobSpec(5, ("h1", "h9"), window=4))


def test_failed_install_rolls_back_every_switch(make_control):
    ctl, fabric = make_control("leafspine")
    ctl.prepare("spine")
    # Behind the controller's back, the spine already holds an entry for job 6 (the last
    # switch the controller writes): installing there fails after both ToRs were written.
    foreign = JobConfig(6, 3000, 4, 1, 77, 999, 1, 0, 100)
    spine = ctl.conn("spine")
    spine.write([JobAdmissionTables(spine).job_update(Update.INSERT, foreign)])
    with pytest.raises(ControllerError, match="not created, nothing left installed"):
        ctl.create_job(JobSpec(6, ("h1", "h3"), window=4))
    assert ctl.store.get_job(6) is None
    for name in ("tor1", "tor2"):
        assert JobAdmissionTables(fabric[name].conn).jobs() == {}, name
        assert ResultGuardTables(fabric[name].conn).guards() == {}, name
    # The rollback took back what it wrote and nothing else: the entry it collided with stays.
    assert JobAdmissionTables(fabric["spine"].conn).jobs() == {(6, 0): foreign}
    assert JobAdmissionTables(fabric["spine"].conn).members() == {}
    assert ResultGuardTables(fabric["spine"].conn).guards() == {}
    assert all(ctl.slots()[s].used() == 0 for s in ("tor1", "tor2", "spine"))


def test_restart_loses_nothing_and_reconcile_reinstalls(make_controller, tmp_path):
    ctl, fabric = make_controller("leafspine")
    ctl.create_job(JobSpec(7, ("h1", "h2", "h3", "h4"), window=4))
    ctl.create_job(JobSpec(8, ("h1", "h2"), window=4))
    ctl.close()
    fabric.reset()  # the switches restart and lose everything
    ctl2, _ = make_controller("leafspine", state=tmp_path / "state.sqlite", fabric=fabric)
    assert [j.job_id for j in ctl2.store.jobs()] == [7, 8]
    dry = ctl2.reconcile(fix=False)
    assert any("missing" in x for x in dry["spine"]["repaired"])
    assert JobAdmissionTables(fabric["spine"].conn).jobs() == {}
    report = ctl2.reconcile()
    assert any("job 7" in x for x in report["tor1"]["repaired"])
    assert all(not r["errors"] for r in report.values())
    allreduce(ctl2, fabric, 7, ["h1", "h2", "h3", "h4"])
    allreduce(ctl2, fabric, 8, ["h1", "h2"], slot=1)
    # A second reconcile finds everything in place; a foreign entry is reported, not removed.
    adm = JobAdmissionTables(fabric["tor2"].conn)
    ctl2.conn("tor2").write([adm.job_update(Update.INSERT, JobConfig(
        99, 1000, 4, 1, 77, 999, 1, 0, 100))])
    again = ctl2.reconcile()
    assert all(not r["repaired"] for r in again.values())
    assert again["tor2"]["stray"] == ["job_config[99]"]
    assert (99, 0) in adm.jobs()


def test_unreachable_switch_is_a_clear_error(tmp_path):
    topo = load(REPO / "topologies" / "star.json")
    ctl = Controller(topo, {"s1": Endpoint("s1", "127.0.0.1:1", 0)}, tmp_path / "s.sqlite",
                     connect_timeout=0.2, retries=2, sleep=lambda _: None)
    try:
        with pytest.raises(ControllerError, match=r"no P4Runtime server at 127.0.0.1:1.*tried 2"):
            ctl.create_job(JobSpec(1, ("h1",), window=2))
        assert ctl.store.get_job(1) is None
    finally:
        ctl.close()


def test_a_build_for_another_k_is_refused_with_how_to_fix_it(tmp_path):
    """A controller whose build directory holds a pipeline of another K (PASSING_K) would push
    one that drops every packet of this K as malformed: it refuses, saying why."""
    other = next(k for k in P.K_CHOICES if k != P.K)
    build = tmp_path / "build"
    build.mkdir()
    for name in ("passing.json", "passing.p4info.txtpb"):
        (build / name).write_text("")
    (build / K_STAMP).write_text(f"{other}\n")
    topo = load(REPO / "topologies" / "star.json")
    ctl = Controller(topo, {"s1": Endpoint("s1", "127.0.0.1:1", 0)}, tmp_path / "s.sqlite",
                     build_dir=build)
    try:
        with pytest.raises(ControllerError, match=f"built for K={other}, but PASSING_K gives "
                                                  f"K={P.K}: build it for this K"):
            ctl.pipelines.pipeline()
    finally:
        ctl.close()


def test_controller_killed_mid_create_is_completed_by_reconcile(make_control, tmp_path,
                                                                monkeypatch):
    """The process dies after the first switch of a three-switch job: the job is on disk, and
    the next controller's reconcile installs the rest; nothing is lost or duplicated. (That a
    reconciled job sums is test_restart_loses_nothing_and_reconcile_reinstalls' part.)"""
    ctl, fabric = make_control("leafspine")
    from controller import installer
    real_install = installer.install
    calls = []

    def dying_install(conn, d):
        if calls:
            raise KeyboardInterrupt  # the operator's Ctrl-C, or a crash, mid-way
        calls.append(conn.name)
        real_install(conn, d)

    monkeypatch.setattr(installer, "install", dying_install)
    with pytest.raises(KeyboardInterrupt):
        ctl.create_job(JobSpec(9, ("h1", "h2", "h3", "h4"), window=4))
    monkeypatch.setattr(installer, "install", real_install)
    ctl.close()
    assert calls == ["tor1"]
    ctl2, _ = make_control("leafspine", state=tmp_path / "state.sqlite", fabric=fabric)
    assert [j.job_id for j in ctl2.store.jobs()] == [9]
    report = ctl2.reconcile()
    assert report["tor1"]["repaired"] == [] and report["spine"]["repaired"]
    assert all(JobAdmissionTables(fabric[s].conn).jobs().keys() == {(9, 0)}
               for s in ("tor1", "tor2", "spine"))
    again = ctl2.reconcile(fix=False)
    assert all(not r["repaired"] and not r["stray"] and not r["errors"] for r in again.values())
