"""The P4Info ids of P4Runtime entities turned into the names the switch state keys them by,
refused with the codes BMv2's server answers for an id or parameter it does not know."""

from __future__ import annotations

from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from passing.p4info import P4InfoIndex, decode_value
from switch_model.state import Action, StateError


class EntityNames:
    """Ids of one P4Info to names; StateError for an unknown one."""

    def __init__(self, p4info: p4info_pb2.P4Info, index: P4InfoIndex):
        self.p4info = p4info
        self.index = index

    def table(self, table_id: int) -> str:
        for t in self.p4info.tables:
            if t.preamble.id == table_id:
                return t.preamble.name.lstrip(".")
        raise StateError("NOT_FOUND", f"Unknown table id {table_id}")

    def counter(self, counter_id: int) -> str:
        for c in self.p4info.counters:
            if c.preamble.id == counter_id:
                return c.preamble.name.lstrip(".")
        raise StateError("NOT_FOUND", f"Unknown counter id {counter_id}")

    def action(self, msg: p4runtime_pb2.Action) -> Action:
        """The action `msg` names, its parameters by name."""
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
