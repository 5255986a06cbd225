"""`make bench`: every all-reduce strategy on the same Mininet fabric, measured and compared with
the analytical model (bench/analytic.py); then data-parallel training with each; then the CSVs,
plots and docs/benchmarks.md.

    sudo .venv/bin/python -m bench.sweep                # the full sweep (make bench)
    sudo .venv/bin/python -m bench.sweep --quick        # small sizes, every strategy checked
    sudo .venv/bin/python -m bench.sweep --sizes 1M --strategies passing,ring   # a subset:
        # one size (float32 values), two strategies, leafspine's links as shipped

A subset (any of --topo, --bw, --gpus, --sizes, --strategies, --hosts) replaces the plan: every
combination of the bandwidths and GPU counts given, each with the sizes and strategies given
(default: the shipped topology's own link rates, its GPUs, 1M values, every strategy). Every run
prints a progress line: run i of N, time so far, and an estimate of the time left.

Per run it records the all-reduce time (the slowest host's mean over its timed calls), the
bytes each host's link carried per timed call (its interface counters in the host's namespace,
read by the host's agent around its timed calls), the packets the switches received (their
ports' counters; for passing and ina also the P4 job counters), the slots of the job and the
model's prediction. The switch counters' deltas cover the warm-up call too and are divided by
the calls made, except `retransmissions`: all hosts' over all the run's calls. A run
whose calls the model predicts at --long-call seconds or more makes one timed call and no
warm-up (call_plan), others a warm-up and --iters timed calls (the CSV's `warmup` and `iters`
say which): at the sweep's largest sizes the extra calls were most of the sweep's time.

Scenarios in a row that differ only in link rate run on one network, its links re-shaped
between them and read back from the kernel (fabric_groups, topologies/link_rate.py); a new GPU
count or target starts a new network.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import analytic, report, results
from bench.analytic import FabricModel, Rates
from bench.progress import Progress
from controller.counters import StatsCounters
from controller.topology import load
from passing.pipeline_files import topology_file
from passing_agent import STRATEGIES
from passing_agent.sizes import parse_size
from passing_agent.workloads import DEFAULT_MODEL, MODELS
from topologies import link_rate
from topologies.cpu_load import CpuSampler, call_windows
from topologies.exclusive import busy_message
from topologies.network import INA_JOB_OFFSET, PassingNetwork, link_bytes_per_call

# What bench.report reads, then what only the CSV keeps (the model's three bounds, and more).
ALLREDUCE_COLUMNS = [*results.ALLREDUCE_COLUMNS, "agg_packets", "predicted_link_s",
                     "predicted_switch_s", "predicted_host_s", "retransmissions", "warmup",
                     "cpu_busy"]
# speculated / spec_missed: the hosts' fragments sent at a speculative scale, and those sent
# again (docs/protocol.md, "Speculative scale"): how often real gradients beat the prediction.
TRAINING_COLUMNS = [*results.TRAINING_COLUMNS, "model", "time_to_target_s", "speculated",
                    "spec_missed"]
KIB, MIB = 1 << 10, 1 << 20
LONG_CALL_S = 2.0  # calls predicted this long or longer are made once (call_plan)


@dataclass
class Scenario:
    """One fabric (topology, target, link bandwidth, GPUs per host) and what to run on it."""

    topo: str
    target: str
    bw_mbps: float | None  # every link shaped to this; 0: unshaped; None: as the file ships them
    gpus: int
    sizes: list[int]  # bytes
    strategies: list[str]
    host_counts: list[int] = field(default_factory=list)  # job sizes; empty: every host
    train_steps: int = 0
    iters: int = 2
    long_call_s: float = LONG_CALL_S  # see call_plan; 0: every run warms up and makes `iters`
    window: int | None = None  # slots per job and switch; None: the target's default
    train_model: str = DEFAULT_MODEL
    target_accuracy: float = 0.9  # time to this test accuracy, from the training curve


def scenarios(quick: bool, target: str) -> list[Scenario]:
    """What `make bench` measures. The shaped link bandwidths are chosen so that the links, not
    the CPUs of this 2-core machine, bound the model's runs (a 20 Mbit/s host link carries ~2.3k
    PASSING packets/s of 1 KiB of values); BMv2 aggregates a few thousand packets/s, so its
    links are shaped lower still. Beside them, the links as shipped: the regime a user runs."""
    every = list(STRATEGIES)
    # The digits MLP reaches its 90% test accuracy after ~120 steps with every strategy (the
    # sums are the same); 150 steps measure that time and the iterations/s with room to
    # spare, and took a quarter less of `make bench` than the 200 before.
    steps = 150
    if quick:
        return [Scenario("star", "model", 0, 2, [16 * KIB, 64 * KIB], every, [],
                         train_steps=20, iters=1)]
    runs = [
        # sizes, all strategies
        Scenario("leafspine", "model", 20, 2, [64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB], every,
                 train_steps=steps),
        # the links as the topology ships them (100 Mbit/s): what a user of `make
        # run-topology` gets; on 2 cores the CPU, not these links, bounds PASSING there
        Scenario("leafspine", "model", None, 2, [MIB, 4 * MIB], every, train_steps=steps),
        # bandwidth
        Scenario("leafspine", "model", 10, 2, [MIB], every),
        Scenario("leafspine", "model", 50, 2, [MIB], every),
        # hosts: jobs of 2 and 3 hosts on the same fabric
        Scenario("leafspine", "model", 20, 2, [MIB], every, host_counts=[2, 3]),
        # GPUs per host (one host count, one size): in-host pre-aggregation's lever
        Scenario("leafspine", "model", 20, 1, [MIB], every),
        Scenario("leafspine", "model", 20, 4, [MIB], every),
    ]
    if target in ("auto", "bmv2") and _have_bmv2():
        runs.append(Scenario("leafspine", "bmv2", 2, 2, [64 * KIB, 256 * KIB, MIB], every))
    return runs


def subset(topo: str, target: str, bws: list[float], gpus: list[int], sizes: list[int],
           strategies: list[str], host_counts: list[int], train_steps: int,
           iters: int, train_model: str = DEFAULT_MODEL,
           target_accuracy: float = 0.9) -> list[Scenario]:
    """The runs of a subset: one scenario per bandwidth and GPU count (bandwidth None: the
    links as the topology file ships them, 0: unshaped; GPUs 0: as the file gives them).
    Sizes are in bytes."""
    target = "model" if target == "auto" else target
    # GPU counts outermost: the bandwidths of one GPU count share a network (fabric_groups).
    return [Scenario(topo, target, bw, g, sizes, strategies, host_counts,
                     train_steps=train_steps, iters=iters, train_model=train_model,
                     target_accuracy=target_accuracy) for g in gpus for bw in bws]


def runs_in(plan: list[Scenario]) -> int:
    """How many measurements `plan` makes (each all-reduce size x strategy x job, and each
    training run): the N of the progress line."""
    return sum(max(1, len(sc.host_counts)) * (len(sc.sizes) + (1 if sc.train_steps else 0))
               * len(sc.strategies) for sc in plan)


def _have_bmv2() -> bool:
    from topologies.mininet_nodes import pick_target
    return pick_target("auto")[0] == "bmv2"


# -- calibration: each component's own rate, measured alone ---------------------------------------
def calibrate(target: str, seconds: float, agent_pps: float) -> dict:
    """The switch target's packet rates, with the agent's (measured once for every target:
    agent_rate)."""
    from bench import switch_pps
    sw = switch_pps.run(target, seconds)
    return {"target": target, "switch_agg_pps": sw["aggregation"]["pps"],
            "switch_fwd_pps": sw["forwarding"]["pps"],
            "agent_pps": agent_pps, "cores": os.cpu_count() or 1}


def agent_rate() -> float:
    """Packets/s one agent streams over UDP on loopback (bench.agent_pps)."""
    agent = subprocess.run([sys.executable, "-m", "bench.agent_pps", "--sink", "udp",
                            "--size", "512K", "--json"], capture_output=True,
                           text=True, timeout=300, check=True)
    return json.loads(agent.stdout)["pps"]


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


def fabric_groups(plan: list[Scenario]) -> list[list[Scenario]]:
    """The plan's scenarios in runs of consecutive ones that differ at most in link rate: each
    run shares one network, its links re-shaped between scenarios (topologies/link_rate.py),
    instead of a fresh one per rate (switches, and agents importing torch in every rank: ~20 s
    on 2 cores)."""
    groups: list[list[Scenario]] = []
    for sc in plan:
        if groups and _fabric(groups[-1][0]) == _fabric(sc):
            groups[-1].append(sc)
        else:
            groups.append([sc])
    return groups


def _fabric(sc: Scenario) -> tuple:
    # The window too: a job already made keeps its window (PassingNetwork.create_job).
    return sc.topo, sc.target, sc.gpus, sc.window


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


def call_plan(predicted_s: float, iters: int, long_call_s: float) -> tuple[int, int]:
    """(untimed warm-up calls, timed calls) of one run. A call the model predicts at
    `long_call_s` or more is made once, timed, without a warm-up: what a first call pays once
    (process groups are built before it, so it is the first round trips and buffers) is then a
    small share of it, and each further call would add that long again. Shorter calls: one
    warm-up, then `iters` timed calls. long_call_s 0: always the latter."""
    if long_call_s > 0 and predicted_s >= long_call_s:
        return 0, 1
    return 1, iters


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


def _list(parse):
    """An argparse type: comma-separated values, each parsed by `parse`."""
    def parse_all(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected one value or more, comma-separated")
        return [parse(t) for t in items]
    return parse_all


def _bandwidth(text: str) -> float | None:
    if text == "shipped":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e6:
        raise argparse.ArgumentTypeError(f"{text!r}: Mbit/s (0: unshaped) or 'shipped'")
    return value


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number, at least 1")
    return int(text)


def _strategy(text: str) -> str:
    if text not in STRATEGIES:
        raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(STRATEGIES)}")
    return text


class CsvOut:
    def __init__(self, path: Path, columns: list[str]):
        self.fh = path.open("w", newline="")
        self.w = csv.DictWriter(self.fh, columns, extrasaction="ignore")
        self.w.writeheader()
        self.rows: list[dict] = []

    def __call__(self, row: dict) -> None:
        self.w.writerow(row)
        self.fh.flush()  # a long sweep that is interrupted keeps what it measured
        self.rows.append(row)

    def close(self) -> None:
        self.fh.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.sweep", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--quick", action="store_true",
                    help="CI mode: star, software model, small sizes, few training steps")
    ap.add_argument("--target", choices=["auto", "model", "bmv2"], default="auto",
                    help="auto (default): the model for the big sweeps, plus BMv2 at low "
                         "bandwidth when installed; model: the model only")
    ap.add_argument("--out", default="build/bench", help="CSV, calibration, plots (default "
                    "build/bench)")
    ap.add_argument("--report", default=None,
                    help="write the results into this Markdown file (make bench: "
                         "docs/benchmarks.md, plots next to it)")
    # Two seconds per rate: its spread from run to run is this machine's (about 15% here), not the
    # measurement's.
    ap.add_argument("--calibrate-seconds", type=float, default=2.0,
                    help="how long each switch and agent rate of the calibration is measured "
                         "(default 2)")
    sub = ap.add_argument_group("a subset instead of the whole plan")
    sub.add_argument("--topo", default=None, help="shipped topology (default leafspine)")
    sub.add_argument("--bw", type=_list(_bandwidth), default=None, metavar="MBITS[,...]",
                     help="link rates in Mbit/s, 0 unshaped, 'shipped' as the topology file "
                          "has them (default shipped)")
    sub.add_argument("--gpus", type=_list(_positive), default=None, metavar="G[,...]",
                     help="GPUs per host (default: as the topology file has them)")
    sub.add_argument("--sizes", type=_list(parse_size), default=None, metavar="SIZE[,...]",
                     help="float32 values per tensor, K/M suffixes, as the allreduce command "
                          "takes them (default 1M)")
    sub.add_argument("--strategies", type=_list(_strategy), default=None, metavar="S[,...]",
                     help=f"of {', '.join(STRATEGIES)} (default all)")
    sub.add_argument("--hosts", type=_list(_positive), default=None, metavar="N[,...]",
                     help="job sizes in hosts (default every host)")
    sub.add_argument("--train-steps", type=int, default=0,
                     help="also train an MLP this many steps per strategy (default 0)")
    sub.add_argument("--train-model", choices=sorted(MODELS), default=DEFAULT_MODEL,
                     help="with --train-steps: digits-mlp (9,610 parameters, default) or "
                          "digits-wide (1,126,410: bandwidth-bound)")
    sub.add_argument("--target-accuracy", type=float, default=0.9,
                     help="with --train-steps: report the training time to this test "
                          "accuracy (default 0.9)")
    sub.add_argument("--iters", type=_positive, default=2,
                     help="timed calls per run, after a warm-up call (default 2; one call, "
                          "untimed warm-up none, where --long-call applies)")
    ap.add_argument("--long-call", type=float, default=LONG_CALL_S, metavar="SECONDS",
                    help="a run whose calls the analytical model predicts at SECONDS or more "
                         "makes one timed call and no warm-up (default %(default)g; 0: every "
                         "run makes a warm-up call and --iters timed calls)")
    args = ap.parse_args(argv)
    picked = [a for a in ("topo", "bw", "gpus", "sizes", "strategies", "hosts")
              if getattr(args, a) is not None]
    if not args.long_call >= 0:  # (NaN too)
        ap.error("--long-call must be a number of seconds (0: never)")
    if args.train_steps < 0 or not 0 < args.target_accuracy <= 1:
        ap.error("--train-steps at least 0, --target-accuracy in (0, 1]")
    if (args.train_model != DEFAULT_MODEL or args.train_steps) and not picked:
        ap.error("--train-steps and --train-model go with a subset (e.g. --strategies or "
                 "--sizes); the whole plan trains the digits MLP itself")
    if picked and args.quick:
        ap.error(f"--quick is a plan of its own; drop it or --{picked[0]}")
    if picked:
        try:
            shipped = load(topology_file(args.topo or "leafspine"))
        except FileNotFoundError as e:
            ap.error(f"--topo: {e}")
        too_many = [n for n in args.hosts or [] if n > len(shipped.hosts)]
        if too_many:
            ap.error(f"--hosts: {shipped.name} has {len(shipped.hosts)} hosts, not "
                     f"{too_many[0]}")
    if os.geteuid() != 0:
        print("bench.sweep: Mininet needs root (sudo make bench)", file=sys.stderr)
        return 2
    busy = busy_message()  # before minutes of calibration, not after
    if busy:
        print(f"bench.sweep: {busy}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if picked:
        todo = subset(args.topo or "leafspine", args.target, args.bw or [None], args.gpus or [0],
                      [4 * n for n in args.sizes or [parse_size("1M")]],
                      args.strategies or list(STRATEGIES), args.hosts or [],
                      args.train_steps, args.iters, args.train_model, args.target_accuracy)
    else:
        todo = scenarios(args.quick, args.target)
    todo = [dataclasses.replace(sc, long_call_s=args.long_call) for sc in todo]
    log_file = (out / "sweep.log").open("w")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    t0 = time.time()
    rates, calib = {}, {}
    agent_pps = agent_rate()
    for target in sorted({sc.target for sc in todo}):
        calib[target] = calibrate(target, 1.0 if args.quick else args.calibrate_seconds,
                                  agent_pps)
        rates[target] = Rates(calib[target]["switch_agg_pps"], calib[target]["switch_fwd_pps"],
                              calib[target]["agent_pps"], calib[target]["cores"])
        log(f"calibration {target}: {calib[target]}")
    (out / "calibration.json").write_text(json.dumps(calib, indent=2) + "\n")
    a_csv, t_csv = out / "allreduce.csv", out / "training.csv"
    writer_a, writer_t = CsvOut(a_csv, ALLREDUCE_COLUMNS), CsvOut(t_csv, TRAINING_COLUMNS)
    curves: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="passing-bench-") as tmp:
            progress = Progress(runs_in(todo))
            for group in fabric_groups(todo):
                run_fabric(group, rates, Path(tmp), writer_a, writer_t, log, progress, curves)
    finally:
        writer_a.close()
        writer_t.close()
        (out / results.CURVES_FILE).write_text(json.dumps(curves) + "\n")
    wrong = [r for r in writer_a.rows if not r["correct"]]
    for r in wrong:
        log(f"WRONG: {r['strategy']} {r['size_bytes']} bytes: {r.get('errors')}")
    log(f"sweep done in {time.time() - t0:.0f} s: {len(writer_a.rows)} all-reduce runs, "
        f"{len(writer_t.rows)} training runs, {len(wrong)} wrong; CSVs in {out}")
    if args.report:
        report_path = Path(args.report)
        plots_dir = report_path.parent / report_path.stem
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": f"{platform.node()}, {platform.platform()}, "
                           f"{os.cpu_count()} cores",
                "command": "make bench" + (" (quick)" if args.quick else ""),
                "sweep time": f"{time.time() - t0:.0f} s",
                "calls per run": "a warm-up, then " + (
                    f"the timed calls in the CSV's iters column; one timed call and no warm-up "
                    f"where the analytical model predicts {args.long_call:g} s or more"
                    if args.long_call else "the timed calls in the CSV's iters column"),
                "calibration": "; ".join(
                    f"{t}: switch {c['switch_agg_pps']:.0f} aggregation / "
                    f"{c['switch_fwd_pps']:.0f} forwarding packets/s, agent "
                    f"{c['agent_pps']:.0f} packets/s" for t, c in calib.items())}
        from bench.plots import make_plots
        plots = make_plots(a_csv, t_csv if writer_t.rows else None, plots_dir)
        # make bench's report (docs/benchmarks.md) also rewrites the README's result block.
        readme = report.readme_for(report_path)
        report.write_report(a_csv, t_csv if writer_t.rows else None, plots, report_path, meta,
                            readme=readme)
        log(f"report {report_path}, plots in {plots_dir}"
            + (f", result block of {readme}" if readme else ""))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
