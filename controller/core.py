"""The controller: switches of one topology, their pipeline and forwarding, and the jobs that
share their aggregation memory. State lives in SQLite (controller.store); the switches are told
over P4Runtime (controller.switch); `reconcile` brings the two back in line after a restart.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from controller import installer
from controller.allocator import AllocationError, SlotAllocator, SlotRange
from controller.jobs import JobError, JobPlan, JobSpec, plan
from controller.store import JobRecord, JobStore, PoolRecord, StoreError
from controller.switch import SwitchConnection, SwitchError, Update
from controller.tables.forwarding import ForwardingTables
from controller.tables.stats import StatsCounters
from controller.topology import Topology
from passing import protocol as P
from passing.p4info import P4InfoIndex, pipeline_signature
from passing.pipeline_files import BUILD_DIR, pipeline_files

FLOOD_GROUP = 1  # multicast group for L2 flooding; job groups start at 2
DEFAULT_MAX_JOBS = 8


class ControllerError(RuntimeError):
    """An operation that could not be done; the message is meant for the operator."""


class SwitchFailure(ControllerError):
    """A switch could not be reached or refused what it was told."""


class SwitchUnreachable(SwitchFailure):
    """No P4Runtime session with a switch, after the retries."""


@dataclass(frozen=True)
class Endpoint:
    name: str
    address: str
    device_id: int


class Controller:
    def __init__(self, topo: Topology, endpoints: dict[str, Endpoint], state: str | Path,
                 build_dir: Path = BUILD_DIR, max_jobs: int = DEFAULT_MAX_JOBS,
                 election_id: tuple[int, int] = (0, 10), connect_timeout: float = 5.0,
                 retries: int = 3, dump_dir: Path | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        missing = [s for s in topo.switches if s not in endpoints]
        if missing:
            raise ControllerError(f"no P4Runtime address for switch(es) {', '.join(missing)}")
        self.topo = topo
        self.endpoints = endpoints
        self.store = JobStore(state)
        self.build_dir = build_dir
        self.max_jobs = max_jobs
        self.election_id = election_id
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.dump_dir = dump_dir
        self._sleep = sleep
        self._conns: dict[str, SwitchConnection] = {}

    # -- connections ----------------------------------------------------------------------------
    def disconnect(self) -> None:
        """Give up the switch sessions (and mastership), e.g. while idle, so that another
        controller process (passing-ctl in another shell) can take them."""
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def close(self) -> None:
        self.disconnect()
        self.store.close()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def conn(self, name: str) -> SwitchConnection:
        """A connection to switch `name`, retried with exponential backoff."""
        if name in self._conns:
            return self._conns[name]
        ep = self.endpoints[name]
        delay, last = 0.5, None
        for attempt in range(self.retries):
            try:
                dump = self.dump_dir / f"{name}-p4runtime.log" if self.dump_dir else None
                c = SwitchConnection(name, ep.address, ep.device_id, self.election_id, dump,
                                     self.connect_timeout)
                c.fetch_pipeline()  # names and ids of what it runs, if it runs anything
                self._conns[name] = c
                return c
            except SwitchError as e:
                last = e
                if attempt + 1 < self.retries:
                    self._sleep(delay)
                    delay *= 2
        raise SwitchUnreachable(f"{last} (tried {self.retries} times)")

    @functools.cached_property
    def _own_signature(self) -> list[tuple]:
        """The pipeline this controller pushes, parsed once rather than per switch and call."""
        return pipeline_signature(P4InfoIndex.from_file(pipeline_files(self.build_dir)[0]).p4info)

    def pipeline_state(self, name: str) -> str:
        """'ours', 'none' or 'other': what the switch runs."""
        c = self.conn(name)
        if not c.fetch_pipeline():
            return "none"
        return "ours" if pipeline_signature(c.info.p4info) == self._own_signature else "other"

    # -- switches -------------------------------------------------------------------------------
    def switch_status(self) -> list[dict]:
        rows = []
        for name, ep in self.endpoints.items():
            row = {"switch": name, "address": ep.address, "device_id": ep.device_id,
                   "role": self.topo.switches[name].role, "reachable": False, "pipeline": None}
            try:
                row["pipeline"] = self.pipeline_state(name)
                row["reachable"] = True
            except ControllerError as e:
                row["error"] = str(e)
            rows.append(row)
        return rows

    def prepare(self, name: str) -> str:
        """Make switch `name` run the PASSING pipeline with forwarding installed. Pushing a
        pipeline wipes a switch, so it is pushed only when the switch runs none or another."""
        state = self.pipeline_state(name)
        c = self.conn(name)
        if state == "other":
            # BMv2's P4Runtime server forgets multicast groups on a new pipeline but leaves
            # them in the replication engine: delete them while they are still known.
            c.write([c.multicast_update(Update.DELETE, g) for g in c.read_multicast_groups()])
        if state != "ours":
            p4info, config = pipeline_files(self.build_dir)
            try:
                c.set_pipeline(p4info, config)
            except SwitchError as e:
                hint = "" if config else " (no build/: run `make build` for BMv2 switches)"
                raise ControllerError(f"{e}{hint}") from None
        self._install_forwarding(name)
        return "pushed" if state != "ours" else "kept"

    def _l2_ports(self, name: str) -> dict[str, int]:
        """Host MAC -> the port of `name` that leads to it."""
        out = {}
        up = self.topo.uplink_of(name)
        for h in self.topo.hosts.values():
            if h.rack == name:
                out[h.mac] = h.port
            elif self.topo.switches[name].role == "tor" and up is not None:
                out[h.mac] = up.tor_port
            elif self.topo.switches[name].role == "spine":
                rack_up = self.topo.uplink_of(h.rack)
                if rack_up is not None:
                    out[h.mac] = rack_up.spine_port
        return out

    def _install_forwarding(self, name: str) -> None:
        ForwardingTables(self.conn(name)).sync(self._l2_ports(name), self.topo.ports_of(name),
                                               FLOOD_GROUP)

    # -- jobs -----------------------------------------------------------------------------------
    def _allocators(self, switches: list[str]) -> dict[str, SlotAllocator]:
        return {s: SlotAllocator(s, P.SLOT_CAPACITY, self.max_jobs,
                                 {jid: SlotRange(p.base, p.size)
                                  for jid, p in self.store.pools_on(s).items()})
                for s in switches}

    def _pool_size(self, spec: JobSpec, allocs: dict[str, SlotAllocator]) -> int:
        """One pool size for every switch of the job (slot indices are shared along the tree)."""
        fits = [a for a in allocs.values()
                if spec.window > a.fair_share() or a.largest_free() < spec.window]
        if not fits:
            return spec.window
        if spec.min_window is None:
            try:
                for a in fits:
                    a.allocate(spec.job_id, spec.window)  # raises with the operator's message
            except AllocationError as e:
                raise ControllerError(f"{e} (or pass a minimum window to accept less)") from None
        size = min([spec.window] + [min(a.fair_share(), a.largest_free())
                                    for a in allocs.values()])
        if size < spec.min_window:
            worst = min(allocs.values(), key=lambda a: min(a.fair_share(), a.largest_free()))
            raise ControllerError(
                f"job {spec.job_id} does not fit: at least {spec.min_window} slots wanted, "
                f"switch {worst.switch} can give {min(worst.fair_share(), worst.largest_free())} "
                f"(fair share {worst.fair_share()}, largest free block {worst.largest_free()})")
        return size

    def create_job(self, spec: JobSpec) -> JobRecord:
        try:
            job_plan = plan(spec, self.topo)
        except JobError as e:
            raise ControllerError(str(e)) from None
        if self.store.get_job(spec.job_id) is not None:
            raise ControllerError(f"job {spec.job_id} already exists")
        allocs = self._allocators(job_plan.switches)
        size = self._pool_size(spec, allocs)
        pools = []
        for s in job_plan.switches:
            try:
                rng = allocs[s].allocate(spec.job_id, size)
            except AllocationError as e:
                raise ControllerError(str(e)) from None
            role = job_plan.roles[s]
            pools.append(PoolRecord(s, rng.base, rng.size, self.store.next_generation(s),
                                    self.store.free_stat_idx(s), self.store.free_mcast_group(s),
                                    role.fan_in, role.is_root,
                                    role.uplink.port if role.uplink else 0))
        record = JobRecord(spec.job_id, spec.to_dict(), tuple(pools), time.time())
        try:
            self.store.add_job(record)
        except StoreError as e:
            raise ControllerError(str(e)) from None
        # The record is on disk first: a crash from here on leaves a job that `reconcile`
        # completes, never entries that nobody knows about.
        done: list[tuple[str, installer.Desired]] = []
        try:
            for pool in pools:
                d = self._desired(job_plan, pool)
                self.prepare_if_needed(pool.switch)
                installer.install(self.conn(pool.switch), d)
                self._reset_counters(pool)
                done.append((pool.switch, d))
        except (SwitchError, ControllerError) as e:
            for name, d in reversed(done):
                try:
                    installer.remove(self.conn(name), d)
                except (SwitchError, ControllerError):
                    pass  # reported by the next reconcile as stray
            self.store.remove_job(spec.job_id)
            cls = ControllerError if type(e) is ControllerError else SwitchFailure
            raise cls(f"job {spec.job_id} not created, nothing left installed: {e}") from None
        return record

    def prepare_if_needed(self, name: str) -> None:
        if self.pipeline_state(name) != "ours":
            self.prepare(name)

    def _reset_counters(self, pool: PoolRecord) -> None:
        """A reused counter row must start from zero for the new job."""
        c = self.conn(pool.switch)
        c.write(StatsCounters(c).reset_updates(pool.stat_idx))

    def _desired(self, job_plan: JobPlan, pool: PoolRecord) -> installer.Desired:
        params = installer.PoolParams(pool.base, pool.size, pool.gen, pool.stat_idx,
                                      pool.mcast_grp)
        return installer.desired(job_plan.roles[pool.switch], params, job_plan.spec.job_id,
                                 self.topo.switches[pool.switch])

    def job(self, job_id: int) -> JobRecord:
        rec = self.store.get_job(job_id)
        if rec is None:
            known = ", ".join(str(j.job_id) for j in self.store.jobs()) or "none"
            raise ControllerError(f"no job {job_id} (jobs: {known})")
        return rec

    def delete_job(self, job_id: int) -> JobRecord:
        rec = self.job(job_id)
        spec = JobSpec.from_dict(rec.spec)
        job_plan = plan(spec, self.topo)
        for pool in rec.pools:
            try:
                installer.remove(self.conn(pool.switch), self._desired(job_plan, pool))
            except SwitchError as e:
                raise SwitchFailure(f"job {job_id} kept: {e}; fix the switch and repeat") \
                    from None
        return self.store.remove_job(job_id)

    def agent_params(self, job_id: int) -> dict:
        """Everything a host agent needs to join the job, per host (see docs/controller.md)."""
        rec = self.job(job_id)
        spec = JobSpec.from_dict(rec.spec)
        job_plan = plan(spec, self.topo)
        size = rec.pools[0].size
        total_gpus = sum(self.topo.hosts[h].gpus for h in spec.hosts)
        hosts = {}
        for pool in rec.pools:
            role = job_plan.roles[pool.switch]
            sw = self.topo.switches[pool.switch]
            if sw.role != "tor":
                continue
            for m in role.members:
                h = self.topo.hosts[m.name]
                hosts[m.name] = {"host_ip": h.ip, "switch": sw.name, "switch_ip": sw.ip,
                                 "switch_mac": sw.mac, "contributor": m.contributor,
                                 "local_gpus": h.gpus}
        # streams: the contributions the switches sum (the agents' fixed-point headroom);
        # in `ina` every GPU rank streams, with id contributor + local rank.
        streams = total_gpus if spec.mode == "ina" else len(spec.hosts)
        return {"job_id": job_id, "mode": spec.mode, "udp_port": P.PASSING_UDP_PORT,
                "agent_port": spec.udp_port, "k": spec.k, "slots": size,
                "scale_bits": spec.scale_bits, "hosts_total": len(spec.hosts),
                "streams": streams, "contributors_total": total_gpus, "hosts": hosts}

    # -- observation ----------------------------------------------------------------------------
    def slots(self) -> dict[str, SlotAllocator]:
        return self._allocators(list(self.topo.switches))

    def stats(self, job_id: int) -> dict[str, dict[str, int]]:
        rec = self.job(job_id)
        return {p.switch: StatsCounters(self.conn(p.switch)).job(p.stat_idx) for p in rec.pools}

    def reconcile(self, fix: bool = True) -> dict[str, dict[str, list[str]]]:
        """Compare every switch with the job table. With fix, re-install what is missing or
        wrong. Stray entries (no known job) are reported, never removed."""
        wanted: dict[str, dict[int, installer.Desired]] = {s: {} for s in self.topo.switches}
        for rec in self.store.jobs():
            job_plan = plan(JobSpec.from_dict(rec.spec), self.topo)
            for pool in rec.pools:
                wanted[pool.switch][rec.job_id] = self._desired(job_plan, pool)
        report = {}
        for name in self.topo.switches:
            entry: dict[str, list[str]] = {"repaired": [], "stray": [], "errors": []}
            try:
                if fix:
                    entry["pipeline"] = [self.prepare(name)]
                else:
                    state = self.pipeline_state(name)
                    entry["pipeline"] = [state]
                    if state != "ours":
                        entry["repaired"] += [f"pipeline: {state} (not fixed)"]
                        entry["repaired"] += [f"job {jid}: everything missing (not fixed)"
                                              for jid in wanted[name]]
                        report[name] = entry
                        continue
                snap = installer.SwitchSnapshot.read(self.conn(name))
                for jid, d in wanted[name].items():
                    diff = installer.differences(snap, d)
                    if diff and fix:
                        installer.repair(self.conn(name), snap, d)
                        if jid not in snap.jobs:  # installed afresh: its counters start at 0
                            self._reset_counters(self.store.pools_on(name)[jid])
                        entry["repaired"] += [f"job {jid}: {x}" for x in diff]
                    elif diff:
                        entry["repaired"] += [f"job {jid}: {x} (not fixed)" for x in diff]
                entry["stray"] = installer.strays(snap, wanted[name], {FLOOD_GROUP})
            except (SwitchError, ControllerError) as e:
                entry["errors"].append(str(e))
            report[name] = entry
        return report
