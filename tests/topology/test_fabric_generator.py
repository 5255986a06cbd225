"""python -m topologies.fabric: generated fabrics load as topology files, with the hosts, GPUs,
spines, pods, cores and link rates asked for; numbers that make no fabric are refused naming
the option."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from controller.job_plan import JobSpec, plan
from controller.topology import load
from tests import REPO
from topologies import fabric


def generate(tmp_path, *args: str):
    out = tmp_path / "fabric.json"
    assert fabric.main([*args, "-o", str(out)]) == 0
    return load(out)


def test_32_racks_of_32_hosts_with_8_gpus_under_4_spines(tmp_path):
    t = generate(tmp_path, "--racks", "32", "--hosts-per-rack", "32", "--gpus", "8",
                 "--spines", "4")
    assert len(t.hosts) == 1024 and all(h.gpus == 8 for h in t.hosts.values())
    assert [s.role for s in t.switches.values()] == ["tor"] * 32 + ["spine"] * 4
    assert t.name == "fabric-32x32x8-4sp"
    for r in range(1, 33):
        tor = f"tor{r}"
        assert [h.port for h in t.hosts_in(tor)] == list(range(1, 33))
        # Every ToR up to every spine on ports 33-36, arriving on the spine's port r.
        assert [(u.upper, u.lower_port, u.upper_port) for u in t.uplinks_of(tor)] == [
            (f"spine{s}", 32 + s, r) for s in range(1, 5)]
    assert t.hosts["h33"].rack == "tor2" and t.hosts["h1024"].rack == "tor32"
    # Non-blocking by default: 32 hosts x 100 Mbit/s over 4 spine links of 800.
    assert {h.link.bw for h in t.hosts.values()} == {100}
    assert {u.link.bw for u in t.uplinks} == {800}
    nodes = [*t.hosts.values(), *t.switches.values()]
    assert len({n.ip for n in nodes}) == len({n.mac for n in nodes}) == len(nodes) == 1060
    # The controller plans a job over one host of every rack through one spine.
    p = plan(JobSpec(1, tuple(f"h{32 * r + 1}" for r in range(32)), 8), t)
    assert p.tree == ("spine1",) and p.roles["spine1"].fan_in == 32 and p.depth == 1


def test_three_tiers_with_pods_cores_and_oversubscription(tmp_path):
    t = generate(tmp_path, "--racks", "8", "--hosts-per-rack", "4", "--spines", "2", "--pods",
                 "2", "--cores", "2", "--oversubscription", "4", "--bw", "1000",
                 "--name", "threetier")
    assert t.name == "threetier" and len(t.hosts) == 32
    assert [s.name for s in t.switches.values()] == [
        *(f"tor{r}" for r in range(1, 9)), *(f"spine{s}" for s in range(1, 5)), "core1", "core2"]
    assert [u.upper for u in t.uplinks_of("tor3")] == ["spine1", "spine2"]
    assert [u.upper for u in t.uplinks_of("tor5")] == ["spine3", "spine4"]
    assert [u.upper for u in t.uplinks_of("spine4")] == ["core1", "core2"]
    assert {t.pod_of(f"tor{r}") for r in range(1, 5)} == {"tor1"}
    assert {t.pod_of(f"tor{r}") for r in range(5, 9)} == {"tor5"}
    # A spine's ports: its pod's 4 ToRs, then the cores; a core's: the 4 spines.
    assert t.ports_of("spine3") == {1: "tor5", 2: "tor6", 3: "tor7", 4: "tor8",
                                    5: "core1", 6: "core2"}
    assert t.ports_of("core2") == {1: "spine1", 2: "spine2", 3: "spine3", 4: "spine4"}
    # 4 x 1000 Mbit/s of hosts, 4:1, over 2 spines: 500 each; a spine's 4 x 500 over 2 cores.
    assert {u.link.bw for u in t.uplinks if u.upper.startswith("spine")} == {500}
    assert {u.link.bw for u in t.uplinks if u.upper.startswith("core")} == {1000}


def test_uplink_bw_sets_every_switch_link(tmp_path):
    t = generate(tmp_path, "--racks", "4", "--hosts-per-rack", "2", "--spines", "1",
                 "--pods", "2", "--cores", "1", "--uplink-bw", "40")
    assert {u.link.bw for u in t.uplinks} == {40} and len(t.uplinks) == 4 + 2


def test_one_rack_needs_no_spine(tmp_path):
    t = generate(tmp_path, "--racks", "1", "--hosts-per-rack", "3", "--spines", "0")
    assert list(t.switches) == ["tor1"] and t.uplinks == []


@pytest.mark.parametrize("args,message", [
    (["--racks", "8", "--pods", "3", "--cores", "1"], "--pods 3: must divide --racks 8"),
    (["--racks", "8", "--pods", "2"], "--cores: pods are joined through cores"),
    (["--racks", "2", "--spines", "0"], "--spines: racks are joined through spines"),
    (["--racks", "2", "--gpus", "0"], "--gpus: at least 1"),
    (["--racks", "2", "--bw", "0"], "--bw: must be positive"),
    (["--racks", "2", "--hosts-per-rack", "509", "--spines", "2"],
     "a ToR would need 511 ports, at most 510"),
    (["--racks", "2", "--uplink-bw", "5", "--oversubscription", "2"], "not allowed with"),
])
def test_numbers_that_make_no_fabric_are_refused_naming_the_option(args, message, capsys):
    if "--hosts-per-rack" not in args:
        args = [*args, "--hosts-per-rack", "2"]
    with pytest.raises(SystemExit) as e:
        fabric.main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_the_module_runs_and_documents_its_options(tmp_path):
    help_text = subprocess.run([sys.executable, "-m", "topologies.fabric", "--help"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout
    for option in ("--racks", "--hosts-per-rack", "--gpus", "--spines", "--pods", "--cores",
                   "--bw", "--uplink-bw", "--oversubscription", "--name", "--output"):
        assert option in help_text, option
    out = subprocess.run([sys.executable, "-m", "topologies.fabric", "--racks", "2",
                          "--hosts-per-rack", "2", "--spines", "2"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    path = tmp_path / "stdout.json"
    path.write_text(out)
    assert len(load(path).hosts) == 4 and json.loads(out)["name"] == "fabric-2x2x1-2sp"
