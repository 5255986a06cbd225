"""The controller: switches of one topology, their pipeline and forwarding, and the jobs that
share their aggregation memory. State lives in SQLite (controller.store); the switches are told
over P4Runtime (controller.switch); `reconcile` brings the two back in line after a restart.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from p4.config.v1 import p4info_pb2

from controller import installer, resize
from controller.allocator import AllocationError, SlotAllocator, SlotRange, common_window
from controller.counters import StatsCounters
from controller.errors import ControllerError, SwitchFailure, SwitchUnreachable
from controller.job_plan import DEFAULT_AGENT_PORT_BASE, JobError, JobPlan, JobSpec, plan
from controller.store import JobRecord, JobStore, PoolRecord, StoreError
from controller.switch import SwitchConnection, SwitchError, Update
from controller.tables.forwarding import ForwardingTables
from controller.topology import Topology
from passing import protocol as P
from passing.contract import HostParams, JobParams
from passing.p4info import pipeline_signature
from passing.pipeline_files import BUILD_DIR, BuildMismatch, pipeline_files

FLOOD_GROUP = 1  # multicast group for L2 flooding; job groups start at 2
DEFAULT_MAX_JOBS = 8
MAX_UDP_PORT = 0xFFFF

# (switch, UDP port) -> (job id, stat_idx) of each live job that receives on that port and has a
# pool on that switch, by job id
GuardClaims = dict[tuple[str, int], list[tuple[int, int]]]


def port_span(ports: range) -> str:
    """`61000` or `61000-61003`, as operators read a port range."""
    return str(ports.start) if len(ports) == 1 else f"{ports.start}-{ports.stop - 1}"


def _overlaps(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


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

    def _pipeline(self) -> tuple[p4info_pb2.P4Info, bytes]:
        """The P4Info and device config this controller pushes (pipeline_files)."""
        try:
            return pipeline_files(self.build_dir)
        except BuildMismatch as e:
            raise ControllerError(str(e)) from None

    @functools.cached_property
    def _own_signature(self) -> list[tuple]:
        """The pipeline this controller pushes, parsed once rather than per switch and call."""
        return pipeline_signature(self._pipeline()[0])

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
            p4info, config = self._pipeline()
            try:
                c.set_pipeline(p4info, config)
            except SwitchError as e:
                hint = "" if config else (f" (no build in {self.build_dir}: `make build` or "
                                          "`python -m passing.p4build` for BMv2 switches)")
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
                                  for jid, p in self.store.pools_on(s).items()},
                                 {jid: SlotRange(r.base, r.size)
                                  for jid, r in self.store.retiring_on(s).items()})
                for s in switches}

    def create_job(self, spec: JobSpec) -> JobRecord:
        """Allocate and install a job. With spec.agent_port 0 the job gets the lowest free
        range of agent ports from 61000; the stored spec holds the port it got."""
        try:
            job_plan = plan(spec, self.topo)
        except JobError as e:
            raise ControllerError(str(e)) from None
        if self.store.get_job(spec.job_id) is not None:
            raise ControllerError(f"job {spec.job_id} already exists")
        held = self._holdings(spec.job_id, job_plan.switches)
        spec = self._resolve_agent_port(spec, held)
        if not spec.session_key:
            spec = dataclasses.replace(spec, session_key=secrets.token_hex(16))
        job_plan = plan(spec, self.topo)
        # Old pools whose hosts have all moved are freed first, so the new job can have them.
        resize.retire_where(self, job_plan.switches)
        allocs = self._allocators(job_plan.switches)
        try:
            window = common_window(spec.job_id, spec.window, spec.min_window, allocs)
            ranges = {s: allocs[s].allocate(spec.job_id, window) for s in job_plan.switches}
        except AllocationError as e:
            raise ControllerError(str(e)) from None
        pools = []
        for s, rng in ranges.items():
            role = job_plan.roles[s]
            on_switch = held[s].jobs.values()
            # What the switch holds counts as taken even when this state file does not know it
            # (see JobStore.next_generation): otherwise the new job's entries would collide with,
            # or its counters and slot state be mistaken for, those left there.
            gen = self.store.next_generation(s, floor=max((c.gen for c in on_switch), default=0))
            pools.append(PoolRecord(s, rng.base, rng.size, gen,
                                    self.store.free_stat_idx(s, {c.stat_idx for c in on_switch}),
                                    self.store.free_mcast_group(s, held[s].groups),
                                    role.fan_in, role.is_root,
                                    role.uplink.port if role.uplink else 0))
        record = JobRecord(spec.job_id, spec.to_dict(), tuple(pools), time.time())
        try:
            self.store.add_job(record)
        except StoreError as e:
            raise ControllerError(str(e)) from None
        # The record is on disk first: a crash from here on leaves a job that `reconcile`
        # completes, never entries that nobody knows about.
        clash = self._port_clash(spec.job_id, spec.agent_ports(self.topo))
        if clash:
            # Another controller sharing the state file picked the same ports meanwhile; both
            # records are on disk now, so at least one of the two sees the other here.
            self.store.remove_job(spec.job_id)
            raise ControllerError(f"job {spec.job_id} not created: its agent ports "
                                  f"{port_span(spec.agent_ports(self.topo))} {clash} (created "
                                  "meanwhile by another controller); try again")
        claims = self._guard_claims()
        done: list[tuple[str, installer.Desired]] = []
        try:
            for pool in pools:
                d = self._desired(job_plan, record, pool, claims)
                installer.install(self.conn(pool.switch), d)
                done.append((pool.switch, d))
                self._reset_counters(pool)
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

    def _holdings(self, job_id: int, switches: list[str]) -> dict[str, installer.SwitchSnapshot]:
        """What the switches of a new job hold now, our pipeline pushed where missing."""
        out = {}
        for s in switches:
            try:
                self.prepare_if_needed(s)
                out[s] = installer.SwitchSnapshot.read(self.conn(s))
            except SwitchError as e:
                raise SwitchFailure(f"job {job_id} not created: {e}") from None
        return out

    def _port_ranges(self) -> dict[int, range]:
        """job id -> the agent ports of every live job."""
        return {rec.job_id: JobSpec.from_dict(rec.spec).agent_ports(self.topo)
                for rec in self.store.jobs()}

    def _port_clash(self, job_id: int, ports: range) -> str | None:
        """Why `ports` cannot be job `job_id`'s agent ports because of another live job."""
        for other, theirs in sorted(self._port_ranges().items()):
            if other != job_id and _overlaps(ports, theirs):
                return f"overlap job {other}'s agent ports {port_span(theirs)}"
        return None

    def _resolve_agent_port(self, spec: JobSpec,
                            held: dict[str, installer.SwitchSnapshot]) -> JobSpec:
        """The spec with the agent ports it will have: the explicit ones if free, else the
        lowest free range from 61000.

        Ranges of live jobs must not overlap: each switch guards a port for one job only, and
        agents of two jobs on one host port would receive each other's results. Ports guarded on
        the job's switches by entries no live job accounts for (left by a lost state file) are
        avoided as well, and so is the aggregation port, which the guard never sees."""
        width = spec.port_width(self.topo)
        guarded = {port: s for s, snap in held.items() for port in snap.guards}
        if spec.agent_port:
            ports = range(spec.agent_port, spec.agent_port + width)
            problem = None
            if ports.stop - 1 > MAX_UDP_PORT:
                problem = f"run past {MAX_UDP_PORT} ({width} ports, one per GPU of a host)"
            elif P.PASSING_UDP_PORT in ports:
                problem = f"include {P.PASSING_UDP_PORT}, the switches' aggregation port"
            else:
                problem = self._port_clash(spec.job_id, ports)
            stray = [p for p in ports if p in guarded]
            if problem is None and stray:
                problem = (f"include port {stray[0]}, which switch {guarded[stray[0]]} guards "
                           "for no known job (a stray entry: see `passing-ctl reconcile "
                           "--dry-run`)")
            if problem:
                raise ControllerError(f"job {spec.job_id}: agent ports {port_span(ports)} "
                                      f"{problem}; pass another --agent-port, or none to get a "
                                      "free range")
            return spec
        taken = set(guarded) | {P.PASSING_UDP_PORT}
        taken.update(p for r in self._port_ranges().values() for p in r)
        base = DEFAULT_AGENT_PORT_BASE
        while base + width - 1 <= MAX_UDP_PORT:
            busy = [p for p in range(base, base + width) if p in taken]
            if not busy:
                return dataclasses.replace(spec, agent_port=base)
            base = busy[-1] + 1
        raise ControllerError(f"job {spec.job_id}: no {width} consecutive free agent ports in "
                              f"{DEFAULT_AGENT_PORT_BASE}..{MAX_UDP_PORT}")

    def _guard_claims(self) -> GuardClaims:
        """Which live jobs want each port guarded on each switch. Jobs created by this
        controller never share a port, but records from before ports were allocated may: the
        lowest job id then guards it, so that repeated reconciles agree."""
        claims: GuardClaims = {}
        for rec in self.store.jobs():  # by job id
            ports = JobSpec.from_dict(rec.spec).agent_ports(self.topo)
            for pool in rec.pools:
                for port in ports:
                    claims.setdefault((pool.switch, port), []).append((rec.job_id, pool.stat_idx))
        return claims

    def _desired(self, job_plan: JobPlan, rec: JobRecord, pool: PoolRecord,
                 claims: GuardClaims) -> installer.Desired:
        """What job `rec` should have on pool.switch: its pool's entries under the job's pool
        bit, and the job_config entry of its retiring pool there, if any."""
        params = installer.PoolParams(pool.base, pool.size, pool.gen, pool.stat_idx,
                                      pool.mcast_grp, P.pool_epoch(rec.pool_epoch))
        # The retiring pool is always the one before (a resize waits for it to retire).
        old = next((installer.OldPool(r.base, r.size, r.gen, P.pool_epoch(rec.pool_epoch - 1))
                    for r in rec.retiring
                    if r.switch == pool.switch), None)
        jid = job_plan.spec.job_id
        guard_ports = [port for port in job_plan.spec.agent_ports(self.topo)
                       if claims.get((pool.switch, port), [(jid, 0)])[0][0] == jid]
        return installer.desired(job_plan.roles[pool.switch], params, jid,
                                 self.topo.switches[pool.switch], guard_ports,
                                 job_plan.quorum_at(pool.switch), old)

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
        self.job(job_id)  # an unknown job is refused with the jobs there are
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
                job_plan = plan(spec, self.topo)
            except JobError as e:
                raise ControllerError(str(e)) from None
            return spec.to_dict()

        rec = self.store.update_spec(job_id, change)
        if quorum is None:
            return rec
        claims = self._guard_claims()
        for pool in rec.pools:
            d = self._desired(job_plan, rec, pool, claims)
            conn = self.conn(pool.switch)
            try:
                installer.repair(conn, installer.SwitchSnapshot.read(conn), d)
            except SwitchError as e:
                raise SwitchFailure(f"job {job_id}: quorum recorded, but {pool.switch} was not "
                                    f"updated: {e}; fix the switch and run reconcile") from None
        return rec

    def quorums(self, job_id: int) -> dict[str, dict[str, int]]:
        """Per switch of the job: its fan-in and the quorum it is configured with."""
        rec = self.job(job_id)
        job_plan = plan(JobSpec.from_dict(rec.spec), self.topo)
        return {p.switch: {"fan_in": p.fan_in, "quorum": job_plan.quorum_at(p.switch)}
                for p in rec.pools}

    def job(self, job_id: int) -> JobRecord:
        rec = self.store.get_job(job_id)
        if rec is None:
            known = ", ".join(str(j.job_id) for j in self.store.jobs()) or "none"
            raise ControllerError(f"no job {job_id} (jobs: {known})")
        return rec

    def delete_job(self, job_id: int) -> JobRecord:
        """Remove the job's entries, a retiring pool's included, and free all its slots."""
        rec = self.job(job_id)
        spec = JobSpec.from_dict(rec.spec)
        job_plan = plan(spec, self.topo)
        claims = self._guard_claims()
        for pool in rec.pools:
            d = self._desired(job_plan, rec, pool, claims)
            # A port another live job also receives on (older records only) passes to it
            # rather than going unguarded.
            heirs = {}
            for port in list(d.guards):
                others = [c for c in claims[pool.switch, port] if c[0] != job_id]
                if others:
                    heirs[port] = others[0][1]
                    del d.guards[port]
            try:
                installer.remove(self.conn(pool.switch), d)
                installer.hand_over_guards(self.conn(pool.switch), heirs)
            except SwitchError as e:
                raise SwitchFailure(f"job {job_id} kept: {e}; fix the switch and repeat") \
                    from None
        return self.store.remove_job(job_id)

    def agent_params(self, job_id: int) -> JobParams:
        """Everything a host agent needs to join the job (passing.contract, docs/controller.md)."""
        rec = self.job(job_id)
        spec = JobSpec.from_dict(rec.spec)
        job_plan = plan(spec, self.topo)
        hosts = []
        for pool in rec.pools:
            sw = self.topo.switches[pool.switch]
            if sw.role != "tor":
                continue
            for m in job_plan.roles[pool.switch].members:
                hosts.append(HostParams(m.name, host_ip=m.ip, switch_ip=sw.ip,
                                        switch_mac=sw.mac, contributor_id=m.contributor,
                                        local_gpus=self.topo.hosts[m.name].gpus))
        window, epoch = rec.pools[0].size, rec.pool_epoch
        if rec.installing:
            # A resize whose entries may not be on every switch yet: agents that moved now
            # would send into a pool some switch does not have.
            window, epoch = rec.retiring[0].size, epoch - 1
        return JobParams(job_id, spec.mode, spec.session_key,
                         switch_udp_port=P.PASSING_UDP_PORT, agent_udp_port=spec.udp_port,
                         window=window, hosts=tuple(hosts),
                         patience=spec.patience, staleness=spec.staleness, pool=epoch,
                         policy=spec.policy)

    def resize_job(self, job_id: int, window: int,
                   min_window: int | None = None) -> JobRecord:
        """Move a running job to a new pool of `window` slots on each of its switches (at
        least `min_window` when short), beside its current one, which retires once every host
        uses the new one (controller.resize, docs/controller.md "Live pool resizing")."""
        return resize.resize_job(self, job_id, window, min_window)

    def retire_pools(self, job_id: int) -> resize.PoolMove:
        """Free the job's retiring pools if every host has moved to its new pool; which hosts
        have and which have not (controller.resize)."""
        return resize.retire_pools(self, job_id)

    # -- observation ----------------------------------------------------------------------------
    def slots(self) -> dict[str, SlotAllocator]:
        return self._allocators(list(self.topo.switches))

    def stats(self, job_id: int, unread: dict[str, str] | None = None
              ) -> dict[str, dict[str, int | str | dict[str, int]]]:
        """Per switch of the job: its counters (StatsCounters.job), its fan-in and quorum, its
        late contributions by member ("late_by") and, under "switch_drops", that switch's
        drops counted for no job, so that every packet the switch dropped is accounted for in
        one place or the other. During a resize, "move_error" when whether the hosts have
        moved could not be told (as in `job show`). A switch that cannot be reached or read
        has only its fan-in, its quorum, "error" (and "move_error"): the others' counters
        are still read. `unread` (switch -> why), shared by the calls of one command, names
        the switches already found unreadable, which are not asked again (each costs the
        connection's retries), and gains those found now."""
        unread = {} if unread is None else unread
        move_error = None
        try:
            self.retire_pools(job_id)  # frees an old pool every host has left (a resize)
        except ControllerError as e:
            # Freeing the old pool is a side task here, as in `job show`: its failing (a ToR
            # not answering the pool_contribs read, a delete refused) must not cost the
            # counters.
            move_error = str(e)
        rec = self.job(job_id)
        job_plan = plan(JobSpec.from_dict(rec.spec), self.topo)
        out: dict[str, dict[str, int | str | dict[str, int]]] = {}
        for p in rec.pools:
            plan_part = {"quorum": job_plan.quorum_at(p.switch), "fan_in": p.fan_in}
            if move_error is not None:
                plan_part["move_error"] = move_error
            if p.switch in unread:
                out[p.switch] = {**plan_part, "error": unread[p.switch]}
                continue
            try:
                counters = StatsCounters(self.conn(p.switch))
                late = counters.late(p.stat_idx)
                read = {**counters.job(p.stat_idx), "switch_drops": counters.global_drops()}
            except (SwitchFailure, SwitchError) as e:
                # A switch that is down is when an operator most needs the others' counters:
                # they are given, and this one's row says why it has none.
                unread[p.switch] = str(e)
                out[p.switch] = {**plan_part, "error": str(e)}
                continue
            # Late contributions by the member that sent them (a host, or a ToR at the spine).
            late_by = {m.name: n for m in job_plan.roles[p.switch].members
                       if (n := sum(late.get(c, 0) for c in m.ids))}
            out[p.switch] = {**read, **plan_part, "late_by": late_by}
        return out

    def reconcile(self, fix: bool = True) -> dict[str, dict[str, list[str]]]:
        """Compare every switch with the job table. With fix, re-install what is missing or
        wrong. Stray entries (no known job) are reported, never removed."""
        wanted: dict[str, dict[int, installer.Desired]] = {s: {} for s in self.topo.switches}
        claims = self._guard_claims()
        records = self.store.jobs()
        for rec in records:
            job_plan = plan(JobSpec.from_dict(rec.spec), self.topo)
            for pool in rec.pools:
                wanted[pool.switch][rec.job_id] = self._desired(job_plan, rec, pool, claims)
        report = {}
        unsettled: set[str] = set()  # switches left with errors or differences
        for name in self.topo.switches:
            entry: dict[str, list[str]] = {"repaired": [], "stray": [], "errors": []}
            report[name] = entry
            unsettled.add(name)
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
                        continue
                snap = installer.SwitchSnapshot.read(self.conn(name))
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
                self.store.resize_installed(rec.job_id, rec.pool_epoch)
        return report

    def _repair(self, name: str, snap: installer.SwitchSnapshot, d: installer.Desired) -> None:
        """installer.repair, with the counters a missing entry needs: zero pool_contribs of a
        pool installed afresh before it can count (see resize), and zero every row of a job
        the switch held nothing of (a reused counter row must start from zero)."""
        jid = d.job.job_id
        conn = self.conn(name)
        counters = StatsCounters(conn)
        if (jid, d.job.pool) not in snap.jobs:
            conn.write(counters.pool_reset_updates(d.job.stat_idx, d.job.pool))
        installer.repair(conn, snap, d)
        if not any(j == jid for j, _ in snap.jobs):
            conn.write(counters.reset_updates(d.job.stat_idx))
