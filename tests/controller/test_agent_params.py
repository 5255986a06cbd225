"""The controller's side of the contract (passing.contract): the parameters it hands to the
agents of star and leaf-spine jobs, in both modes, validate and carry the topology's and the
job's values. No frames are sent: `make_control` (the model in-process, no root)."""

from __future__ import annotations

import json

import pytest

from controller.cli import main
from controller.job_plan import JobSpec
from passing import protocol as P
from passing.contract import JobParams

CASES = [  # topology, hosts, mode, expected (switch, contributor id) per host
    ("star", ("h1", "h2", "h4"), "passing", {"h1": ("s1", 0), "h2": ("s1", 1), "h4": ("s1", 2)}),
    ("star", ("h2", "h3"), "ina", {"h2": ("s1", 0), "h3": ("s1", 2)}),
    ("leafspine", ("h1", "h2", "h3", "h4"), "passing",
     {"h1": ("tor1", 0), "h2": ("tor1", 1), "h3": ("tor2", 0), "h4": ("tor2", 1)}),
    ("leafspine", ("h2", "h3", "h4"), "ina",
     {"h2": ("tor1", 0), "h3": ("tor2", 0), "h4": ("tor2", 2)}),
]


@pytest.mark.parametrize(("topo", "hosts", "mode", "where"), CASES,
                         ids=[f"{t}-{m}-{len(h)}" for t, h, m, _ in CASES])
def test_params_carry_the_jobs_values(make_control, topo, hosts, mode, where):
    ctl, _ = make_control(topo)
    rec = ctl.create_job(JobSpec(5, hosts, window=24, mode=mode))
    params = ctl.agent_params(5)
    # Valid by construction, and the same after a trip through JSON (what agents read).
    assert JobParams.from_json(params.to_json()) == params
    assert (params.job_id, params.mode, params.window) == (5, mode, 24)
    assert params.session_key == rec.spec["session_key"] and len(params.session_key) >= 32
    assert params.switch_udp_port == P.PASSING_UDP_PORT
    assert params.agent_udp_port == JobSpec.from_dict(rec.spec).udp_port
    assert params.host_names == sorted(hosts)
    for name, (switch, cid) in where.items():
        hp, h, sw = params.host(name), ctl.topo.hosts[name], ctl.topo.switches[switch]
        assert (hp.host_ip, hp.local_gpus, hp.contributor_id) == (h.ip, h.gpus, cid)
        assert (hp.switch_ip, hp.switch_mac) == (sw.ip, sw.mac)
    gpus = sum(ctl.topo.hosts[h].gpus for h in hosts)
    assert params.streams == (gpus if mode == "ina" else len(hosts))
    # What the switches admit: the ids each ToR's job_admission entries hold are the agents'.
    for pool in rec.pools:
        if ctl.topo.switches[pool.switch].role != "tor":
            continue
        at_tor = {cid for hp in params.hosts if hp.switch_ip == ctl.topo.switches[pool.switch].ip
                  for cid in params.contributor_ids(hp.name)}
        assert at_tor == set(range(pool.fan_in)), pool.switch


def test_job_show_prints_the_contract(make_control, tmp_path, capsys):
    ctl, _ = make_control("leafspine")
    assert main(["job", "create", "3", "--hosts", "h1,h3", "--window", "8", "--mode", "ina",
                 "--params-out", str(tmp_path / "job3.json")], ctl=ctl) == 0
    capsys.readouterr()
    assert main(["job", "show", "3", "--json"], ctl=ctl) == 0
    doc = json.loads(capsys.readouterr().out)["agent_params"]
    assert doc["version"] == 1 and doc["window"] == 8 and doc["mode"] == "ina"
    assert set(doc) == {"version", "job_id", "mode", "session_key", "switch_udp_port",
                        "agent_udp_port", "window", "values_per_packet", "patience",
                        "staleness", "pool", "hosts"}
    assert doc["patience"] == [] and doc["staleness"] == 1  # no straggler policy: BSP
    # Never changed: no policy number, so agents that know none still read the document.
    assert JobParams.from_dict(doc).policy == 0
    assert JobParams.from_dict(doc) == JobParams.load(tmp_path / "job3.json") \
        == ctl.agent_params(3)


def test_a_job_stored_under_another_k_is_read_with_the_builds_k(make_control):
    """K is one compile-time number for switches and agents; a job's entries do not depend on
    it. A job table written by a build of another K (an older runs/ directory) still loads:
    before, the stored K stopped `make run-topology` at its start."""
    ctl, _ = make_control("star")
    rec = ctl.create_job(JobSpec(5, ("h1", "h2"), window=8))
    other = next(k for k in P.K_CHOICES if k != P.K)
    spec = JobSpec.from_dict({**rec.spec, "k": other})
    assert spec == JobSpec.from_dict(rec.spec) and spec.k == P.K
