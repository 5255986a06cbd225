"""The updates of a P4Runtime Write applied to the switch state, and the status a Write that
failed answers with, as BMv2's server applies and reports them: each update on its own, in
order, the failures listed per update in the status's details."""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2

from passing.p4info import decode_value
from switch_model.p4runtime_abort import Abort
from switch_model.p4runtime_names import EntityNames
from switch_model.state import StateError, SwitchState

Update = p4runtime_pb2.Update
_UPDATE_KIND = {Update.INSERT: "INSERT", Update.MODIFY: "MODIFY", Update.DELETE: "DELETE"}
# The error space BMv2's server names in a Write's per-update details.
_ERROR_SPACE = "ALL-sswitch-p4org"
WriteErrors = list[tuple[int, str] | None]


class EntityWriter:
    """Table entries (exact match, default actions), multicast groups and counters written;
    other entities refused as UNIMPLEMENTED."""

    def __init__(self, state: SwitchState, names: EntityNames):
        self.state = state
        self.names = names

    def apply(self, updates: Iterable[Update]) -> WriteErrors:
        """Per update, None, or (google.rpc canonical code, message) of its failure."""
        errors: WriteErrors = []
        for update in updates:
            try:
                self._apply(update)
                errors.append(None)
            except StateError as e:
                errors.append((getattr(code_pb2, e.code), str(e)))
            except Abort as e:
                errors.append((e.code.value[0], str(e)))
        return errors

    def _apply(self, update: Update) -> None:
        kind = _UPDATE_KIND.get(update.type)
        if kind is None:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "Update type UNSPECIFIED")
        which = update.entity.WhichOneof("entity")
        if which == "table_entry":
            self._write_table(kind, update.entity.table_entry)
        elif which == "packet_replication_engine_entry":
            pre = update.entity.packet_replication_engine_entry
            if pre.WhichOneof("type") != "multicast_group_entry":
                raise Abort(grpc.StatusCode.UNIMPLEMENTED, "clone sessions are not supported")
            g = pre.multicast_group_entry
            self.state.mcast_write(kind, g.multicast_group_id,
                                   [(r.egress_port, r.instance) for r in g.replicas])
        elif which == "counter_entry":
            self._write_counter(kind, update.entity.counter_entry)
        elif which == "register_entry":
            raise Abort(grpc.StatusCode.UNIMPLEMENTED, "Register writes are not supported")
        else:
            raise Abort(grpc.StatusCode.UNIMPLEMENTED, f"{which} is not supported")

    def _write_table(self, kind: str, entry: p4runtime_pb2.TableEntry) -> None:
        table = self.names.table(entry.table_id)
        if entry.is_default_action:
            if kind != "MODIFY" or entry.match:
                raise StateError("INVALID_ARGUMENT", "default entries can only be modified")
            self.state.set_default(table, self.names.action(entry.action.action))
            return
        match_fields = self.names.index.table(table).match_fields
        fields = {m.id: m for m in match_fields}
        values = {}
        for m in entry.match:
            if m.field_id not in fields:
                raise StateError("INVALID_ARGUMENT", f"Unknown match field id {m.field_id}")
            if m.WhichOneof("field_match_type") != "exact":
                raise StateError("INVALID_ARGUMENT", f"{table} has exact match fields only")
            values[m.field_id] = decode_value(m.exact.value)
        if set(values) != set(fields):
            raise StateError("INVALID_ARGUMENT", f"{table}: every exact field must be given")
        key = tuple(values[f.id] for f in match_fields)
        if kind == "DELETE":
            self.state.delete(table, key)
            return
        if entry.action.WhichOneof("type") != "action":
            raise StateError("INVALID_ARGUMENT", "only direct actions are supported")
        action = self.names.action(entry.action.action)
        (self.state.insert if kind == "INSERT" else self.state.modify)(table, key, action)

    def _write_counter(self, kind: str, entry: p4runtime_pb2.CounterEntry) -> None:
        if kind != "MODIFY":
            raise StateError("INVALID_ARGUMENT", "counter entries can only be modified")
        cells = self.state.counters[self.names.counter(entry.counter_id)]
        targets = [entry.index.index] if entry.HasField("index") else range(len(cells))
        with self.state.lock:
            for i in targets:
                if not 0 <= i < len(cells):
                    raise StateError("OUT_OF_RANGE", f"counter index {i} out of range")
                if entry.data.packet_count < 0 or entry.data.byte_count < 0:
                    raise StateError("INVALID_ARGUMENT", "counter values cannot be negative")
                cells[i] = (entry.data.packet_count, entry.data.byte_count)


def failure_status(errors: WriteErrors) -> status_pb2.Status:
    """The status of a Write with a failed update: UNKNOWN, one detail per update (OK for
    those that were applied), which is how a P4Runtime client tells which updates failed."""
    status = status_pb2.Status(code=code_pb2.UNKNOWN, message="Write failure.")
    for err in errors:
        detail = p4runtime_pb2.Error()
        if err is None:
            detail.canonical_code = code_pb2.OK
        else:
            detail.canonical_code, detail.message = err
            detail.space = _ERROR_SPACE
        packed = any_pb2.Any()
        packed.Pack(detail)
        status.details.append(packed)
    return status
