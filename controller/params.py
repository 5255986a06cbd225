"""A recorded job as its host agents see it: the parameters they join with (passing.contract,
docs/controller.md "Host agents' parameters")."""

from __future__ import annotations

from controller.job_plan import JobSpec, plan
from controller.records import JobRecord
from controller.topology import Topology
from passing import protocol as P
from passing.contract import HostParams, JobParams


def job_params(rec: JobRecord, topo: Topology) -> JobParams:
    """Everything a host agent of job `rec` on `topo` needs to join it."""
    spec = JobSpec.from_dict(rec.spec)
    job_plan = plan(spec, topo)
    hosts = []
    for pool in rec.pools:
        sw = topo.switches[pool.switch]
        if sw.role != "tor":
            continue
        for m in job_plan.roles[pool.switch].members:
            hosts.append(HostParams(m.name, host_ip=m.ip, switch_ip=sw.ip,
                                    switch_mac=sw.mac, contributor_id=m.contributor,
                                    local_gpus=topo.hosts[m.name].gpus))
    window, epoch = rec.pools[0].size, rec.pool_epoch
    if rec.installing:
        # A resize whose entries may not be on every switch yet: agents that moved now
        # would send into a pool some switch does not have.
        # (A job that waited for slots had none: its agents stay on the host collective.)
        window, epoch = (rec.retiring[0].size if rec.retiring else 0), epoch - 1
    return JobParams(rec.job_id, spec.mode, spec.session_key,
                     switch_udp_port=P.PASSING_UDP_PORT, agent_udp_port=spec.udp_port,
                     window=window, hosts=tuple(hosts),
                     patience=spec.patience, staleness=spec.staleness, pool=epoch,
                     policy=spec.policy)
