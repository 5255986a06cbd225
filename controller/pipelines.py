"""What the switches run: the PASSING pipeline, pushed only where a switch runs none or another
(a push wipes a switch), and the L2 forwarding entries that carry ordinary traffic beside it."""

from __future__ import annotations

import functools
from pathlib import Path

from p4.config.v1 import p4info_pb2

from controller.connections import SwitchConnections
from controller.errors import ControllerError
from controller.l2_paths import L2Paths
from controller.switch import SwitchError, Update
from controller.tables.forwarding import ForwardingTables
from controller.topology import Topology
from passing import protocol as P
from passing.control_surface import control_surface, surface_difference, values_per_packet
from passing.p4info import pipeline_signature
from passing.pipeline_files import BUILD_DIR, BuildMismatch, committed_p4info, pipeline_files

FLOOD_GROUP = 1  # multicast group for L2 flooding; job groups start at 2


class Pipelines:
    """The pipeline of the switches of `topo`, reached through `connections`, as built in
    `build_dir`."""

    def __init__(self, topo: Topology, connections: SwitchConnections,
                 build_dir: Path = BUILD_DIR) -> None:
        self.topo = topo
        self.connections = connections
        self.build_dir = build_dir

    def pipeline(self) -> tuple[p4info_pb2.P4Info, bytes]:
        """The P4Info and device config this controller pushes (pipeline_files)."""
        try:
            return pipeline_files(self.build_dir)
        except BuildMismatch as e:
            raise ControllerError(str(e)) from None

    @functools.cached_property
    def _own_signature(self) -> list[tuple]:
        """The pipeline this controller pushes, parsed once rather than per switch and call."""
        return pipeline_signature(self.pipeline()[0])

    def pipeline_state(self, name: str) -> str:
        """'ours', 'none' or 'other': what the switch runs. On a switch that loads its own
        program, ours is one whose tables and counters are PASSING's (passing.control_surface):
        its loader's compiler numbers and names them its own way."""
        c = self.connections.conn(name)
        if not c.fetch_pipeline():
            return "none"
        if self._preloaded(name):
            return "other" if self._difference(c.info.p4info) else "ours"
        return "ours" if pipeline_signature(c.info.p4info) == self._own_signature else "other"

    def _preloaded(self, name: str) -> bool:
        return self.connections.endpoints[name].preloaded

    @functools.cached_property
    def _own_surface(self) -> dict[str, tuple | None]:
        """What a preloaded switch's program must match, parsed once (as _own_signature): from
        the committed P4Info, since the surface does not change with K and no build is needed
        where the controller pushes nothing."""
        return control_surface(committed_p4info())

    def _difference(self, running: p4info_pb2.P4Info) -> str | None:
        """Why the controller cannot drive a preloaded program `running`, or None: its tables
        and counters, then its K, which must be this process's (PASSING_K), as its agents'."""
        differs = surface_difference(self._own_surface, running)
        if differs:
            return differs
        k = values_per_packet(running)
        if k is None:
            return "it holds no slot_values registers to tell its K by"
        if k != P.K:
            return (f"it sums K={k} values per packet, this controller K={P.K}: run the "
                    f"controller and every agent with PASSING_K={k}")
        return None

    def _refuse_preloaded(self, name: str, state: str) -> ControllerError:
        c = self.connections.conn(name)
        runs = ("runs no pipeline" if state == "none" else
                f"runs a program the controller cannot drive ({self._difference(c.info.p4info)})")
        return ControllerError(
            f"switch {name} {runs}, and its configuration says \"pipeline\": \"preloaded\", so "
            "the controller loads nothing there: load the PASSING program with the switch's own "
            "tools (Tofino: docs/tofino.md), or drop \"pipeline\" to let the controller push it")

    def switch_status(self) -> list[dict]:
        """Per switch: its endpoint and role, whether its own tools load its program, whether
        it answers, and what it runs."""
        rows = []
        for name, ep in self.connections.endpoints.items():
            row = {"switch": name, "address": ep.address, "device_id": ep.device_id,
                   "role": self.topo.switches[name].role, "preloaded": ep.preloaded,
                   "reachable": False, "pipeline": None}
            try:
                row["pipeline"] = self.pipeline_state(name)
                row["reachable"] = True
            except ControllerError as e:
                row["error"] = str(e)
            rows.append(row)
        return rows

    def prepare(self, name: str) -> str:
        """Make switch `name` run the PASSING pipeline with forwarding installed. Pushing a
        pipeline wipes a switch, so it is pushed only when the switch runs none or another."""
        state = self.pipeline_state(name)
        if self._preloaded(name) and state != "ours":
            raise self._refuse_preloaded(name, state)
        c = self.connections.conn(name)
        if state == "other":
            # BMv2's P4Runtime server forgets multicast groups on a new pipeline but leaves
            # them in the replication engine: delete them while they are still known.
            c.write([c.multicast_update(Update.DELETE, g) for g in c.read_multicast_groups()])
        if state != "ours":
            p4info, config = self.pipeline()
            try:
                c.set_pipeline(p4info, config)
            except SwitchError as e:
                hint = "" if config else (f" (no build in {self.build_dir}: `make build` or "
                                          "`python -m passing.p4build` for BMv2 switches)")
                raise ControllerError(f"{e}{hint}") from None
        self._install_forwarding(name)
        return "pushed" if state != "ours" else "kept"

    def prepare_if_needed(self, name: str) -> None:
        if self.pipeline_state(name) != "ours":
            self.prepare(name)

    @functools.cached_property
    def l2_paths(self) -> L2Paths:
        """Ordinary traffic's loop-free ways through the fabric (controller.l2_paths)."""
        return L2Paths(self.topo)

    def _install_forwarding(self, name: str) -> None:
        ForwardingTables(self.connections.conn(name)).sync(self.l2_paths.to_hosts(name),
                                                           self.l2_paths.flood_ports(name),
                                                           FLOOD_GROUP)
