"""A topology's data plane in Mininet: its hosts, its PASSING switches (BMv2 or the model) and
the links between them, shaped as the topology file says; loss and link rates changed while it
runs."""

from __future__ import annotations

from pathlib import Path

from mininet.link import Link
from mininet.net import Mininet
from mininet.node import Node

from controller.topology import LinkParams, Switch, Topology
from host_agent.transport import segments_for_link
from passing import p4build
from passing import protocol as P
from passing.pipeline_files import BUILD_DIR
from topologies import link_loss, link_rate
from topologies.mininet_nodes import (
    GRPC_PORT_BASE,
    MAX_SWITCH_INDEX,
    BMv2Switch,
    ModelSwitch,
    QuietTCLink,
)
from topologies.root_links import remove_stale


class MininetFabric:
    """The hosts, switches and links of `topo` on `target` ("bmv2" or "model"); switch logs,
    pcaps and loss rules go under `run_dir`."""

    def __init__(self, topo: Topology, target: str, run_dir: Path, pcap: bool = False,
                 log: bool = False):
        self.topo = topo
        self.target = target
        self.run_dir = run_dir
        self.pcap = pcap
        self.log = log
        self.net: Mininet | None = None

    def node(self, name: str) -> Node:
        return self.net.get(name)

    def switch_addresses(self) -> dict[str, tuple[str, int]]:
        """Each switch's P4Runtime address and device id, by name: what its controller
        connects to."""
        return {s.name: (f"127.0.0.1:{GRPC_PORT_BASE + s.index}", s.index)
                for s in self.topo.switches.values()}

    def start(self) -> None:
        """Build and start the whole fabric; stop() undoes whatever part of it was made."""
        too_high = [s.name for s in self.topo.switches.values() if s.index > MAX_SWITCH_INDEX]
        if too_high:
            raise ValueError(f"{len(too_high)} switches ({too_high[0]}, ...) have an index above "
                             f"{MAX_SWITCH_INDEX}: Mininet gives each switch its own ports from "
                             f"{GRPC_PORT_BASE} on; simulate a fabric this large (python -m sim)")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        stale = remove_stale(self._switch_port_names())
        if stale:
            print(f"*** removed interfaces left by an earlier run: {', '.join(stale)}")
        if self.target == "bmv2":
            # BMv2 starts without a program; the controller pushes this build to it.
            if p4build.build(BUILD_DIR):
                print(f"*** compiled the P4 program into {BUILD_DIR}")
        net = Mininet(build=False, controller=None, link=QuietTCLink, autoSetMacs=False)
        self.net = net
        cls = BMv2Switch if self.target == "bmv2" else ModelSwitch
        for s in self.topo.switches.values():
            net.addSwitch(s.name, cls=cls, device_id=s.index,
                          grpc_port=GRPC_PORT_BASE + s.index, run_dir=self.run_dir,
                          pcap=self.pcap, log=self.log)
        for h in self.topo.hosts.values():
            net.addHost(h.name, ip=f"{h.ip}/8", mac=h.mac)
        for h in self.topo.hosts.values():
            net.addLink(h.name, h.rack, port2=h.port, **_shape(h.link))
        for u in self.topo.uplinks:  # every switch link: all of a ToR's spines, the cores
            net.addLink(u.lower, u.upper, port1=u.lower_port, port2=u.upper_port,
                        **_shape(u.link))
        net.build()
        if P.LINK_MTU != P.ETHERNET_MTU:
            self._set_mtu(P.LINK_MTU)
        # A loss rule left by an earlier run would hook onto these interfaces' names.
        stale = link_loss.remove_root_tables(self._root_interfaces())
        if stale:
            print(f"*** removed loss rules left by an earlier run: {', '.join(stale)}")
        net.start()
        for h in self.topo.hosts.values():
            self._set_up_host(net.get(h.name), self.topo.switches[h.rack])
        net.staticArp()
        self._apply_link_params()

    def _set_mtu(self, mtu: int) -> None:
        """Every link's both ends (hosts and switch ports) to `mtu`: K's packets need jumbo
        frames (passing.protocol.LINK_MTU), set before the switches open their ports."""
        for link in self.net.links:
            for intf in (link.intf1, link.intf2):
                out = intf.node.cmd(f"ip link set dev {intf.name} mtu {mtu}")
                if out.strip():
                    raise RuntimeError(f"{intf.name}: MTU {mtu} refused: {out.strip()}")
        print(f"*** K={P.K}: every link's MTU is {mtu} (jumbo frames)")

    def pipelines_loaded(self) -> None:
        """What a switch can be told only once it runs the controller's pipeline: BMv2's
        egress queue depth (BMv2Switch.deepen_egress_queues)."""
        for sw in self.net.switches:
            if isinstance(sw, BMv2Switch):
                sw.deepen_egress_queues()

    @staticmethod
    def _set_up_host(node: Node, tor: Switch) -> None:
        node.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
        # An ordinary flow on the aggregation port would be dropped by the switches' guard
        # (only switches send from 48879): keep it out of the ephemeral range.
        node.cmd(f"sysctl -qw net.ipv4.ip_local_reserved_ports={P.PASSING_UDP_PORT}")
        # Checksums left to the NIC (veth) would leave the host unfinished: a software
        # switch forwards the frame as it is and the receiver drops ordinary TCP/UDP.
        node.cmd(f"ethtool -K {node.defaultIntf().name} tx off rx off")
        node.setARP(tor.ip, tor.mac)  # switches do not answer ARP

    def _apply_link_params(self) -> None:
        """Loss from the topology file (bandwidth is Mininet's TCLink). Delay needs netem,
        which this kernel lacks: said once, not silently dropped."""
        for a, b, params in self.links():
            if params.loss:
                self.set_loss(a, b, params.loss)
            if params.delay:
                print(f"*** warning: link {a}-{b}: delay {params.delay} not applied "
                      "(no netem on this kernel)")

    def stop(self) -> None:
        if self.net is not None:
            names = self._root_interfaces()
            self.net.stop()
            self.net = None
            link_loss.remove_root_tables(names)

    def _switch_port_names(self) -> list[str]:
        """The names Mininet will give the switches' ports (`<switch>-eth<port>`), all in the
        root namespace. A run killed before its stop leaves the switch-to-switch ones there
        (a host's end dies with its namespace, taking its pair along; two switch ends keep
        each other), and Mininet then refuses the link: "RTNETLINK answers: File exists"."""
        return [f"{h.rack}-eth{h.port}" for h in self.topo.hosts.values()] + \
            [f"{n}-eth{p}" for u in self.topo.uplinks
             for n, p in ((u.lower, u.lower_port), (u.upper, u.upper_port))]

    def _root_interfaces(self) -> list[str]:
        """The switches' interfaces: those in the root namespace."""
        return [intf.name for sw in self.net.switches for intf in sw.intfList()
                if intf.name != "lo"]

    def links(self) -> list[tuple[str, str, LinkParams]]:
        """Every link of the topology as (node, node, its link parameters): hosts to their
        ToR, then the switch links, lower end first (ToRs to spines, spines to cores)."""
        return _links(self.topo)

    def _link(self, a: str, b: str) -> Link:
        link = next((ln for ln in self.net.links
                     if {ln.intf1.node.name, ln.intf2.node.name} == {a, b}), None)
        if link is None:
            raise ValueError(f"no link between {a} and {b}")
        return link

    def set_loss(self, a: str, b: str, percent: float) -> None:
        """Random loss on the link between nodes a and b, both directions (nftables; this
        kernel has no netem)."""
        link = self._link(a, b)
        for intf in (link.intf1, link.intf2):
            link_loss.set_loss(intf, percent, self.run_dir)

    def udp_segments(self, host: str) -> int:
        """Datagrams per message for `host`'s agent at its link's current rate: about a
        millisecond of the link (host_agent.transport.segments_for_link), so that no message
        leaves the emulated link faster than TCP's own segmentation lets the baselines'."""
        return segments_for_link(self.topo.hosts[host].link.bw or 0)

    def set_link_rates(self, topo: Topology) -> None:
        """Shape every running link to its rate in `topo`, the running topology with other
        link rates (the same switches, hosts, GPUs and links), and take `topo` as the running
        one: what the network reports from now on (link use per call) uses those rates."""
        if _wiring(topo) != _wiring(self.topo):
            raise ValueError(f"{topo.name}: not the running topology {self.topo.name} with "
                             "other link rates")
        for a, b, params in _links(topo):
            link = self._link(a, b)
            for intf in (link.intf1, link.intf2):
                link_rate.set_rate(intf, params.bw)
        self.topo = topo


def _links(topo: Topology) -> list[tuple[str, str, LinkParams]]:
    return [(h.name, h.rack, h.link) for h in topo.hosts.values()] + \
        [(u.lower, u.upper, u.link) for u in topo.uplinks]


def _shape(link: LinkParams) -> dict:
    return {"bw": link.bw} if link.bw else {}


def _wiring(topo: Topology) -> tuple:
    """A topology less its link rates: what set_link_rates may not change."""
    return (sorted((s.name, s.index, s.role, s.ip, s.mac) for s in topo.switches.values()),
            sorted((h.name, h.rack, h.port, h.gpus, h.ip, h.mac, h.link.delay, h.link.loss)
                   for h in topo.hosts.values()),
            sorted((u.lower, u.upper, u.lower_port, u.upper_port, u.link.delay, u.link.loss)
                   for u in topo.uplinks))
