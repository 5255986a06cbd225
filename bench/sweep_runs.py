"""The runs of `make bench` on one Mininet network: the calibration of each component's rate,
then per scenario every all-reduce (time, link bytes, switch packets, the analytical model's
prediction) and training run, each a row for the CSVs."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from bench import analytic, results
from bench.analytic import FabricModel, Rates
from bench.progress import Progress
from bench.sweep_plan import KIB, Scenario, call_plan
from controller.counters import StatsCounters
from controller.topology import load
from passing.pipeline_files import topology_file
from topologies import link_rate
from topologies.cpu_load import CpuSampler, call_windows
from topologies.network import INA_JOB_OFFSET, PassingNetwork, link_bytes_per_call


# -- calibration: each component's own rate, measured alone ---------------------------------------
def calibrate(target: str, seconds: float, agent_pps: float) -> dict:
    """The switch target's packet rates, with the agent's (measured once for every target:
    agent_rate). A switch's rate is what it could carry alone (switch_pps's capacity_pps): per
    CPU second of its own where the Python sender, not the switch, sets the pace. Also
    the rates per CPU second of the switch process (cpu_pps): what a packet costs in CPU,
    which binds where the switches share the cores with everything else (BMv2's threads carry
    more a second alone than one core would)."""
    from bench import switch_pps
    sw = switch_pps.run(target, seconds)
    return {"target": target, "switch_agg_pps": sw["aggregation"]["capacity_pps"],
            "switch_fwd_pps": sw["forwarding"]["capacity_pps"],
            "switch_agg_cpu_pps": sw["aggregation"]["cpu_pps"],
            "switch_fwd_cpu_pps": sw["forwarding"]["cpu_pps"],
            "agent_pps": agent_pps, "cores": os.cpu_count() or 1}


AGENT_RUNS = 5


def agent_rate(runs: int = AGENT_RUNS) -> float:
    """Packets/s one agent streams over UDP on loopback (bench.agent_pps): the median of
    `runs` runs of three 4 MiB calls each. One run of 512 KiB lasted 10 ms, and one
    scheduling hiccup in it halved a report's calibration (2026-12-07 03:04: 113k)."""
    rates = []
    for _ in range(runs):
        agent = subprocess.run([sys.executable, "-m", "bench.agent_pps", "--sink", "udp",
                                "--size", "4M", "--json"], capture_output=True,
                               text=True, timeout=300, check=True)
        rates.append(json.loads(agent.stdout)["pps"])
    return sorted(rates)[len(rates) // 2]


# -- one fabric ---------------------------------------------------------------------------------
def _variant(topo: str, bw_mbps: float | None, gpus: int, work: Path) -> Path:
    """The shipped topology with every link shaped to bw_mbps (0: unshaped, None: as shipped)
    and `gpus` GPUs per host (0: as shipped)."""
    doc = json.loads(topology_file(topo).read_text())
    for h in doc["hosts"].values():
        if gpus:
            h["gpus"] = gpus
    for link in doc["links"]:
        if bw_mbps is not None:
            link.pop("bw", None)
            if bw_mbps:
                link["bw"] = bw_mbps
    rate = "shipped" if bw_mbps is None else f"{bw_mbps:g}mbit"
    path = work / f"{topo}-{rate}-{gpus or 'shipped'}gpu.json"
    path.write_text(json.dumps(doc, indent=2))
    return path


def _read(path: str) -> int:
    with open(path) as fh:
        return int(fh.read())


class Counters:
    """Interface counters of the job's hosts (in their namespaces) and of every switch port."""

    def __init__(self, pnet: PassingNetwork, hosts: list[str]):
        self.pnet = pnet
        self.hosts = hosts
        self.switch_intfs = [i.name for s in pnet.net.switches for i in s.intfList()
                             if i.name != "lo"]

    def snapshot(self) -> dict:
        snap: dict = {h: self.pnet.host_link_bytes(h) for h in self.hosts}
        snap["switch_rx"] = sum(_read(f"/sys/class/net/{i}/statistics/rx_packets")
                                for i in self.switch_intfs)
        return snap


def _agg_packets(pnet: PassingNetwork, job_id: int) -> int:
    """Every packet the P4 pipelines counted for the job (all events and drops)."""
    rec = pnet.ctl.job(job_id)
    return sum(sum(StatsCounters(pnet.ctl.conn(p.switch)).events(p.stat_idx).values())
               for p in rec.pools)


def run_fabric(group: list[Scenario], rates: dict[str, Rates], work: Path, writer_a, writer_t,
               log, progress: Progress, curves: list[dict] | None = None) -> None:
    """The scenarios of one fabric_groups() group, in order, on one network."""
    first = group[0]
    paths = [_variant(sc.topo, sc.bw_mbps, sc.gpus, work) for sc in group]
    pnet = PassingNetwork(load(paths[0]), paths[0], first.target,
                          work / f"run-{first.topo}-{first.gpus or 'shipped'}gpu-{first.target}")
    pnet.start()
    try:
        for sc, path in zip(group, paths, strict=True):
            # The first scenario's rates too: set as Mininet set them, and read back.
            pnet.set_link_rates(load(path))
            run_scenario(pnet, sc, rates, writer_a, writer_t, log, progress, curves)
    finally:
        pnet.stop()


def run_scenario(pnet: PassingNetwork, sc: Scenario, rates: dict[str, Rates], writer_a,
                 writer_t, log, progress: Progress, curves: list[dict] | None = None) -> None:
    """The runs of `sc` on the running network `pnet`, shaped as `sc` says."""
    topo = pnet.topo
    # What the runs record is the fabric they ran on, as shipped or as shaped.
    host_mbps = _link_mbps(topo, [h.link for h in topo.hosts.values()])
    uplink_mbps = _link_mbps(topo, [u.link for u in topo.uplinks]) if topo.uplinks \
        else host_mbps
    sc = dataclasses.replace(sc, bw_mbps=host_mbps,
                             gpus=next(iter(topo.hosts.values())).gpus)
    counts = sc.host_counts or [len(topo.hosts)]
    for n_hosts in counts:
        hosts = _spread(topo, n_hosts)
        job_id = n_hosts  # one job per host count, over hosts spread across racks
        pnet.create_job(job_id, hosts, window=sc.window)
        racks = tuple(sum(1 for h in hosts if topo.hosts[h].rack == r)
                      for r in sorted({topo.hosts[h].rack for h in hosts}))
        fabric = FabricModel(racks, sc.gpus, host_mbps * 1e6, uplink_mbps * 1e6)
        for size in sc.sizes:
            for strategy in sc.strategies:
                row = measure(pnet, job_id, hosts, fabric, size, strategy, sc, rates)
                writer_a(row)
                log(f"{progress.step()} {sc.topo}/{sc.target} {sc.bw_mbps:g} Mbit/s "
                    f"{n_hosts}x{sc.gpus} "
                    f"{size // KIB} KiB {strategy:9s}: {row['mean_s'] * 1e3:9.1f} ms "
                    f"(model {row['predicted_s'] * 1e3:9.1f} ms, {row['bound']}) "
                    f"{'correct' if row['correct'] else 'WRONG'}{_busy_note(row)}")
        if sc.train_steps:
            for strategy in sc.strategies:
                row = train(pnet, job_id, hosts, strategy, sc)
                curve = row.pop("curve")
                writer_t(row)
                if curves is not None and curve:
                    curves.append({"label": results.train_label(
                        ((sc.topo, sc.target, sc.bw_mbps, len(hosts), sc.gpus),
                         sc.train_model)), "strategy": strategy, "curve": curve,
                        "target_accuracy": sc.target_accuracy})
                tta = row["time_to_target_s"]
                log(f"{progress.step()} train {sc.train_model} {strategy:9s}: "
                    f"{row['iters_per_s']:.2f} it/s, accuracy {row['accuracy']:.4f}"
                    + ("" if math.isnan(tta) else
                       f", {sc.target_accuracy:.0%} " + ("not reached" if math.isinf(tta)
                                                         else f"after {tta:.1f} s")))


def _link_mbps(topo, links) -> float:
    """The one rate of `links` in Mbit/s (0: unshaped): links of different rates are outside
    what the analytical model describes."""
    rates = {link.bw or 0 for link in links}
    if len(rates) > 1:
        raise ValueError(f"{topo.name}: links of different rates {sorted(rates)} Mbit/s")
    return float(rates.pop()) if rates else 0.0


def _spread(topo, n: int) -> list[str]:
    """n hosts taken round-robin over the racks (so 2 hosts on leafspine span both racks)."""
    by_rack: dict[str, list[str]] = {}
    for name in sorted(topo.hosts):
        by_rack.setdefault(topo.hosts[name].rack, []).append(name)
    order = [h for i in range(max(map(len, by_rack.values())))
             for r in sorted(by_rack) for h in by_rack[r][i:i + 1]]
    return sorted(order[:n])


def _busy_note(row: dict) -> str:
    """How busy the busiest host link was during a call (CPU-bound when under half), and how
    busy the machine's CPUs were."""
    b = results.host_link_busy(row["host_tx_bytes"], row["host_rx_bytes"], row["mean_s"],
                               row["bw_mbps"])
    cpu = row.get("cpu_busy")
    cpu_note = "" if cpu is None else f", CPU {cpu:.0%} busy"
    if b is None:
        return cpu_note
    return (f", link {b:.0%} busy" + (": CPU-bound" if b < link_rate.CPU_BOUND_BELOW else "")
            + cpu_note)


def measure(pnet: PassingNetwork, job_id: int, hosts: list[str], fabric: FabricModel, size: int,
            strategy: str, sc: Scenario, rates: dict[str, Rates]) -> dict:
    counters = Counters(pnet, hosts)
    # The switch aggregates for passing and ina (on the job's INA companion); the others only
    # forward.
    switched = strategy in ("passing", "ina")
    if strategy == "ina":
        pnet.ina_companion(job_id)
    agg_job = INA_JOB_OFFSET + job_id if strategy == "ina" else job_id
    window = pnet.ctl.job(job_id).pools[0].size
    pred = analytic.predict(strategy, fabric, size, rates[sc.target], window=window)
    warmup, iters = call_plan(pred.seconds, sc.iters, sc.long_call_s)
    if warmup:  # the timed calls repeat the warm-up's size: the switch strategies speculate
        pred = analytic.predict(strategy, fabric, size, rates[sc.target], window=window,
                                speculating=True)
    agg_before = _agg_packets(pnet, agg_job) if switched else 0
    before = counters.snapshot()
    with CpuSampler() as cpu:
        res = pnet.allreduce(str(size // 4), job_id, iters, timeout=60.0, strategy=strategy,
                             warmup=warmup)
    after = counters.snapshot()
    agg = _agg_packets(pnet, agg_job) - agg_before if switched else 0
    calls = iters + warmup
    ok = all(r.get("ok") for r in res.values())
    slowest = max(res.values(), key=lambda r: r.get("mean_s", 0.0)) if ok else {}
    mean = slowest.get("mean_s", float("nan"))
    times = slowest.get("times", [])
    std = (sum((t - mean) ** 2 for t in times) / len(times)) ** 0.5 if times else 0.0
    # Bytes per timed call (the warm-up left out, as it is of the times); a failed run's
    # from the counters over all its calls.
    link = [link_bytes_per_call(res[h] if ok else {}, (after[h][0] - before[h][0],
                                                       after[h][1] - before[h][1]), calls)
            for h in hosts]
    tx, rx = max(t for t, _ in link), max(r for _, r in link)
    return {"topology": sc.topo, "target": sc.target, "strategy": strategy,
            "hosts": len(hosts), "gpus_per_host": sc.gpus, "size_bytes": size,
            "bw_mbps": sc.bw_mbps, "iters": iters, "mean_s": mean, "std_s": std,
            "algbw_gbps": size * 8 / mean / 1e9 if ok else 0.0,
            "host_tx_bytes": tx, "host_rx_bytes": rx,
            "switch_packets": (after["switch_rx"] - before["switch_rx"]) // calls,
            "slots": pnet.ctl.job(agg_job).pools[0].size if switched else 0,
            "predicted_s": pred.seconds, "ratio": mean / pred.seconds if pred.seconds else 0.0,
            "bound": pred.bound,
            "correct": ok and all(r.get("correct") for r in res.values()),
            "agg_packets": agg // calls, "predicted_link_s": pred.link_s,
            "predicted_switch_s": pred.switch_s, "predicted_host_s": pred.host_s,
            "retransmissions": sum(r.get("retransmissions", 0) for r in res.values()),
            "warmup": warmup,
            "cpu_busy": cpu.busy_during(call_windows(res.values())) if ok else None,
            "errors": {h: r.get("error") for h, r in res.items() if not r.get("ok")}}


def train(pnet: PassingNetwork, job_id: int, hosts: list[str], strategy: str,
          sc: Scenario) -> dict:
    # Ten points on the accuracy curve: the time to the target accuracy is read off it.
    res = pnet.allreduce("1", job_id, 1, timeout=60.0, strategy=strategy,
                         train_steps=sc.train_steps, train_model=sc.train_model,
                         eval_every=max(1, sc.train_steps // 10))
    bad = {h: r.get("error") for h, r in res.items() if not r.get("ok")}
    if bad:
        raise RuntimeError(f"training with {strategy} failed: {bad}")
    # Every rank trains the same model; the slowest host sets the pace.
    slowest = min(res.values(), key=lambda r: r["iters_per_s"])
    curve = slowest.get("curve") or []
    reached = results.time_to(curve, sc.target_accuracy)
    tta = math.nan if not curve else math.inf if reached is None else reached
    return {"topology": sc.topo, "target": sc.target, "strategy": strategy,
            "hosts": len(hosts), "gpus_per_host": sc.gpus, "bw_mbps": sc.bw_mbps,
            "steps": slowest["steps"], "seconds": slowest["seconds"],
            "iters_per_s": slowest["iters_per_s"], "accuracy": slowest["accuracy"],
            "final_loss": slowest["final_loss"], "model": sc.train_model,
            "time_to_target_s": tta, "curve": curve,
            "speculated": sum(r.get("speculated", 0) for r in res.values()),
            "spec_missed": sum(r.get("spec_missed", 0) for r in res.values())}
