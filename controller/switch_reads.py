"""Reads of one switch over its P4Runtime connection: table entries, counter cells and
multicast groups, decoded with the switch's P4Info."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import grpc
from p4.v1 import p4runtime_pb2
from p4runtime_sh.p4runtime import P4RuntimeClient, P4RuntimeException

from controller.switch_errors import SwitchError
from passing.p4info import P4InfoIndex, decode_value


class SwitchReads:
    """SwitchConnection's reads. Uses what the connection holds: `name`, `device_id`, the
    P4Runtime client `_client` and the P4Info `_index()`."""

    name: str
    device_id: int
    _client: P4RuntimeClient
    _index: Callable[[], P4InfoIndex]  # SwitchWriter's

    def _read(self, entity: p4runtime_pb2.Entity) -> list[p4runtime_pb2.Entity]:
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

    def read_counter_cells(self, counter: str,
                           indices: Iterable[int]) -> dict[int, tuple[int, int]]:
        """{index: (packets, bytes)} of the given cells, in one request: cheaper than reading
        a large counter whole, and than one request per cell."""
        cid = self._index().counter(counter).preamble.id
        req = p4runtime_pb2.ReadRequest(device_id=self.device_id)
        if self._client.role_name is not None:  # as P4RuntimeClient.read_one does
            req.role = self._client.role_name
        for i in indices:
            ent = req.entities.add()
            ent.counter_entry.counter_id = cid
            ent.counter_entry.index.index = i
        if not req.entities:
            return {}
        try:
            reps = list(self._client.stub.Read(req))
        except grpc.RpcError as e:
            raise SwitchError(f"switch {self.name}: read failed: {e.code().name}: "
                              f"{e.details()}") from None
        return {e.counter_entry.index.index: (e.counter_entry.data.packet_count,
                                              e.counter_entry.data.byte_count)
                for rep in reps for e in rep.entities}

    def read_multicast_groups(self) -> dict[int, list[tuple[int, int]]]:
        ent = p4runtime_pb2.Entity()
        ent.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        groups = {}
        for e in self._read(ent):
            g = e.packet_replication_engine_entry.multicast_group_entry
            groups[g.multicast_group_id] = [(r.egress_port, r.instance) for r in g.replicas]
        return groups
