"""Bringing the switches back in line with the job table after a restart or a failure: what is
missing or wrong is re-installed, entries no known job accounts for are reported, never
removed."""

from __future__ import annotations

from controller import installer
from controller.agent_ports import AgentPorts
from controller.connections import SwitchConnections
from controller.counters import StatsCounters
from controller.errors import ControllerError
from controller.job_plan import JobSpec, plan
from controller.pipelines import FLOOD_GROUP, Pipelines
from controller.recorded_jobs import RecordedJobs
from controller.switch import SwitchError


class Reconciler:
    """Compares the switches of `jobs.topo`, reached through `connections` and running the
    pipeline of `pipelines`, with the jobs recorded in `jobs`."""

    def __init__(self, jobs: RecordedJobs, ports: AgentPorts, connections: SwitchConnections,
                 pipelines: Pipelines) -> None:
        self.jobs = jobs
        self.ports = ports
        self.connections = connections
        self.pipelines = pipelines

    def reconcile(self, fix: bool = True) -> dict[str, dict[str, list[str]]]:
        """Compare every switch with the job table. With fix, re-install what is missing or
        wrong. Stray entries (no known job) are reported, never removed."""
        topo, store = self.jobs.topo, self.jobs.store
        wanted: dict[str, dict[int, installer.Desired]] = {s: {} for s in topo.switches}
        claims = self.ports.guard_claims()
        records = store.jobs()
        for rec in records:
            job_plan = plan(JobSpec.from_dict(rec.spec), topo)
            for pool in rec.pools:
                wanted[pool.switch][rec.job_id] = self.jobs.desired(job_plan, rec, pool, claims)
        report = {}
        unsettled: set[str] = set()  # switches left with errors or differences
        for name in topo.switches:
            entry: dict[str, list[str]] = {"repaired": [], "stray": [], "errors": []}
            report[name] = entry
            unsettled.add(name)
            try:
                if fix:
                    entry["pipeline"] = [self.pipelines.prepare(name)]
                else:
                    state = self.pipelines.pipeline_state(name)
                    entry["pipeline"] = [state]
                    if state != "ours":
                        entry["repaired"] += [f"pipeline: {state} (not fixed)"]
                        entry["repaired"] += [f"job {jid}: everything missing (not fixed)"
                                              for jid in wanted[name]]
                        continue
                snap = installer.SwitchSnapshot.read(self.connections.conn(name))
                for jid, d in wanted[name].items():
                    diff = installer.differences(snap, d)
                    if diff and fix:
                        self._repair(name, snap, d)
                        entry["repaired"] += [f"job {jid}: {x}" for x in diff]
                    elif diff:
                        entry["repaired"] += [f"job {jid}: {x} (not fixed)" for x in diff]
                entry["stray"] = installer.strays(snap, wanted[name], {FLOOD_GROUP})
                unsettled.discard(name)
            except (SwitchError, ControllerError) as e:
                entry["errors"].append(str(e))
        # A resize interrupted while installing is complete once all its switches are in line.
        for rec in records:
            if rec.installing and fix and not unsettled & {p.switch for p in rec.pools}:
                store.resize_installed(rec.job_id, rec.pool_epoch)
        return report

    def _repair(self, name: str, snap: installer.SwitchSnapshot, d: installer.Desired) -> None:
        """installer.repair, with the counters a missing entry needs: zero pool_contribs of a
        pool installed afresh before it can count (see resize), and zero every row of a job
        the switch held nothing of (a reused counter row must start from zero)."""
        jid = d.job.job_id
        conn = self.connections.conn(name)
        counters = StatsCounters(conn)
        if (jid, d.job.pool) not in snap.jobs:
            conn.write(counters.pool_reset_updates(d.job.stat_idx, d.job.pool))
        installer.repair(conn, snap, d)
        if not any(j == jid for j, _ in snap.jobs):
            conn.write(counters.reset_updates(d.job.stat_idx))
