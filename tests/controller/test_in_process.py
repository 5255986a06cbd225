"""Without root: the P4Runtime message dump, and the one description of a job's entries applied
in-process (the testbed's loopback switch) as over gRPC."""

from __future__ import annotations

import json

import pytest

from controller.cli import main
from controller.installer import SwitchSnapshot, differences, strays
from controller.switch import SwitchConnection, Update, WriteError
from controller.tables.job_admission import JobAdmissionTables
from switch_model.p4runtime_server import listen
from testbed.entries import agent_port, job_entries
from testbed.loopback import InProcessConnection, LoopbackSwitch
from tests import REPO
from tests.controller.conftest import ServedSwitches


@pytest.fixture
def star():
    switches = ServedSwitches(["s1"])
    yield switches
    switches.close()


def dump_records(path) -> list[tuple[str, str, str]]:
    """(rpc, message type, text) of each record of a P4Runtime dump."""
    out = []
    for record in path.read_text().split("\n["):
        head, _, text = record.lstrip("[").partition("\n")
        _, _switch, rpc, kind = head.split(" ", 3)
        out.append((rpc, kind, text))
    return out


def test_dump_holds_the_arbitration_and_every_write(star, tmp_path, capsys):
    cfg = tmp_path / "controller.json"
    cfg.write_text(json.dumps({
        "topology": str(REPO / "topologies" / "star.json"), "state": "state.sqlite",
        "switches": {"s1": {"address": star["s1"].grpc_address, "device_id": 0}}}))
    dump_dir = tmp_path / "dump"
    dump_dir.mkdir()
    args = ["--config", str(cfg), "--dump-p4runtime", str(dump_dir)]
    assert main([*args, "job", "create", "7", "--hosts", "h1,h2", "--window", "4"]) == 0
    assert main([*args, "job", "delete", "7"]) == 0
    capsys.readouterr()
    records = dump_records(dump_dir / "s1-p4runtime.log")
    kinds = [(rpc, kind) for rpc, kind, _ in records]
    # Both runs' stream: the arbitration sent, and the switch's answer making it primary.
    arbitration = [text for rpc, kind, text in records
                   if (rpc, kind) == ("StreamChannel", "StreamMessageRequest")]
    assert len(arbitration) == 2 and all("election_id" in t for t in arbitration)
    answers = [text for rpc, kind, text in records
               if (rpc, kind) == ("StreamChannel", "StreamMessageResponse")]
    assert answers and all("Is primary" in t for t in answers)
    # The job's writes (its entries inserted, then deleted), their answers, and the reads.
    writes = [text for rpc, kind, text in records if (rpc, kind) == ("Write", "WriteRequest")]
    job_table = star["s1"].conn.info.table("job_config").preamble.id
    job_writes = [w for w in writes if f"table_id: {job_table}" in w]
    assert len(job_writes) == 2
    assert "type: INSERT" in job_writes[0] and "type: DELETE" in job_writes[1]
    assert ("Write", "WriteResponse") in kinds
    assert ("Read", "ReadRequest") in kinds and ("Read", "ReadResponse") in kinds
    # The P4Info the switch reports is summarised, not written out whole.
    pipeline = [text for rpc, kind, text in records
                if kind == "GetForwardingPipelineConfigResponse"]
    assert pipeline and all("P4Info with" in t and "preamble" not in t for t in pipeline)


@pytest.mark.parametrize("kw,ports", [
    ({}, {(p, r): agent_port(p, r) for p in (1, 2, 3) for r in (0, 1)}),
    ({"agent_udp_port": 41000}, {(p, r): 41000 + r for p in (1, 2, 3) for r in (0, 1)}),
])
def test_loopback_switch_holds_exactly_its_jobs_entries(kw, ports):
    sw = LoopbackSwitch(3, job_id=4, slots=8, ranks=2, **kw)
    server, port = listen(sw.service, "127.0.0.1:0")
    try:
        with SwitchConnection("loopback", f"127.0.0.1:{port}", 0) as conn:
            conn.fetch_pipeline()
            snap = SwitchSnapshot.read(conn)
    finally:
        server.stop(grace=None)
    assert differences(snap, sw.entries) == []
    assert strays(snap, {4: sw.entries}, set()) == []
    assert snap.members == {(4, p): ((p - 1) * 2, 2) for p in (1, 2, 3)}
    assert {(port, rid - (port - 1) * 2): peer["dst_port"]
            for (_, port, rid), peer in snap.peers.items()} == ports
    assert snap.guards == {}


def test_in_process_writes_fail_as_writes_over_grpc_do(star):
    """The same refused updates give the same WriteError in-process as over gRPC, so the
    installer's rollback behaves alike on both."""
    job = job_entries(0, 5, {1: 0, 2: 1}, pool_size=4).job
    remote = star["s1"].conn  # primary: no controller holds the switch here
    local = InProcessConnection(star["s1"].service, name="s1")
    remote.write([JobAdmissionTables(remote).job_update(Update.INSERT, job)])
    failures = {}
    for how, conn in (("grpc", remote), ("in-process", local)):
        adm = JobAdmissionTables(conn)
        with pytest.raises(WriteError) as e:
            conn.write([adm.job_update(Update.INSERT, job), adm.job_delete(6)])
        failures[how] = [(i, code) for i, code, _ in e.value.failures]
        assert str(e.value).startswith(
            "switch s1: write failed: update 0 (table_entry): ALREADY_EXISTS")
    assert failures["grpc"] == failures["in-process"] == [(0, "ALREADY_EXISTS"),
                                                         (1, "NOT_FOUND")]
    assert JobAdmissionTables(remote).jobs() == {(5, 0): job}


def test_dumped_connection_still_reports_each_failed_update(star, tmp_path):
    dump = tmp_path / "s1.log"
    job = job_entries(0, 5, {1: 0}, pool_size=4).job
    with SwitchConnection("s1", star["s1"].grpc_address, 0, election_id=(0, 20),
                          dump_file=dump) as conn:
        conn.fetch_pipeline()
        adm = JobAdmissionTables(conn)
        conn.write([adm.job_update(Update.INSERT, job)])
        with pytest.raises(WriteError) as e:
            conn.write([adm.job_delete(6), adm.job_update(Update.INSERT, job)])
    assert [(i, code) for i, code, _ in e.value.failures] == [(0, "NOT_FOUND"),
                                                             (1, "ALREADY_EXISTS")]
    assert [(rpc, kind, text) for rpc, kind, text in dump_records(dump)
            if kind == "error"] == [("Write", "error", "UNKNOWN: Write failure.\n")]
