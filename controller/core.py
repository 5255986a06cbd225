"""The controller: switches of one topology, their pipeline and forwarding, and the jobs that
share their aggregation memory. State lives in SQLite (controller.store); the switches are told
over P4Runtime (controller.switch); `reconcile` brings the two back in line after a restart.

`Controller` is the one object callers hold (passing-ctl, serve, topologies, bench, tests); it
puts the pieces together and hands each request to the one that does it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from controller.agent_ports import MAX_UDP_PORT as MAX_UDP_PORT
from controller.agent_ports import AgentPorts
from controller.agent_ports import GuardClaims as GuardClaims
from controller.agent_ports import port_span as port_span
from controller.allocator import SlotAllocator
from controller.connections import Endpoint as Endpoint
from controller.connections import SwitchConnections
from controller.errors import ControllerError as ControllerError
from controller.errors import SwitchFailure as SwitchFailure
from controller.job_plan import JobSpec
from controller.lifecycle import JobLifecycle
from controller.params import job_params
from controller.pipelines import FLOOD_GROUP as FLOOD_GROUP
from controller.pipelines import Pipelines
from controller.policy import PolicyChanges
from controller.reconcile import Reconciler
from controller.recorded_jobs import RecordedJobs
from controller.resize import PoolResizer
from controller.retire import PoolMove, PoolRetirement
from controller.stats import JobStats
from controller.store import JobRecord, JobStore
from controller.switch import SwitchConnection
from controller.topology import Topology
from controller.waiting import WaitingJobs
from passing import protocol as P
from passing.contract import JobParams
from passing.pipeline_files import BUILD_DIR

# Jobs per switch: job_config holds P.MAX_JOBS entries, two per job while it resizes.
DEFAULT_MAX_JOBS = P.MAX_JOBS // 2
# Equal shares of a switch's slots: so many jobs get all they may ask for (4096 / 8 = 512 slots,
# twice the model's default window) whatever came and went; more jobs pack into the shares.
DEFAULT_SHARES = 8


class Controller:
    def __init__(self, topo: Topology, endpoints: dict[str, Endpoint], state: str | Path,
                 build_dir: Path = BUILD_DIR, max_jobs: int = DEFAULT_MAX_JOBS,
                 shares: int | None = None, reserve: int = 0,
                 election_id: tuple[int, int] = (0, 10), connect_timeout: float = 5.0,
                 retries: int = 3, dump_dir: Path | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        missing = [s for s in topo.switches if s not in endpoints]
        if missing:
            raise ControllerError(f"no P4Runtime address for switch(es) {', '.join(missing)}")
        self.topo = topo
        self.store = JobStore(state)
        # Each setting is kept by the one piece that uses it, so that it has one place:
        # connections (endpoints, election id, timeouts, retries, dump_dir), pipelines
        # (build_dir), the recorded jobs (max_jobs, shares, reserve).
        self.connections = SwitchConnections(endpoints, election_id, connect_timeout, retries,
                                             dump_dir, sleep)
        self.pipelines = Pipelines(topo, self.connections, build_dir)
        ports = AgentPorts(topo, self.store)
        self._jobs = RecordedJobs(topo, self.store, max_jobs,
                                  min(max_jobs, DEFAULT_SHARES) if shares is None else shares,
                                  reserve)
        self._retirement = PoolRetirement(self._jobs, self.connections)
        self._resizer = PoolResizer(self._jobs, self.connections, self._retirement)
        self._lifecycle = JobLifecycle(self._jobs, ports, self.connections, self.pipelines,
                                       self._retirement)
        self._policy = PolicyChanges(self._jobs, ports, self.connections)
        self._stats = JobStats(self._jobs, self.connections, self._retirement)
        self._reconciler = Reconciler(self._jobs, ports, self.connections, self.pipelines)
        self._waiting = WaitingJobs(self._jobs, self._resizer, self._retirement)
        # The waiting jobs the last call moved onto their switches, and the running jobs it
        # shrank to make room for them (controller.waiting).
        self.placed: list[JobRecord] = []
        self.shrunk: list[JobRecord] = []
        self.grown: list[JobRecord] = []

    # -- connections ----------------------------------------------------------------------------
    def disconnect(self) -> None:
        """Give up the switch sessions (and mastership), e.g. while idle, so that another
        controller process (passing-ctl in another shell) can take them."""
        self.connections.disconnect()

    def close(self) -> None:
        self.disconnect()
        self.store.close()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def conn(self, name: str) -> SwitchConnection:
        """A connection to switch `name`, retried with exponential backoff."""
        return self.connections.conn(name)

    # -- switches -------------------------------------------------------------------------------
    def pipeline_state(self, name: str) -> str:
        """'ours', 'none' or 'other': what the switch runs."""
        return self.pipelines.pipeline_state(name)

    def switch_status(self) -> list[dict]:
        return self.pipelines.switch_status()

    def prepare(self, name: str) -> str:
        """Make switch `name` run the PASSING pipeline with forwarding installed (pushed only
        where it runs none or another); 'pushed' or 'kept'."""
        return self.pipelines.prepare(name)

    def prepare_if_needed(self, name: str) -> None:
        self.pipelines.prepare_if_needed(name)

    # -- jobs -----------------------------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> JobRecord:
        """Allocate and install a job. With spec.agent_port 0 the job gets the lowest free
        range of agent ports from 61000; the stored spec holds the port it got. A `passing`
        job that does not fit now is created waiting for slots (JobRecord.waiting), unless
        spec.fallback is False; jobs that waited before it are placed first."""
        self.place_waiting()
        rec = self._lifecycle.create_job(spec)
        if rec.waiting:
            self.shrunk = self.shrunk + self._waiting.make_room()
        return rec

    def set_quorum(self, job_id: int, quorum: tuple[int, ...]) -> JobRecord:
        """Change a job's quorum while it runs (PolicyChanges.set_quorum)."""
        return self._policy.set_quorum(job_id, quorum)

    def set_policy(self, job_id: int, *, quorum: tuple[int, ...] | None = None,
                   patience: tuple[float, ...] | None = None,
                   staleness: int | None = None) -> JobRecord:
        """Change what is given of a job's quorum, patience and staleness (None: left as it
        is; PolicyChanges.set_policy)."""
        return self._policy.set_policy(job_id, quorum=quorum, patience=patience,
                                       staleness=staleness)

    def quorums(self, job_id: int) -> dict[str, dict[str, int]]:
        """Per switch of the job: its fan-in and the quorum it is configured with."""
        return self._policy.quorums(job_id)

    def job(self, job_id: int) -> JobRecord:
        return self._jobs.job(job_id)

    def delete_job(self, job_id: int) -> JobRecord:
        """Remove the job's entries, a retiring pool's included, and free all its slots;
        waiting jobs that fit then are given pools (`placed`)."""
        rec = self._lifecycle.delete_job(job_id)
        self.place_waiting()
        return rec

    def place_waiting(self) -> list[JobRecord]:
        """Give pools to the jobs waiting for slots that fit now, oldest first (WaitingJobs);
        the jobs placed, also kept in `placed`. Every call here that may free slots does it.
        Then running jobs are shrunk for those still waiting (WaitingJobs.make_room; the
        jobs shrunk kept in `shrunk`), and the jobs shrunk before grow back toward the window
        they asked for where nobody waits (WaitingJobs.grow_back; `grown`)."""
        self.placed = self._waiting.place()
        self.shrunk = self._waiting.make_room()
        self.grown = self._waiting.grow_back()
        return self.placed

    def waiting_jobs(self) -> list[JobRecord]:
        """The jobs waiting for slots, oldest first."""
        return self._waiting.waiting()

    def agent_params(self, job_id: int) -> JobParams:
        """Everything a host agent needs to join the job (passing.contract, docs/controller.md)."""
        return job_params(self._jobs.job(job_id), self.topo)

    def resize_job(self, job_id: int, window: int,
                   min_window: int | None = None) -> JobRecord:
        """Move a running job to a new pool of `window` slots on each of its switches (at
        least `min_window` when short), beside its current one, which retires once every host
        uses the new one (controller.resize, docs/controller.md "Live pool resizing")."""
        rec = self._resizer.resize_job(job_id, window, min_window)
        self.place_waiting()
        return rec

    def retire_pools(self, job_id: int) -> PoolMove:
        """Free the job's retiring pools if every host has moved to its new pool; which hosts
        have and which have not (controller.retire). Waiting jobs that fit then (the job
        itself among them) are given pools (`placed`)."""
        move = self._retirement.retire_pools(job_id)
        self.place_waiting()
        return move

    # -- observation ----------------------------------------------------------------------------
    def slots(self) -> dict[str, SlotAllocator]:
        return self._jobs.allocators(list(self.topo.switches))

    def stats(self, job_id: int, unread: dict[str, str] | None = None
              ) -> dict[str, dict[str, int | str | dict[str, int]]]:
        """Per switch of the job: its counters, fan-in and quorum, or why it has none
        (JobStats.stats); `unread` (switch -> why), shared by the calls of one command,
        spares the switches already found unreadable."""
        return self._stats.stats(job_id, unread)

    def reconcile(self, fix: bool = True) -> dict[str, dict[str, list[str]]]:
        """Compare every switch with the job table. With fix, re-install what is missing or
        wrong. Stray entries (no known job) are reported, never removed."""
        report = self._reconciler.reconcile(fix)
        self.placed = self.place_waiting() if fix else []
        return report
