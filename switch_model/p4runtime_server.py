"""The P4Runtime gRPC service of the software switch, answering as BMv2's server (PI) does for
the subset PASSING uses: arbitration, Set/GetForwardingPipelineConfig, Capabilities, table
entries (exact match, default actions), multicast groups, counters. Register reads and writes are
answered UNIMPLEMENTED, as BMv2's P4Runtime server answers them; clone sessions, meters, digests
and packet-out are not used by the PASSING program and are answered UNIMPLEMENTED too.

The servicer checks each request and hands it on: arbitration (p4runtime_arbitration), the
pipeline config (p4runtime_pipeline_config), writes (p4runtime_write) and reads
(p4runtime_read) of entities.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent import futures

import grpc
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from passing.p4info import P4InfoIndex
from switch_model.p4runtime_abort import Abort
from switch_model.p4runtime_arbitration import Arbitration
from switch_model.p4runtime_names import EntityNames
from switch_model.p4runtime_pipeline_config import PipelineConfig
from switch_model.p4runtime_read import EntityReader
from switch_model.p4runtime_write import EntityWriter, WriteErrors, failure_status
from switch_model.pipeline import Pipeline
from switch_model.state import StateError

Update = p4runtime_pb2.Update


class P4RuntimeService(p4runtime_pb2_grpc.P4RuntimeServicer):
    def __init__(self, pipeline: Pipeline, device_id: int, p4info: p4info_pb2.P4Info,
                 preloaded: bool = True):
        self.pipeline = pipeline
        self.state = pipeline.state
        self.device_id = device_id
        self.own_p4info = p4info
        self.index = P4InfoIndex(p4info)
        self.arbitration = Arbitration(device_id)
        self.config = PipelineConfig(pipeline, p4info, preloaded)
        names = EntityNames(p4info, self.index)
        self.writer = EntityWriter(self.state, names)
        self.reader = EntityReader(self.state, names)

    @property
    def loaded(self) -> bool:
        """Whether a pipeline config is loaded: entities are refused until one is."""
        return self.config.loaded

    def StreamChannel(self, request_iterator: Iterable[p4runtime_pb2.StreamMessageRequest],
                      context: grpc.ServicerContext
                      ) -> Iterator[p4runtime_pb2.StreamMessageResponse]:
        yield from self.arbitration.stream(request_iterator, context)

    def SetForwardingPipelineConfig(
            self, request: p4runtime_pb2.SetForwardingPipelineConfigRequest,
            context: grpc.ServicerContext) -> p4runtime_pb2.SetForwardingPipelineConfigResponse:
        try:
            self.arbitration.check_primary(request.device_id, request.election_id)
            self.config.set(request)
        except Abort as e:
            context.abort(e.code, str(e))
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(
            self, request: p4runtime_pb2.GetForwardingPipelineConfigRequest,
            context: grpc.ServicerContext) -> p4runtime_pb2.GetForwardingPipelineConfigResponse:
        try:
            self.arbitration.check_device(request.device_id)
        except Abort as e:
            context.abort(e.code, str(e))
        return self.config.get(request.response_type)

    def Capabilities(self, request: p4runtime_pb2.CapabilitiesRequest,
                     context: grpc.ServicerContext) -> p4runtime_pb2.CapabilitiesResponse:
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version="1.4.1")

    def Write(self, request: p4runtime_pb2.WriteRequest,
              context: grpc.ServicerContext) -> p4runtime_pb2.WriteResponse:
        try:
            self.arbitration.check_primary(request.device_id, request.election_id)
            self._check_loaded()
        except Abort as e:
            context.abort(e.code, str(e))
        errors = self.apply_updates(request.updates)
        if any(errors):
            context.set_trailing_metadata(
                (("grpc-status-details-bin", failure_status(errors).SerializeToString()),))
            context.abort(grpc.StatusCode.UNKNOWN, "Write failure.")
        return p4runtime_pb2.WriteResponse()

    def apply_updates(self, updates: Iterable[Update]) -> WriteErrors:
        """A Write's updates applied in order, each on its own as BMv2 applies them: per update
        None, or (google.rpc canonical code, message) of its failure. In-process callers (the
        testbed's loopback switch) write through here too, so they take the same path as a
        Write over gRPC, less arbitration."""
        return self.writer.apply(updates)

    def Read(self, request: p4runtime_pb2.ReadRequest,
             context: grpc.ServicerContext) -> Iterator[p4runtime_pb2.ReadResponse]:
        try:
            self.arbitration.check_device(request.device_id)
            self._check_loaded()
        except Abort as e:
            context.abort(e.code, str(e))
        rep = p4runtime_pb2.ReadResponse()
        try:
            with self.state.lock:
                for ent in request.entities:
                    self.reader.read(ent, rep)
        except StateError as e:
            context.abort(getattr(grpc.StatusCode, e.code), str(e))
        except Abort as e:
            context.abort(e.code, str(e))
        yield rep

    def _check_loaded(self) -> None:
        if not self.config.loaded:
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION, "No forwarding pipeline config")


def serve(service: P4RuntimeService, address: str, workers: int = 4) -> grpc.Server:
    return listen(service, address, workers)[0]


def listen(service: P4RuntimeService, address: str,
           workers: int = 4) -> tuple[grpc.Server, int]:
    """The service served on `address`, and the TCP port it listens on: with port 0 the
    system picks a free one, so servers started side by side never race for a port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(service, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server, port
