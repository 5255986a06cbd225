"""The entities a P4Runtime Read asks for, read from the switch state as BMv2's server answers
them: an id of 0 reads every table or counter, a match or index narrows the read."""

from __future__ import annotations

import grpc
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from passing.p4info import decode_value, encode_value
from switch_model.p4runtime_abort import Abort
from switch_model.p4runtime_names import EntityNames
from switch_model.state import StateError, SwitchState

_PACKETS = (p4info_pb2.CounterSpec.PACKETS, p4info_pb2.CounterSpec.BOTH)
_BYTES = (p4info_pb2.CounterSpec.BYTES, p4info_pb2.CounterSpec.BOTH)


class EntityReader:
    """Table entries, counters and multicast groups read into a ReadResponse; registers and
    other entities refused as UNIMPLEMENTED (Abort), unknown ids with StateError."""

    def __init__(self, state: SwitchState, names: EntityNames):
        self.state = state
        self.names = names
        self.index = names.index

    def read(self, entity: p4runtime_pb2.Entity, rep: p4runtime_pb2.ReadResponse) -> None:
        """The entities that `entity` asks for, added to `rep` (the caller holds the state's
        lock, so that one Read sees one instant)."""
        which = entity.WhichOneof("entity")
        if which == "table_entry":
            te = entity.table_entry
            names = [self.names.table(te.table_id)] if te.table_id else list(self.state.tables)
            for name in names:
                self._read_table(name, te, rep)
        elif which == "counter_entry":
            ce = entity.counter_entry
            names = [self.names.counter(ce.counter_id)] if ce.counter_id \
                else list(self.state.counters)
            for name in names:
                self._read_counter(name, ce, rep)
        elif which == "packet_replication_engine_entry":
            pre = entity.packet_replication_engine_entry
            if pre.WhichOneof("type") != "multicast_group_entry":
                raise Abort(grpc.StatusCode.UNIMPLEMENTED, "clone sessions are not supported")
            self._read_groups(pre.multicast_group_entry.multicast_group_id, rep)
        elif which == "register_entry":
            raise Abort(grpc.StatusCode.UNIMPLEMENTED, "Register reads are not supported")
        else:
            raise Abort(grpc.StatusCode.UNIMPLEMENTED, f"reading {which} is not supported")

    def _read_table(self, name: str, query: p4runtime_pb2.TableEntry,
                    rep: p4runtime_pb2.ReadResponse) -> None:
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

    def _read_counter(self, name: str, query: p4runtime_pb2.CounterEntry,
                      rep: p4runtime_pb2.ReadResponse) -> None:
        cells = self.state.counters[name]
        cid = self.index.counter(name).preamble.id
        if query.HasField("index"):
            if not 0 <= query.index.index < len(cells):
                raise StateError("OUT_OF_RANGE", f"counter index {query.index.index}")
            indices = [query.index.index]
        else:
            indices = range(len(cells))
        unit = self.index.counter(name).spec.unit
        for i in indices:
            out = rep.entities.add().counter_entry
            out.counter_id = cid
            out.index.index = i
            # Only the units the P4 program declared are reported, as BMv2 does.
            if unit in _PACKETS:
                out.data.packet_count = int(cells[i, 0])
            if unit in _BYTES:
                out.data.byte_count = int(cells[i, 1])

    def _read_groups(self, gid: int, rep: p4runtime_pb2.ReadResponse) -> None:
        for g, replicas in sorted(self.state.mcast.items()):
            if gid and g != gid:
                continue
            out = rep.entities.add().packet_replication_engine_entry.multicast_group_entry
            out.multicast_group_id = g
            for port, inst in replicas:
                out.replicas.add(egress_port=port, instance=inst)
