"""Fabrics to simulate: the project's topology files, reshaped, and generated leaf-spine fabrics.

The shipped files (topologies/*.json) are loaded by controller.topology, the same loader the
controller and Mininet use, and reshaped as bench.sweep reshapes them for a scenario: every
link to one rate and every host to one GPU count.

Larger fabrics are described by a few numbers (FabricSpec) and turned into the same Topology
object. The topology file format allows one spine and one uplink per ToR, which a 4-spine
fabric exceeds, so the Topology is built directly rather than parsed. The controller's job plan
reads only the first spine and each ToR's first uplink, so it plans jobs on these fabrics as
it would on a file: its aggregation tree uses spine 0 (the first uplink of every ToR goes
there); the other spines carry only the TCP strategies' traffic (sim.platform).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from controller import topology as T
from controller.topology import Host, LinkParams, Switch, Topology

try:  # a switch link's class: SwitchLink since the controller has cores, SpineLink before
    from controller.topology import SwitchLink as UpLink
except ImportError:
    from controller.topology import SpineLink as UpLink

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY_DIR = ROOT / "topologies"


@dataclass(frozen=True)
class FabricSpec:
    """A leaf-spine fabric: `racks` ToRs of `hosts_per_rack` hosts each, every ToR linked to
    every one of `spines` spines. `oversubscription` is a rack's host bandwidth over its
    uplink bandwidth (1: non-blocking, 4: the common 4:1)."""

    racks: int
    hosts_per_rack: int
    spines: int = 1
    gpus: int = 1
    host_mbps: float = 100_000.0
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        for name in ("racks", "hosts_per_rack", "spines", "gpus"):
            if getattr(self, name) < 1:
                raise ValueError(f"fabric {name} must be at least 1")
        if self.host_mbps <= 0 or self.oversubscription <= 0:
            raise ValueError("fabric rates and oversubscription must be positive")

    @property
    def uplink_mbps(self) -> float:
        """One ToR-spine link: the rack's host bandwidth over the spines, oversubscribed."""
        return self.hosts_per_rack * self.host_mbps / (self.spines * self.oversubscription)

    @property
    def hosts(self) -> int:
        return self.racks * self.hosts_per_rack

    @property
    def name(self) -> str:
        return (f"fabric-{self.racks}x{self.hosts_per_rack}-{self.spines}sp-"
                f"{self.oversubscription:g}to1")


_SPEC = re.compile(r"^(\d+)x(\d+)(?:x(\d+))?$")


def parse_spec(text: str, gpus: int = 1, host_mbps: float = 100_000.0,
               oversubscription: float = 1.0) -> FabricSpec:
    """`RACKSxHOSTS[xSPINES]`, e.g. 32x32x4: 32 racks of 32 hosts under 4 spines."""
    m = _SPEC.match(text.strip())
    if not m:
        raise ValueError(f"fabric {text!r}: expected RACKSxHOSTS[xSPINES], e.g. 32x32x4")
    racks, hosts, spines = int(m[1]), int(m[2]), int(m[3] or 1)
    return FabricSpec(racks, hosts, spines, gpus, host_mbps, oversubscription)


def load(path_or_name: str | Path) -> Topology:
    """A topology file, by path or by the name of a shipped one (`star`, `leafspine`)."""
    path = Path(path_or_name)
    if not path.exists() and (TOPOLOGY_DIR / f"{path_or_name}.json").exists():
        path = TOPOLOGY_DIR / f"{path_or_name}.json"
    return T.load(path)


def reshape(topo: Topology, link_mbps: float | None = None, gpus: int | None = None) -> Topology:
    """`topo` with every link at `link_mbps` and every host with `gpus` GPUs (None: as is),
    as bench.sweep shapes a scenario's fabric."""
    def link(p: LinkParams) -> LinkParams:
        return p if link_mbps is None else dataclasses.replace(p, bw=link_mbps)
    hosts = {n: dataclasses.replace(h, link=link(h.link), gpus=gpus or h.gpus)
             for n, h in topo.hosts.items()}
    uplinks = [dataclasses.replace(u, link=link(u.link)) for u in topo.uplinks]
    return Topology(topo.name, dict(topo.switches), hosts, uplinks)


def generate(spec: FabricSpec) -> Topology:
    """The Topology of a generated fabric. Names: ToRs tor1..torR, spines spine1..spineS,
    hosts h1..hN numbered rack by rack; ToR ports 1..H for hosts, H+1.. for the spines."""
    switches: dict[str, Switch] = {}
    index = 0

    def add_switch(name: str, role: str) -> None:
        nonlocal index
        ip = str(ipaddress.IPv4Address(0x0AFF0000 + index))
        switches[name] = Switch(name, role, index, ip, _mac(0xFE0000 + index))
        index += 1

    for r in range(spec.racks):
        add_switch(f"tor{r + 1}", "tor")
    for s in range(spec.spines):
        add_switch(f"spine{s + 1}", "spine")
    host_link = LinkParams(spec.host_mbps)
    hosts: dict[str, Host] = {}
    for r in range(spec.racks):
        for i in range(spec.hosts_per_rack):
            n = r * spec.hosts_per_rack + i + 1
            hosts[f"h{n}"] = Host(f"h{n}", f"tor{r + 1}", i + 1, spec.gpus,
                                  str(ipaddress.IPv4Address(0x0A000000 + n)), _mac(n), host_link)
    up_link = LinkParams(spec.uplink_mbps)
    # Spine 1 first for every ToR: Topology.uplink_of (the job plan's way up) takes the first.
    uplinks = [UpLink(f"tor{r + 1}", spec.hosts_per_rack + s + 1, f"spine{s + 1}", r + 1,
                         up_link)
               for r in range(spec.racks) for s in range(spec.spines)]
    return Topology(spec.name, switches, hosts, uplinks)


def _mac(n: int) -> str:
    return "08:00:" + ":".join(f"{(n >> s) & 0xFF:02x}" for s in (24, 16, 8, 0))


def ends(link: UpLink) -> tuple[str, str]:
    """A switch link's (lower, upper) switches: (ToR, spine), or (spine, core)."""
    if hasattr(link, "lower"):
        return link.lower, link.upper
    return link.tor, link.spine


def tors(topo: Topology) -> list[str]:
    """The ToRs in file order (their device index)."""
    return [s.name for s in sorted(topo.switches.values(), key=lambda s: s.index)
            if s.role == "tor"]


def spines(topo: Topology) -> list[str]:
    return [s.name for s in sorted(topo.switches.values(), key=lambda s: s.index)
            if s.role == "spine"]


def above_tors(topo: Topology) -> list[str]:
    """Every switch that is not a ToR (spines, and cores where a topology has them)."""
    return [s.name for s in sorted(topo.switches.values(), key=lambda s: s.index)
            if s.role != "tor"]


def host_mbps(topo: Topology) -> float:
    """The host links' rate when they all have one (the scenario's rate); else the lowest."""
    rates = {h.link.bw for h in topo.hosts.values() if h.link.bw}
    if not rates:
        raise ValueError(f"{topo.name}: no host link has a rate (bw)")
    return min(rates)


def spread(topo: Topology, n: int) -> list[str]:
    """n hosts taken round-robin over the racks, as bench.sweep picks a job of n hosts (so 2
    hosts on leafspine span both racks)."""
    by_rack: dict[str, list[str]] = {}
    for name in sorted(topo.hosts, key=_host_order):
        by_rack.setdefault(topo.hosts[name].rack, []).append(name)
    order = [h for i in range(max(map(len, by_rack.values())))
             for r in sorted(by_rack) for h in by_rack[r][i:i + 1]]
    if n > len(order):
        raise ValueError(f"{topo.name} has {len(order)} hosts, not {n}")
    return sorted(order[:n], key=_host_order)


def _host_order(name: str) -> tuple[int, str]:
    """h2 before h10 (bench.sweep sorts names as strings, the same for its 4-host files)."""
    digits = "".join(c for c in name if c.isdigit())
    return (int(digits) if digits else 0, name)
