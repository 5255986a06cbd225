"""The P4Runtime gRPC service of the software switch, answering as BMv2's server (PI) does for
the subset PASSING uses: arbitration, Set/GetForwardingPipelineConfig, Capabilities, table
entries (exact match, default actions), multicast groups, counters. Register reads and writes are
answered UNIMPLEMENTED, as BMv2's P4Runtime server answers them; clone sessions, meters, digests
and packet-out are not used by the PASSING program and are answered UNIMPLEMENTED too.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Iterable
from concurrent import futures

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from passing.p4info import P4InfoIndex, decode_value, encode_value, pipeline_signature
from switch_model.pipeline import Pipeline
from switch_model.state import Action, StateError

log = logging.getLogger("switch_model.p4runtime")
Update = p4runtime_pb2.Update
_UPDATE_KIND = {Update.INSERT: "INSERT", Update.MODIFY: "MODIFY", Update.DELETE: "DELETE"}


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class P4RuntimeService(p4runtime_pb2_grpc.P4RuntimeServicer):
    def __init__(self, pipeline: Pipeline, device_id: int, p4info: p4info_pb2.P4Info,
                 preloaded: bool = True):
        self.pipeline = pipeline
        self.state = pipeline.state
        self.device_id = device_id
        self.own_p4info = p4info
        self.own_signature = pipeline_signature(p4info)
        self.index = P4InfoIndex(p4info)
        self.loaded = preloaded
        self.cookie = 0
        self.device_config = b""
        self._arb_lock = threading.Lock()
        self._streams: dict[int, dict] = {}  # stream id -> {"election": (hi, lo), "q": Queue}
        self._ids = itertools.count(1)

    # -- arbitration --------------------------------------------------------------------------
    def _primary_election(self) -> tuple[int, int] | None:
        elections = [s["election"] for s in self._streams.values() if s["election"] is not None]
        return max(elections) if elections else None

    def _announce(self) -> None:
        primary = self._primary_election()
        for s in self._streams.values():
            if s["election"] is None:
                continue
            msg = p4runtime_pb2.StreamMessageResponse()
            msg.arbitration.device_id = self.device_id
            msg.arbitration.election_id.high, msg.arbitration.election_id.low = primary
            if s["election"] == primary:
                msg.arbitration.status.code = code_pb2.OK
                msg.arbitration.status.message = "Is primary"
            else:
                msg.arbitration.status.code = code_pb2.ALREADY_EXISTS
                msg.arbitration.status.message = "Is backup"
            s["q"].put(msg)

    def StreamChannel(self, request_iterator, context):
        sid = next(self._ids)
        out: queue.Queue = queue.Queue()
        with self._arb_lock:
            self._streams[sid] = {"election": None, "q": out}

        def reader():
            try:
                for req in request_iterator:
                    if req.HasField("arbitration"):
                        arb = req.arbitration
                        if arb.device_id != self.device_id:
                            out.put(_Abort(grpc.StatusCode.NOT_FOUND,
                                           f"Invalid device id {arb.device_id}"))
                            return
                        election = (arb.election_id.high, arb.election_id.low)
                        with self._arb_lock:
                            taken = [s["election"] for i, s in self._streams.items()
                                     if i != sid]
                            if election in taken:
                                out.put(_Abort(grpc.StatusCode.INVALID_ARGUMENT,
                                               "Election id already in use by another client"))
                                return
                            self._streams[sid]["election"] = election
                            self._announce()
                    elif req.HasField("packet"):
                        log.info("packet-out ignored: the PASSING program has no CPU port")
            except grpc.RpcError:
                pass
            finally:
                out.put(None)

        threading.Thread(target=reader, daemon=True).start()
        try:
            while True:
                item = out.get()
                if item is None:
                    break
                if isinstance(item, _Abort):
                    context.abort(item.code, str(item))
                yield item
        finally:
            with self._arb_lock:
                was_primary = self._streams[sid]["election"] == self._primary_election()
                del self._streams[sid]
                if was_primary:
                    self._announce()

    def _check_primary(self, device_id: int, election_id) -> None:
        if device_id != self.device_id:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"Invalid device id {device_id}")
        with self._arb_lock:
            primary = self._primary_election()
        if primary is None or (election_id.high, election_id.low) != primary:
            raise _Abort(grpc.StatusCode.PERMISSION_DENIED, "Not primary")

    # -- pipeline config ----------------------------------------------------------------------
    def SetForwardingPipelineConfig(self, request, context):
        try:
            self._check_primary(request.device_id, request.election_id)
        except _Abort as e:
            context.abort(e.code, str(e))
        A = p4runtime_pb2.SetForwardingPipelineConfigRequest
        if request.action in (A.VERIFY, A.VERIFY_AND_SAVE, A.VERIFY_AND_COMMIT,
                              A.RECONCILE_AND_COMMIT):
            sig = pipeline_signature(request.config.p4info)
            if sig != self.own_signature:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              "this switch model runs the PASSING pipeline only; the pushed "
                              "P4Info describes a different program")
        if request.action in (A.VERIFY_AND_COMMIT, A.COMMIT, A.VERIFY_AND_SAVE,
                              A.RECONCILE_AND_COMMIT):
            with self.state.lock:
                if request.action != A.RECONCILE_AND_COMMIT:
                    self.pipeline.reset()
                self.loaded = True
                self.cookie = request.config.cookie.cookie
                self.device_config = request.config.p4_device_config
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request, context):
        if request.device_id != self.device_id:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Invalid device id {request.device_id}")
        rep = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        if not self.loaded:
            return rep
        R = p4runtime_pb2.GetForwardingPipelineConfigRequest
        rep.config.cookie.cookie = self.cookie
        if request.response_type in (R.ALL, R.P4INFO_AND_COOKIE):
            rep.config.p4info.CopyFrom(self.own_p4info)
        if request.response_type in (R.ALL, R.DEVICE_CONFIG_AND_COOKIE):
            rep.config.p4_device_config = self.device_config
        return rep

    def Capabilities(self, request, context):
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version="1.4.1")

    # -- write --------------------------------------------------------------------------------
    def Write(self, request, context):
        try:
            self._check_primary(request.device_id, request.election_id)
            if not self.loaded:
                raise _Abort(grpc.StatusCode.FAILED_PRECONDITION, "No forwarding pipeline config")
        except _Abort as e:
            context.abort(e.code, str(e))
        errors = self.apply_updates(request.updates)
        if any(errors):
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message="Write failure.")
            for err in errors:
                detail = p4runtime_pb2.Error()
                if err is None:
                    detail.canonical_code = code_pb2.OK
                else:
                    detail.canonical_code, detail.message = err
                    detail.space = "ALL-sswitch-p4org"
                packed = any_pb2.Any()
                packed.Pack(detail)
                status.details.append(packed)
            context.set_trailing_metadata(
                (("grpc-status-details-bin", status.SerializeToString()),))
            context.abort(grpc.StatusCode.UNKNOWN, "Write failure.")
        return p4runtime_pb2.WriteResponse()

    def apply_updates(self, updates: Iterable[Update]) -> list[tuple[int, str] | None]:
        """A Write's updates applied in order, each on its own as BMv2 applies them: per update
        None, or (google.rpc canonical code, message) of its failure. In-process callers (the
        testbed's loopback switch) write through here too, so they take the same path as a
        Write over gRPC, less arbitration."""
        errors: list[tuple[int, str] | None] = []
        for update in updates:
            try:
                self._apply(update)
                errors.append(None)
            except StateError as e:
                errors.append((getattr(code_pb2, e.code), str(e)))
            except _Abort as e:
                errors.append((e.code.value[0], str(e)))
        return errors

    def _apply(self, update) -> None:
        kind = _UPDATE_KIND.get(update.type)
        if kind is None:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "Update type UNSPECIFIED")
        which = update.entity.WhichOneof("entity")
        if which == "table_entry":
            self._write_table(kind, update.entity.table_entry)
        elif which == "packet_replication_engine_entry":
            pre = update.entity.packet_replication_engine_entry
            if pre.WhichOneof("type") != "multicast_group_entry":
                raise _Abort(grpc.StatusCode.UNIMPLEMENTED, "clone sessions are not supported")
            g = pre.multicast_group_entry
            self.state.mcast_write(kind, g.multicast_group_id,
                                   [(r.egress_port, r.instance) for r in g.replicas])
        elif which == "counter_entry":
            self._write_counter(kind, update.entity.counter_entry)
        elif which == "register_entry":
            raise _Abort(grpc.StatusCode.UNIMPLEMENTED, "Register writes are not supported")
        else:
            raise _Abort(grpc.StatusCode.UNIMPLEMENTED, f"{which} is not supported")

    def _table_name(self, table_id: int) -> str:
        for t in self.own_p4info.tables:
            if t.preamble.id == table_id:
                return t.preamble.name.lstrip(".")
        raise StateError("NOT_FOUND", f"Unknown table id {table_id}")

    def _decode_action(self, msg) -> Action:
        try:
            name = self.index.action_name(msg.action_id)
        except KeyError:
            raise StateError("NOT_FOUND", f"Unknown action id {msg.action_id}") from None
        names = {p.id: p.name for p in self.index.action_params(name)}
        params = {}
        for p in msg.params:
            if p.param_id not in names:
                raise StateError("INVALID_ARGUMENT", f"Unknown param id {p.param_id} of {name}")
            params[names[p.param_id]] = decode_value(p.value)
        return Action(name, params)

    def _write_table(self, kind: str, entry) -> None:
        table = self._table_name(entry.table_id)
        if entry.is_default_action:
            if kind != "MODIFY" or entry.match:
                raise StateError("INVALID_ARGUMENT", "default entries can only be modified")
            self.state.set_default(table, self._decode_action(entry.action.action))
            return
        fields = {m.id: m for m in self.index.table(table).match_fields}
        values = {}
        for m in entry.match:
            if m.field_id not in fields:
                raise StateError("INVALID_ARGUMENT", f"Unknown match field id {m.field_id}")
            if m.WhichOneof("field_match_type") != "exact":
                raise StateError("INVALID_ARGUMENT", f"{table} has exact match fields only")
            values[m.field_id] = decode_value(m.exact.value)
        if set(values) != set(fields):
            raise StateError("INVALID_ARGUMENT", f"{table}: every exact field must be given")
        key = tuple(values[f.id] for f in self.index.table(table).match_fields)
        if kind == "DELETE":
            self.state.delete(table, key)
            return
        if entry.action.WhichOneof("type") != "action":
            raise StateError("INVALID_ARGUMENT", "only direct actions are supported")
        action = self._decode_action(entry.action.action)
        (self.state.insert if kind == "INSERT" else self.state.modify)(table, key, action)

    def _counter_name(self, counter_id: int) -> str:
        for c in self.own_p4info.counters:
            if c.preamble.id == counter_id:
                return c.preamble.name.lstrip(".")
        raise StateError("NOT_FOUND", f"Unknown counter id {counter_id}")

    def _write_counter(self, kind: str, entry) -> None:
        if kind != "MODIFY":
            raise StateError("INVALID_ARGUMENT", "counter entries can only be modified")
        cells = self.state.counters[self._counter_name(entry.counter_id)]
        targets = [entry.index.index] if entry.HasField("index") else range(len(cells))
        with self.state.lock:
            for i in targets:
                if not 0 <= i < len(cells):
                    raise StateError("OUT_OF_RANGE", f"counter index {i} out of range")
                if entry.data.packet_count < 0 or entry.data.byte_count < 0:
                    raise StateError("INVALID_ARGUMENT", "counter values cannot be negative")
                cells[i] = (entry.data.packet_count, entry.data.byte_count)

    # -- read ---------------------------------------------------------------------------------
    def Read(self, request, context):
        if request.device_id != self.device_id:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Invalid device id {request.device_id}")
        if not self.loaded:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "No forwarding pipeline config")
        rep = p4runtime_pb2.ReadResponse()
        try:
            with self.state.lock:
                for ent in request.entities:
                    self._read_entity(ent, rep)
        except StateError as e:
            context.abort(getattr(grpc.StatusCode, e.code), str(e))
        except _Abort as e:
            context.abort(e.code, str(e))
        yield rep

    def _read_entity(self, ent, rep) -> None:
        which = ent.WhichOneof("entity")
        if which == "table_entry":
            te = ent.table_entry
            names = [self._table_name(te.table_id)] if te.table_id else list(self.state.tables)
            for name in names:
                self._read_table(name, te, rep)
        elif which == "counter_entry":
            ce = ent.counter_entry
            names = [self._counter_name(ce.counter_id)] if ce.counter_id \
                else list(self.state.counters)
            for name in names:
                cells = self.state.counters[name]
                cid = self.index.counter(name).preamble.id
                if ce.HasField("index"):
                    if not 0 <= ce.index.index < len(cells):
                        raise StateError("OUT_OF_RANGE", f"counter index {ce.index.index}")
                    indices = [ce.index.index]
                else:
                    indices = range(len(cells))
                unit = self.index.counter(name).spec.unit
                for i in indices:
                    out = rep.entities.add().counter_entry
                    out.counter_id = cid
                    out.index.index = i
                    # Only the units the P4 program declared are reported, as BMv2 does.
                    if unit in (p4info_pb2.CounterSpec.PACKETS, p4info_pb2.CounterSpec.BOTH):
                        out.data.packet_count = int(cells[i, 0])
                    if unit in (p4info_pb2.CounterSpec.BYTES, p4info_pb2.CounterSpec.BOTH):
                        out.data.byte_count = int(cells[i, 1])
        elif which == "packet_replication_engine_entry":
            pre = ent.packet_replication_engine_entry
            if pre.WhichOneof("type") != "multicast_group_entry":
                raise _Abort(grpc.StatusCode.UNIMPLEMENTED, "clone sessions are not supported")
            gid = pre.multicast_group_entry.multicast_group_id
            for g, replicas in sorted(self.state.mcast.items()):
                if gid and g != gid:
                    continue
                out = rep.entities.add().packet_replication_engine_entry.multicast_group_entry
                out.multicast_group_id = g
                for port, inst in replicas:
                    out.replicas.add(egress_port=port, instance=inst)
        elif which == "register_entry":
            raise _Abort(grpc.StatusCode.UNIMPLEMENTED, "Register reads are not supported")
        else:
            raise _Abort(grpc.StatusCode.UNIMPLEMENTED, f"reading {which} is not supported")

    def _read_table(self, name: str, query, rep) -> None:
        t = self.state.tables[name]
        info_table = self.index.table(name)
        fields = list(info_table.match_fields)
        wanted = {m.field_id: decode_value(m.exact.value) for m in query.match}
        for key, action in t.entries.items():
            if any(key[i] != wanted[f.id] for i, f in enumerate(fields) if f.id in wanted):
                continue
            out = rep.entities.add().table_entry
            out.table_id = info_table.preamble.id
            for f, v in zip(fields, key, strict=True):
                m = out.match.add()
                m.field_id = f.id
                m.exact.value = encode_value(v, f.bitwidth)
            a = out.action.action
            a.action_id = self.index.action(action.name).preamble.id
            for p in self.index.action_params(action.name):
                a.params.add(param_id=p.id, value=encode_value(action.params[p.name], p.bitwidth))


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
