"""Data-parallel PyTorch training on the hosts of a running fabric: torchrun on each host,
bounded in time, and each rank's result (topologies/training.py starts and kills the
processes, topologies/train_results.py judges them)."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from host_agent.transport import SEGMENTS_ENV
from passing.pipeline_files import CHECKOUT
from topologies import training
from topologies.control_plane import ControlPlane
from topologies.mininet_fabric import MininetFabric
from topologies.train_results import collect


class TrainingRuns:
    """Training runs on `fabric`'s hosts over jobs of `control`; their logs under
    `run_dir`/train. A host trains in one run at a time."""

    def __init__(self, fabric: MininetFabric, control: ControlPlane, run_dir: Path):
        self.fabric = fabric
        self.control = control
        self.run_dir = run_dir
        self._running: dict[str, training.HostRun] = {}  # host -> its run, while one runs
        self._lock = threading.Lock()
        self._runs = itertools.count(1)

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

        Returns {host: {"ok", "error", "exit_code", "killed", "ranks": [each rank's result:
        "ok" and "exit_code" as torchrun reported them, the fields of its JSON report where
        its last stdout line is one, else that line as "output", and a failed rank's
        "error"], "log_dir", ...}} (topologies/train_results.py). Never hangs: after
        `timeout` seconds every process still running is killed and its ranks reported as
        failed, and so is every host still running `after_failure` seconds after another
        host's torchrun failed (its ranks should have failed too: a host that never started
        leaves the others waiting in the rendezvous). `hosts` runs on those hosts instead of
        the job's (the job need not exist: its ranks then fail as the backend says); `env`
        adds environment variables (e.g. PASSING_TIMEOUT)."""
        if self.fabric.net is None:
            raise RuntimeError("the network is not started")
        topo = self.fabric.topo
        job_id = job_id if job_id is not None else self.control.first_job()
        hosts = list(hosts) if hosts else self.control.job_hosts(job_id)
        unknown = [h for h in hosts if h not in topo.hosts]
        if unknown:
            raise ValueError(f"hosts not in the topology: {', '.join(unknown)}")
        if nproc_per_node is not None and nproc_per_node < 1:
            raise ValueError(f"nproc_per_node {nproc_per_node}: at least 1")
        script = Path(script) if script else default_script()
        if not script.is_file():
            raise FileNotFoundError(f"training script {script} not found")
        nprocs = [nproc_per_node or topo.hosts[h].gpus for h in hosts]
        base = self.run_dir / "train" / f"job{job_id}"
        n = next(self._runs)
        runs = {h: training.HostRun(h, i, nprocs[i], sum(nprocs[:i]), base / h,
                                    tag=f"{os.getpid()}-{n}-{job_id}-{h}")
                for i, h in enumerate(hosts)}
        with self._lock:
            busy = set(runs) & set(self._running)
            if busy:
                raise RuntimeError(f"hosts {', '.join(sorted(busy))} are already training")
            self._running.update(runs)
        try:
            shutil.rmtree(base, ignore_errors=True)  # the previous run's logs of this job
            script_args = ["--backend", backend, "--json", *map(str, args)]
            for run in runs.values():
                run.log_dir.mkdir(parents=True)
                self._start_torchrun(run, job_id, hosts, script, script_args, env or {})
            _wait(runs, timeout, after_failure)
        finally:
            for r in runs.values():
                training.kill_tagged(r.tag)  # workers a dead torchrun left behind
                if r.proc is not None:
                    r.proc.wait()
            with self._lock:
                for h in runs:
                    self._running.pop(h, None)
        return {h: collect(r) for h, r in runs.items()}

    def _start_torchrun(self, run: training.HostRun, job_id: int, hosts: list[str],
                        script: Path, script_args: list[str], extra_env: dict) -> None:
        node = self.fabric.node(run.host)
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               SEGMENTS_ENV: str(self.fabric.udp_segments(run.host)),
               **extra_env,
               training.TAG_VAR: run.tag, "PASSING_JOB": str(job_id),
               "PASSING_CONTROLLER": self.control.controller_url, "PASSING_HOST": run.host,
               # gloo (the baseline, and the passing backend's in-host stage and delegated
               # collectives) between the hosts over the data plane
               "GLOO_SOCKET_IFNAME": node.defaultIntf().name}
        argv = training.torchrun_argv(sys.executable, run, len(hosts),
                                      self.fabric.topo.hosts[hosts[0]].ip,
                                      training.master_port(job_id), script, script_args)
        # mnexec -d makes torchrun a session leader (start_new_session here would make
        # mnexec fork and return at once).
        with open(run.log_dir / "torchrun.log", "wb") as log:
            run.proc = node.popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, env=env)

    def kill_training(self, host: str) -> bool:
        """Kill every process of `host`'s running training (torchrun and its ranks), as a host
        failing mid-training would; False when it has none."""
        with self._lock:
            run = self._running.get(host)
        if run is None:
            return False
        run.killed = "killed: host failure (kill_training)"
        training.kill_tagged(run.tag)
        return True

    def stop(self) -> None:
        """Kill every run still going (the network is stopping); their train() calls
        return."""
        with self._lock:
            runs = list(self._running.values())
        for run in runs:
            run.killed = run.killed or "killed: the network was stopped"
            training.kill_tagged(run.tag)


def _wait(runs: dict[str, training.HostRun], timeout: float, after_failure: float) -> None:
    deadline = time.monotonic() + timeout
    failed_at, failed = None, None
    while any(r.proc.poll() is None for r in runs.values()):
        now = time.monotonic()
        if failed_at is None:
            failed = next((h for h, r in runs.items() if r.proc.poll() not in (None, 0)), None)
            failed_at = now if failed else None
        why = None
        if now > deadline:
            why = f"killed: no result within {timeout:g}s"
        elif failed_at is not None and now - failed_at > after_failure:
            why = f"killed: still running {after_failure:g}s after {failed}'s torchrun failed"
        if why:
            for r in runs.values():
                if r.proc.poll() is None:
                    r.killed = r.killed or why
                    training.kill_tagged(r.tag)
            return
        time.sleep(0.2)


def default_script() -> Path:
    """The checkout's examples/train_ddp.py: what train() runs unless told another script."""
    script = CHECKOUT / "examples" / "train_ddp.py" if CHECKOUT else None
    if script is None or not script.is_file():
        raise FileNotFoundError(
            "no training script: the default is examples/train_ddp.py of a source checkout"
            f"{f' ({script} is missing)' if script else ' (this is an installed wheel)'}; "
            "pass one (train(script=PATH), or train --script PATH in the CLI)")
    return script
