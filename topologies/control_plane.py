"""The controller of a running fabric's switches, the controller's parameter service on the
management network, and the jobs made through them."""

from __future__ import annotations

import json
from pathlib import Path

from controller.core import Controller, Endpoint
from controller.job_plan import JobSpec
from topologies.management import ParamsService
from topologies.mininet_fabric import MininetFabric

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


class ControlPlane:
    """The controller of `fabric`'s switches (configured from `topo_file`; its state, job
    parameters and logs under `run_dir`), its parameter service, and the jobs made here."""

    def __init__(self, fabric: MininetFabric, topo_file: Path, run_dir: Path):
        self.fabric = fabric
        self.topo_file = topo_file
        self.run_dir = run_dir
        self.ctl: Controller | None = None
        self.params_service: ParamsService | None = None
        self.jobs: dict[int, Path] = {}  # job id -> its agent parameters, of jobs made here

    @property
    def controller_url(self) -> str | None:
        """The controller's parameter service on the management network (http://IP:PORT;
        GET /v1/jobs/<id>), reachable from every host; None before start()."""
        return self.params_service.url if self.params_service else None

    def start(self, mgmt_address: str) -> None:
        """The controller, with the switches brought up to its job table, and its parameter
        service on `mgmt_address`."""
        self.ctl = self._controller()
        # The run directory's job table may hold jobs of an earlier run: the fresh switches
        # get them back (prepare, then re-install what is missing).
        self.ctl.reconcile()
        # Its own Controller of the same state file: it outlives restart_controller().
        self.params_service = ParamsService(self._controller(), mgmt_address,
                                            self.run_dir / "params-service.log")
        self.params_service.start()

    def config_file(self) -> Path:
        """The controller configuration of this run (for passing-ctl --config)."""
        return self.run_dir / "controller.json"

    def _controller(self) -> Controller:
        addresses = self.fabric.switch_addresses()
        cfg = {"topology": str(self.topo_file), "state": "controller.sqlite",
               "switches": {name: {"address": address, "device_id": device_id}
                            for name, (address, device_id) in addresses.items()}}
        self.config_file().write_text(json.dumps(cfg, indent=2) + "\n")
        endpoints = {name: Endpoint(name, address, device_id)
                     for name, (address, device_id) in addresses.items()}
        return Controller(self.fabric.topo, endpoints, self.run_dir / "controller.sqlite")

    def restart_controller(self) -> None:
        self.ctl.close()
        self.ctl = self._controller()

    def stop_params_service(self) -> None:
        if self.params_service is not None:
            self.params_service.stop()
            self.params_service = None

    def stop_controller(self) -> None:
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None

    def create_job(self, job_id: int, hosts: list[str] | None = None,
                   window: int | None = None, mode: str = "passing") -> Path:
        """Job `job_id` over `hosts` (default every host) with `window` slots per switch
        (default DEFAULT_WINDOWS[target]), made unless the controller has it already; the
        path of its agent parameters."""
        window = DEFAULT_WINDOWS[self.fabric.target] if window is None else window
        spec = JobSpec(job_id, tuple(hosts or self.fabric.topo.hosts), window, mode=mode)
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
        # (A job waiting for slots has none yet: the window it asked for.)
        return self.create_job(ina_id, list(rec.spec["hosts"]),
                               rec.pools[0].size or rec.spec["window"], mode="ina")

    def first_job(self) -> int:
        """The lowest job id made here, else in the controller's table."""
        ids = list(self.jobs) or [j.job_id for j in self.ctl.store.jobs()]
        if not ids:
            raise ValueError("no job yet: create one (create_job, or passing-ctl job create)")
        return min(ids)

    def job_hosts(self, job_id: int) -> list[str]:
        rec = self.ctl.store.get_job(job_id)
        if rec is None:
            known = ", ".join(str(j.job_id) for j in self.ctl.store.jobs()) or "none"
            raise ValueError(f"no job {job_id} (jobs: {known}); create it first, or name the "
                             "hosts to run on")
        return list(rec.spec["hosts"])
