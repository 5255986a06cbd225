"""`make run-topology`'s machinery end to end: Mininet hosts and links, the switches (the model,
and BMv2 when installed), the controller, the default job, agents on every host, the management
network with the controller's parameter service, and PyTorch training with torchrun."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from controller.job_plan import JobSpec
from controller.topology import load
from passing import protocol as P
from tests import REPO
from topologies import link_loss, link_rate, train_results, training
from topologies import network as network_module
from topologies.exclusive import NetworkBusy
from topologies.management import MGMT_BRIDGE, ManagementError
from topologies.network import PassingNetwork
from topologies.reports import report_train


@pytest.fixture
def network(target, tmp_path):
    made = []

    def start(topo_name: str) -> PassingNetwork:
        path = REPO / "topologies" / f"{topo_name}.json"
        pnet = PassingNetwork(load(path), path, target, tmp_path / topo_name)
        made.append(pnet)
        pnet.start()
        return pnet
    yield start
    for pnet in made:
        pnet.stop()


@pytest.mark.parametrize("topo", ["star", "leafspine"])
def test_allreduce_on_every_host_is_correct(network, topo):
    pnet = network(topo)
    pnet.create_job(1, window=16)
    res = pnet.allreduce("16K", iters=1)
    assert set(res) == {"h1", "h2", "h3", "h4"}
    for host, r in res.items():
        assert r.get("ok") and r["correct"] and r["contributors"] == 8, (host, r)
        # Each host link carried the tensor at least once per call (16K float32 values), and
        # how busy it was is reported against its shipped rate.
        assert r["link_bytes_per_call"] >= 16 * 1024 * 4 and r["link_mbps"] == 100, r
        # ... counted by the host's agent around its timed call, the warm-up left out.
        assert r["link_bytes_per_call"] == max(r["timed_tx_bytes"], r["timed_rx_bytes"]), r
        assert min(r["timed_tx_bytes"], r["timed_rx_bytes"]) >= 16 * 1024 * 4, r
        assert 0 < r["link_busy"] == pytest.approx(
            r["link_bytes_per_call"] * 8 / (r["mean_s"] * 100e6)), r
    # Ordinary traffic crosses the same switches.
    h1, h4 = pnet.net.get("h1"), pnet.net.get("h4")
    # -w: keep going until 3 replies came back (an occasional lost echo through three software
    # switches sharing two cores is tolerated; forwarding itself must work)
    assert " 3 received" in h1.cmd(f"ping -c 3 -i 0.2 -w 10 {h4.IP()}")


def test_a_full_window_through_every_switch_is_not_resent(network):
    """With 64 slots of K values in flight per host through three switches, no switch
    drops a window's burst on its way in (see PassingSwitch._no_offload; without it this test
    saw BMv2 lose 4.6% and 11.9% of its packets) or out (BMv2Switch.deepen_egress_queues;
    without it, 2% in one run of four). Losses are what the order rule finds (packets
    overtaken by a later answer); a busy switch's pause may also cost a probe (1 + W/8
    packets), which is not a loss."""
    pnet = network("leafspine")
    pnet.create_job(1, window=64)
    before = _drops(pnet)
    res = pnet.allreduce("256K", iters=1)
    for host, r in res.items():
        assert r.get("ok") and r["correct"], (host, r)
        # Two calls (a warm-up, then the timed one) of 256K / K fragments each, and more.
        lost = r["fast_retransmissions"]
        # Where frames were dropped, should this fail (a drop counted nowhere here is the
        # switch's own: BMv2's capture ring or egress queues, or the model's sockets).
        where = {k: n - before.get(k, 0) for k, n in _drops(pnet).items()
                 if n != before.get(k, 0)}
        assert r["packets"] >= 2 * -(-256 * 1024 // P.K) and lost < 0.01 * r["packets"], \
            (host, lost, r["retransmissions"], r["probes"], r["packets"], where)
    ports = [i.name for s in pnet.net.switches for i in s.intfList() if i.name != "lo"]
    for name in ports:
        features = subprocess.run(["ethtool", "-k", name], capture_output=True, text=True,
                                  check=True).stdout
        assert all(f"{f}: on" not in features for f in (
            "tcp-segmentation-offload", "generic-segmentation-offload",
            "generic-receive-offload", "large-receive-offload")), (name, features)


def _drops(pnet: PassingNetwork) -> dict[str, int]:
    """Frames each data interface's queueing discipline dropped, each one's receive drops
    (the kernel's count for frames nothing could take), and each node's UDP errors (a full
    socket buffer), by name."""
    out = {}
    for node in (*pnet.net.switches, *pnet.net.hosts):
        names, values = (line.split() for line in node.cmd("grep Udp: /proc/net/snmp")
                         .splitlines()[:2])
        out.update({f"{node.name} udp {name}": int(v) for name, v in zip(names, values, strict=True)
                    if name.endswith("Errors")})
        for intf in node.intfList():
            if intf.name == "lo" or not node.cmd(f"ls /sys/class/net/{intf.name}").strip():
                continue
            qdisc = node.cmd(f"tc -s qdisc show dev {intf.name}")
            out[f"{intf.name} qdisc"] = sum(
                int(part.split(",")[0]) for part in qdisc.split("dropped ")[1:])
            out[f"{intf.name} rx"] = int(node.cmd(
                f"cat /sys/class/net/{intf.name}/statistics/rx_dropped").strip() or 0)
    return out


def _class_bytes(intf) -> int:
    """Bytes the link's htb class (topologies/link_rate.py) has sent."""
    out = intf.node.cmd(f"tc -s class show dev {intf.name}")
    return int(out.split("Sent ", 1)[1].split()[0])


def _quantum(intf) -> int:
    out = intf.node.cmd(f"tc -d class show dev {intf.name}")
    return int(out.split(" quantum ", 1)[1].split()[0])


def test_links_reshaped_live_take_the_new_rate_and_keep_the_hosts_offloads_off(network,
                                                                                 tmp_path):
    """bench.sweep measures several link rates on one network (PassingNetwork.set_link_rates):
    both ends of every link take the new rate, the traffic crosses it within that rate, the
    network reports against it, and the hosts' checksum offloads stay off (Mininet's own
    re-configuration would switch them on, and TCP through the software switches would
    break). A topology wired otherwise is refused and changes nothing."""
    pnet = network("leafspine")
    shipped = REPO / "topologies" / "leafspine.json"
    doc = json.loads(shipped.read_text())
    for link in doc["links"]:
        link["bw"] = 5
    slow = tmp_path / "leafspine-5mbit.json"
    slow.write_text(json.dumps(doc))
    star = load(REPO / "topologies" / "star.json")
    with pytest.raises(ValueError, match="not the running topology"):
        pnet.set_link_rates(star)
    ends = [i for ln in pnet.net.links for i in (ln.intf1, ln.intf2)]
    assert len(ends) == 12 and {link_rate.rate(i) for i in ends} == {100.0}
    # Built and re-shaped alike: htb's quantum set (no warning for Mininet to print as an
    # error at every start), the rest as Mininet's TCLink has it.
    assert {_quantum(i) for i in ends} == {link_rate.HTB_QUANTUM}
    pnet.set_link_rates(load(slow))
    assert {link_rate.rate(i) for i in ends} == {5.0}
    assert {_quantum(i) for i in ends} == {link_rate.HTB_QUANTUM}
    pnet.create_job(1)  # the target's default window, on every switch
    assert {p.size for p in pnet.ctl.job(1).pools} == \
        {network_module.DEFAULT_WINDOWS[pnet.target]}
    h1 = pnet.net.get("h1").defaultIntf()
    before = _class_bytes(h1)
    for strategy in ("ring", "passing"):
        res = pnet.allreduce("64K", iters=1, strategy=strategy)
        for host, r in res.items():
            assert r.get("ok") and r["correct"] and r["link_mbps"] == 5, (strategy, host, r)
            # A link carries at most its rate (what shaping is), give or take htb's burst
            # (15 KB at line rate when a call starts: up to ~10% of a call this short). Left
            # at 100 Mbit/s they would carry several times 5 Mbit/s (docs/benchmarks.md, "Where the
            # emulation is faithful").
            assert 0 < r["link_busy"] <= 1.25, (strategy, host, r)
    assert _class_bytes(h1) - before >= 2 * 64 * 1024 * 4  # the calls crossed the new class
    assert "tx-checksumming: off" in pnet.net.get("h1").cmd(f"ethtool -k {h1.name}")
    pnet.set_link_rates(load(shipped))
    assert {link_rate.rate(i) for i in ends} == {100.0}


def test_jobs_survive_a_controller_restart(network):
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=8)
    pnet.restart_controller()
    assert [j.job_id for j in pnet.ctl.store.jobs()] == [2]
    assert all(not r["repaired"] for r in pnet.ctl.reconcile().values())
    res = pnet.allreduce("4K", job_id=2, iters=1)
    assert set(res) == {"h1", "h2"} and all(r.get("correct") for r in res.values())


def test_one_percent_loss_on_every_link(network):
    pnet = network("leafspine")
    pnet.create_job(1, window=16)
    for link in pnet.net.links:
        pnet.set_loss(link.intf1.node.name, link.intf2.node.name, 1.0)
    assert link_loss.root_tables()  # the switches' side of every link
    # 32K values: enough frames that a run with no drop to recover from is all but impossible
    # (at 8K only a handful of drops a run were to be expected).
    res = pnet.allreduce("32K", iters=1)
    assert all(r.get("ok") and r["correct"] for r in res.values()), res
    assert sum(r["retransmissions"] for r in res.values()) > 0
    # The rules go with the network: a later run on the same interface names has no loss.
    pnet.stop()
    assert link_loss.root_tables() == []


def test_a_loss_rule_left_by_a_crashed_run_is_removed_at_start(network):
    """Tables for tor1-eth1 and tor2-eth1 as a crashed run (and, under the older name
    loss_<interface>, an older version) would have left them: the next network on those
    interface names removes them before any frame flows. The tables drop every frame, so h1
    and h3 would get no result at all if either were still hooked."""
    tables = {"tor1-eth1": link_loss.table_name("tor1-eth1"), "tor2-eth1": "loss_tor2_eth1"}
    for ifname, table in tables.items():
        subprocess.run(["nft", "-f", "-"], check=True, text=True, input=(
            f"table netdev {table} {{ chain c {{ type filter hook egress device \"{ifname}\" "
            "priority 0; drop; }; }\n"))
    try:
        pnet = network("leafspine")
        listed = subprocess.run(["nft", "list", "tables", "netdev"], capture_output=True,
                                text=True).stdout
        assert not any(t in listed.split() for t in tables.values()), listed
        pnet.create_job(1, window=16)
        res = pnet.allreduce("8K", iters=1)
        assert all(r.get("ok") and r["correct"] for r in res.values()), res
    finally:
        link_loss.remove_root_tables(list(tables))


def test_switch_links_left_by_a_killed_run_are_removed_at_start(network):
    """A run killed before its stop leaves its switch-to-switch veth pairs in the root
    namespace (tor1-eth3 to spine-eth1 on leafspine, as a CI run found them): the next network
    removes them and starts, and a call through the spine, from both racks, is correct on
    every host."""
    pairs = [("tor1-eth3", "spine-eth1"), ("tor2-eth3", "spine-eth2")]
    for a, b in pairs:
        subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
    try:
        pnet = network("leafspine")
        pnet.create_job(1, window=16)
        res = pnet.allreduce("8K", iters=1)
        assert set(res) == set(pnet.topo.hosts), res
        assert all(r.get("ok") and r["correct"] for r in res.values()), res
    finally:
        for a, _ in pairs:
            if Path("/sys/class/net", a).exists():
                subprocess.run(["ip", "link", "del", a], check=False)


def test_agents_stay_up_between_calls_and_a_dead_one_is_replaced(network):
    """Every host's passing-agent answers call after call (strategies alternating, each
    result checked) without starting again; one killed between calls is replaced by the
    next call, which is correct on every host."""
    pnet = network("star")
    pnet.create_job(1, window=16)
    for size, strategy in (("4K", "passing"), ("2K", "ring"), ("8K", "passing")):
        res = pnet.allreduce(size, iters=1, strategy=strategy)
        assert set(res) == {"h1", "h2", "h3", "h4"}
        assert all(r.get("ok") and r["correct"] and r["strategy"] == strategy
                   and r["rank_starts"] == 1 for r in res.values()), res
    assert pnet.agents.started == 4
    (victim,) = pnet.agents.processes("h2")
    victim.kill()
    victim.wait()
    res = pnet.allreduce("4K", iters=1)
    assert all(r.get("ok") and r["correct"] for r in res.values()), res
    assert pnet.agents.started == 5


def test_two_concurrent_jobs_on_disjoint_hosts(network):
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=8)
    pnet.create_job(3, ["h3", "h4"], window=8)
    results = {}
    threads = [threading.Thread(target=lambda j=j: results.update(
        {j: pnet.allreduce("8K", job_id=j, iters=1)})) for j in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert set(results[2]) == {"h1", "h2"} and set(results[3]) == {"h3", "h4"}
    assert all(r.get("correct") for res in results.values() for r in res.values()), results


FORGE = """
import socket, numpy as np
from passing import packet, protocol as P
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for slot in range(8):
    for cid in (0, 1):
        for version in (0, 1):
            s.sendto(packet.pack(np.full(P.K, 10**6), job_id=2, slot=slot, contributor=cid,
                                 version=version, flags=1, num_contrib=1),
                     ("{switch_ip}", P.PASSING_UDP_PORT))
"""


def test_forged_contributions_from_a_host_outside_the_job_change_nothing(network):
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=8)
    h3 = pnet.net.get("h3")
    out = h3.cmd(f"{sys.executable} -c '{FORGE.format(switch_ip=pnet.topo.switches['s1'].ip)}'")
    assert "Error" not in out, out
    res = pnet.allreduce("4K", job_id=2, iters=1)
    assert all(r.get("correct") for r in res.values()), res
    stats = pnet.ctl.stats(2)["s1"]
    assert stats["drops_not_member"] == 32


@pytest.mark.parametrize("strategy", ["ina", "ring", "hier-ring", "ps"])
def test_baseline_strategies_return_the_correct_sum(network, strategy):
    """Quick mode of the comparison: the same hosts, links and check for every strategy."""
    pnet = network("leafspine")
    pnet.create_job(1, window=16)
    res = pnet.allreduce("4K", iters=1, strategy=strategy)
    assert set(res) == {"h1", "h2", "h3", "h4"}
    assert all(r.get("ok") and r["correct"] and r["strategy"] == strategy
               for r in res.values()), res
    if strategy == "ina":
        # Every GPU rank was its own contributor: each ToR summed 4 streams (2 hosts x 2).
        for tor in ("tor1", "tor2"):
            stats = pnet.ctl.stats(1001)[tor]
            assert stats["job_contributions"] >= 4 * (4096 // P.K), stats


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name],
                          capture_output=True).returncode == 0


def test_management_network_serves_the_job_parameters(network):
    """Every host reaches the controller's parameter service over its management interface,
    not through the switches; the bridge and its veths go with stop()."""
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=8)
    url = pnet.controller_url
    assert url and url.startswith(f"http://{pnet.mgmt.address}:"), url
    for i, name in enumerate(pnet.topo.hosts, start=1):
        host = pnet.net.get(name)
        assert f"dev {name}-mgmt" in host.cmd(f"ip route get {pnet.mgmt.address}")
        doc = json.loads(host.cmd(f"curl -sf --max-time 10 {url}/v1/jobs/2"))
        assert doc["job_id"] == 2 and list(doc["hosts"]) == ["h1", "h2"], doc
        assert pnet.mgmt.hosts[name] == f"172.31.0.{i}"
    missing = pnet.net.get("h3").cmd(f"curl -s --max-time 10 {url}/v1/jobs/99")
    assert "job 99 does not exist" in json.loads(missing)["error"]
    ports = [f"pmg{i}" for i in range(1, 5)]
    assert all(_link_exists(n) for n in [MGMT_BRIDGE, *ports])
    pnet.stop()
    assert not any(_link_exists(n) for n in [MGMT_BRIDGE, *ports])


def test_a_failed_start_leaves_nothing_behind(target, tmp_path):
    """A management subnet this machine already routes is refused, naming the clash, and the
    half-started network (Mininet, switches, bridge) is stopped before the error is raised."""
    path = REPO / "topologies" / "star.json"
    clash = "pmgtest0"
    subprocess.run(["ip", "link", "add", clash, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", "172.30.5.1/24", "dev", clash], check=True)
        subprocess.run(["ip", "link", "set", clash, "up"], check=True)
        pnet = PassingNetwork(load(path), path, target, tmp_path / "star",
                              mgmt_subnet="172.30.0.0/16")
        with pytest.raises(ManagementError, match=r"172\.30\.0\.0/16 overlaps 172\.30\.5\.0/24"):
            pnet.start()
        assert pnet.net is None and pnet.ctl is None and pnet.controller_url is None
        assert not _link_exists(MGMT_BRIDGE)
    finally:
        subprocess.run(["ip", "link", "del", clash])
    pnet.stop()  # again: nothing left to do


def test_a_second_network_is_refused_and_the_running_one_goes_on(network, tmp_path):
    """Two networks at once would share the management bridge and the gRPC ports: the
    second start is refused before it touches anything, naming this process, and stopping
    the refused one leaves the running one's bridge alone."""
    pnet = network("star")
    pnet.create_job(1, window=16)
    path = REPO / "topologies" / "star.json"
    second = PassingNetwork(load(path), path, pnet.target, tmp_path / "second")
    with pytest.raises(NetworkBusy, match=rf"another PASSING network .*pid {os.getpid()}"):
        second.start()
    second.stop()
    assert second.net is None and _link_exists(MGMT_BRIDGE)
    res = pnet.allreduce("4K", iters=1)
    assert all(r.get("ok") and r["correct"] for r in res.values()), res


def test_killing_a_run_kills_every_process_with_its_tag():
    """Also those that left the process group and were reparented (torchrun's workers run in
    sessions of their own)."""
    tag = f"test-{time.monotonic_ns()}"
    with _tagged_shell(tag) as (proc, children):
        expected = {proc.pid, *children}
        # Until a child has exec'd sleep its environment is read mid-exec, or not at all.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
                all(_comm(pid) == "sleep" for pid in children)
                and expected <= set(training.tagged_pids(tag))):
            time.sleep(0.05)
        assert set(training.tagged_pids(tag)) == expected, \
            {pid: _process_state(pid, tag) for pid in expected}
        assert training.kill_tagged(tag) >= 3
        assert proc.wait(10) == -9 and training.tagged_pids(tag) == []


def test_a_run_killed_while_its_processes_start_leaves_none_behind():
    """Killed at once, while the shell's children may still be exec'ing (a process mid-exec
    shows no environment), none of them survives."""
    for attempt in range(5):
        tag = f"test-{time.monotonic_ns()}"
        with _tagged_shell(tag) as (proc, children):
            training.kill_tagged(tag)
            assert proc.wait(10) == -9
            deadline = time.monotonic() + 10
            while any(map(_alive, children)) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert {pid: _process_state(pid, tag) for pid in children if _alive(pid)} == {}, \
                attempt


@contextlib.contextmanager
def _tagged_shell(tag: str):
    """A shell with the run's tag and two children, one in a session of its own; yields the
    shell and its children's PIDs (it names them, so a miss says which process was not found
    and why). On the way out it kills, by PID, whichever of the three a failed test left."""
    proc = subprocess.Popen(["bash", "-c", "setsid sleep 60 & echo $!; sleep 60 & echo $!; wait"],
                            env={"PATH": "/usr/bin:/bin", training.TAG_VAR: tag},
                            stdout=subprocess.PIPE, text=True)
    children: list[int] = []
    try:
        children += [int(proc.stdout.readline()), int(proc.stdout.readline())]
        yield proc, children
    finally:
        for pid in children:
            if _alive(pid) and _comm(pid) in ("setsid", "sleep"):  # still ours, not a reused PID
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Neither gone nor a zombie (an orphan's zombie waits for init, which may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def _process_state(pid: int, tag: str) -> str:
    """What /proc says of a process: its state line, and whether its environment has the tag."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().strip()
    except OSError as e:
        return f"no /proc entry ({e})"
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as e:
        return f"{stat}; environ unreadable ({e})"
    return f"{stat}; environ {len(env)} bytes, tag {'present' if tag.encode() in env else 'absent'}"


# 2 hosts x 2 local ranks (star's hosts have 2 GPUs each); tiny runs: one epoch of 4096 samples.
TRAIN_ARGS = ("--epochs", "1", "--seed", "3")


def _ranks(res: dict[str, dict]) -> list[dict]:
    return sorted((r for host in res.values() for r in host["ranks"]), key=lambda r: r["rank"])


def test_train_with_passing_matches_gloo(network):
    """torchrun on h1 and h2 (2 local ranks each): the passing backend, which streams each
    host's sum through the switch, trains to gloo's loss up to fixed-point rounding."""
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=16)
    results = {}
    for backend in ("gloo", "passing"):
        res = pnet.train(2, backend=backend, args=TRAIN_ARGS, timeout=240)
        assert set(res) == {"h1", "h2"}
        assert all(r["ok"] for r in res.values()), {h: r["error"] for h, r in res.items()}
        ranks = _ranks(res)
        assert [r["rank"] for r in ranks] == [0, 1, 2, 3], ranks
        assert {(r["backend"], r["world_size"]) for r in ranks} == {(backend, 4)}, ranks
        assert all(r["host"] == h for h, host in res.items() for r in host["ranks"])
        results[backend] = ranks
    # DDP keeps the replicas equal: one loss per backend; passing's within rounding of gloo's.
    losses = {b: {r["final_loss"] for r in ranks} for b, ranks in results.items()}
    assert len(losses["gloo"]) == 1 and len(losses["passing"]) == 1, losses
    assert losses["passing"].pop() == pytest.approx(losses["gloo"].pop(), rel=1e-3, abs=1e-4)
    assert results["passing"][0]["accuracy"] == pytest.approx(results["gloo"][0]["accuracy"],
                                                              abs=0.02)
    # The gradients went through the switch's aggregation.
    assert pnet.ctl.stats(2)["s1"]["job_contributions"] > 0


# A user's own DDP script: no JSON report, a plain line last on stdout, a warning on stderr. It
# takes the --backend that train() passes and ignores the rest (--json).
FOREIGN_SCRIPT = """\
import argparse
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--backend", default="gloo")
backend = ap.parse_known_args()[0].backend
dist.init_process_group(backend)
torch.manual_seed(0)
model = DDP(nn.Linear(16, 4))
model(torch.randn(8, 16)).sum().backward()
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: one step on {backend}", flush=True)
warnings.warn("this script's own warning")
del model
dist.barrier()
dist.destroy_process_group()
"""


def test_a_script_of_the_users_own_is_judged_by_its_exit_status(network, tmp_path, capsys):
    """The issue's case: a DDP script that prints no JSON report and warns on stderr, and
    exits 0 on every rank: every rank ok, showing its last stdout line; `train` says ok."""
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=16)
    script = tmp_path / "my_ddp.py"
    script.write_text(FOREIGN_SCRIPT)
    res = pnet.train(2, backend="passing", script=script, timeout=240)
    assert all(r["ok"] for r in res.values()), {h: r["error"] for h, r in res.items()}
    ranks = _ranks(res)
    assert [(r["rank"], r["exit_code"], r["output"]) for r in ranks] == \
        [(i, 0, f"rank {i} of 4: one step on passing") for i in range(4)], ranks
    for host in res.values():  # the warning was there, and judged nothing
        for r in host["ranks"]:
            _, err = train_results.rank_logs(Path(host["log_dir"]), r["local_rank"])
            assert "UserWarning: this script's own warning" in err.read_text()
    assert report_train(res)
    out = capsys.readouterr().out
    assert "h2 rank 3 (local 1): ok, exit code 0; printed last: rank 3 of 4: one step on " \
           "passing\n" in out
    assert out.endswith("train: ok, 4 ranks on 2 hosts, exit code 0 on every rank\n")
    assert pnet.ctl.stats(2)["s1"]["job_contributions"] > 0  # its gradients went through s1


def test_train_across_every_host_of_leafspine_through_both_racks(network):
    """The issue's bar: the unchanged script, backend passing, torchrun on every host of a
    two-level topology (4 hosts x 2 local ranks); both ToRs and the spine aggregated."""
    pnet = network("leafspine")
    pnet.create_job(1, window=16)
    res = pnet.train(1, backend="passing", args=TRAIN_ARGS, timeout=400)
    assert set(res) == {"h1", "h2", "h3", "h4"} and all(r["ok"] for r in res.values()), res
    ranks = _ranks(res)
    assert [r["rank"] for r in ranks] == list(range(8))
    assert {(r["backend"], r["world_size"]) for r in ranks} == {("passing", 8)}
    assert len({r["final_loss"] for r in ranks}) == 1  # one model on every rank
    stats = pnet.ctl.stats(1)
    assert all(stats[s]["job_contributions"] > 0 for s in ("tor1", "tor2", "spine")), stats
    assert stats["spine"]["job_results"] > 0


def test_train_with_a_wrong_job_fails_at_start_on_every_rank(network):
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=8)
    start = time.monotonic()
    res = pnet.train(99, backend="passing", hosts=["h1", "h2"], args=TRAIN_ARGS, timeout=120)
    elapsed = time.monotonic() - start
    ranks = _ranks(res)
    assert len(ranks) == 4 and not any(r["ok"] for r in ranks), res
    for r in ranks:
        # the controller's answer, on every rank: no timeout, nothing killed
        assert "job 99" in r["error"] and "does not exist" in r["error"], r
    assert not any(h["killed"] for h in res.values()), res
    assert elapsed < 100, elapsed


def _rx_bytes(pnet: PassingNetwork, host: str) -> int:
    """Bytes the host's switch port received from it (the switch side is in the root
    namespace)."""
    h = pnet.net.get(host)
    link = pnet.net.linksBetween(h, pnet.net.get(pnet.topo.hosts[host].rack))[0]
    intf = link.intf2 if link.intf1.node is h else link.intf1
    return int(Path(f"/sys/class/net/{intf.name}/statistics/rx_bytes").read_text())


def test_a_host_killed_mid_training_fails_every_other_rank(network):
    """h2's torchrun and ranks are killed once gradients flow; h1's ranks each end with an
    error of their own (the switch's silence), well before train()'s own bounds kill them."""
    pnet = network("star")
    pnet.create_job(2, ["h1", "h2"], window=16)
    out = {}
    before = _rx_bytes(pnet, "h2")
    trainer = threading.Thread(target=lambda: out.update(pnet.train(
        2, backend="passing", args=("--epochs", "200"), timeout=240,
        env={"PASSING_TIMEOUT": "5"})))
    start = time.monotonic()
    trainer.start()
    # Training runs when h2 has sent its gradients for a few steps (~27 KB each).
    while _rx_bytes(pnet, "h2") - before < 300_000:
        assert trainer.is_alive() and time.monotonic() - start < 180, out
        time.sleep(0.1)
    assert pnet.kill_training("h2")
    trainer.join(300)
    assert not trainer.is_alive()
    assert out["h2"]["killed"] and not out["h2"]["ok"], out["h2"]
    h1 = out["h1"]
    assert not h1["ok"] and h1["killed"] is None, h1  # it ended on its own
    assert len(h1["ranks"]) == 2 and all(not r["ok"] and r["error"] for r in h1["ranks"]), h1
    assert time.monotonic() - start < 200


def _moved_together(pnet, path: Path, runner: threading.Thread, out: dict) -> list:
    """After a live change of job 1's pool: its parameters file rewritten (as `passing-ctl
    job resize --params-out` does), the run `runner` finished, every call of every host
    correct; the pool moves ([call, pool, window] each), after checking every host made them
    after the same calls."""
    fresh = path.with_suffix(".new")
    fresh.write_text(pnet.ctl.agent_params(1).to_json() + "\n")
    fresh.replace(path)  # whole, never half written
    runner.join(600)
    assert not runner.is_alive()
    assert set(out) == {"h1", "h2", "h3", "h4"}
    assert all(r.get("ok") and r["correct"] for r in out.values()), out
    moves = {json.dumps(r["pool_moves"]) for r in out.values()}
    assert len(moves) == 1, f"the hosts moved after different calls: {moves}"
    return out["h1"]["pool_moves"]


def test_passing_agent_follows_a_resize_written_to_its_params_file(network, monkeypatch):
    """passing-agent's leaders re-read their --params file (every PASSING_POOL_POLL seconds):
    rewritten mid-run after a resize (as `passing-ctl job resize --params-out` does), every
    host moves to the new pool after the same call, every call before and after sums
    correctly, and the old pool is freed once every host uses the new one."""
    monkeypatch.setenv("PASSING_POOL_POLL", "0.2")  # the agents inherit it
    pnet = network("star")
    path = pnet.create_job(1, window=16)
    out = {}
    runner = threading.Thread(target=lambda: out.update(pnet.allreduce("4K", iters=150)))
    start = time.monotonic()
    runner.start()
    while pnet.ctl.stats(1)["s1"]["job_results"] < 20:
        assert runner.is_alive() and time.monotonic() - start < 200, out
        time.sleep(0.2)
    pnet.ctl.resize_job(1, 4)
    moves = _moved_together(pnet, path, runner, out)
    assert [m[1:] for m in moves] == [[1, 4]]
    assert all(r["window"] == 4 for r in out.values())
    move = pnet.ctl.retire_pools(1)
    assert not move.pending and sorted(move.moved) == ["h1", "h2", "h3", "h4"], move


def test_a_job_waiting_for_slots_sums_on_its_hosts_then_moves_onto_the_switch(network,
                                                                              monkeypatch):
    """No job refused for want of switch memory: with s1's slots all held by other jobs, job 1
    is created waiting (window 0); its agents sum every call over their leaders (the host
    collective), exactly; deleting one of the other jobs gives job 1 a pool in the same call,
    and the agents, re-reading their parameters file, move onto the switch after the same
    call, every call before and after exact."""
    monkeypatch.setenv("PASSING_POOL_POLL", "0.2")  # the agents inherit it
    pnet = network("star")
    for filler in range(10, 18):  # s1's 4,096 slots: eight equal shares of 512
        pnet.ctl.create_job(JobSpec(filler, ("h4",), window=512))
    path = pnet.create_job(1, window=16)
    assert pnet.ctl.job(1).waiting and pnet.ctl.agent_params(1).window == 0
    out = {}
    runner = threading.Thread(target=lambda: out.update(pnet.allreduce("4K", iters=150)))
    # What h2 sends, read at the switch's end of its link, in this namespace: a Mininet host's
    # shell takes one command at a time, and the runner's thread uses h2's.
    link = pnet.net.get("h2").defaultIntf().link
    port = link.intf2 if link.intf1.node.name == "h2" else link.intf1
    received = Path(f"/sys/class/net/{port.name}/statistics/rx_bytes")
    sent = int(received.read_text())
    start = time.monotonic()
    runner.start()
    # About 40 calls over the hosts' links (gloo's ring moves ~24 KB of a 16 KB call a host).
    while int(received.read_text()) - sent < 1_000_000:
        assert runner.is_alive() and time.monotonic() - start < 200, out
        time.sleep(0.2)
    assert pnet.ctl.stats(1)["s1"]["job_contributions"] == 0  # nothing through the switch
    pnet.ctl.delete_job(10)
    assert [r.job_id for r in pnet.ctl.placed] == [1]
    [[call, pool, window]] = _moved_together(pnet, path, runner, out)
    assert (pool, window) == (1, 16) and 10 < call < 151
    assert all(r["host_calls"] == call and r["window"] == 16 for r in out.values()), out
    assert pnet.ctl.stats(1)["s1"]["job_results"] > 0


def _train_changing(pnet, switch: str, change, *extra: str) -> list[dict]:
    """Job 1's hosts train 150 steps of bench/straggler_train.py (`extra`: its options), their
    agents polling their parameters every 0.2 s; once `switch` has sent 20 results,
    `change()` (the controller's live change). Every rank's report, in rank order, after
    checking that every rank finished, all 8, with one model."""
    out = {}
    trainer = threading.Thread(target=lambda: out.update(pnet.train(
        1, script=REPO / "bench" / "straggler_train.py", timeout=400,
        args=("--steps", "150", "--compute-ms", "30", "--eval-every", "50", *extra),
        env={"PASSING_POOL_POLL": "0.2"})))
    start = time.monotonic()
    trainer.start()
    while pnet.ctl.stats(1)[switch]["job_results"] < 20:
        assert trainer.is_alive() and time.monotonic() - start < 200, out
        time.sleep(0.2)
    change()
    trainer.join(420)
    assert not trainer.is_alive()
    assert all(r["ok"] for r in out.values()), {h: r["error"] for h, r in out.items()}
    ranks = _ranks(out)
    assert [r["rank"] for r in ranks] == list(range(8))
    assert len({r["param_checksum"] for r in ranks}) == 1, "the replicas differ"
    return ranks


def _leaders_agree(ranks: list[dict], key: str) -> list[dict]:
    """The 4 host leaders' reports, after checking they give the same `key` (the calls after
    which they moved or changed policy)."""
    leaders = [r for r in ranks if key in r]
    assert len(leaders) == 4, ranks
    seen = {json.dumps(r[key]) for r in leaders}
    assert len(seen) == 1, f"the hosts' {key} differ (changed after different calls): {seen}"
    return leaders


def test_a_policy_set_while_it_trains_reaches_every_host_at_the_same_call(network):
    """passing-ctl job set's path end to end: 4 hosts x 2 ranks train on star with h4 4x
    slower, bulk-synchronous; mid-run the controller sets quorum 3, patience 20 ms and
    staleness 2. The agents (polling the parameter service) take the new policy after the same
    call, rounds then close without h4 (short calls), and training ends on every rank with
    one model."""
    pnet = network("star")
    pnet.create_job(1, window=16)

    def set_policy() -> None:
        pnet.ctl.set_policy(1, quorum=(3,), patience=(0.02,), staleness=2)
        assert pnet.ctl.agent_params(1).policy == 1

    ranks = _train_changing(pnet, "s1", set_policy, "--slow-node", "3", "--slow-factor", "4")
    leaders = _leaders_agree(ranks, "policy_changes")
    [[call, policy]] = leaders[0]["policy_changes"]
    assert policy == 1 and 0 < call < 150
    assert all(r["staleness_end"] == 2 and r["short_calls"] > 0 for r in leaders), leaders
    assert all(r["pool_moves"] == [] for r in leaders)


def test_a_job_resized_while_it_trains_moves_and_frees_its_old_pools(network):
    """passing-ctl job resize's path end to end on two levels: while 4 hosts x 2 ranks train
    through both racks, the controller moves the job from 16 to 4 slots per switch; the
    agents (polling the parameter service) move after the same call, training ends on every
    rank with one model, and the old pools are freed once every host uses the new ones."""
    pnet = network("leafspine")
    pnet.create_job(1, window=16)
    old = {p.switch: (p.base, p.size) for p in pnet.ctl.job(1).pools}

    def resize() -> None:
        pnet.ctl.resize_job(1, 4)
        params = pnet.ctl.agent_params(1)
        assert (params.window, params.pool) == (4, 1)

    # Training runs through the spine.
    leaders = _leaders_agree(_train_changing(pnet, "spine", resize), "pool_moves")
    assert [m[1:] for m in leaders[0]["pool_moves"]] == [[1, 4]]
    assert all(r["window"] == 4 for r in leaders)
    move = pnet.ctl.retire_pools(1)
    assert not move.pending and sorted(move.moved) == ["h1", "h2", "h3", "h4"], move
    new = {p.switch: (p.base, p.size) for p in pnet.ctl.job(1).pools}
    assert set(new) == set(old) and all(size == 4 for _, size in new.values())
    assert all(new[s][0] >= old[s][0] + 16 or new[s][0] + 4 <= old[s][0] for s in old)
