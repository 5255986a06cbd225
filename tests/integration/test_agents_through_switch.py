"""Host agents as real processes in their own network namespaces, G=2 local ranks each, the
controller setting up the job, the switch a separate process (the model, and BMv2 when
installed) on veth links: every host gets the correct sum, also with random loss on every
host link in both directions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from controller.core import Controller, Endpoint
from controller.job_plan import JobSpec
from controller.topology import load
from passing.pipeline_files import topology_file
from testbed.fabric import Fabric
from testbed.netns_hosts import NetnsHosts


@pytest.fixture
def star_hosts(target, tmp_path):
    fabric = Fabric(target, {"s1": 4})
    hosts = None
    try:
        topo = load(topology_file("star"))
        hosts = NetnsHosts(fabric, topo)
        with Controller(topo, {"s1": Endpoint("s1", fabric["s1"].grpc_address, 0)},
                        tmp_path / "state.sqlite") as ctl:
            ctl.prepare("s1")
            ctl.create_job(JobSpec(1, tuple(topo.hosts), window=32))
            params = tmp_path / "job1.json"
            params.write_text(ctl.agent_params(1).to_json())
        yield hosts, params
    finally:
        if hosts is not None:
            hosts.close()
        fabric.close()


def run_agents(hosts: NetnsHosts, params, size: str, timeout: float = 300) -> dict:
    procs = {h: hosts.popen(h, [sys.executable, "-m", "passing_agent.cli", "--params", str(params),
                                "--host", h, "--size", size, "--iters", "2", "--json",
                                "--rto", "0.05", "--timeout", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for h in hosts.ns}
    out = {}
    for h, p in procs.items():
        stdout, stderr = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"{h}: {stdout} {stderr[-500:]}"
        out[h] = json.loads(stdout)
    return out


# Sizes with enough packets that the rules drop some in every run but about one in e^35 (39
# drops measured at 1% with 32K values, 52 at 5% with 8K). At 1% with 8K (about 9 expected)
# a CI run once saw no retransmission; the rules' counters now tell bad luck from a recovery
# that did not happen.
@pytest.mark.parametrize("loss,size", [(0.0, "8K"), (1.0, "32K"), (5.0, "8K")])
def test_every_host_gets_the_sum(star_hosts, loss, size):
    hosts, params = star_hosts
    hosts.set_loss(loss)
    res = run_agents(hosts, params, size)
    for h, r in res.items():
        assert r["correct"] and r["contributors"] == 8, (h, r)
    dropped = hosts.dropped()
    if loss:
        # Each drop left some host without a slot's result: only a resend gets it back.
        assert dropped > 0
        assert sum(r["retransmissions"] for r in res.values()) > 0, dropped
    else:
        assert dropped == 0
