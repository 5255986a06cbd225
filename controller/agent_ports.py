"""Where a job's agents receive results: a range of UDP ports per job that no other live job's
overlaps, and which job's counter row each switch's result guard counts a forged result into.

Ranges of live jobs must not overlap: each switch guards a port for one job only, and agents of
two jobs on one host port would receive each other's results."""

from __future__ import annotations

import dataclasses

from controller import installer
from controller.errors import ControllerError
from controller.job_plan import DEFAULT_AGENT_PORT_BASE, JobSpec
from controller.store import JobStore
from controller.topology import Topology
from passing import protocol as P

MAX_UDP_PORT = 0xFFFF

# (switch, UDP port) -> (job id, stat_idx) of each live job that receives on that port and has a
# pool on that switch, by job id
GuardClaims = dict[tuple[str, int], list[tuple[int, int]]]


def port_span(ports: range) -> str:
    """`61000` or `61000-61003`, as operators read a port range."""
    return str(ports.start) if len(ports) == 1 else f"{ports.start}-{ports.stop - 1}"


def _overlaps(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


class AgentPorts:
    """The agent ports of the jobs recorded in `store`, on the hosts of `topo`."""

    def __init__(self, topo: Topology, store: JobStore) -> None:
        self.topo = topo
        self.store = store

    def ranges(self) -> dict[int, range]:
        """job id -> the agent ports of every live job."""
        return {rec.job_id: JobSpec.from_dict(rec.spec).agent_ports(self.topo)
                for rec in self.store.jobs()}

    def clash(self, job_id: int, ports: range) -> str | None:
        """Why `ports` cannot be job `job_id`'s agent ports because of another live job."""
        for other, theirs in sorted(self.ranges().items()):
            if other != job_id and _overlaps(ports, theirs):
                return f"overlap job {other}'s agent ports {port_span(theirs)}"
        return None

    def resolve(self, spec: JobSpec, held: dict[str, installer.SwitchSnapshot]) -> JobSpec:
        """The spec with the agent ports it will have: the explicit ones if free, else the
        lowest free range from 61000.

        Ports guarded on the job's switches (`held`) by entries no live job accounts for (left
        by a lost state file) are avoided as well, and so is the aggregation port, which the
        guard never sees."""
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
                problem = self.clash(spec.job_id, ports)
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
        taken.update(p for r in self.ranges().values() for p in r)
        base = DEFAULT_AGENT_PORT_BASE
        while base + width - 1 <= MAX_UDP_PORT:
            busy = [p for p in range(base, base + width) if p in taken]
            if not busy:
                return dataclasses.replace(spec, agent_port=base)
            base = busy[-1] + 1
        raise ControllerError(f"job {spec.job_id}: no {width} consecutive free agent ports in "
                              f"{DEFAULT_AGENT_PORT_BASE}..{MAX_UDP_PORT}")

    def guard_claims(self) -> GuardClaims:
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
