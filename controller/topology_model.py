"""What a topology file describes, once read (controller.topology reads and checks the files):
hosts, switches by tier, the links between them, and the questions the rest of the controller
asks about them."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

# Switch tiers from the hosts up: hosts attach to ToRs, a switch link joins two adjacent tiers.
ROLES = ("tor", "spine", "core")
TIER = {role: i for i, role in enumerate(ROLES)}


class TopologyError(ValueError):
    """A topology file that cannot be used; the message names the offending field."""


@dataclass(frozen=True)
class LinkParams:
    bw: float | None = None  # Mbit/s
    delay: str | None = None  # e.g. "0.1ms"
    loss: float = 0.0  # percent


@dataclass(frozen=True)
class Host:
    name: str
    rack: str  # the ToR it is attached to
    port: int  # that ToR's port
    gpus: int
    ip: str
    mac: str
    link: LinkParams


@dataclass(frozen=True)
class Switch:
    name: str
    role: str
    index: int  # position in the file: device id, address block
    ip: str
    mac: str

    @property
    def tier(self) -> int:
        return TIER[self.role]


@dataclass(frozen=True)
class SwitchLink:
    """A link between two switches of adjacent tiers: `lower` (a ToR, or a spine under a core)
    on its port `lower_port`, `upper` on `upper_port`. (A job's way up, with the lower
    switch's id above, is controller.job_plan.SwitchRole.uplink.)"""

    lower: str
    lower_port: int
    upper: str
    upper_port: int
    link: LinkParams

    # The ends' names from when ToR-spine links were the only switch links, which code outside
    # the controller (sim/) still reads; for a spine-core link they name the spine and core.
    @property
    def tor(self) -> str:
        return self.lower

    @property
    def tor_port(self) -> int:
        return self.lower_port

    @property
    def spine(self) -> str:
        return self.upper

    @property
    def spine_port(self) -> int:
        return self.upper_port


SpineLink = SwitchLink  # its name while ToR-spine links were the only switch links


@dataclass
class Topology:
    name: str
    switches: dict[str, Switch]
    hosts: dict[str, Host]
    # Every switch link, lower end first, in file order (the name is older than the cores).
    uplinks: list[SwitchLink] = field(default_factory=list)

    def hosts_in(self, rack: str) -> list[Host]:
        return [h for h in self.hosts.values() if h.rack == rack]

    def tier(self, switch: str) -> int:
        return self.switches[switch].tier

    def of_role(self, role: str) -> list[Switch]:
        """The switches of one role, in file order."""
        return [s for s in self.switches.values() if s.role == role]

    def uplink_of(self, tor: str) -> SwitchLink | None:
        """The switch's first link up (file order), or None."""
        ups = self.uplinks_of(tor)
        return ups[0] if ups else None

    def uplinks_of(self, switch: str) -> list[SwitchLink]:
        """The switch's links to the tier above, in file order."""
        return [u for u in self.uplinks if u.lower == switch]

    def downlinks_of(self, switch: str) -> list[SwitchLink]:
        """The switch's links to the tier below, in file order."""
        return [u for u in self.uplinks if u.upper == switch]

    def link_between(self, a: str, b: str) -> SwitchLink | None:
        """The link joining switches a and b, whichever is the lower one (one at most)."""
        return self._by_pair.get(frozenset((a, b)))

    @functools.cached_property
    def _by_pair(self) -> dict[frozenset, SwitchLink]:
        return {frozenset((u.lower, u.upper)): u for u in self.uplinks}

    def neighbors(self, switch: str) -> dict[str, int]:
        """Switch neighbor -> the port of `switch` that leads to it."""
        return self._neighbors[switch]

    @functools.cached_property
    def _neighbors(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {s: {} for s in self.switches}
        for u in self.uplinks:
            out[u.lower][u.upper] = u.lower_port
            out[u.upper][u.lower] = u.upper_port
        return out

    def pod_of(self, switch: str) -> str | None:
        """The pod of a ToR or spine, named by its first ToR (file order): the ToRs and spines
        that ToR-spine links join, directly or through each other. None for a core."""
        return self._pods.get(switch)

    @functools.cached_property
    def _pods(self) -> dict[str, str]:
        pods: dict[str, str] = {}
        for tor in self.of_role("tor"):
            if tor.name in pods:
                continue
            todo = [tor.name]
            while todo:
                s = todo.pop()
                if s in pods:
                    continue
                pods[s] = tor.name
                todo += [n for n in self.neighbors(s) if self.switches[n].role != "core"]
        return pods

    def ports_of(self, switch: str) -> dict[int, str]:
        """port -> what is attached (host or switch name)."""
        ports = {h.port: h.name for h in self.hosts.values() if h.rack == switch}
        ports.update({port: other for other, port in self.neighbors(switch).items()})
        return ports
