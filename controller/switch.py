"""One P4Runtime connection per switch.

p4runtime-shell's `shell` module keeps one global connection, which cannot drive a leaf-spine
fabric; its lower-level `P4RuntimeClient` can be instantiated once per switch, so each
`SwitchConnection` owns one, and builds every message itself from the switch's P4Info. Optionally
every request and response is appended to a text file (p4lang tutorials' habit) for debugging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import grpc
from google.protobuf import text_format
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2
from p4runtime_sh.p4runtime import P4RuntimeClient, P4RuntimeException

from passing.p4info import P4InfoIndex, decode_value, encode_value

Update = p4runtime_pb2.Update


def write_failures(err: grpc.RpcError) -> list[tuple[int, str, str]]:
    """(update index, status code name, message) of each failed update of a Write, from the
    status details (P4Runtime spec, section 12)."""
    out = []
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for i, detail in enumerate(status_pb2.Status.FromString(value).details):
                e = p4runtime_pb2.Error()
                if detail.Unpack(e) and e.canonical_code != code_pb2.OK:
                    out.append((i, code_pb2.Code.Name(e.canonical_code), e.message))
    return out


class SwitchError(RuntimeError):
    """A switch refused a request or could not be reached; the message says which and why."""


class WriteError(SwitchError):
    """A Write with failed updates; `failures` lists (index, code name, message) of each."""

    def __init__(self, message: str, failures: list[tuple[int, str, str]]):
        super().__init__(message)
        self.failures = failures


class _Client(P4RuntimeClient):
    """P4RuntimeClient that raises instead of calling sys.exit when arbitration fails."""

    handshake_timeout = 5.0

    def handshake(self) -> None:
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = self.device_id
        req.arbitration.election_id.high = self.election_id[0]
        req.arbitration.election_id.low = self.election_id[1]
        self.stream_out_q.put(req)
        rep = self.get_stream_packet("arbitration", timeout=self.handshake_timeout)
        if rep is None:
            self.stream_out_q.put(None)
            self.channel.close()
            raise SwitchError("no arbitration answer on the P4Runtime stream")
        self.is_primary = rep.arbitration.status.code == 0


class SwitchConnection:
    def __init__(self, name: str, address: str, device_id: int = 0,
                 election_id: tuple[int, int] = (0, 10), dump_file: str | Path | None = None,
                 connect_timeout: float = 5.0):
        self.name = name
        self.address = address
        self.device_id = device_id
        self.election_id = election_id
        self._dump_path = Path(dump_file) if dump_file else None
        self._dump_lock = threading.Lock()
        self.info: P4InfoIndex | None = None
        self._client = self._connect(connect_timeout)

    # -- connection -------------------------------------------------------------------------
    def _connect(self, timeout: float) -> _Client:
        channel = grpc.insecure_channel(self.address)
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            channel.close()
            raise SwitchError(f"switch {self.name}: no P4Runtime server at {self.address} "
                              f"(waited {timeout:.0f}s)") from None
        channel.close()
        try:
            client = _Client(self.device_id, self.address, self.election_id)
        except (SwitchError, P4RuntimeException) as e:
            raise SwitchError(f"switch {self.name} at {self.address}: {e}") from None
        if not client.is_primary:
            client.tear_down()
            raise SwitchError(f"switch {self.name}: another controller holds mastership "
                              f"(election id {self.election_id} is not the highest)")
        return client

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.tear_down()

    def __enter__(self) -> SwitchConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _dump(self, kind: str, msg) -> None:
        if self._dump_path is None:
            return
        with self._dump_lock, self._dump_path.open("a") as f:
            f.write(f"[{time.strftime('%H:%M:%S')}] {self.name} {kind}\n{msg}\n")

    # -- pipeline ---------------------------------------------------------------------------
    def set_pipeline(self, p4info_path: str | Path, device_config: bytes = b"") -> None:
        """Push a P4Info and the target's device config (BMv2 JSON) with VERIFY_AND_COMMIT."""
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest()
        req.device_id = self.device_id
        req.election_id.high, req.election_id.low = self.election_id
        req.action = req.VERIFY_AND_COMMIT
        text_format.Merge(Path(p4info_path).read_text(), req.config.p4info)
        req.config.p4_device_config = device_config
        self._dump("SetForwardingPipelineConfig", f"p4info={p4info_path}, "
                   f"{len(device_config)} bytes of device config")
        try:
            self._client.stub.SetForwardingPipelineConfig(req)
        except grpc.RpcError as e:
            raise SwitchError(f"switch {self.name}: pipeline rejected: {e.code().name}: "
                              f"{e.details()}") from None
        self.info = P4InfoIndex(req.config.p4info)

    def fetch_pipeline(self) -> bool:
        """Load the P4Info the switch already runs. False if it has no pipeline."""
        try:
            info = self._client.get_p4info()
        except P4RuntimeException:
            return False
        if not info.tables:
            return False
        self.info = P4InfoIndex(info)
        return True

    def _index(self) -> P4InfoIndex:
        if self.info is None:
            raise SwitchError(f"switch {self.name}: no pipeline loaded")
        return self.info

    # -- writes -----------------------------------------------------------------------------
    def write(self, updates: Iterable[Update]) -> None:
        """One WriteRequest. On failure the SwitchError lists each failed update."""
        req = p4runtime_pb2.WriteRequest()
        req.updates.extend(updates)
        if not req.updates:
            return
        req.device_id = self.device_id
        req.election_id.high, req.election_id.low = self.election_id
        self._dump("WriteRequest", req)
        try:
            self._client.stub.Write(req)
        except grpc.RpcError as e:
            failures = write_failures(e)
            if not failures:
                raise SwitchError(f"switch {self.name}: write failed: {e.code().name}: "
                                  f"{e.details()}") from None
            what = "; ".join(f"update {i} ({req.updates[i].entity.WhichOneof('entity')}): "
                             f"{code}: {msg}" for i, code, msg in failures)
            raise WriteError(f"switch {self.name}: write failed: {what}", failures) from None

    def table_entry(self, table: str, match: Mapping[str, int | str], action: str,
                    params: Mapping[str, int | str] | None = None,
                    default: bool = False) -> p4runtime_pb2.TableEntry:
        info = self._index()
        entry = p4runtime_pb2.TableEntry()
        entry.table_id = info.table(table).preamble.id
        fields = {f.name: f for f in info.match_fields(table)}
        if set(match) != (set() if default else set(fields)):
            raise SwitchError(f"table {table}: match needs {sorted(fields)}, got {sorted(match)}")
        for name, value in match.items():
            f = fields[name]
            m = entry.match.add()
            m.field_id = f.id
            m.exact.value = encode_value(value, f.bitwidth)
        if default:
            entry.is_default_action = True
        self._fill_action(entry.action.action, action, params or {})
        return entry

    def _fill_action(self, msg, action: str, params: Mapping[str, int | str]) -> None:
        info = self._index()
        msg.action_id = info.action(action).preamble.id
        wanted = {p.name: p for p in info.action_params(action)}
        if set(params) != set(wanted):
            raise SwitchError(f"action {action}: needs parameters {sorted(wanted)}, "
                              f"got {sorted(params)}")
        for name, value in params.items():
            p = msg.params.add()
            p.param_id = wanted[name].id
            try:
                p.value = encode_value(value, wanted[name].bitwidth)
            except ValueError as e:
                raise SwitchError(f"action {action}, parameter {name}: {e}") from None

    def table_update(self, kind: int, table: str, match: Mapping[str, int | str],
                     action: str = "", params: Mapping[str, int | str] | None = None) -> Update:
        u = Update(type=kind)
        if kind == Update.DELETE:
            info = self._index()
            entry = u.entity.table_entry
            entry.table_id = info.table(table).preamble.id
            fields = {f.name: f for f in info.match_fields(table)}
            for name, value in match.items():
                m = entry.match.add()
                m.field_id = fields[name].id
                m.exact.value = encode_value(value, fields[name].bitwidth)
        else:
            u.entity.table_entry.CopyFrom(self.table_entry(table, match, action, params))
        return u

    def set_default_action(self, table: str, action: str,
                           params: Mapping[str, int | str] | None = None) -> None:
        u = Update(type=Update.MODIFY)
        u.entity.table_entry.CopyFrom(self.table_entry(table, {}, action, params, default=True))
        self.write([u])

    def multicast_update(self, kind: int, group_id: int,
                         replicas: Iterable[tuple[int, int]] = ()) -> Update:
        """replicas: (egress_port, instance) pairs."""
        u = Update(type=kind)
        group = u.entity.packet_replication_engine_entry.multicast_group_entry
        group.multicast_group_id = group_id
        for port, instance in replicas:
            r = group.replicas.add()
            r.egress_port = port
            r.instance = instance
        return u

    # -- reads ------------------------------------------------------------------------------
    def _read(self, entity: p4runtime_pb2.Entity) -> list[p4runtime_pb2.Entity]:
        self._dump("ReadRequest", entity)
        out = []
        try:
            for rep in self._client.read_one(entity):
                out.extend(rep.entities)
        except (grpc.RpcError, P4RuntimeException) as e:
            raise SwitchError(f"switch {self.name}: read failed: {e}") from None
        return out

    def read_table(self, table: str) -> list[dict]:
        info = self._index()
        ent = p4runtime_pb2.Entity()
        ent.table_entry.table_id = info.table(table).preamble.id
        names = {f.id: f.name for f in info.match_fields(table)}
        rows = []
        for e in self._read(ent):
            te = e.table_entry
            action = te.action.action
            pnames = {p.id: p.name for p in info.action_params(info.action_name(action.action_id))}
            rows.append({
                "match": {names[m.field_id]: decode_value(m.exact.value) for m in te.match},
                "action": info.action_name(action.action_id),
                "params": {pnames[p.param_id]: decode_value(p.value) for p in action.params},
            })
        return rows

    def read_counter(self, counter: str, index: int | None = None) -> dict[int, tuple[int, int]]:
        """{index: (packets, bytes)} for one cell, or for every cell when index is None."""
        ent = p4runtime_pb2.Entity()
        ent.counter_entry.counter_id = self._index().counter(counter).preamble.id
        if index is not None:
            ent.counter_entry.index.index = index
        return {e.counter_entry.index.index: (e.counter_entry.data.packet_count,
                                              e.counter_entry.data.byte_count)
                for e in self._read(ent)}

    def read_multicast_groups(self) -> dict[int, list[tuple[int, int]]]:
        ent = p4runtime_pb2.Entity()
        ent.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        groups = {}
        for e in self._read(ent):
            g = e.packet_replication_engine_entry.multicast_group_entry
            groups[g.multicast_group_id] = [(r.egress_port, r.instance) for r in g.replicas]
        return groups

    def read_register(self, register: str, index: int) -> int:
        """Registers over P4Runtime: BMv2's server answers UNIMPLEMENTED, and so does the model."""
        ent = p4runtime_pb2.Entity()
        ent.register_entry.register_id = self._index().register(register).preamble.id
        ent.register_entry.index.index = index
        entities = self._read(ent)
        return decode_value(entities[0].register_entry.data.bitstring) if entities else 0
