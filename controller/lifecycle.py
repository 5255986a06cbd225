"""A job's coming and going: allocating and installing it on every switch it spans, all or
nothing, and removing it with everything it holds."""

from __future__ import annotations

import dataclasses
import secrets
import time

from controller import installer
from controller.agent_ports import AgentPorts, port_span
from controller.allocator import AllocationError, SlotRange
from controller.common_window import common_window
from controller.connections import SwitchConnections
from controller.counters import StatsCounters
from controller.errors import ControllerError, StoreError, SwitchFailure
from controller.job_plan import JobError, JobSpec, plan
from controller.job_tree import Rank
from controller.pipelines import Pipelines
from controller.recorded_jobs import RecordedJobs
from controller.records import JobRecord, PoolRecord
from controller.retire import PoolRetirement
from controller.switch import SwitchError


class JobLifecycle:
    """Creates and deletes the jobs recorded in `jobs`, on switches reached through
    `connections` and running the pipeline of `pipelines`; a new job's slots may be those of
    old pools `retirement` frees first."""

    def __init__(self, jobs: RecordedJobs, ports: AgentPorts, connections: SwitchConnections,
                 pipelines: Pipelines, retirement: PoolRetirement) -> None:
        self.jobs = jobs
        self.ports = ports
        self.connections = connections
        self.pipelines = pipelines
        self.retirement = retirement

    def create_job(self, spec: JobSpec) -> JobRecord:
        """Allocate and install a job. With spec.agent_port 0 the job gets the lowest free
        range of agent ports from 61000; the stored spec holds the port it got."""
        topo, store = self.jobs.topo, self.jobs.store
        try:
            job_plan = plan(spec, topo)
        except JobError as e:
            raise ControllerError(str(e)) from None
        if store.get_job(spec.job_id) is not None:
            raise ControllerError(f"job {spec.job_id} already exists")
        if not spec.tree:
            # Its tree, chosen now and kept for the job's life (JobSpec.tree).
            job_plan = plan(spec, topo, rank=self._rank(spec))
            spec = dataclasses.replace(spec, tree=job_plan.tree)
        held = self._holdings(spec.job_id, job_plan.switches)
        spec = self.ports.resolve(spec, held)
        if not spec.session_key:
            spec = dataclasses.replace(spec, session_key=secrets.token_hex(16))
        job_plan = plan(spec, topo)
        # Old pools whose hosts have all moved are freed first, so the new job can have them.
        self.retirement.retire_where(job_plan.switches)
        allocs = self.jobs.allocators(job_plan.switches)
        try:
            window = common_window(spec.job_id, spec.window, spec.min_window, allocs)
            ranges = {s: allocs[s].allocate(spec.job_id, window) for s in job_plan.switches}
        except AllocationError as e:
            # A `passing` job (its hosts can sum without the switch) may wait for slots, if
            # an empty switch would grant its request: one beyond the equal share never fits.
            share = min(a.fair_share() for a in allocs.values())
            if spec.mode != "passing" or not spec.fallback:
                raise ControllerError(str(e)) from None
            if (spec.min_window or spec.window) > share:
                raise ControllerError(f"{e}; it cannot wait for slots either: no switch ever "
                                      f"gives a job more than the equal share of {share} "
                                      "slots") from None
            # It waits for slots (controller.waiting): every entry but its pools.
            ranges = {s: SlotRange(0, 0) for s in job_plan.switches}
        pools = []
        for s, rng in ranges.items():
            role = job_plan.roles[s]
            on_switch = held[s].jobs.values()
            # What the switch holds counts as taken even when this state file does not know it
            # (see JobStore.next_generation): otherwise the new job's entries would collide with,
            # or its counters and slot state be mistaken for, those left there.
            gen = store.next_generation(s, floor=max((c.gen for c in on_switch), default=0))
            pools.append(PoolRecord(s, rng.base, rng.size, gen,
                                    store.free_stat_idx(s, {c.stat_idx for c in on_switch}),
                                    store.free_mcast_group(s, held[s].groups),
                                    role.fan_in, role.is_root,
                                    role.uplink.port if role.uplink else 0))
        record = JobRecord(spec.job_id, spec.to_dict(), tuple(pools), time.time())
        try:
            store.add_job(record)
        except StoreError as e:
            raise ControllerError(str(e)) from None
        # The record is on disk first: a crash from here on leaves a job that `reconcile`
        # completes, never entries that nobody knows about.
        clash = self.ports.clash(spec.job_id, spec.agent_ports(topo))
        if clash:
            # Another controller sharing the state file picked the same ports meanwhile; both
            # records are on disk now, so at least one of the two sees the other here.
            store.remove_job(spec.job_id)
            raise ControllerError(f"job {spec.job_id} not created: its agent ports "
                                  f"{port_span(spec.agent_ports(topo))} {clash} (created "
                                  "meanwhile by another controller); try again")
        claims = self.ports.guard_claims()
        done: list[tuple[str, installer.Desired]] = []
        try:
            for pool in pools:
                d = self.jobs.desired(job_plan, record, pool, claims)
                installer.install(self.connections.conn(pool.switch), d)
                done.append((pool.switch, d))
                self._reset_counters(pool)
        except (SwitchError, ControllerError) as e:
            for name, d in reversed(done):
                try:
                    installer.remove(self.connections.conn(name), d)
                except (SwitchError, ControllerError):
                    pass  # reported by the next reconcile as stray
            store.remove_job(spec.job_id)
            cls = ControllerError if type(e) is ControllerError else SwitchFailure
            raise cls(f"job {spec.job_id} not created, nothing left installed: {e}") from None
        return record

    def _rank(self, spec: JobSpec) -> Rank:
        """How the job's root, and a core root's spine in each pod, are chosen among the
        switches that qualify (controller.job_tree): first those where the job's window (its
        --min-window, if given) fits now, then the most free slots (slots no pool holds, a
        retiring pool's included), then the first by name. So jobs spread over the spines."""
        need = spec.min_window or spec.window
        allocs = {}

        def rank(switch: str) -> tuple:
            if switch not in allocs:
                allocs[switch] = self.jobs.allocators([switch])[switch]
            a = allocs[switch]
            return (a.largest_grant() < need, a.used() - a.capacity, switch)
        return rank

    def delete_job(self, job_id: int) -> JobRecord:
        """Remove the job's entries, a retiring pool's included, and free all its slots."""
        rec = self.jobs.job(job_id)
        spec = JobSpec.from_dict(rec.spec)
        job_plan = plan(spec, self.jobs.topo)
        claims = self.ports.guard_claims()
        for pool in rec.pools:
            d = self.jobs.desired(job_plan, rec, pool, claims)
            # A port another live job also receives on (older records only) passes to it
            # rather than going unguarded.
            heirs = {}
            for port in list(d.guards):
                others = [c for c in claims[pool.switch, port] if c[0] != job_id]
                if others:
                    heirs[port] = others[0][1]
                    del d.guards[port]
            try:
                installer.remove(self.connections.conn(pool.switch), d)
                installer.hand_over_guards(self.connections.conn(pool.switch), heirs)
            except SwitchError as e:
                raise SwitchFailure(f"job {job_id} kept: {e}; fix the switch and repeat") \
                    from None
        return self.jobs.store.remove_job(job_id)

    def _holdings(self, job_id: int, switches: list[str]) -> dict[str, installer.SwitchSnapshot]:
        """What the switches of a new job hold now, our pipeline pushed where missing."""
        out = {}
        for s in switches:
            try:
                self.pipelines.prepare_if_needed(s)
                out[s] = installer.SwitchSnapshot.read(self.connections.conn(s))
            except SwitchError as e:
                raise SwitchFailure(f"job {job_id} not created: {e}") from None
        return out

    def _reset_counters(self, pool: PoolRecord) -> None:
        """A reused counter row must start from zero for the new job."""
        c = self.connections.conn(pool.switch)
        c.write(StatsCounters(c).reset_updates(pool.stat_idx))
