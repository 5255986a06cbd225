"""Control-plane-visible state of the software switch: exact-match tables, multicast groups and
counters, named and sized exactly as in the P4Info of the P4 program.

The P4Runtime server writes and reads it; the pipeline reads tables and groups and updates
counters and registers. Errors carry a gRPC status code name so that the server can answer the way
BMv2's P4Runtime server does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from passing.p4info import P4InfoIndex


class StateError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code  # a grpc.StatusCode name: ALREADY_EXISTS, NOT_FOUND, INVALID_ARGUMENT...


@dataclass(frozen=True)
class Action:
    name: str
    params: dict[str, int]


@dataclass
class Table:
    name: str
    key_names: tuple[str, ...]
    key_widths: tuple[int, ...]
    actions: dict[str, dict[str, int]]  # action name -> {param: bitwidth}
    table_only: set[str]  # actions that may not be the default
    default_only: set[str]  # actions that may only be the default
    size: int
    default: Action
    const_default: bool
    entries: dict[tuple[int, ...], Action]

    def check_action(self, action: Action, as_default: bool) -> None:
        if action.name not in self.actions:
            raise StateError("INVALID_ARGUMENT",
                             f"action {action.name} is not an action of table {self.name}")
        if as_default and action.name in self.table_only:
            raise StateError("INVALID_ARGUMENT", f"{action.name} cannot be {self.name}'s default")
        if not as_default and action.name in self.default_only:
            raise StateError("INVALID_ARGUMENT", f"{action.name} is default-only in {self.name}")
        widths = self.actions[action.name]
        if set(action.params) != set(widths):
            raise StateError("INVALID_ARGUMENT", f"action {action.name} takes {sorted(widths)}, "
                                                 f"got {sorted(action.params)}")
        for p, v in action.params.items():
            if v >= 1 << widths[p]:
                raise StateError("INVALID_ARGUMENT",
                                 f"{action.name}.{p}: value does not fit in {widths[p]} bits")

    def check_key(self, key: tuple[int, ...]) -> None:
        if len(key) != len(self.key_names):
            raise StateError("INVALID_ARGUMENT",
                             f"table {self.name} needs key fields {list(self.key_names)}")
        for name, width, v in zip(self.key_names, self.key_widths, key, strict=True):
            if v >= 1 << width:
                raise StateError("INVALID_ARGUMENT",
                                 f"{self.name}.{name}: value does not fit in {width} bits")


class SwitchState:
    def __init__(self, info: P4InfoIndex):
        self.info = info
        self.lock = threading.RLock()
        self.tables: dict[str, Table] = {}
        for t in info.p4info.tables:
            name = t.preamble.name.lstrip(".")
            actions, table_only, default_only = {}, set(), set()
            for ref in t.action_refs:
                aname = info.action_name(ref.id)
                actions[aname] = {p.name: p.bitwidth for p in info.action_params(aname)}
                if ref.scope == ref.TABLE_ONLY:
                    table_only.add(aname)
                elif ref.scope == ref.DEFAULT_ONLY:
                    default_only.add(aname)
            default_name = info.action_name(t.const_default_action_id) \
                if t.const_default_action_id else None
            self.tables[name] = Table(
                name=name,
                key_names=tuple(m.name for m in t.match_fields),
                key_widths=tuple(m.bitwidth for m in t.match_fields),
                actions=actions, table_only=table_only, default_only=default_only,
                size=t.size, default=Action(default_name or "NoAction", {}),
                const_default=bool(t.const_default_action_id), entries={})
        # Each counter as (cells, 2) uint64 (packets, bytes): the compiled PASSING path
        # (switch_model/fastpath.c) counts into the same memory.
        self.counters: dict[str, np.ndarray] = {
            c.preamble.name.lstrip("."): np.zeros((c.size, 2), dtype=np.uint64)
            for c in info.p4info.counters}
        self.mcast: dict[int, list[tuple[int, int]]] = {}
        # Bumped by every write to tables or multicast groups: the compiled path copies them
        # again when it changed.
        self.changes = 0

    # -- tables -------------------------------------------------------------------------------
    def table(self, name: str) -> Table:
        try:
            return self.tables[name]
        except KeyError:
            raise StateError("NOT_FOUND", f"no table {name}") from None

    def insert(self, table: str, key: tuple[int, ...], action: Action) -> None:
        with self.lock:
            t = self.table(table)
            t.check_key(key)
            t.check_action(action, as_default=False)
            if key in t.entries:
                raise StateError("ALREADY_EXISTS", f"{table}: entry {key} already exists")
            if len(t.entries) >= t.size:
                raise StateError("RESOURCE_EXHAUSTED", f"{table} is full ({t.size} entries)")
            t.entries[key] = action
            self.changes += 1

    def modify(self, table: str, key: tuple[int, ...], action: Action) -> None:
        with self.lock:
            t = self.table(table)
            t.check_key(key)
            t.check_action(action, as_default=False)
            if key not in t.entries:
                raise StateError("NOT_FOUND", f"{table}: no entry {key}")
            t.entries[key] = action
            self.changes += 1

    def delete(self, table: str, key: tuple[int, ...]) -> None:
        with self.lock:
            t = self.table(table)
            if t.entries.pop(key, None) is None:
                raise StateError("NOT_FOUND", f"{table}: no entry {key}")
            self.changes += 1

    def set_default(self, table: str, action: Action) -> None:
        with self.lock:
            t = self.table(table)
            if t.const_default:
                raise StateError("PERMISSION_DENIED", f"{table} has a const default action")
            t.check_action(action, as_default=True)
            t.default = action
            self.changes += 1

    # -- multicast ----------------------------------------------------------------------------
    def mcast_write(self, kind: str, group: int, replicas: list[tuple[int, int]]) -> None:
        with self.lock:
            if group == 0:
                raise StateError("INVALID_ARGUMENT", "multicast group id 0 is reserved")
            exists = group in self.mcast
            if kind == "INSERT" and exists:
                raise StateError("ALREADY_EXISTS", f"multicast group {group} exists")
            if kind in ("MODIFY", "DELETE") and not exists:
                raise StateError("NOT_FOUND", f"no multicast group {group}")
            if kind == "DELETE":
                del self.mcast[group]
            else:
                if len(set(replicas)) != len(replicas):
                    raise StateError("INVALID_ARGUMENT", f"group {group}: duplicate replicas")
                self.mcast[group] = list(replicas)
            self.changes += 1

    # -- counters -----------------------------------------------------------------------------
    def count(self, counter: str, index: int, nbytes: int) -> None:
        cells = self.counters[counter]
        if not 0 <= index < len(cells):
            return  # an index the controller should never produce; never crash the switch
        cells[index, 0] += 1
        cells[index, 1] += nbytes

    def reset(self) -> None:
        """A new pipeline config wipes everything, as on BMv2."""
        with self.lock:
            for t in self.tables.values():
                t.entries.clear()
            for cells in self.counters.values():
                cells[:] = 0  # in place: the compiled path holds their addresses
            self.mcast.clear()
            self.changes += 1
