"""A running job's straggler policy: its quorum, live on the switches, and the agents' patience
and staleness bound, handed to them in their parameters (docs/controller.md, `job set`)."""

from __future__ import annotations

import dataclasses

from controller import installer
from controller.agent_ports import AgentPorts
from controller.connections import SwitchConnections
from controller.errors import ControllerError, SwitchFailure
from controller.job_plan import JobError, JobSpec, plan
from controller.recorded_jobs import RecordedJobs
from controller.records import JobRecord
from controller.switch import SwitchError


class PolicyChanges:
    """Changes the policy of the jobs recorded in `jobs`, on switches reached through
    `connections`."""

    def __init__(self, jobs: RecordedJobs, ports: AgentPorts,
                 connections: SwitchConnections) -> None:
        self.jobs = jobs
        self.ports = ports
        self.connections = connections

    def set_quorum(self, job_id: int, quorum: tuple[int, ...]) -> JobRecord:
        """Change a job's quorum while it runs (JobSpec.quorum; () for bulk-synchronous). The
        job_config entry of each of its switches is modified in place: rounds in flight keep
        their sums, and the next CLOSE request is judged by the new quorum. The record is
        written first; if a switch fails, `reconcile` finishes the change."""
        return self.set_policy(job_id, quorum=quorum)

    def set_policy(self, job_id: int, *, quorum: tuple[int, ...] | None = None,
                   patience: tuple[float, ...] | None = None,
                   staleness: int | None = None) -> JobRecord:
        """Change what is given (None: left as it is): the quorum, live on the switches (see
        set_quorum); the agents' patience and staleness bound, in the parameters agents read
        (`passing-ctl serve`), under a new policy number: running agents that poll their
        parameters change to it after the same call (host_agent.pool_move)."""
        self.jobs.job(job_id)  # an unknown job is refused with the jobs there are
        job_plan = None

        def change(recorded: dict) -> dict:
            # Inside the store's write transaction: the policy number is raised from the spec
            # as recorded, so two `job set`s at once never hand out one number twice.
            nonlocal job_plan
            spec = JobSpec.from_dict(recorded)
            new = {k: tuple(v) if isinstance(v, list | tuple) else v
                   for k, v in (("quorum", quorum), ("patience", patience),
                                ("staleness", staleness)) if v is not None}
            if (patience is not None and tuple(patience) != spec.patience) \
                    or (staleness is not None and staleness != spec.staleness):
                new["policy"] = spec.policy + 1  # running agents vote on it (pool_move)
            try:
                spec = dataclasses.replace(spec, **new)
                job_plan = plan(spec, self.jobs.topo)
            except JobError as e:
                raise ControllerError(str(e)) from None
            return spec.to_dict()

        rec = self.jobs.store.update_spec(job_id, change)
        if quorum is None:
            return rec
        claims = self.ports.guard_claims()
        for pool in rec.pools:
            d = self.jobs.desired(job_plan, rec, pool, claims)
            conn = self.connections.conn(pool.switch)
            try:
                installer.repair(conn, installer.SwitchSnapshot.read(conn), d)
            except SwitchError as e:
                raise SwitchFailure(f"job {job_id}: quorum recorded, but {pool.switch} was not "
                                    f"updated: {e}; fix the switch and run reconcile") from None
        return rec

    def quorums(self, job_id: int) -> dict[str, dict[str, int]]:
        """Per switch of the job: its fan-in and the quorum it is configured with."""
        rec = self.jobs.job(job_id)
        job_plan = plan(JobSpec.from_dict(rec.spec), self.jobs.topo)
        return {p.switch: {"fan_in": p.fan_in, "quorum": job_plan.quorum_at(p.switch)}
                for p in rec.pools}
