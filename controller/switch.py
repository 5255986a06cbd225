"""One P4Runtime connection per switch.

p4runtime-shell's `shell` module keeps one global connection, which cannot drive a leaf-spine
fabric; its lower-level `P4RuntimeClient` can be instantiated once per switch, so each
`SwitchConnection` owns one, and builds every message itself from the switch's P4Info
(`SwitchWriter`, which other ways of delivering the same updates share). Optionally every message
on the connection, stream included, is appended to a text file by a gRPC client interceptor
(p4lang tutorials' habit) for debugging.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from pathlib import Path

import grpc
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc
from p4runtime_sh.p4runtime import P4RuntimeClient, P4RuntimeException

from controller.grpc_dump import MessageDump
from controller.switch_errors import SwitchError, Update, WriteError, write_failures
from controller.switch_reads import SwitchReads
from passing.p4info import P4InfoIndex, encode_value


class _Client(P4RuntimeClient):
    """P4RuntimeClient that raises instead of calling sys.exit when arbitration fails."""

    handshake_timeout = 5.0

    def __init__(self, device_id: int, address: str, election_id: tuple[int, int],
                 dump: MessageDump | None = None):
        self._dump = dump
        super().__init__(device_id, address, election_id)

    def set_up_stream(self) -> None:
        # The base class opens the channel and starts the stream in its constructor; this is
        # the one point in between, so the dump sees the stream's arbitration too.
        if self._dump is not None:
            self.channel = grpc.intercept_channel(self.channel, self._dump)
            self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        super().set_up_stream()

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


class SwitchWriter(ABC):
    """What an installer needs of a switch: updates built from the names in the switch's P4Info,
    and a way to write them. `SwitchConnection` writes over gRPC; a switch model in the same
    process can take the very same updates."""

    def __init__(self, name: str, info: P4InfoIndex | None = None):
        self.name = name
        self.info = info

    @abstractmethod
    def write(self, updates: Iterable[Update]) -> None:
        """Apply the updates in order, as one WriteRequest; raise WriteError listing each
        failed update (the others are applied: P4Runtime writes are not atomic)."""

    def _index(self) -> P4InfoIndex:
        if self.info is None:
            raise SwitchError(f"switch {self.name}: no pipeline loaded")
        return self.info

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


class SwitchConnection(SwitchWriter, SwitchReads):
    def __init__(self, name: str, address: str, device_id: int = 0,
                 election_id: tuple[int, int] = (0, 10), dump_file: str | Path | None = None,
                 connect_timeout: float = 5.0):
        super().__init__(name)
        self.address = address
        self.device_id = device_id
        self.election_id = election_id
        self._dump = MessageDump(name, Path(dump_file)) if dump_file else None
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
        # Closing a channel that was watched for readiness waits out gRPC's 0.2 s polling
        # tick: 3.4 of a 5.4 s `job create` over 17 switches. The probe is not needed any more.
        threading.Thread(target=channel.close, daemon=True).start()
        try:
            client = _Client(self.device_id, self.address, self.election_id, self._dump)
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

    # -- pipeline ---------------------------------------------------------------------------
    def set_pipeline(self, p4info: p4info_pb2.P4Info | str | Path,
                     device_config: bytes = b"") -> None:
        """Push a P4Info (or the P4Info text file at a path) and the target's device config
        (BMv2 JSON) with VERIFY_AND_COMMIT."""
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest()
        req.device_id = self.device_id
        req.election_id.high, req.election_id.low = self.election_id
        req.action = req.VERIFY_AND_COMMIT
        if isinstance(p4info, p4info_pb2.P4Info):
            req.config.p4info.CopyFrom(p4info)
        else:
            text_format.Merge(Path(p4info).read_text(), req.config.p4info)
        req.config.p4_device_config = device_config
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

    # -- writes -----------------------------------------------------------------------------
    def write(self, updates: Iterable[Update]) -> None:
        """One WriteRequest. On failure the SwitchError lists each failed update."""
        req = p4runtime_pb2.WriteRequest()
        req.updates.extend(updates)
        if not req.updates:
            return
        req.device_id = self.device_id
        req.election_id.high, req.election_id.low = self.election_id
        try:
            self._client.stub.Write(req)
        except grpc.RpcError as e:
            failures = write_failures(e)
            if not failures:
                raise SwitchError(f"switch {self.name}: write failed: {e.code().name}: "
                                  f"{e.details()}") from None
            raise WriteError.of(self.name, list(req.updates), failures) from None
