"""Sharing a ToR uplink (issue 47's fairness goals), on the shipped leafspine in Mininet:

- two-jobs: job 1 on h1 and h3 (pool of --windows[0] slots), job 2 on h2 and h4 (--windows[1]),
  all-reducing at once: each job's stream up from tor1 is its tor1 host's, and both cross the
  one uplink to the spine. Goal: each gets 45-55% of what they carry together.
- tcp: job 1 on h1 and h3 all-reducing beside a bulk TCP flow (iperf3) from h2 to h4 over the
  same uplink. Goal: TCP keeps at least 40% of the link; Jain's index over the two >= 0.95.
- slow-host: job 3 on all four hosts, h4's link shaped to --slow-mbps (the others as shipped):
  the sums reach h4 no faster than its link, so its ToR queues them, and the hosts' windows
  must hold the job to that link without flooding it. Goal: the slow link busy >= 80% while
  the job runs, resends under 2% of packets, and a call within 1.3x of the slow link's time.

    sudo .venv/bin/python -m bench.fairness                    # both, model target, 1M values
    sudo .venv/bin/python -m bench.fairness --scenarios tcp --target bmv2 --json-out f.json
    sudo .venv/bin/python -m bench.fairness --scenarios slow-host --slow-mbps 25
    sudo .venv/bin/python -m bench.fairness --scenarios two-jobs --target bmv2 --link-mbps 6 \
        --size 256K --iters 12          # every link at 6 Mbit/s: BMv2 link-bound, not CPU-bound

What a flow carries is read off the switch side of its host's link (the frames tor1 received
from h1, h2), sampled every SAMPLE_S while both run; a share counts only the samples in which
both flows moved (one that has finished, or not started, shares nothing). Every all-reduce is
checked on every host, as always: a run with a wrong sum fails."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from controller.topology import load
from passing.pipeline_files import topology_file
from sim.fabric import reshape
from topologies.exclusive import busy_message
from topologies.network import PassingNetwork

SAMPLE_S = 0.25
ACTIVE_MBPS = 2.0  # below this in a sample, a flow is not moving
SCENARIOS = ("two-jobs", "tcp", "slow-host")
SLOW_JOB = 3


def jain(rates: list[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one has everything."""
    total = sum(rates)
    squares = sum(r * r for r in rates)
    return total * total / (len(rates) * squares) if squares else 1.0


class Sampler(threading.Thread):
    """Bytes received on root-namespace interfaces, every SAMPLE_S, until stopped."""

    def __init__(self, interfaces: dict[str, str], direction: str = "rx"):
        super().__init__(daemon=True)
        self.interfaces = interfaces
        self.direction = direction
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop_event = threading.Event()

    def _read(self) -> dict[str, int]:
        out = {}
        for flow, intf in self.interfaces.items():
            with open(f"/sys/class/net/{intf}/statistics/{self.direction}_bytes") as f:
                out[flow] = int(f.read())
        return out

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append((time.monotonic(), self._read()))
            self._stop_event.wait(SAMPLE_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def rates(self) -> dict[str, float]:
        """Each flow's mean rate, Mbit/s, over the samples in which every flow moved."""
        flows = list(self.interfaces)
        moved = {f: 0 for f in flows}
        both_s = 0.0
        for (t0, a), (t1, b) in zip(self.samples, self.samples[1:], strict=False):
            step = {f: (b[f] - a[f]) * 8 / ((t1 - t0) * 1e6) for f in flows}
            if all(v >= ACTIVE_MBPS for v in step.values()):
                both_s += t1 - t0
                for f in flows:
                    moved[f] += b[f] - a[f]
        if both_s < 1.0:
            raise RuntimeError(f"the flows ran together for {both_s:.2f} s only: give them "
                               "more work (--iters)")
        return {f: moved[f] * 8 / (both_s * 1e6) for f in flows}


def _port_intf(pnet: PassingNetwork, host: str) -> str:
    """The switch side of `host`'s link, in the root namespace."""
    link = pnet.fabric.node(host).defaultIntf().link
    return (link.intf2 if link.intf1.node.name == host else link.intf1).name


def _concurrently(*work) -> list:
    """Each of `work` called in a thread of its own, all at once; their results, in order (the
    first error raised here)."""
    with ThreadPoolExecutor(len(work)) as pool:
        futures = [pool.submit(fn) for fn in work]
        return [f.result() for f in futures]


def _checked(reports: dict[str, dict], job: int) -> dict[str, dict]:
    bad = {h: r.get("error") or "wrong sums" for h, r in reports.items()
           if not (r.get("ok") and r.get("correct"))}
    if bad:
        raise RuntimeError(f"job {job}: {bad}")
    return reports


def two_jobs(pnet: PassingNetwork, size: str, iters: int, windows: tuple[int, int]) -> dict:
    pnet.create_job(1, ["h1", "h3"], window=windows[0])
    pnet.create_job(2, ["h2", "h4"], window=windows[1])
    for job in (1, 2):  # rendezvous and warm-up apart, so the timed calls overlap
        _checked(pnet.allreduce(size, job_id=job, iters=1, warmup=0), job)
    sampler = Sampler({"job1": _port_intf(pnet, "h1"), "job2": _port_intf(pnet, "h2")})
    sampler.start()
    try:
        reports = _concurrently(
            lambda: pnet.allreduce(size, job_id=1, iters=iters, warmup=0, timeout=120),
            lambda: pnet.allreduce(size, job_id=2, iters=iters, warmup=0, timeout=120))
    finally:
        sampler.stop()
    for job, rep in zip((1, 2), reports, strict=True):
        _checked(rep, job)
    rates = sampler.rates()
    total = sum(rates.values())
    return {"scenario": "two-jobs", "windows": list(windows), "mbps": rates,
            "shares": {f: r / total for f, r in rates.items()}, "jain": jain(list(rates.values())),
            "stats": {job: _window_stats(rep) for job, rep in zip((1, 2), reports, strict=True)}}


def _window_stats(reports: dict[str, dict]) -> dict:
    return {h: {k: r.get(k) for k in ("window", "marks", "window_cuts", "retransmissions",
                                      "packets")}
            for h, r in reports.items()}


def tcp_beside(pnet: PassingNetwork, size: str, iters: int, link_mbps: float) -> dict:
    pnet.create_job(1, ["h1", "h3"])
    _checked(pnet.allreduce(size, job_id=1, iters=1, warmup=0), 1)
    h2, h4 = pnet.fabric.node("h2"), pnet.fabric.node("h4")
    server = h4.popen(["iperf3", "-s", "-1"])
    client = None
    sampler = Sampler({"passing": _port_intf(pnet, "h1"), "tcp": _port_intf(pnet, "h2")})
    try:
        time.sleep(0.5)
        client = h2.popen(["iperf3", "-c", h4.IP(), "-t", "600"])
        time.sleep(2.0)  # TCP past its slow start
        sampler.start()
        reports = pnet.allreduce(size, job_id=1, iters=iters, warmup=0, timeout=120)
        sampler.stop()
    finally:
        for p in (client, server):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait()
    _checked(reports, 1)
    rates = sampler.rates()
    return {"scenario": "tcp", "mbps": rates, "tcp_share_of_link": rates["tcp"] / link_mbps,
            "shares": {f: r / sum(rates.values()) for f, r in rates.items()},
            "jain": jain(list(rates.values())), "stats": {1: _window_stats(reports)}}


def slow_host(pnet: PassingNetwork, size: str, iters: int, slow_mbps: float) -> dict:
    hosts = sorted(pnet.topo.hosts)
    slow = hosts[-1]
    pnet.create_job(SLOW_JOB, hosts)  # its own job: the other scenarios' jobs have two hosts
    fast = _checked(pnet.allreduce(size, job_id=SLOW_JOB, iters=iters, warmup=1, timeout=120),
                    SLOW_JOB)
    shipped = pnet.topo
    host = shipped.hosts[slow]
    pnet.set_link_rates(replace(shipped, hosts={
        **shipped.hosts, slow: replace(host, link=replace(host.link, bw=slow_mbps))}))
    sampler = Sampler({"down": _port_intf(pnet, slow)}, direction="tx")
    try:
        sampler.start()
        reports = pnet.allreduce(size, job_id=SLOW_JOB, iters=iters, warmup=1, timeout=300)
    finally:
        sampler.stop()
        pnet.set_link_rates(shipped)
    _checked(reports, SLOW_JOB)
    call_s = max(r["mean_s"] for r in reports.values())
    # What one call brings down the slow link, at its rate: no call can take less.
    bound_s = reports[slow]["timed_rx_bytes"] * 8 / (slow_mbps * 1e6)
    packets = sum(r["packets"] for r in reports.values())
    resent = sum(r["retransmissions"] for r in reports.values())
    return {"scenario": "slow-host", "slow_host": slow, "slow_mbps": slow_mbps,
            "shipped_call_s": max(r["mean_s"] for r in fast.values()), "call_s": call_s,
            "link_bound_s": bound_s, "call_over_bound": call_s / bound_s,
            "slow_link_busy": sampler.rates()["down"] / slow_mbps,
            "resent_share": resent / packets if packets else 0.0,
            "stats": {SLOW_JOB: _window_stats(reports)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.fairness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="model", help="model, bmv2 or auto (default model)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help=f"comma-separated, of {', '.join(SCENARIOS)}")
    ap.add_argument("--size", default="1M", help="values per all-reduce (default 1M)")
    ap.add_argument("--iters", type=int, default=20, help="all-reduces per job (default 20)")
    ap.add_argument("--windows", default="256,32", help="two-jobs: the jobs' pools")
    ap.add_argument("--slow-mbps", type=float, default=None,
                    help="slow-host: the last host's link rate (default a quarter of the uplink)")
    ap.add_argument("--link-mbps", type=float, default=None,
                    help="every link at this rate (default: as leafspine ships them)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    scenarios = args.scenarios.split(",")
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        ap.error(f"unknown scenario {unknown[0]!r}: one of {', '.join(SCENARIOS)}")
    windows = tuple(int(w) for w in args.windows.split(","))
    if len(windows) != 2 or min(windows) < 1:
        ap.error(f"--windows {args.windows!r}: two pools of at least 1 slot, e.g. 256,32")
    for opt, value in (("--slow-mbps", args.slow_mbps), ("--link-mbps", args.link_mbps)):
        if value is not None and value <= 0:
            ap.error(f"{opt} {value:g}: a rate above 0 Mbit/s")
    busy = busy_message()
    if busy:
        print(f"bench.fairness: {busy}", file=sys.stderr)
        return 2
    topo_path = topology_file("leafspine")
    topo = load(topo_path)
    links = json.loads(Path(topo_path).read_text())["links"]
    uplink_mbps = args.link_mbps or next(ln["bw"] for ln in links
                                         if (ln["switch"], ln.get("peer")) == ("tor1", "spine"))
    out = []
    with tempfile.TemporaryDirectory(prefix="fairness-") as work:
        pnet = PassingNetwork(topo, topo_path, args.target, Path(work) / "run")
        pnet.start()
        try:
            if args.link_mbps:
                pnet.set_link_rates(reshape(topo, args.link_mbps))
            for sc in scenarios:
                if sc == "two-jobs":
                    res = two_jobs(pnet, args.size, args.iters, windows)
                elif sc == "tcp":
                    res = tcp_beside(pnet, args.size, args.iters, uplink_mbps)
                else:
                    res = slow_host(pnet, args.size, args.iters,
                                    args.slow_mbps or uplink_mbps / 4)
                res["target"] = pnet.target
                res["link_mbps"] = uplink_mbps
                print(json.dumps(res), flush=True)
                out.append(res)
        finally:
            pnet.stop()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
