"""The P4Runtime service answers the same way on both targets, so the controller cannot tell
which one it talks to."""

from __future__ import annotations

import grpc
import pytest
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.switch import SwitchConnection, SwitchError, Update
from controller.tables.job_admission import JobAdmissionTables, JobConfig
from passing import protocol as P
from passing.pipeline_files import pipeline_files

JOB = JobConfig(job_id=5, pool_base=0, pool_size=4, fan_in=2, mcast_grp=9, gen=1, is_root=1,
                uplink_port=0, stat_idx=0)


def test_register_access_is_unimplemented(star):
    """Both targets refuse registers over P4Runtime: tests read them through each target's
    own side door (Fabric.register_read)."""
    sw = star["s1"]
    req = p4runtime_pb2.ReadRequest(device_id=sw.device_id)
    entry = req.entities.add().register_entry
    entry.register_id = sw.conn.info.register("slot_state").preamble.id
    entry.index.index = 0
    with grpc.insecure_channel(sw.grpc_address) as channel:
        with pytest.raises(grpc.RpcError) as e:
            list(p4runtime_pb2_grpc.P4RuntimeStub(channel).Read(req, timeout=10))
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_duplicate_insert_and_missing_delete_are_reported_per_update(star):
    conn = star["s1"].conn
    adm = JobAdmissionTables(conn)
    conn.write([adm.job_update(Update.INSERT, JOB)])
    with pytest.raises(SwitchError, match=r"update 0 \(table_entry\): ALREADY_EXISTS"):
        conn.write([adm.job_update(Update.INSERT, JOB)])
    with pytest.raises(SwitchError, match=r"update 1 \(table_entry\): NOT_FOUND"):
        conn.write([adm.job_update(Update.MODIFY, JOB), adm.job_delete(6)])
    assert set(adm.jobs()) == {(5, 0)}


def test_table_and_group_round_trip(star):
    conn = star["s1"].conn
    adm = JobAdmissionTables(conn)
    conn.write([adm.job_update(Update.INSERT, JOB),
                adm.member_update(Update.INSERT, 5, 2, 1),
                conn.multicast_update(Update.INSERT, 9, [(1, 0), (2, 1)])])
    assert adm.jobs() == {(5, 0): JOB}
    assert adm.members() == {(5, 2): (1, 1)}
    assert sorted(conn.read_multicast_groups()[9]) == [(1, 0), (2, 1)]  # a set of replicas
    conn.write([conn.multicast_update(Update.MODIFY, 9, [(3, 0)])])
    assert conn.read_multicast_groups()[9] == [(3, 0)]
    conn.write([adm.job_delete(5), adm.member_delete(5, 2),
                conn.multicast_update(Update.DELETE, 9)])
    assert adm.jobs() == {} and adm.members() == {} and 9 not in conn.read_multicast_groups()


def test_counters_start_at_zero_and_have_the_declared_size(star):
    conn = star["s1"].conn
    cells = conn.read_counter("job_stats")
    assert len(cells) == 256 * 32 and all(v == (0, 0) for v in cells.values())
    assert len(conn.read_counter("global_drops")) == P.GLOBAL_DROP_SLOTS == 8
    late = conn.read_counter("late_contribs")
    assert len(late) == 256 * P.MAX_FAN_IN and all(v[0] == 0 for v in late.values())


def test_second_controller_with_lower_election_id_cannot_write(star):
    sw = star["s1"]
    with pytest.raises(SwitchError, match="another controller holds mastership"):
        SwitchConnection("backup", sw.grpc_address, sw.device_id, election_id=(0, 2))


def test_pushing_the_pipeline_again_clears_the_tables(star):
    conn = star["s1"].conn
    adm = JobAdmissionTables(conn)
    conn.write([adm.job_update(Update.INSERT, JOB)])
    conn.set_pipeline(*pipeline_files())
    assert adm.jobs() == {}


def test_value_too_wide_for_a_parameter_is_refused_before_sending(star):
    conn = star["s1"].conn
    with pytest.raises(SwitchError, match="does not fit in 16 bits"):
        conn.table_update(Update.INSERT, "job_config", {"job_id": 1, "pool": 0}, "set_job",
                          dict(pool_base=0, pool_size=1 << 16, fan_in=1, quorum=1, mcast_grp=1,
                               gen=1, is_root=1, uplink_port=0, stat_idx=0, epoch=0))
