"""A topology file brought to life: Mininet hosts and links, PASSING switches (BMv2 or the
model), the controller programming them, a management network with the controller's parameter
service on it, jobs, all-reduces run by agents on the hosts, and PyTorch training run by torchrun
on the hosts.

PassingNetwork starts and stops these parts, in order, on one machine at a time; each part's
work is its own class: topologies/mininet_fabric.py (hosts, switches, links),
topologies/control_plane.py (controller, parameter service, jobs), topologies/allreduce_runs.py
(agents' all-reduces, link accounting), topologies/training_runs.py (torchrun training)."""

from __future__ import annotations

import sys
from pathlib import Path

from mininet.net import Mininet

from controller.core import Controller
from controller.topology import LinkParams, Topology
from passing_agent.workloads import DEFAULT_MODEL
from topologies.agent_servers import AgentServers
from topologies.allreduce_runs import AllreduceRuns, link_bytes_per_call
from topologies.control_plane import DEFAULT_WINDOWS, INA_JOB_OFFSET, ControlPlane
from topologies.exclusive import NetworkLock
from topologies.management import MGMT_SUBNET, ManagementNetwork, ParamsService
from topologies.mininet_fabric import MininetFabric
from topologies.mininet_nodes import pick_target
from topologies.training_runs import TrainingRuns

__all__ = ["DEFAULT_WINDOWS", "INA_JOB_OFFSET", "PassingNetwork", "link_bytes_per_call"]


class PassingNetwork:
    def __init__(self, topo: Topology, topo_file: Path, target: str, run_dir: Path,
                 pcap: bool = False, log: bool = False, mgmt_subnet: str = MGMT_SUBNET):
        self.topo_file = Path(topo_file).resolve()
        self.target, self.target_reason = pick_target(target)
        self.run_dir = Path(run_dir).resolve()
        self.pcap = pcap
        self.log = log
        self.fabric = MininetFabric(topo, self.target, self.run_dir, pcap, log)
        self.mgmt = ManagementNetwork(mgmt_subnet)
        self.control = ControlPlane(self.fabric, self.topo_file, self.run_dir)
        self.agents = AgentServers(self.fabric.node, self.run_dir / "agents")
        self.allreduce_runs = AllreduceRuns(self.fabric, self.control, self.agents)
        self.training_runs = TrainingRuns(self.fabric, self.control, self.run_dir)
        self._lock = NetworkLock()

    @property
    def topo(self) -> Topology:
        """The running topology (set_link_rates changes its link rates)."""
        return self.fabric.topo

    @property
    def net(self) -> Mininet | None:
        return self.fabric.net

    @property
    def ctl(self) -> Controller | None:
        return self.control.ctl

    @property
    def params_service(self) -> ParamsService | None:
        return self.control.params_service

    @property
    def jobs(self) -> dict[int, Path]:
        """Job id -> the path of its agent parameters, of the jobs made here."""
        return self.control.jobs

    @property
    def controller_url(self) -> str | None:
        """The controller's parameter service on the management network (http://IP:PORT;
        GET /v1/jobs/<id>), reachable from every host; None before start()."""
        return self.control.controller_url

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Mininet, switches, management network, controller and its parameter service. On a
        failure, whatever was started is stopped again before the error is raised. Another
        PASSING network on this machine: NetworkBusy, before anything is touched (its bridge
        and ports would be this one's)."""
        self._lock.acquire()
        try:
            self.fabric.start()
            self.mgmt.start([self.fabric.node(h) for h in self.topo.hosts])
            self.control.start(self.mgmt.address)
            self.fabric.pipelines_loaded()
        except BaseException:
            try:
                self.stop()
            except Exception as e:  # noqa: BLE001 - the start's error is the one to see
                print(f"*** while stopping after a failed start: {e}", file=sys.stderr)
            raise

    def stop(self) -> None:
        """Stop everything start() started (also after a failed start; idempotent). A network
        that never started (another one held the machine) touches nothing: the bridge and
        interfaces of that name are the other network's."""
        if not self._lock.held:
            return
        steps = [self.agents.stop, self.training_runs.stop, self.control.stop_params_service,
                 self.control.stop_controller, self.mgmt.stop, self.fabric.stop,
                 self._lock.release]
        error = None
        for step in steps:
            try:
                step()
            except Exception as e:  # noqa: BLE001 - the rest must still be stopped
                error = error or e
        if error is not None:
            raise error

    def config_file(self) -> Path:
        """The controller configuration of this run (for passing-ctl --config)."""
        return self.control.config_file()

    def restart_controller(self) -> None:
        self.control.restart_controller()

    # -- jobs and traffic ---------------------------------------------------------------------
    def create_job(self, job_id: int, hosts: list[str] | None = None,
                   window: int | None = None, mode: str = "passing") -> Path:
        """ControlPlane.create_job: job `job_id` over `hosts` (default every host), made unless
        the controller has it already; the path of its agent parameters."""
        return self.control.create_job(job_id, hosts, window, mode)

    def ina_companion(self, job_id: int) -> Path:
        """ControlPlane.ina_companion: the job's switch-only INA companion's parameters."""
        return self.control.ina_companion(job_id)

    def allreduce(self, size: str = "1M", job_id: int | None = None, iters: int = 2,
                  timeout: float = 20.0, strategy: str = "passing",
                  train_steps: int = 0, train_model: str = DEFAULT_MODEL,
                  eval_every: int = 0, warmup: int = 1,
                  rendezvous_timeout: float = 60.0) -> dict[str, dict]:
        """AllreduceRuns.allreduce: passing-agent on every host of the job (default the first
        made here) at once; their JSON reports."""
        return self.allreduce_runs.allreduce(size, job_id, iters, timeout, strategy,
                                             train_steps, train_model, eval_every, warmup,
                                             rendezvous_timeout)

    def host_link_bytes(self, host: str) -> tuple[int, int]:
        """(tx, rx) bytes of the host's data interface so far, read in its namespace."""
        return self.allreduce_runs.host_link_bytes(host)

    def train(self, job_id: int | None = None, backend: str = "passing",
              nproc_per_node: int | None = None, script: str | Path | None = None,
              args: tuple[str, ...] | list[str] = (), timeout: float = 300.0,
              hosts: list[str] | None = None, env: dict[str, str] | None = None,
              after_failure: float = 60.0) -> dict[str, dict]:
        """TrainingRuns.train: torchrun on every host of the job running `script` (default
        examples/train_ddp.py); {host: its result, with each rank's}."""
        return self.training_runs.train(job_id, backend, nproc_per_node, script, args,
                                        timeout, hosts, env, after_failure)

    def kill_training(self, host: str) -> bool:
        """Kill every process of `host`'s running training (torchrun and its ranks), as a host
        failing mid-training would; False when it has none."""
        return self.training_runs.kill_training(host)

    # -- links --------------------------------------------------------------------------------
    def links(self) -> list[tuple[str, str, LinkParams]]:
        """Every link of the topology as (node, node, its link parameters): hosts to their
        ToR, then the switch links, lower end first."""
        return self.fabric.links()

    def set_loss(self, a: str, b: str, percent: float) -> None:
        """Random loss on the link between nodes a and b, both directions."""
        self.fabric.set_loss(a, b, percent)

    def udp_segments(self, host: str) -> int:
        """Datagrams per message for `host`'s agent at its link's current rate."""
        return self.fabric.udp_segments(host)

    def set_link_rates(self, topo: Topology) -> None:
        """MininetFabric.set_link_rates: every running link shaped to its rate in `topo`, the
        running topology with other link rates, which becomes the running one."""
        self.fabric.set_link_rates(topo)
