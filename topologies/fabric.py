"""Topology files of generated fabrics: racks of hosts under ToRs, every ToR linked to each
spine of its pod, and, with pods, every spine linked to each core.

    python -m topologies.fabric --racks 32 --hosts-per-rack 32 --gpus 8 --spines 4 -o f.json
    python -m topologies.fabric --racks 8 --hosts-per-rack 4 --spines 2 --pods 2 --cores 2 \\
        -o threetier.json

The file is what controller.topology.load reads (and Mininet, the controller and bench use);
addresses are left to be derived (controller.addresses). Names and ports:

* switches, in this order (their index: device id, address): tor1..torR, spine1..spineS*P (pod
  p's spines are the p-th S of them), core1..coreC; hosts h1..hN numbered rack by rack;
* a ToR's ports 1..H are its hosts, H+1.. its pod's spines in order; a spine's ports 1.. are
  its pod's ToRs in order, then the cores; a core's ports 1.. are the spines in order.

Link rates (Mbit/s): hosts at --bw; a ToR's spine links at --uplink-bw, or else so that they
carry together the rack's host bandwidth divided by --oversubscription (1: non-blocking); a
spine's core links carry together what its ToR links do (non-blocking above the racks), or
--uplink-bw when given.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

MAX_PORT = 510  # controller.topology: the highest port a link may name


class FabricError(ValueError):
    """Numbers that make no fabric; the message names the option."""


@dataclass(frozen=True)
class FabricLayout:
    racks: int
    hosts_per_rack: int
    gpus: int = 1
    spines: int = 1  # per pod
    pods: int = 1
    cores: int = 0
    bw: float = 100.0  # host links
    uplink_bw: float | None = None  # every switch link; None: from oversubscription
    oversubscription: float = 1.0
    name: str = ""

    def __post_init__(self) -> None:
        for opt, value, low in (("--racks", self.racks, 1), ("--hosts-per-rack",
                                self.hosts_per_rack, 1), ("--gpus", self.gpus, 1),
                                ("--spines", self.spines, 0), ("--pods", self.pods, 1),
                                ("--cores", self.cores, 0)):
            if value < low:
                raise FabricError(f"{opt}: at least {low}, got {value}")
        if self.gpus > 64:
            raise FabricError(f"--gpus: at most 64 per host, got {self.gpus}")
        if self.racks % self.pods:
            raise FabricError(f"--pods {self.pods}: must divide --racks {self.racks}")
        if self.racks > 1 and self.spines == 0:
            raise FabricError("--spines: racks are joined through spines, give one at least")
        if self.pods > 1 and self.cores == 0:
            raise FabricError("--cores: pods are joined through cores, give one at least")
        if self.cores and self.spines == 0:
            raise FabricError("--cores: cores link to spines; give --spines")
        for opt, value in (("--bw", self.bw), ("--uplink-bw", self.uplink_bw),
                           ("--oversubscription", self.oversubscription)):
            if value is not None and not value > 0:
                raise FabricError(f"{opt}: must be positive, got {value}")
        for what, ports in (("a ToR", self.hosts_per_rack + self.spines),
                            ("a spine", self.racks // self.pods + self.cores),
                            ("a core", self.spines * self.pods)):
            if ports > MAX_PORT:
                raise FabricError(f"{what} would need {ports} ports, at most {MAX_PORT}")

    @property
    def racks_per_pod(self) -> int:
        return self.racks // self.pods

    @property
    def tor_uplink_bw(self) -> float:
        if self.uplink_bw is not None:
            return self.uplink_bw
        return self.hosts_per_rack * self.bw / (self.spines * self.oversubscription)

    @property
    def core_link_bw(self) -> float:
        if self.uplink_bw is not None:
            return self.uplink_bw
        return self.racks_per_pod * self.tor_uplink_bw / self.cores

    def title(self) -> str:
        if self.name:
            return self.name
        tiers = f"{self.spines}sp" if self.pods == 1 else \
            f"{self.pods}pods-{self.spines}sp-{self.cores}core"
        return f"fabric-{self.racks}x{self.hosts_per_rack}x{self.gpus}-{tiers}"


def _rate(mbps: float) -> float | int:
    """Whole rates as integers; others to the kbit/s, as a file would be written by hand."""
    return int(mbps) if float(mbps).is_integer() else round(mbps, 3)


def document(f: FabricLayout) -> dict:
    """The topology file (a JSON document) of fabric `f`."""
    tors = [f"tor{r + 1}" for r in range(f.racks)]
    spines = [f"spine{s + 1}" for s in range(f.spines * f.pods)]
    cores = [f"core{c + 1}" for c in range(f.cores)]
    switches = {n: {"role": "tor"} for n in tors}
    switches |= {n: {"role": "spine"} for n in spines}
    switches |= {n: {"role": "core"} for n in cores}
    hosts, links = {}, []
    for r, tor in enumerate(tors):
        for j in range(f.hosts_per_rack):
            name = f"h{r * f.hosts_per_rack + j + 1}"
            hosts[name] = {"gpus": f.gpus}
            links.append({"node": name, "switch": tor, "port": j + 1, "bw": _rate(f.bw)})
    for r, tor in enumerate(tors):
        pod, in_pod = divmod(r, f.racks_per_pod)
        for s in range(f.spines):
            links.append({"switch": tor, "port": f.hosts_per_rack + s + 1,
                          "peer": spines[pod * f.spines + s], "peer_port": in_pod + 1,
                          "bw": _rate(f.tor_uplink_bw)})
    for i, spine in enumerate(spines):
        for c, core in enumerate(cores):
            links.append({"switch": spine, "port": f.racks_per_pod + c + 1, "peer": core,
                          "peer_port": i + 1, "bw": _rate(f.core_link_bw)})
    tiers = f"{f.spines} spine(s)" if f.pods == 1 else \
        f"{f.pods} pods of {f.racks_per_pod} racks and {f.spines} spine(s), {f.cores} core(s)"
    return {"name": f.title(),
            "description": f"{f.racks} racks x {f.hosts_per_rack} hosts x {f.gpus} GPUs, "
                           f"{tiers}; generated by python -m topologies.fabric.",
            "switches": switches, "hosts": hosts, "links": links}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m topologies.fabric",
        description="Write the topology file of a leaf-spine fabric (two tiers) or, with "
                    "--pods and --cores, of a three-tier one. Every ToR links to each spine "
                    "of its pod, every spine to each core. The file loads with "
                    "controller.topology.load; run it with `python -m topologies.run --topo "
                    "FILE` or name it in passing-ctl's configuration.",
        epilog="example: python -m topologies.fabric --racks 32 --hosts-per-rack 32 --gpus 8 "
               "--spines 4 -o fabric-32x32.json (1,024 hosts, 36 switches)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--racks", type=int, required=True, help="ToRs (racks)")
    p.add_argument("--hosts-per-rack", type=int, required=True, help="hosts under each ToR")
    p.add_argument("--gpus", type=int, default=1, help="GPUs of each host")
    p.add_argument("--spines", type=int, default=1,
                   help="spines (per pod with --pods); each ToR links to every spine of its pod")
    p.add_argument("--pods", type=int, default=1,
                   help="pods: the racks cut into this many groups of consecutive racks, each "
                        "with its own spines; more than one needs --cores")
    p.add_argument("--cores", type=int, default=0,
                   help="cores, a third tier: every spine links to each of them")
    p.add_argument("--bw", type=float, default=100.0, help="host links' rate, Mbit/s")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--uplink-bw", type=float, default=None,
                      help="every switch link's rate, Mbit/s (default: from --oversubscription)")
    rate.add_argument("--oversubscription", type=float, default=1.0,
                      help="a rack's host bandwidth over its spine links' (1: non-blocking); "
                           "spine-core links carry together what a spine's ToR links do")
    p.add_argument("--name", default="", help="the topology's name (default: from the numbers)")
    p.add_argument("-o", "--output", default="-", help="the file to write; - for stdout")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    try:
        layout = FabricLayout(a.racks, a.hosts_per_rack, a.gpus, a.spines, a.pods, a.cores,
                              a.bw, a.uplink_bw, a.oversubscription, a.name)
    except FabricError as e:
        p.error(str(e))
    text = json.dumps(document(layout), indent=1) + "\n"
    if a.output == "-":
        sys.stdout.write(text)
    else:
        with open(a.output, "w") as out:
            out.write(text)
        switches = a.racks + a.spines * a.pods + a.cores
        print(f"{a.output}: {a.racks * a.hosts_per_rack} hosts, {switches} switches",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
