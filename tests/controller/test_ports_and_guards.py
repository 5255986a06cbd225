"""Agent ports and the result guard, against live switches (the model always, BMv2 when
installed): every job gets its own range of agent ports, every switch of a job guards them, and
install, delete, reconcile and a lost state file all keep the guard entries right. Tests that
send frames use `make_controller` (root), the others `make_control` (no root on the model)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from controller.core import Controller, ControllerError
from controller.job_plan import JobSpec
from controller.store import JobRecord, PoolRecord
from controller.switch import Update
from controller.tables.guard import ResultGuardTables
from controller.tables.job_admission import JobAdmissionTables
from passing import packet
from passing import protocol as P
from tests.controller.test_controller_fabric import allreduce, contribution, port_of


def guards(fabric, switch: str) -> dict[int, int]:
    return ResultGuardTables(fabric[switch].conn).guards()


def ina_round(ctl: Controller, fabric, job_id: int) -> set[tuple[str, int]]:
    """Every GPU of the job contributes ones to slot 0; returns (host, UDP port) of each result
    and checks that each is the full sum."""
    params = ctl.agent_params(job_id)
    for hp in params.hosts:
        h = ctl.topo.hosts[hp.name]
        for rank in range(hp.local_gpus):
            payload = packet.pack(np.ones(P.K, dtype=np.int64), job_id=job_id, slot=0,
                                  contributor=params.contributor_ids(hp.name)[rank],
                                  flags=int(P.Flag.CONTRIB), num_contrib=1)
            port_of(ctl, fabric, hp.name).send(bytes(
                Ether(src=h.mac, dst=hp.switch_mac) / IP(src=h.ip, dst=hp.switch_ip)
                / UDP(sport=params.agent_udp_ports(hp.name)[rank],
                      dport=params.switch_udp_port) / payload))
    got = set()
    for hp in params.hosts:
        for frame in port_of(ctl, fabric, hp.name).recv(hp.local_gpus, 3):
            pkt = Ether(frame)
            assert (packet.unpack(bytes(pkt[UDP].payload))["values"] == params.gpus).all()
            got.add((hp.name, pkt[UDP].dport))
    return got


def udp(ctl: Controller, src: str, dst: str, dport: int, sport: int = 12345) -> bytes:
    """Host `src` sends a UDP datagram to host `dst`: what a forged result looks like when
    dport is one of dst's agent ports."""
    a, b = ctl.topo.hosts[src], ctl.topo.hosts[dst]
    return bytes(Ether(src=a.mac, dst=b.mac) / IP(src=a.ip, dst=b.ip)
                 / UDP(sport=sport, dport=dport) / (b"\x00" * 32))


def test_adjacent_ina_jobs_get_disjoint_agent_ports(make_controller, tmp_path):
    ctl, fabric = make_controller("star")
    r1 = ctl.create_job(JobSpec(1, ("h1", "h2"), window=4, mode="ina"))
    r2 = ctl.create_job(JobSpec(2, ("h3", "h4"), window=4, mode="ina"))
    # Every host has 2 GPUs, so each job needs 2 ports. The old rule (40000 + job id) gave
    # job 1 40001-40002 and job 2 40002-40003: both jobs' agents on port 40002.
    assert [ctl.agent_params(j).agent_udp_port for j in (1, 2)] == [61000, 61002]
    assert ina_round(ctl, fabric, 1) == {(h, p) for h in ("h1", "h2") for p in (61000, 61001)}
    assert ina_round(ctl, fabric, 2) == {(h, p) for h in ("h3", "h4") for p in (61002, 61003)}
    i1, i2 = r1.pools[0].stat_idx, r2.pools[0].stat_idx
    assert guards(fabric, "s1") == {61000: i1, 61001: i1, 61002: i2, 61003: i2}
    # A passing job needs one port: the next free one. A deleted job's range is free again.
    ctl.create_job(JobSpec(3, ("h1",), window=4))
    assert ctl.agent_params(3).agent_udp_port == 61004
    ctl.delete_job(1)
    ctl.create_job(JobSpec(4, ("h2",), window=4))
    assert ctl.agent_params(4).agent_udp_port == 61000
    # The port is part of the job's record: a restarted controller hands out the same one.
    ctl.close()
    ctl2, _ = make_controller("star", state=tmp_path / "state.sqlite", fabric=fabric)
    assert [ctl2.agent_params(j).agent_udp_port for j in (2, 3, 4)] == [61002, 61004, 61000]
    assert all(not r["repaired"] and not r["stray"] for r in ctl2.reconcile().values())


def test_explicit_agent_ports_must_not_overlap_another_job(make_control):
    ctl, fabric = make_control("star")
    ctl.create_job(JobSpec(1, ("h1", "h2"), window=4, mode="ina", agent_port=41000))
    with pytest.raises(ControllerError, match=r"job 2: agent ports 41001-41002 overlap job 1's "
                                              r"agent ports 41000-41001; pass another"):
        ctl.create_job(JobSpec(2, ("h3", "h4"), window=4, mode="ina", agent_port=41001))
    assert ctl.store.get_job(2) is None
    assert set(JobAdmissionTables(fabric["s1"].conn).jobs()) == {(1, 0)}
    assert set(guards(fabric, "s1")) == {41000, 41001}
    # Right below job 1's range is free for a one-port (passing) job.
    ctl.create_job(JobSpec(2, ("h3",), window=4, agent_port=40999))
    assert ctl.agent_params(2).agent_udp_port == 40999
    with pytest.raises(ControllerError, match=r"agent ports 65535-65536 run past 65535"):
        ctl.create_job(JobSpec(3, ("h3", "h4"), window=4, mode="ina", agent_port=65535))
    with pytest.raises(ControllerError, match=r"agent ports 48878-48879 include 48879"):
        ctl.create_job(JobSpec(3, ("h3", "h4"), window=4, mode="ina", agent_port=48878))
    # Allocation fills around explicit ranges.
    ctl.create_job(JobSpec(3, ("h4",), window=4, mode="ina"))
    assert ctl.agent_params(3).agent_udp_port == 61000


def test_every_switch_of_a_job_guards_its_agent_ports(make_controller):
    ctl, fabric = make_controller("leafspine")
    for name in ctl.topo.switches:
        ctl.prepare(name)  # L2 forwarding, for the ordinary traffic below
    ctl.create_job(JobSpec(1, ("h1", "h2"), window=4))  # takes counter row 0 on tor1 only
    rec = ctl.create_job(JobSpec(2, ("h1", "h2", "h3", "h4"), window=4, mode="ina"))
    pools = {p.switch: p for p in rec.pools}
    assert pools["tor1"].stat_idx != pools["tor2"].stat_idx
    base = ctl.agent_params(2).agent_udp_port
    for name, pool in pools.items():
        want = {base: pool.stat_idx, base + 1: pool.stat_idx}
        if name == "tor1":
            want[ctl.agent_params(1).agent_udp_port] = 0
        assert guards(fabric, name) == want, name
    # From h3 to the port h1's second GPU receives on: dropped at tor2, counted for job 2.
    port_of(ctl, fabric, "h3").send(udp(ctl, "h3", "h1", base + 1))
    # Ordinary UDP to another port crosses the fabric.
    port_of(ctl, fabric, "h3").send(udp(ctl, "h3", "h1", base + 7))
    got = port_of(ctl, fabric, "h1").recv(2, 2)
    assert [Ether(f)[UDP].dport for f in got] == [base + 7]
    stats = ctl.stats(2)
    assert (stats["tor2"]["drops_forged_result"], stats["tor1"]["drops_forged_result"]) == (1, 0)
    # The guards go with the job (job 1's stays).
    ctl.delete_job(2)
    assert guards(fabric, "tor2") == guards(fabric, "spine") == {}
    assert guards(fabric, "tor1") == {ctl.agent_params(1).agent_udp_port: 0}
    port_of(ctl, fabric, "h3").send(udp(ctl, "h3", "h1", base + 1))
    assert [Ether(f)[UDP].dport for f in port_of(ctl, fabric, "h1").recv(1, 2)] == [base + 1]


def spoil_guards(ctl: Controller) -> int:
    """Job 1 (ina, h1 and h2) on s1, then behind the controller's back one of its guards
    deleted and the other counting into another job's row; returns the job's stat_idx."""
    idx = ctl.create_job(JobSpec(1, ("h1", "h2"), window=4, mode="ina")).pools[0].stat_idx
    g = ResultGuardTables(ctl.conn("s1"))
    ctl.conn("s1").write([g.guard_delete(61001), g.guard_update(Update.MODIFY, 61000, idx + 3)])
    return idx


def test_repaired_guards_drop_forged_results_again(make_controller):
    ctl, fabric = make_controller("star")
    spoil_guards(ctl)
    ctl.reconcile()
    port_of(ctl, fabric, "h3").send(udp(ctl, "h3", "h1", 61001))
    assert port_of(ctl, fabric, "h1").recv(1, 1) == []
    assert ctl.stats(1)["s1"]["drops_forged_result"] == 1


def test_reconcile_repairs_guards_and_reports_unknown_ones(make_control):
    ctl, _ = make_control("star")
    idx = spoil_guards(ctl)
    conn = ctl.conn("s1")
    g = ResultGuardTables(conn)
    dry = ctl.reconcile(fix=False)["s1"]
    assert dry["repaired"] == [
        f"job 1: result_guard[udp port 61000]: counts into stat_idx {idx + 3}, not {idx} "
        "(not fixed)",
        "job 1: result_guard[udp port 61001]: missing (not fixed)"]
    assert g.guards() == {61000: idx + 3}
    assert len(ctl.reconcile()["s1"]["repaired"]) == 2
    assert g.guards() == {61000: idx, 61001: idx}
    # A guard no job accounts for is reported, never removed, and never handed out.
    conn.write([g.guard_update(Update.INSERT, 61002, 5)])
    again = ctl.reconcile()["s1"]
    assert again["repaired"] == [] and again["stray"] == ["result_guard[udp port 61002]"]
    assert g.guards()[61002] == 5
    with pytest.raises(ControllerError, match="port 61002, which switch s1 guards for no known"):
        ctl.create_job(JobSpec(2, ("h3",), window=4, agent_port=61002))
    ctl.create_job(JobSpec(2, ("h3",), window=4))
    assert ctl.agent_params(2).agent_udp_port == 61003


def test_new_state_file_allocates_above_what_the_switch_still_holds(make_controller, tmp_path):
    ctl, fabric = make_controller("star")
    ctl.create_job(JobSpec(1, ("h1", "h2"), window=4))
    ctl.create_job(JobSpec(2, ("h3", "h4"), window=4))
    # Job 1 leaves half a round in slot 0: h1 contributed, h2 did not.
    port_of(ctl, fabric, "h1").send(contribution(ctl, 1, "h1", np.full(P.K, 1000)))
    old = JobAdmissionTables(fabric["s1"].conn).jobs()
    old_guards = guards(fabric, "s1")
    ctl.close()
    # The state file is lost; the switch still holds both jobs and that slot state.
    ctl2, _ = make_controller("star", state=tmp_path / "new.sqlite", fabric=fabric)
    pool = ctl2.create_job(JobSpec(3, ("h1", "h2"), window=4)).pools[0]
    assert pool.base == old[1, 0].pool_base  # the same slots as job 1: the new store knows no job
    assert pool.gen > max(c.gen for c in old.values())
    assert pool.stat_idx not in {c.stat_idx for c in old.values()}
    assert pool.mcast_grp not in {c.mcast_grp for c in old.values()}
    assert ctl2.agent_params(3).agent_udp_port not in old_guards
    # Under job 1's generation, h1's old contribution would be taken for job 3's: the sum
    # would be wrong (h1 a duplicate). Under a new one the slot starts empty.
    allreduce(ctl2, fabric, 3, ["h1", "h2"])
    stray = ctl2.reconcile(fix=False)["s1"]["stray"]
    assert {"job_config[1]", "job_config[2]"} <= set(stray)
    assert {f"result_guard[udp port {p}]" for p in old_guards} <= set(stray)


def test_records_from_older_state_files_keep_their_derived_ports(make_controller):
    ctl, fabric = make_controller("star")
    # Written before ports were allocated: agent_port 0 means 40000 + job id, so these two
    # ina jobs' ranges (40001-40002 and 40002-40003) overlap.
    for jid, hosts in ((1, ("h1", "h2")), (2, ("h3", "h4"))):
        spec = JobSpec(jid, hosts, window=4, mode="ina").to_dict()
        assert spec["agent_port"] == 0
        ctl.store.add_job(JobRecord(jid, spec, (PoolRecord(
            "s1", base=8 * jid, size=4, gen=jid, stat_idx=jid, mcast_grp=jid + 1, fan_in=4,
            is_root=True, uplink_port=0),), time.time()))
    report = ctl.reconcile()["s1"]
    assert not report["errors"] and report["stray"] == []
    assert [ctl.agent_params(j).agent_udp_port for j in (1, 2)] == [40001, 40002]
    # The shared port is guarded for the lower job id, and a second pass agrees.
    assert guards(fabric, "s1") == {40001: 1, 40002: 1, 40003: 2}
    again = ctl.reconcile()["s1"]
    assert again["repaired"] == [] and again["stray"] == []
    assert ina_round(ctl, fabric, 1) == {(h, p) for h in ("h1", "h2") for p in (40001, 40002)}
    # New jobs avoid both ranges.
    i3 = ctl.create_job(JobSpec(3, ("h1",), window=4)).pools[0].stat_idx
    i4 = ctl.create_job(JobSpec(4, ("h3", "h4"), window=4, mode="ina")).pools[0].stat_idx
    assert [ctl.agent_params(j).agent_udp_port for j in (3, 4)] == [61000, 61001]
    # Job 1 goes: the port it shared passes to job 2 instead of going unguarded.
    ctl.delete_job(1)
    assert guards(fabric, "s1") == {61000: i3, 40002: 2, 40003: 2, 61001: i4, 61002: i4}
    assert ctl.reconcile()["s1"]["repaired"] == []
