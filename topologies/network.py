"""A topology file brought to life: Mininet hosts and links, PASSING switches (BMv2 or the
model), the controller programming them, a management network with the controller's parameter
service on it, jobs, all-reduces run by agents on the hosts, and PyTorch training run by torchrun
on the hosts."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from mininet.net import Mininet

from bench.agent.options import IDLE_GRACE_S, RunOptions, command_budget_s
from bench.workloads import DEFAULT_MODEL
from controller.core import Controller, Endpoint
from controller.job_plan import JobSpec
from controller.topology import LinkParams, Topology
from host_agent.transport import SEGMENTS_ENV, segments_for_link
from passing import p4build
from passing import protocol as P
from passing.contract import JobParams
from passing.pipeline_files import BUILD_DIR, CHECKOUT
from topologies import link_loss, link_rate, training
from topologies.agent_servers import AgentServers
from topologies.exclusive import NetworkLock
from topologies.management import MGMT_SUBNET, ManagementNetwork, ParamsService
from topologies.mininet_nodes import (
    GRPC_PORT_BASE,
    BMv2Switch,
    ModelSwitch,
    QuietTCLink,
    pick_target,
)

INA_JOB_OFFSET = 1000  # job id of a job's switch-only INA companion: 1000 + id
# Slots per switch of a job made here without a window (the default job of `make
# run-topology`, the sweep's jobs), per target. A window must cover a slot's round trip
# through the switches, not only the links. The model (leafspine, 2 cores, 2026-12-01): 16 MiB
# at 20 Mbit/s took 10.0-10.2 s with 64 slots (host links 70-75% busy), 8.8-9.2 s with 128,
# 8.3-8.6 s with 256 (85-91%), 8.0 s with 512; 4 MiB as shipped 1.61-2.05 s, 1.44-1.67 s and
# 1.35-1.64 s with 64, 128 and 256. BMv2 drops a wider window's burst (its egress queues hold
# 64 packets): as shipped, 256K values, 64 slots 2.9 s and 0.2-0.4% resent, 256 slots 3.4-3.7 s
# and 10-11% (2.2-2.5% and still slower with queues of 1024). A call that agrees on its scale
# first uses only the slots it needs (passing.protocol.slots_used), so smaller calls pay no
# more exponent packets than with 64; one that speculates sends none and uses up to the whole
# window, so on BMv2 a window over 64 bursts in every call of more than 64 fragments.
# docs/benchmarks.md, "Window".
DEFAULT_WINDOWS = {"model": 256, "bmv2": 64}


def link_bytes_per_call(report: dict, delta: tuple[int, int], calls: int
                        ) -> tuple[float, float]:
    """(tx, rx) bytes a host link carried per timed call: as the host's agent counted them
    around its timed calls (bench.agent.worker), else the counters' `delta` over all `calls`,
    warm-ups included (an agent that failed, or could not read its interface)."""
    if "timed_tx_bytes" in report:
        return report["timed_tx_bytes"], report["timed_rx_bytes"]
    return delta[0] / calls, delta[1] / calls


class PassingNetwork:
    def __init__(self, topo: Topology, topo_file: Path, target: str, run_dir: Path,
                 pcap: bool = False, log: bool = False, mgmt_subnet: str = MGMT_SUBNET):
        self.topo = topo
        self.topo_file = Path(topo_file).resolve()
        self.target, self.target_reason = pick_target(target)
        self.run_dir = Path(run_dir).resolve()
        self.pcap = pcap
        self.log = log
        self.net: Mininet | None = None
        self.ctl: Controller | None = None
        self.jobs: dict[int, Path] = {}
        self.mgmt = ManagementNetwork(mgmt_subnet)
        self.params_service: ParamsService | None = None
        self._training: dict[str, training.HostRun] = {}  # host -> its run, while one runs
        self._training_lock = threading.Lock()
        self._runs = itertools.count(1)
        self.agents = AgentServers(lambda h: self.net.get(h), self.run_dir / "agents")
        self._lock = NetworkLock()

    @property
    def controller_url(self) -> str | None:
        """The controller's parameter service on the management network (http://IP:PORT;
        GET /v1/jobs/<id>), reachable from every host; None before start()."""
        return self.params_service.url if self.params_service else None

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Mininet, switches, management network, controller and its parameter service. On a
        failure, whatever was started is stopped again before the error is raised. Another
        PASSING network on this machine: NetworkBusy, before anything is touched (its bridge
        and ports would be this one's)."""
        self._lock.acquire()
        try:
            self._start()
        except BaseException:
            try:
                self.stop()
            except Exception as e:  # noqa: BLE001 - the start's error is the one to see
                print(f"*** while stopping after a failed start: {e}", file=sys.stderr)
            raise

    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
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
            net.addHost(h.name, ip=f"{h.ip}/16", mac=h.mac)
        for h in self.topo.hosts.values():
            net.addLink(h.name, h.rack, port2=h.port, **_shape(h.link))
        for u in self.topo.uplinks:
            net.addLink(u.tor, u.spine, port1=u.tor_port, port2=u.spine_port, **_shape(u.link))
        net.build()
        # A loss rule left by an earlier run would hook onto these interfaces' names.
        stale = link_loss.remove_root_tables(self._root_interfaces())
        if stale:
            print(f"*** removed loss rules left by an earlier run: {', '.join(stale)}")
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
        self.mgmt.start([net.get(h) for h in self.topo.hosts])
        self.ctl = self._controller()
        # The run directory's job table may hold jobs of an earlier run: the fresh switches
        # get them back (prepare, then re-install what is missing).
        self.ctl.reconcile()
        # Its own Controller of the same state file: it outlives restart_controller().
        self.params_service = ParamsService(self._controller(), self.mgmt.address,
                                            self.run_dir / "params-service.log")
        self.params_service.start()

    def _apply_link_params(self) -> None:
        """Loss from the topology file (bandwidth is Mininet's TCLink). Delay needs netem,
        which this kernel lacks: said once, not silently dropped."""
        for a, b, params in self.links():
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
        """Stop everything start() started (also after a failed start; idempotent). A network
        that never started (another one held the machine) touches nothing: the bridge and
        interfaces of that name are the other network's."""
        if not self._lock.held:
            return
        steps = [self.agents.stop, self._stop_training, self._stop_params_service,
                 self._stop_controller, self.mgmt.stop, self._stop_mininet, self._lock.release]
        error = None
        for step in steps:
            try:
                step()
            except Exception as e:  # noqa: BLE001 - the rest must still be stopped
                error = error or e
        if error is not None:
            raise error

    def _stop_training(self) -> None:
        with self._training_lock:
            runs = list(self._training.values())
        for run in runs:
            run.killed = run.killed or "killed: the network was stopped"
            training.kill_tagged(run.tag)

    def _stop_params_service(self) -> None:
        if self.params_service is not None:
            self.params_service.stop()
            self.params_service = None

    def _stop_controller(self) -> None:
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None

    def _stop_mininet(self) -> None:
        if self.net is not None:
            names = self._root_interfaces()
            self.net.stop()
            self.net = None
            link_loss.remove_root_tables(names)

    def _root_interfaces(self) -> list[str]:
        """The switches' interfaces: those in the root namespace."""
        return [intf.name for sw in self.net.switches for intf in sw.intfList()
                if intf.name != "lo"]

    # -- jobs and traffic ---------------------------------------------------------------------
    def create_job(self, job_id: int, hosts: list[str] | None = None,
                   window: int | None = None,
                   mode: str = "passing") -> Path:
        """Job `job_id` over `hosts` (default every host) with `window` slots per switch
        (default DEFAULT_WINDOWS[target]), made unless the controller has it already; the
        path of its agent parameters."""
        window = DEFAULT_WINDOWS[self.target] if window is None else window
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
                  train_steps: int = 0, train_model: str = DEFAULT_MODEL,
                  eval_every: int = 0, warmup: int = 1,
                  rendezvous_timeout: float = 60.0) -> dict[str, dict]:
        """Run passing-agent on every host of the job at once; their JSON reports. Baseline
        strategies run over the same hosts and links: ring, hier-ring and ps without the
        switch's aggregation (their traffic is ordinary L2 forwarding), ina through the
        switch with every GPU rank streaming (on the job's INA companion, see ina_companion).
        Each host makes `warmup` untimed calls, then `iters` timed ones, and checks every
        one. With train_steps the agents train the MLP `train_model` instead (passing-agent
        --train --model, accuracy every `eval_every` steps). `rendezvous_timeout`: how long
        the hosts' TCP meetings (session, process groups, the first start line) may take;
        under heavy loss on every link TCP's backoff alone can take a minute."""
        job_id = job_id if job_id is not None else min(self.jobs)
        params = self.jobs.get(job_id) or self.create_job(job_id)
        job = JobParams.load(params)
        if strategy == "ina" and job.mode != "ina":
            params = self.ina_companion(job_id)
            job = JobParams.load(params)
        hosts = job.host_names
        before = {h: self.host_link_bytes(h) for h in hosts}
        # Each host's agent stays up between calls (topologies/agent_servers.py).
        commands = {h: ["--params", str(params), "--host", h, "--size", size,
                        "--iters", str(iters), "--warmup", str(warmup), "--json",
                        "--timeout", str(timeout), "--strategy", strategy,
                        "--ifname", self.net.get(h).defaultIntf().name,
                        "--train", str(train_steps), "--model", train_model,
                        "--eval-every", str(eval_every),
                        "--rendezvous-timeout", str(rendezvous_timeout),
                        "--udp-segments", str(self.udp_segments(h))] for h in hosts}
        # A hung agent (e.g. a baseline's rendezvous) must not hang the caller; the agent's
        # own bound, and its ranks' tear-down, come first, with a clearer error.
        opts = RunOptions(iters=iters, warmup=warmup, timeout=timeout, train_steps=train_steps,
                          model=train_model, rendezvous_timeout=rendezvous_timeout)
        out = self.agents.run(commands, command_budget_s(opts) + IDLE_GRACE_S + 20)
        if not train_steps:
            for h in hosts:
                self._link_use(out[h], h, before[h], iters + warmup)
        return out

    def host_link_bytes(self, host: str) -> tuple[int, int]:
        """(tx, rx) bytes of the host's data interface so far, read in its namespace."""
        node = self.net.get(host)
        intf = node.defaultIntf().name
        tx, rx = node.cmd(f"cat /sys/class/net/{intf}/statistics/tx_bytes "
                          f"/sys/class/net/{intf}/statistics/rx_bytes").split()
        return int(tx), int(rx)

    def _link_use(self, report: dict, host: str, before: tuple[int, int], calls: int) -> None:
        """Add to an agent's report the bytes its host link carried per timed call (as the
        agent counted them around its timed calls; else the counters' delta over all `calls`,
        warm-ups included) and, for a shaped link, how busy the link was during a call: far
        below 1, the CPU, not the emulated link, set the time (README, "Running a
        topology")."""
        if not report.get("ok") or not report.get("mean_s"):
            return
        delta = tuple(b - a for a, b in zip(before, self.host_link_bytes(host), strict=True))
        per_call = max(link_bytes_per_call(report, delta, calls))
        report["link_bytes_per_call"] = per_call
        bw = self.topo.hosts[host].link.bw
        report["link_mbps"] = bw or 0
        if bw:
            report["link_busy"] = link_rate.busy(per_call, report["mean_s"], bw)

    def train(self, job_id: int | None = None, backend: str = "passing",
              nproc_per_node: int | None = None, script: str | Path | None = None,
              args: tuple[str, ...] | list[str] = (), timeout: float = 300.0,
              hosts: list[str] | None = None, env: dict[str, str] | None = None,
              after_failure: float = 60.0) -> dict[str, dict]:
        """Data-parallel PyTorch training on every host of the job: torchrun on each (node rank
        = the host's position in the job, local ranks = its GPUs in the topology, or
        nproc_per_node), rendezvous on the first host's data address, gloo over the data
        interfaces; the ranks get PASSING_JOB, PASSING_CONTROLLER (the parameter service on
        the management network) and PASSING_HOST. Runs `script --backend BACKEND --json
        *args` (default: the checkout's examples/train_ddp.py).

        Returns {host: {"ok", "error", "exit_code", "killed", "ranks": [each rank's JSON
        report, or {"ok": False, "rank", "local_rank", "error"}], "log_dir", ...}}. Never
        hangs: after `timeout` seconds every process still running is killed and its ranks
        reported as failed, and so is every host still running `after_failure` seconds after
        another host's torchrun failed (its ranks should have failed too: a host that never
        started leaves the others waiting in the rendezvous). `hosts` runs on those hosts
        instead of the job's (the job need not exist: its ranks then fail as the backend
        says); `env` adds environment variables (e.g. PASSING_TIMEOUT)."""
        if self.net is None:
            raise RuntimeError("the network is not started")
        job_id = job_id if job_id is not None else self._first_job()
        hosts = list(hosts) if hosts else self._job_hosts(job_id)
        unknown = [h for h in hosts if h not in self.topo.hosts]
        if unknown:
            raise ValueError(f"hosts not in the topology: {', '.join(unknown)}")
        if nproc_per_node is not None and nproc_per_node < 1:
            raise ValueError(f"nproc_per_node {nproc_per_node}: at least 1")
        script = Path(script) if script else self._default_script()
        if not script.is_file():
            raise FileNotFoundError(f"training script {script} not found")
        nprocs = [nproc_per_node or self.topo.hosts[h].gpus for h in hosts]
        base = self.run_dir / "train" / f"job{job_id}"
        n = next(self._runs)
        runs = {h: training.HostRun(h, i, nprocs[i], sum(nprocs[:i]), base / h,
                                    tag=f"{os.getpid()}-{n}-{job_id}-{h}")
                for i, h in enumerate(hosts)}
        with self._training_lock:
            busy = set(runs) & set(self._training)
            if busy:
                raise RuntimeError(f"hosts {', '.join(sorted(busy))} are already training")
            self._training.update(runs)
        try:
            shutil.rmtree(base, ignore_errors=True)  # the previous run's logs of this job
            script_args = ["--backend", backend, "--json", *map(str, args)]
            for run in runs.values():
                run.log_dir.mkdir(parents=True)
                self._start_torchrun(run, job_id, hosts, script, script_args, env or {})
            self._wait_training(runs, timeout, after_failure)
        finally:
            for r in runs.values():
                training.kill_tagged(r.tag)  # workers a dead torchrun left behind
                if r.proc is not None:
                    r.proc.wait()
            with self._training_lock:
                for h in runs:
                    self._training.pop(h, None)
        return {h: training.collect(r) for h, r in runs.items()}

    def _start_torchrun(self, run: training.HostRun, job_id: int, hosts: list[str],
                        script: Path, script_args: list[str], extra_env: dict) -> None:
        node = self.net.get(run.host)
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               SEGMENTS_ENV: str(self.udp_segments(run.host)),
               **extra_env,
               training.TAG_VAR: run.tag, "PASSING_JOB": str(job_id),
               "PASSING_CONTROLLER": self.controller_url, "PASSING_HOST": run.host,
               # gloo (the baseline, and the passing backend's in-host stage and delegated
               # collectives) between the hosts over the data plane
               "GLOO_SOCKET_IFNAME": node.defaultIntf().name}
        argv = training.torchrun_argv(sys.executable, run, len(hosts),
                                      self.topo.hosts[hosts[0]].ip,
                                      training.master_port(job_id), script, script_args)
        # mnexec -d makes torchrun a session leader (start_new_session here would make
        # mnexec fork and return at once).
        with open(run.log_dir / "torchrun.log", "wb") as log:
            run.proc = node.popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, env=env)

    @staticmethod
    def _wait_training(runs: dict[str, training.HostRun], timeout: float,
                       after_failure: float) -> None:
        deadline = time.monotonic() + timeout
        failed_at, failed = None, None
        while any(r.proc.poll() is None for r in runs.values()):
            now = time.monotonic()
            if failed_at is None:
                failed = next((h for h, r in runs.items() if r.proc.poll() not in (None, 0)),
                              None)
                failed_at = now if failed else None
            why = None
            if now > deadline:
                why = f"killed: no result within {timeout:g}s"
            elif failed_at is not None and now - failed_at > after_failure:
                why = (f"killed: still running {after_failure:g}s after {failed}'s torchrun "
                       "failed")
            if why:
                for r in runs.values():
                    if r.proc.poll() is None:
                        r.killed = r.killed or why
                        training.kill_tagged(r.tag)
                return
            time.sleep(0.2)

    def kill_training(self, host: str) -> bool:
        """Kill every process of `host`'s running training (torchrun and its ranks), as a host
        failing mid-training would; False when it has none."""
        with self._training_lock:
            run = self._training.get(host)
        if run is None:
            return False
        run.killed = "killed: host failure (kill_training)"
        training.kill_tagged(run.tag)
        return True

    def _first_job(self) -> int:
        ids = list(self.jobs) or [j.job_id for j in self.ctl.store.jobs()]
        if not ids:
            raise ValueError("no job yet: create one (create_job, or passing-ctl job create)")
        return min(ids)

    def _job_hosts(self, job_id: int) -> list[str]:
        rec = self.ctl.store.get_job(job_id)
        if rec is None:
            known = ", ".join(str(j.job_id) for j in self.ctl.store.jobs()) or "none"
            raise ValueError(f"no job {job_id} (jobs: {known}); create it first, or name the "
                             "hosts to run on")
        return list(rec.spec["hosts"])

    @staticmethod
    def _default_script() -> Path:
        script = CHECKOUT / "examples" / "train_ddp.py" if CHECKOUT else None
        if script is None or not script.is_file():
            raise FileNotFoundError(
                "no training script: the default is examples/train_ddp.py of a source checkout"
                f"{f' ({script} is missing)' if script else ' (this is an installed wheel)'}; "
                "pass one (train(script=PATH), or train --script PATH in the CLI)")
        return script

    def links(self) -> list[tuple[str, str, LinkParams]]:
        """Every link of the topology as (node, node, its link parameters): hosts to their
        ToR, then ToRs to their spine."""
        return _links(self.topo)

    def _link(self, a: str, b: str):
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
        [(u.tor, u.spine, u.link) for u in topo.uplinks]


def _shape(link) -> dict:
    return {"bw": link.bw} if link.bw else {}


def _wiring(topo: Topology) -> tuple:
    """A topology less its link rates: what set_link_rates may not change."""
    return (sorted((s.name, s.index, s.role, s.ip, s.mac) for s in topo.switches.values()),
            sorted((h.name, h.rack, h.port, h.gpus, h.ip, h.mac, h.link.delay, h.link.loss)
                   for h in topo.hosts.values()),
            sorted((u.tor, u.spine, u.tor_port, u.spine_port, u.link.delay, u.link.loss)
                   for u in topo.uplinks))
