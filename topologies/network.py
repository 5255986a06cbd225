"""A topology file brought to life: Mininet hosts and links, PASSING switches (BMv2 or the
model), the controller programming them, jobs, and all-reduces run by agents on the hosts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mininet.link import TCLink
from mininet.net import Mininet

from controller.core import Controller, Endpoint
from controller.job_plan import JobSpec
from controller.topology import Topology
from passing import p4build
from passing import protocol as P
from passing.contract import JobParams
from passing.pipeline_files import BUILD_DIR
from topologies.mininet_nodes import GRPC_PORT_BASE, BMv2Switch, ModelSwitch, pick_target

INA_JOB_OFFSET = 1000  # job id of a job's switch-only INA companion: 1000 + id


class PassingNetwork:
    def __init__(self, topo: Topology, topo_file: Path, target: str, run_dir: Path,
                 pcap: bool = False, log: bool = False):
        self.topo = topo
        self.topo_file = Path(topo_file).resolve()
        self.target, self.target_reason = pick_target(target)
        self.run_dir = Path(run_dir).resolve()
        self.pcap = pcap
        self.log = log
        self.net: Mininet | None = None
        self.ctl: Controller | None = None
        self.jobs: dict[int, Path] = {}

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.target == "bmv2":
            # BMv2 starts without a program; the controller pushes this build to it.
            if p4build.build(BUILD_DIR):
                print(f"*** compiled the P4 program into {BUILD_DIR}")
        net = Mininet(build=False, controller=None, link=TCLink, autoSetMacs=False)
        self.net = net
        cls = BMv2Switch if self.target == "bmv2" else ModelSwitch
        for s in self.topo.switches.values():
            net.addSwitch(s.name, cls=cls, device_id=s.index,
                          grpc_port=GRPC_PORT_BASE + s.index, run_dir=self.run_dir,
                          pcap=self.pcap, log=self.log)
        for h in self.topo.hosts.values():
            net.addHost(h.name, ip=f"{h.ip}/16", mac=h.mac)
        for h in self.topo.hosts.values():
            net.addLink(h.name, h.rack, port2=h.port, **_shape(h.link))
        for u in self.topo.uplinks:
            net.addLink(u.tor, u.spine, port1=u.tor_port, port2=u.spine_port, **_shape(u.link))
        net.build()
        net.start()
        for h in self.topo.hosts.values():
            node = net.get(h.name)
            node.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
            # An ordinary flow on the aggregation port would be dropped by the switches' guard
            # (only switches send from 48879): keep it out of the ephemeral range.
            node.cmd(f"sysctl -qw net.ipv4.ip_local_reserved_ports={P.PASSING_UDP_PORT}")
            # Checksums left to the NIC (veth) would leave the host unfinished: a software
            # switch forwards the frame as it is and the receiver drops ordinary TCP/UDP.
            node.cmd(f"ethtool -K {node.defaultIntf().name} tx off rx off")
            tor = self.topo.switches[h.rack]
            node.setARP(tor.ip, tor.mac)  # switches do not answer ARP
        net.staticArp()
        self._apply_link_params()
        self.ctl = self._controller()
        # The run directory's job table may hold jobs of an earlier run: the fresh switches
        # get them back (prepare, then re-install what is missing).
        self.ctl.reconcile()

    def _apply_link_params(self) -> None:
        """Loss from the topology file (bandwidth is Mininet's TCLink). Delay needs netem,
        which this kernel lacks: said once, not silently dropped."""
        links = [(h.name, h.rack, h.link) for h in self.topo.hosts.values()]
        links += [(u.tor, u.spine, u.link) for u in self.topo.uplinks]
        for a, b, params in links:
            if params.loss:
                self.set_loss(a, b, params.loss)
            if params.delay:
                print(f"*** warning: link {a}-{b}: delay {params.delay} not applied "
                      "(no netem on this kernel)")

    def config_file(self) -> Path:
        """The controller configuration of this run (for passing-ctl --config)."""
        return self.run_dir / "controller.json"

    def _controller(self) -> Controller:
        cfg = {"topology": str(self.topo_file), "state": "controller.sqlite",
               "switches": {s.name: {"address": f"127.0.0.1:{GRPC_PORT_BASE + s.index}",
                                     "device_id": s.index} for s in self.topo.switches.values()}}
        self.config_file().write_text(json.dumps(cfg, indent=2) + "\n")
        endpoints = {n: Endpoint(n, v["address"], v["device_id"])
                     for n, v in cfg["switches"].items()}
        return Controller(self.topo, endpoints, self.run_dir / "controller.sqlite")

    def restart_controller(self) -> None:
        self.ctl.close()
        self.ctl = self._controller()

    def stop(self) -> None:
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self.net is not None:
            self.net.stop()
            self.net = None

    # -- jobs and traffic ---------------------------------------------------------------------
    def create_job(self, job_id: int, hosts: list[str] | None = None, window: int = 64,
                   mode: str = "passing") -> Path:
        spec = JobSpec(job_id, tuple(hosts or self.topo.hosts), window, mode=mode)
        if self.ctl.store.get_job(job_id) is None:
            self.ctl.create_job(spec)
        path = self.run_dir / f"job{job_id}.json"
        path.write_text(self.ctl.agent_params(job_id).to_json() + "\n")
        self.jobs[job_id] = path
        return path

    def ina_companion(self, job_id: int) -> Path:
        """The switch-only INA baseline needs its own job (every GPU a contributor): job
        INA_JOB_OFFSET + id over the same hosts and window, made on first use."""
        rec = self.ctl.job(job_id)
        ina_id = INA_JOB_OFFSET + job_id
        if ina_id in self.jobs:
            return self.jobs[ina_id]
        return self.create_job(ina_id, list(rec.spec["hosts"]), rec.pools[0].size, mode="ina")

    def allreduce(self, size: str = "1M", job_id: int | None = None, iters: int = 2,
                  timeout: float = 20.0, strategy: str = "passing",
                  train_steps: int = 0) -> dict[str, dict]:
        """Run passing-agent on every host of the job at once; their JSON reports. Baseline
        strategies run over the same hosts and links: ring, hier-ring and ps without the
        switch's aggregation (their traffic is ordinary L2 forwarding), ina through the
        switch with every GPU rank streaming (on the job's INA companion, see ina_companion).
        With train_steps the agents train the digits MLP instead (passing-agent --train)."""
        job_id = job_id if job_id is not None else min(self.jobs)
        params = self.jobs.get(job_id) or self.create_job(job_id)
        job = JobParams.load(params)
        if strategy == "ina" and job.mode != "ina":
            params = self.ina_companion(job_id)
            job = JobParams.load(params)
        hosts = job.host_names
        procs = {h: self.net.get(h).popen(
                    [sys.executable, "-m", "bench.agent.cli", "--params", str(params),
                     "--host", h, "--size", size, "--iters", str(iters), "--json",
                     "--timeout", str(timeout), "--strategy", strategy,
                     "--ifname", self.net.get(h).defaultIntf().name,
                     "--train", str(train_steps)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for h in hosts}
        out = {}
        for h, p in procs.items():
            try:
                # A generous bound: a hung agent (e.g. a baseline's rendezvous) must not hang
                # the caller; the agent's own deadline covers the switch.
                bound = timeout * (iters + 2) + 120 + 2 * train_steps
                stdout, stderr = p.communicate(timeout=bound)
            except subprocess.TimeoutExpired:
                for q in procs.values():
                    q.kill()
                stdout, stderr = p.communicate()
                out[h] = {"ok": False, "error": "agent did not finish (killed)"}
                continue
            try:
                out[h] = json.loads(stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                out[h] = {"ok": False, "error": (stderr or stdout).strip()[-300:]}
        return out

    def set_loss(self, a: str, b: str, percent: float) -> None:
        """Random loss on the link between nodes a and b, both directions (nftables; this
        kernel has no netem)."""
        link = next((ln for ln in self.net.links
                     if {ln.intf1.node.name, ln.intf2.node.name} == {a, b}), None)
        if link is None:
            raise ValueError(f"no link between {a} and {b}")
        for intf in (link.intf1, link.intf2):
            _nft_loss(intf, percent, self.run_dir)


def _shape(link) -> dict:
    return {"bw": link.bw} if link.bw else {}


def _nft_loss(intf, percent: float, run_dir: Path) -> None:
    """Drop `percent` % of the frames leaving `intf` (egress hook of the netdev family)."""
    table = f"loss_{intf.name.replace('-', '_')}"
    node = intf.node
    node.cmd(f"nft delete table netdev {table} 2>/dev/null")
    if percent <= 0:
        return
    rules = run_dir / f"{table}.nft"
    rules.write_text(f"table netdev {table} {{\n  chain c {{\n"
                     f"    type filter hook egress device \"{intf.name}\" priority 0;\n"
                     f"    numgen random mod 10000 < {int(round(percent * 100))} drop\n"
                     f"  }}\n}}\n")
    out = node.cmd(f"nft -f {rules}")
    if out.strip():
        raise RuntimeError(f"nft on {intf.name}: {out.strip()}")
