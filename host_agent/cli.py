"""`passing-agent`: run timed PASSING all-reduces on this host with G local ranks.

Every host of the job runs it at the same time with the same --size, --iters and --seed. Each
local rank fills its tensor from (seed, host, rank), so each host can compute the exact global
sum with numpy and check what came back through the switch.

Exit codes: 0 correct result, 1 wrong result or the switch did not answer, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import socket
import sys
import time
from pathlib import Path

import numpy as np

from host_agent import STRATEGIES

EXAMPLE = ("passing-ctl job show 7 --json | jq .agent_params > job7.json\n"
           "  passing-agent --params job7.json --host h1 --size 4M --iters 5")


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KkMm]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"size must be a number of float32 values with an "
                                         f"optional K or M suffix (e.g. 4M), got {text!r}")
    n = int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20}[m.group(2).lower()]
    if n < 1:
        raise argparse.ArgumentTypeError("size must be at least 1")
    return n


def rank_tensor(seed: int, host_index: int, rank: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, host_index, rank]).standard_normal(n).astype(np.float32)


def expected_sum(params: dict, seed: int, n: int) -> tuple[np.ndarray, float, int]:
    """(exact float64 sum over every rank of every host, largest |value|, contributors)."""
    total = np.zeros(n)
    largest, count = 0.0, 0
    for idx, (_, h) in enumerate(sorted(params["hosts"].items())):
        for g in range(h.get("local_gpus", 1)):
            t = rank_tensor(seed, idx, g, n)
            total += t
            largest = max(largest, float(np.max(np.abs(t))))
            count += 1
    return total, largest, count


def _worker(rank: int, world: int, port: int, args: dict, out) -> None:
    try:
        import os

        import torch
        import torch.distributed as dist

        from host_agent import strategies

        params, host = args["params"], args["host"]
        hosts = sorted(params["hosts"])
        host_index = hosts.index(host)
        ranks = strategies.Ranks(host_index, rank,
                                 [params["hosts"][h].get("local_gpus", 1) for h in hosts])
        stream = dict(rto=args["rto"], min_rto=min(args["min_rto"], args["rto"]),
                      deadline=args["timeout"])
        # NCCL among the local GPUs when there is one per rank, gloo among CPU ranks otherwise;
        # the code path is the same (PassingAllreduce moves the leader's sum to the CPU).
        cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
        device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        else:
            # Many ranks share few cores (Mininet hosts on one machine): one thread each, or
            # they oversubscribe the CPUs and every collective waits on a descheduled rank.
            torch.set_num_threads(1)
        if args["strategy"] == "passing":
            # Only the local ranks form a process group: between hosts there is the switch.
            dist.init_process_group("nccl" if cuda else "gloo",
                                    init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world)
            passing = strategies.PassingAllreduce(params, host, **stream)
            allreduce, stats = passing.allreduce, passing.streamer.stats if rank == 0 else None
        else:
            # The baselines need every rank of every host in one group, met at the first host
            # (ina only for the barrier that starts each timed call together).
            if args["ifname"]:
                os.environ["GLOO_SOCKET_IFNAME"] = args["ifname"]
            first = params["hosts"][hosts[0]]["host_ip"]
            dist.init_process_group("gloo", rank=ranks.rank, world_size=sum(ranks.local_size),
                                    init_method=f"tcp://{first}:{args['rendezvous_port']}")
            if args["strategy"] == "ina":
                ina = strategies.InaAllreduce(params, host, rank, **stream)
                allreduce, stats = ina.allreduce, ina.streamer.stats
            else:
                allreduce = strategies.build(args["strategy"], ranks, params, host, **stream)
                stats = None
        if args["train_steps"]:
            out.put(_train(allreduce, ranks, args, stats))
            dist.destroy_process_group()
            return
        base = torch.from_numpy(rank_tensor(args["seed"], host_index, rank, args["size"]))
        base = base.to(device)
        times = []
        for it in range(args["iters"] + 1):  # the first call warms up and is not timed
            t = base.clone()
            dist.barrier()
            t0 = time.perf_counter()
            allreduce(t)
            if it:
                times.append(time.perf_counter() - t0)
        if rank == 0:
            exact, largest, count = expected_sum(params, args["seed"], args["size"])
            err = float(np.max(np.abs(t.cpu().numpy().astype(np.float64) - exact)))
            out.put({"ok": True, "rank": 0, "strategy": args["strategy"],
                     "device": str(device), "times": times, "max_error": err,
                     "tolerance": 1e-5 * largest * count, "contributors": count,
                     **_stream_counts(stats)})
        dist.destroy_process_group()
    except Exception as e:
        out.put({"ok": False, "rank": rank, "error": f"{type(e).__name__}: {e}"})


def _stream_counts(stats) -> dict:
    """What this rank's own switch stream sent (zero for strategies without one)."""
    return {"packets": stats.packets if stats else 0,
            "retransmissions": stats.retransmissions if stats else 0}


def _train(allreduce, ranks, args: dict, stats) -> dict:
    """The training workload (bench/training.py) with this strategy's all-reduce: every rank
    of every host is one data-parallel worker."""
    from bench.training import train

    world = sum(ranks.local_size)
    res = train(allreduce, ranks.rank, world, args["train_steps"],
                seed=args["seed"], global_batch=args["global_batch"] or 8 * world)
    res.update({"ok": True, "rank": ranks.local_rank, "strategy": args["strategy"],
                "world": world, **_stream_counts(stats)})
    return res


def run(params: dict, host: str, size: int, iters: int, seed: int, rto: float,
        timeout: float, min_rto: float = 0.02, strategy: str = "passing",
        ifname: str | None = None, rendezvous_port: int | None = None,
        train_steps: int = 0, global_batch: int = 0) -> dict:
    """Timed all-reduces of `size` values (or, with train_steps, data-parallel training of the
    digits MLP for that many steps); the leader's report."""
    gpus = params["hosts"][host].get("local_gpus", 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    job = {"params": params, "host": host, "size": size, "iters": iters, "seed": seed,
           "rto": rto, "min_rto": min_rto, "timeout": timeout, "strategy": strategy,
           "ifname": ifname, "train_steps": train_steps, "global_batch": global_batch,
           "rendezvous_port": rendezvous_port or 29500 + params["job_id"] % 1000}
    procs = [ctx.Process(target=_worker, args=(r, gpus, port, job, out)) for r in range(gpus)]
    for p in procs:
        p.start()
    try:
        # The leader's report says most (its error names the switch); others only if it has none.
        reports = []
        while not any(r.get("rank") == 0 for r in reports) and len(reports) < gpus:
            reports.append(out.get(timeout=timeout * (iters + 2) + 120 + 2 * train_steps))
        res = next((r for r in reports if r.get("rank") == 0), reports[0])
    finally:
        for p in procs:
            p.join(timeout + 10)
            if p.is_alive():
                p.kill()
    if not res["ok"] or train_steps:
        return res
    mean = float(np.mean(res["times"]))
    nbytes = size * 4
    res.update({"host": host, "local_ranks": gpus, "size": size, "bytes": nbytes,
                "iters": iters, "mean_s": mean, "goodput_gbps": nbytes * 8 / mean / 1e9,
                "correct": res["max_error"] <= res["tolerance"]})
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="passing-agent", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run timed PASSING all-reduces on this host: G local ranks pre-aggregate "
                    "with torch.distributed, the leader streams through the switch.",
        epilog="example:\n  " + EXAMPLE)
    ap.add_argument("--params", required=True,
                    help="the job's agent parameters (JSON from passing-ctl)")
    ap.add_argument("--host", required=True, help="this host's name in the job")
    ap.add_argument("--size", type=parse_size, default=parse_size("1M"),
                    help="float32 values per tensor, K/M suffixes (default 1M)")
    ap.add_argument("--iters", type=int, default=3, help="timed all-reduces (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="same on every host (default 0)")
    ap.add_argument("--rto", type=float, default=0.05,
                    help="retransmission timeout until round trips are measured, seconds "
                         "(default 0.05)")
    ap.add_argument("--min-rto", type=float, default=0.02,
                    help="lower bound of the measured retransmission timeout (default 0.02)")
    ap.add_argument("--timeout", type=float, default=10.0,
                    help="give up after this many seconds without progress (default 10)")
    ap.add_argument("--strategy", choices=STRATEGIES, default="passing",
                    help="passing (default), or a baseline: ina (needs a job in mode ina), "
                         "ring, hier-ring, ps")
    ap.add_argument("--ifname", default=None,
                    help="baselines: the interface gloo uses between hosts (e.g. h1-eth0)")
    ap.add_argument("--rendezvous-port", type=int, default=None,
                    help="baselines: TCP port on the first host where all ranks meet "
                         "(default 29500 + job id)")
    ap.add_argument("--train", type=int, default=0, metavar="STEPS",
                    help="instead of timed all-reduces: train a small MLP on scikit-learn's "
                         "digits for STEPS data-parallel steps (every rank a worker) and report "
                         "iterations/s and test accuracy")
    ap.add_argument("--global-batch", type=int, default=0,
                    help="with --train: samples per step over all ranks (default 8 x ranks)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    try:
        params = json.loads(Path(args.params).read_text())
    except (OSError, json.JSONDecodeError) as e:
        ap.error(f"--params: {e}")
    if args.host not in params.get("hosts", {}):
        ap.error(f"--host: {args.host} is not in job {params.get('job_id')} "
                 f"(hosts: {', '.join(params.get('hosts', {}))})")
    if args.iters < 1:
        ap.error("--iters must be at least 1")
    mode = params.get("mode", "passing")
    if args.strategy in ("passing", "ina") and mode != args.strategy:
        ap.error(f"--strategy {args.strategy}: job {params.get('job_id')} was created in mode "
                 f"{mode} (passing-ctl job create --mode {args.strategy})")
    if args.train < 0:
        ap.error("--train must be a number of steps (0: no training)")
    res = run(params, args.host, args.size, args.iters, args.seed, args.rto, args.timeout,
              args.min_rto, args.strategy, args.ifname, args.rendezvous_port, args.train,
              args.global_batch)
    if args.json:
        print(json.dumps(res))
    elif not res["ok"]:
        print(f"passing-agent: {res['error']}", file=sys.stderr)
    elif args.train:
        print(f"{args.host} [{args.strategy}]: {res['steps']} steps on {res['world']} ranks, "
              f"{res['iters_per_s']:.1f} it/s, test accuracy {res['accuracy']:.4f}, "
              f"final loss {res['final_loss']:.4f}")
        return 0
    else:
        print(f"{args.host} [{args.strategy}]: {res['local_ranks']} local ranks, "
              f"{res['bytes'] / 2**20:.1f} MiB, "
              f"{res['mean_s'] * 1e3:.1f} ms per all-reduce, {res['goodput_gbps']:.3f} Gbit/s, "
              f"{'correct' if res['correct'] else 'WRONG'} (max error {res['max_error']:.2e}, "
              f"tolerance {res['tolerance']:.2e}), {res['retransmissions']} retransmissions")
    return 0 if res.get("ok") and (args.train or res.get("correct")) else 1


if __name__ == "__main__":
    sys.exit(main())
