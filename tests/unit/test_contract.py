"""The controller-agent contract (passing.contract): JSON round trip, what agents derive, and a
clear error naming the field for every bad value, old format and foreign version."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys

import pytest

from passing.contract import FORMAT_VERSION, HostParams, JobParams, ParamsError


def host(name: str, cid: int, gpus: int = 2, switch_ip: str = "10.0.1.254") -> HostParams:
    return HostParams(name, host_ip=f"10.0.1.{cid + 1}", switch_ip=switch_ip,
                      switch_mac="08:00:00:00:01:fe", contributor_id=cid, local_gpus=gpus)


def job(mode: str = "passing", **kw) -> JobParams:
    hosts = (host("h2", 1), host("h1", 0), host("h3", 0, switch_ip="10.0.2.254"))
    if mode == "ina":
        hosts = (host("h1", 0), host("h2", 2), host("h3", 0, switch_ip="10.0.2.254"))
    args = {"job_id": 7, "mode": mode, "session_key": "ab" * 16, "switch_udp_port": 48879,
            "agent_udp_port": 61000, "window": 32, "hosts": hosts, **kw}
    return JobParams(**args)


@pytest.mark.parametrize("mode", ["passing", "ina"])
def test_json_round_trip_keeps_every_field(mode):
    params = job(mode)
    doc = json.loads(params.to_json())
    assert doc["version"] == FORMAT_VERSION and doc["switch_udp_port"] == 48879
    assert doc["hosts"]["h1"] == {"host_ip": "10.0.1.1", "switch_ip": "10.0.1.254",
                                  "switch_mac": "08:00:00:00:01:fe", "contributor_id": 0,
                                  "local_gpus": 2}
    assert JobParams.from_json(params.to_json()) == params
    assert JobParams.from_dict(params.to_dict()) == params
    # passing-agent hands the parameters to its spawned ranks by pickling.
    assert pickle.loads(pickle.dumps(params)) == params


def test_the_quorum_policy_travels_and_older_files_without_it_mean_none():
    params = job(patience=(0.005, 0.05), staleness=4)
    doc = json.loads(params.to_json())
    assert doc["patience"] == [0.005, 0.05] and doc["staleness"] == 4
    assert JobParams.from_json(params.to_json()) == params
    assert JobParams.from_json(job(patience=(0.05,)).to_json()).patience == (0.05,)
    older = job().to_dict()
    del older["patience"], older["staleness"]
    assert JobParams.from_dict(older) == job() and job().patience == () \
        and job().staleness == 1
    # The policy number: written once a `job set` raised it, absent (0) before, as agents of
    # the release before it expect.
    assert "policy" not in job().to_dict()
    changed = job(patience=(0.05,), policy=3)
    assert changed.to_dict()["policy"] == 3 and JobParams.from_json(changed.to_json()) == changed
    with pytest.raises(ParamsError, match="policy: -1 outside"):
        job(policy=-1)


def test_load_reads_a_file_and_names_an_unreadable_one(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(job().to_json())
    assert JobParams.load(path) == job()
    with pytest.raises(ParamsError, match="cannot read .*nope.json"):
        JobParams.load(tmp_path / "nope.json")
    path.write_text("{")
    with pytest.raises(ParamsError, match="not JSON"):
        JobParams.load(path)


def test_derived_quantities_per_mode():
    passing, ina = job("passing"), job("ina")
    assert passing.host_names == ["h1", "h2", "h3"] and passing.host_index("h3") == 2
    # passing: one stream per host, whatever its GPUs; ina: one per GPU.
    assert passing.streams == 3 and ina.streams == 6 and passing.gpus == ina.gpus == 6
    assert passing.contributor_ids("h2") == range(1, 2)
    assert passing.agent_udp_ports("h2") == range(61000, 61001)
    assert ina.contributor_ids("h2") == range(2, 4)
    assert ina.agent_udp_ports("h2") == range(61000, 61002)
    with pytest.raises(ParamsError, match=r"host h9 is not in job 7 \(hosts: h1, h2, h3\)"):
        passing.host("h9")


BAD_FIELDS = [
    ("job_id", 0, "job_id: 0 outside 1..65535"),
    ("job_id", True, "job_id: True is not an integer"),
    ("mode", "switchml", "mode: 'switchml' is not one of passing, ina"),
    ("session_key", "xyz", "session_key: not a hexadecimal"),
    ("session_key", "abc", "session_key: not a hexadecimal"),
    ("switch_udp_port", 70000, "switch_udp_port: 70000 outside 1..65535"),
    ("switch_udp_port", "48879", "switch_udp_port: '48879' is not an integer"),
    ("agent_udp_port", 0, "agent_udp_port: 0 outside 1..65535"),
    ("patience", (0.0,), r"patience \[0.0\]: \[\] \(rounds wait for everyone\)"),
    ("patience", (0.2, 0.1), r"patience \[0.2, 0.1\]: .*MIN <= MAX"),
    ("patience", (0.1, 0.2, 0.3), r"patience \[0.1, 0.2, 0.3\]"),
    ("patience", (float("inf"),), "patience .inf.: "),
    ("patience", [0.1], r"patience '\[0.1\]'|patience \[0.1\]"),
    ("staleness", -1, "staleness: -1 outside"),
    ("staleness", True, "staleness: True is not an integer"),
    ("window", -1, "window: -1 outside 0..4096"),  # 0: the job waits for switch slots
    ("window", 5000, "window: 5000 outside 0..4096"),
    ("hosts", (), "hosts: a job has at least one host"),
    ("hosts", [host("h1", 0)], "hosts: must be a tuple of HostParams"),
    ("hosts", (host("h1", 0), host("h1", 1)), "hosts: listed twice: h1"),
    ("hosts", (host("h1", 0), host("h2", 0)),
     "hosts.h2.contributor_id: id 0 at switch 10.0.1.254 is also h1's"),
    ("hosts", (host("h1", 0), host("h2", 2)),
     r"hosts.\*.contributor_id: the ids at switch 10.0.1.254 are not 0..n-1 \(missing 1\)"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD_FIELDS,
                         ids=[f"{f}={v!r}"[:40] for f, v, _ in BAD_FIELDS])
def test_a_bad_job_field_is_named(field, value, message):
    with pytest.raises(ParamsError, match=message):
        job(**{field: value})


BAD_HOST_FIELDS = [
    ("host_ip", "10.0.1", "hosts.h1.host_ip: '10.0.1' is not an IPv4 address"),
    ("switch_ip", None, "hosts.h1.switch_ip: None is not an IPv4 address"),
    ("switch_mac", "08:00:00:00:01", "hosts.h1.switch_mac: '08:00:00:00:01' is not a MAC"),
    ("contributor_id", -1, "hosts.h1.contributor_id: -1 outside 0..63"),
    ("contributor_id", 64, "hosts.h1.contributor_id: 64 outside 0..63"),
    ("local_gpus", 0, "hosts.h1.local_gpus: 0 outside 1..64"),
    ("name", "", "hosts: host name '' is not a non-empty string"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD_HOST_FIELDS,
                         ids=[f for f, _, _ in BAD_HOST_FIELDS])
def test_a_bad_host_field_is_named(field, value, message):
    with pytest.raises(ParamsError, match=message):
        dataclasses.replace(host("h1", 0), **{field: value})


def test_ina_ports_and_ids_must_fit():
    # h1's 4 ranks receive on 65534..65537: the last two do not exist.
    with pytest.raises(ParamsError, match="agent_udp_port: 65534 \\+ local ranks reaches 65537"):
        JobParams(1, "ina", "", 48879, 65534, 8, (host("h1", 0, gpus=4),))
    # The same host is fine as one passing stream.
    assert JobParams(1, "passing", "", 48879, 65535, 8, (host("h1", 0, gpus=4),)).streams == 1
    # 33 + 32 GPUs at one switch: 65 contributors, one more than the switch admits.
    with pytest.raises(ParamsError, match="65 contributors at switch 10.0.1.254, at most 64"):
        JobParams(1, "ina", "", 48879, 61000, 8,
                  (host("h1", 0, gpus=33), host("h2", 33, gpus=32)))


def test_missing_and_unknown_keys_are_named():
    doc = job().to_dict()
    del doc["window"]
    with pytest.raises(ParamsError, match="^window: missing$"):
        JobParams.from_dict(doc)
    doc = job().to_dict()
    doc["k"] = 64
    with pytest.raises(ParamsError, match="^k: unknown field"):
        JobParams.from_dict(doc)
    doc = job().to_dict()
    del doc["hosts"]["h1"]["switch_mac"]
    with pytest.raises(ParamsError, match="^hosts.h1.switch_mac: missing$"):
        JobParams.from_dict(doc)
    doc = job().to_dict()
    doc["hosts"]["h1"]["contributor"] = 0
    with pytest.raises(ParamsError, match="^hosts.h1.contributor: unknown field"):
        JobParams.from_dict(doc)
    doc = job().to_dict()
    doc["hosts"]["h1"]["local_gpus"] = "2"
    with pytest.raises(ParamsError, match="hosts.h1.local_gpus: '2' is not an integer"):
        JobParams.from_dict(doc)
    with pytest.raises(ParamsError, match="a JSON object, not list"):
        JobParams.from_dict([])


# What passing-ctl printed before the contract had a version (docs/controller.md of then).
OLD_FORMAT = {"job_id": 7, "mode": "passing", "session_key": "5f0c", "udp_port": 48879,
              "agent_port": 61000, "k": 64, "slots": 32, "scale_bits": 0, "hosts_total": 2,
              "streams": 2, "contributors_total": 4,
              "hosts": {"h1": {"host_ip": "10.0.0.1", "switch": "s1", "switch_ip": "10.0.0.254",
                               "switch_mac": "08:00:00:00:00:fe", "contributor": 0,
                               "local_gpus": 2}}}


def test_the_old_format_is_refused_with_how_to_regenerate():
    with pytest.raises(ParamsError) as e:
        JobParams.from_dict(OLD_FORMAT)
    msg = str(e.value)
    assert "format before version 1" in msg and "agent_port" in msg and "slots" in msg
    assert "passing-ctl job show 7 --json | jq .agent_params" in msg


@pytest.mark.parametrize("version", [2, "1", True])
def test_another_version_is_refused(version):
    doc = {**job().to_dict(), "version": version}
    with pytest.raises(ParamsError, match=f"version: agent parameters of format {version!r}, "
                                          "this agent reads format 1"):
        JobParams.from_dict(doc)


def test_the_contract_imports_without_torch():
    # The controller imports it, and the controller does not depend on torch.
    code = ("import sys; sys.modules['torch'] = None; import passing.contract, controller.core; "
            "print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_parameters_of_another_k_are_refused_and_say_which_k_to_run():
    """An agent of another K than its switches would have every packet dropped as malformed
    and time out; the parameters carry the controller's K, so it is told at once instead."""
    from passing import protocol as P

    doc = job().to_dict()
    assert doc["values_per_packet"] == P.K
    other = next(k for k in P.K_CHOICES if k != P.K)
    doc["values_per_packet"] = other
    with pytest.raises(ParamsError, match=f"values_per_packet: .*take {other} values per packet, "
                                          f"this process {P.K}: run the agents with "
                                          f"PASSING_K={other}"):
        JobParams.from_dict(doc)
    # Files written before the field existed still load (at this process's K).
    del doc["values_per_packet"]
    assert JobParams.from_dict(doc) == job()
