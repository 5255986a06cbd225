"""The management network of a Mininet topology, beside the aggregation fabric, as a real
cluster has an Ethernet management network beside its training fabric: a Linux bridge in the
root namespace with an address of its own, and one veth per Mininet host attached to it. The
hosts reach the controller's parameter service over it; nothing of it crosses the PASSING
switches (the hosts have no route between the two networks).

Names: the bridge `passing-mgmt`, its ports `pmg<i>` (host i of the topology, from 1), the
hosts' ends `<host>-mgmt`; none can clash with Mininet's (`h1-eth0`) or the test fabrics'
(`pl*`, `ps*`, `pt*`). A bridge of that name left by a crashed run is removed at start.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path

from topologies.root_links import link_exists

MGMT_BRIDGE = "passing-mgmt"
MGMT_SUBNET = "172.31.0.0/16"


class ManagementError(RuntimeError):
    """The management network could not be set up (the message says why)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and res.returncode != 0:
        raise ManagementError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


class ManagementNetwork:
    """The bridge (address: the subnet's last usable one, e.g. 172.31.255.254) and host i's
    veth (the subnet's i-th address, e.g. 172.31.0.1)."""

    def __init__(self, subnet: str = MGMT_SUBNET, bridge: str = MGMT_BRIDGE):
        self.subnet = ipaddress.ip_network(subnet)
        self.bridge = bridge
        self.address = str(self.subnet.broadcast_address - 1)
        self.hosts: dict[str, str] = {}  # host name -> its management address
        self.intfs: dict[str, str] = {}  # host name -> its interface's name in the host
        self._ports: list[str] = []  # root-side veth ends

    def _check_subnet(self) -> None:
        """Refuse a subnet the root namespace already routes elsewhere (a cloud VPC may use
        172.31/16): the hosts would reach the wrong network, or the root lose its own."""
        out = _ip("-j", "route", "show", "table", "all").stdout
        for r in json.loads(out or "[]"):
            dst, dev = r.get("dst"), r.get("dev")
            if dev == self.bridge or dst in (None, "default") or r.get("type") in (
                    "local", "broadcast", "multicast"):
                continue
            try:
                net = ipaddress.ip_network(dst, strict=False)
            except ValueError:
                continue
            if net.version == 4 and net.overlaps(self.subnet):
                raise ManagementError(
                    f"management subnet {self.subnet} overlaps {net} (dev {dev}) of this "
                    "machine: pass another one (PassingNetwork(mgmt_subnet=...))")

    def start(self, nodes: list) -> None:
        """Create the bridge and attach the Mininet hosts `nodes` (in topology order)."""
        if link_exists(self.bridge):  # left by a crashed run
            _ip("link", "del", self.bridge)
        self._check_subnet()
        if len(nodes) > self.subnet.num_addresses - 3:
            raise ManagementError(f"{len(nodes)} hosts do not fit {self.subnet}")
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, node in enumerate(nodes, start=1):
            port = f"pmg{i}"
            intf = f"{node.name}-mgmt" if len(node.name) <= 10 else "mgmt0"
            if link_exists(port):
                _ip("link", "del", port)
            _ip("link", "add", port, "type", "veth", "peer", "name", intf,
                "netns", str(node.pid))
            self._ports.append(port)
            _ip("link", "set", port, "master", self.bridge, "up")
            ip = str(self.subnet.network_address + i)
            out = node.cmd(f"ip addr add {ip}/{self.subnet.prefixlen} dev {intf} && "
                           f"ip link set {intf} up && echo ok")
            if "ok" not in out:
                raise ManagementError(f"{node.name}: {intf} {ip}: {out.strip()}")
            self.hosts[node.name] = ip
            self.intfs[node.name] = intf

    def stop(self) -> None:
        """Remove the veths and the bridge (idempotent; also after a failed start)."""
        for port in self._ports:
            if link_exists(port):
                _ip("link", "del", port, check=False)
        self._ports.clear()
        if link_exists(self.bridge):
            _ip("link", "del", self.bridge, check=False)
        self.hosts.clear()
        self.intfs.clear()


class ParamsService:
    """The controller's parameter service (controller.serve: GET /v1/jobs/<id>) on the
    management address, in a thread of this process, over its own Controller of the run's
    state file (it reads that file on every request and never connects to a switch, so it
    outlives a restart of the runner's controller). Port 7700 when free, else any."""

    PORT = 7700

    def __init__(self, ctl, host: str, log_path: Path):
        self.ctl = ctl
        self.host = host
        self.log_path = Path(log_path)
        self._log = None
        self._server = None

    @property
    def url(self) -> str | None:
        return self._server.url if self._server else None

    def start(self) -> str:
        from controller.serve import ParamsServer, ServeError
        self._log = open(self.log_path, "a")  # noqa: SIM115 - closed in stop()
        try:
            server = ParamsServer(self.ctl, self.host, self.PORT, log=self._log)
        except ServeError:
            server = ParamsServer(self.ctl, self.host, 0, log=self._log)
        self._server = server.start()
        return self._server.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self._log is not None:
            self._log.close()
            self._log = None
