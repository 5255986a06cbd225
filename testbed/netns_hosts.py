"""Hosts as network namespaces on the test ports of a Fabric: the agents then run as real
processes with real UDP sockets, their packets crossing veth links into the switch process.

Each host gets the topology's MAC and IPv4 address and a static ARP entry for its switch's
aggregation address (switches do not answer ARP). Random loss on a host's link, in both
directions, is an nftables rule in the host's namespace (this kernel has no netem).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence

from controller.topology import Topology
from testbed.fabric import Fabric


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", "netns", "exec", ns, *args] if ns else list(args)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class NetnsHosts:
    def __init__(self, fabric: Fabric, topo: Topology):
        self.fabric = fabric
        self.topo = topo
        self.ns: dict[str, str] = {}
        tag = f"{os.getpid() % 10000}"
        try:
            for name, h in topo.hosts.items():
                port = fabric[h.rack].test_ports.pop(h.port)
                port.close()  # the interface moves into the namespace: the test stops using it
                ifname = port.ifname
                ns = f"pas{tag}{name}"
                _ip("ip", "netns", "add", ns)
                self.ns[name] = ns
                _ip("ip", "link", "set", ifname, "netns", ns)
                _ip("ip", "link", "set", ifname, "name", "eth0", ns=ns)
                _ip("ip", "link", "set", "eth0", "address", h.mac, ns=ns)
                _ip("ip", "addr", "add", f"{h.ip}/8", "dev", "eth0", ns=ns)
                _ip("ip", "link", "set", "eth0", "up", ns=ns)
                # Checksums must be complete on the wire: a software switch forwards frames
                # as they are, and veth would otherwise leave them to a NIC that is not there.
                _ip("ethtool", "-K", "eth0", "tx", "off", "rx", "off", ns=ns)
                _ip("ip", "link", "set", "lo", "up", ns=ns)
                s = topo.switches[h.rack]
                _ip("ip", "neigh", "replace", s.ip, "lladdr", s.mac, "dev", "eth0", ns=ns)
        except BaseException:
            self.close()
            raise

    def set_loss(self, percent: float) -> None:
        """Drop `percent` % of the UDP packets leaving and arriving at every host on its link
        (eth0), and count them: `dropped()`."""
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "exec", ns, "nft", "flush", "ruleset"], check=True)
            if percent <= 0:
                continue
            p = int(round(percent * 100))
            rules = "table inet loss {\n" + "".join(
                f"  chain {hook} {{\n    type filter hook {hook} priority 0;\n"
                f"    {way} \"eth0\" meta l4proto udp numgen random mod 10000 < {p} "
                f"counter drop\n  }}\n"
                for hook, way in (("input", "iifname"), ("output", "oifname"))) + "}\n"
            subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules,
                           text=True, check=True)

    def dropped(self) -> int:
        """UDP packets the loss rules have dropped, all hosts and both directions together
        (0 with no loss set): a test that asks for recovery must know there was loss."""
        total = 0
        for ns in self.ns.values():
            out = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "ruleset"],
                                 check=True, capture_output=True, text=True).stdout
            total += sum(int(n) for n in re.findall(r"counter packets (\d+)", out))
        return total

    def popen(self, host: str, cmd: Sequence[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.ns[host], *cmd], **kw)

    def close(self) -> None:
        for ns in self.ns.values():
            # Deleting the namespace deletes its end of the veth, and so the pair.
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        self.ns.clear()

