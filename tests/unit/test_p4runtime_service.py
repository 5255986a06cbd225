"""The pieces of the switch model's P4Runtime service (switch_model/p4runtime_*.py): the
arbitration between clients, served over real gRPC as a controller meets it; the pipeline
config; the writes and reads of entities, each update applied or refused on its own."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import pytest
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from passing.pipeline_files import load_p4info
from switch_model.p4runtime_abort import Abort
from switch_model.p4runtime_pipeline_config import PipelineConfig
from switch_model.p4runtime_server import P4RuntimeService, listen
from switch_model.p4runtime_write import failure_status
from switch_model.pipeline import Pipeline
from testbed.loopback import InProcessConnection

DEV = 3
Update = p4runtime_pb2.Update
SET = p4runtime_pb2.SetForwardingPipelineConfigRequest


class Client:
    """One P4Runtime client: its StreamChannel and its stub."""

    def __init__(self, stub: p4runtime_pb2_grpc.P4RuntimeStub, election: tuple[int, int]):
        self.stub, self.election = stub, election
        self._out: queue.Queue = queue.Queue()
        self.replies = stub.StreamChannel(self._requests())

    def _requests(self) -> Iterator[p4runtime_pb2.StreamMessageRequest]:
        while (req := self._out.get()) is not None:
            yield req

    def arbitrate(self) -> p4runtime_pb2.MasterArbitrationUpdate:
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = DEV
        req.arbitration.election_id.high, req.arbitration.election_id.low = self.election
        self._out.put(req)
        return self.status()

    def status(self) -> p4runtime_pb2.MasterArbitrationUpdate:
        return next(self.replies).arbitration

    def close(self) -> None:
        self._out.put(None)

    def write(self, conn: InProcessConnection) -> None:
        """A Write of one multicast group, with this client's election id."""
        req = p4runtime_pb2.WriteRequest(device_id=DEV)
        req.election_id.high, req.election_id.low = self.election
        req.updates.append(conn.multicast_update(Update.INSERT, 7, [(1, 0)]))
        self.stub.Write(req, timeout=10)


@pytest.fixture
def served():
    info = load_p4info()
    service = P4RuntimeService(Pipeline.from_p4info(info), DEV, info)
    server, port = listen(service, "127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield service, p4runtime_pb2_grpc.P4RuntimeStub(channel)
    finally:
        channel.close()
        server.stop(grace=None)


def test_a_client_that_is_not_primary_is_refused_a_write_until_the_primary_leaves(served):
    service, stub = served
    conn = InProcessConnection(service)
    primary, backup = Client(stub, (0, 2)), Client(stub, (0, 1))
    assert primary.arbitrate().status.code == code_pb2.OK
    told = backup.arbitrate()
    assert (told.status.code, told.election_id.low) == (code_pb2.ALREADY_EXISTS, 2)
    with pytest.raises(grpc.RpcError) as refused:
        backup.write(conn)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details() == "Not primary"
    primary.close()
    assert backup.status().status.code == code_pb2.OK  # told it is primary now
    backup.write(conn)
    assert service.state.mcast[7] == [(1, 0)]
    backup.close()


def test_a_write_before_any_client_arbitrated_or_for_another_device_is_refused(served):
    service, stub = served
    conn = InProcessConnection(service)
    client = Client(stub, (0, 1))
    with pytest.raises(grpc.RpcError) as nobody:
        client.write(conn)
    assert nobody.value.code() == grpc.StatusCode.PERMISSION_DENIED
    client.close()
    with pytest.raises(grpc.RpcError) as other:
        list(stub.Read(p4runtime_pb2.ReadRequest(device_id=DEV + 1), timeout=10))
    assert (other.value.code(), other.value.details()) == \
        (grpc.StatusCode.NOT_FOUND, f"Invalid device id {DEV + 1}")


def test_an_election_id_another_client_holds_is_refused(served):
    _, stub = served
    first, second = Client(stub, (0, 5)), Client(stub, (0, 5))
    first.arbitrate()
    with pytest.raises(grpc.RpcError) as refused:
        second.arbitrate()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    first.close()
    second.close()


def test_a_write_with_a_failed_update_says_which_one_over_grpc(served):
    service, stub = served
    conn = InProcessConnection(service)
    client = Client(stub, (0, 1))
    client.arbitrate()
    req = p4runtime_pb2.WriteRequest(device_id=DEV)
    req.election_id.low = 1
    req.updates.extend([conn.multicast_update(Update.INSERT, 7, [(1, 0)]),
                        conn.multicast_update(Update.DELETE, 8)])
    with pytest.raises(grpc.RpcError) as failed:
        stub.Write(req, timeout=10)
    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    status = status_pb2.Status.FromString(
        dict(failed.value.trailing_metadata())["grpc-status-details-bin"])
    codes = []
    for packed in status.details:
        detail = p4runtime_pb2.Error()
        packed.Unpack(detail)
        codes.append(detail.canonical_code)
    assert codes == [code_pb2.OK, code_pb2.NOT_FOUND]
    assert 7 in service.state.mcast  # the first update stays applied
    client.close()


def _entry(conn: InProcessConnection, kind: int = Update.INSERT, job: int = 1) -> Update:
    return conn.table_update(kind, "job_config", {"job_id": job, "pool": 0}, "set_job",
                             dict(pool_base=0, pool_size=4, fan_in=2, quorum=2, mcast_grp=9,
                                  gen=1, is_root=1, uplink_port=0, stat_idx=0, epoch=0))


def test_each_update_is_applied_or_refused_on_its_own():
    info = load_p4info()
    service = P4RuntimeService(Pipeline.from_p4info(info), DEV, info)
    conn = InProcessConnection(service)
    unknown = _entry(conn, job=2)
    unknown.entity.table_entry.table_id = 1
    register = Update(type=Update.MODIFY)
    register.entity.register_entry.register_id = conn.info.register("slot_state").preamble.id
    errors = service.apply_updates([_entry(conn), unknown, register, _entry(conn)])
    assert [e and e[0] for e in errors] == \
        [None, code_pb2.NOT_FOUND, code_pb2.UNIMPLEMENTED, code_pb2.ALREADY_EXISTS]
    assert list(service.state.tables["job_config"].entries) == [(1, 0)]
    details = failure_status(errors).details
    assert len(details) == 4


def test_a_read_narrows_to_the_match_and_refuses_a_counter_index_past_the_end(served):
    service, stub = served
    conn = InProcessConnection(service)
    assert service.apply_updates([_entry(conn, job=1), _entry(conn, job=2)]) == [None, None]
    req = p4runtime_pb2.ReadRequest(device_id=DEV)
    req.entities.add().table_entry.CopyFrom(_entry(conn, job=2).entity.table_entry)
    del req.entities[0].table_entry.match[1:]  # the job id only
    (rep,) = stub.Read(req, timeout=10)
    assert len(rep.entities) == 1
    assert rep.entities[0].table_entry.match[0].exact.value == b"\x02"
    req = p4runtime_pb2.ReadRequest(device_id=DEV)
    counter = req.entities.add().counter_entry
    counter.counter_id = conn.info.counter("global_drops").preamble.id
    counter.index.index = 8
    with pytest.raises(grpc.RpcError) as past:
        list(stub.Read(req, timeout=10))
    assert past.value.code() == grpc.StatusCode.OUT_OF_RANGE


def _config(info, action: int) -> SET:
    req = SET(action=action)
    req.config.p4info.CopyFrom(info)
    req.config.cookie.cookie = 42
    return req


def test_a_pipeline_of_another_program_is_refused_and_nothing_is_cleared():
    info = load_p4info()
    pipe = Pipeline.from_p4info(info)
    service = P4RuntimeService(pipe, DEV, info)
    service.apply_updates([_entry(InProcessConnection(service))])
    config = PipelineConfig(pipe, info, preloaded=False)
    assert not config.get(p4runtime_pb2.GetForwardingPipelineConfigRequest.ALL).HasField(
        "config")
    other = type(info)()
    other.CopyFrom(info)
    del other.tables[0]
    with pytest.raises(Abort) as refused:
        config.set(_config(other, SET.VERIFY_AND_COMMIT))
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert not config.loaded and pipe.state.tables["job_config"].entries
    config.set(_config(info, SET.RECONCILE_AND_COMMIT))  # keeps the forwarding state
    assert config.loaded and pipe.state.tables["job_config"].entries
    assert config.get(p4runtime_pb2.GetForwardingPipelineConfigRequest.ALL).config.cookie \
        .cookie == 42
    config.set(_config(info, SET.VERIFY_AND_COMMIT))
    assert not pipe.state.tables["job_config"].entries
