"""`passing-agent`: run timed PASSING all-reduces on this host with G local ranks.

Every host of the job runs it at the same time with the same --size, --iters and --seed. Each
local rank fills its tensor from (seed, host, rank), so each host can compute the exact global
sum with numpy and check what came back through the switch: every call is checked, the first
(untimed warm-up) one included, on every local rank. The hosts' leaders first meet at the first
host (--rendezvous-port) to agree on a new session (host_agent.session).

A live resize (`passing-ctl job resize`) reaches a running passing agent as it reaches the
`passing` backend: the leader re-reads the job's parameters every PASSING_POOL_POLL seconds
(default 2; 0: never) from where they came from, the --params file (write it with
`job resize --params-out`) or the controller, and the hosts move to the new pool after the
same call. The report gives the moves ([call, pool, window]) and the window it ended in.

Exit codes: 0 correct result, 1 wrong result or the switch did not answer, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import multiprocessing as mp
import os
import queue
import socket
import sys
import time
from dataclasses import dataclass

import numpy as np

from bench.agent import STRATEGIES
from bench.agent.check import expected_sum, rank_tensor
from bench.sizes import parse_size
from bench.workloads import MODELS as TRAIN_MODELS
from bench.workloads import train_budget_s
from host_agent.job_source import JobSourceError, params_from_env, pool_poll, this_host
from passing.contract import JobParams, ParamsError

EXAMPLE = ("passing-ctl job show 7 --json | jq .agent_params > job7.json\n"
           "  passing-agent --params job7.json --host h1 --size 4M --iters 5\n"
           "  PASSING_CONTROLLER=10.0.0.100:7700 PASSING_JOB=7 passing-agent --size 4M")


def _die_with_parent(parent: int) -> None:
    """A rank must not outlive its passing-agent: an orphaned leader would go on streaming as
    if its host were still in the session."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: the parent's own cleanup is all there is
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _worker(rank: int, world: int, port: int, args: dict, out) -> None:
    _die_with_parent(args["parent_pid"])
    try:
        # torch's store logs every wait it retries; the agent reports its own clear error.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        import torch
        import torch.distributed as dist

        from bench.agent import strategies
        from host_agent.session import RendezvousError, agree_by_tcp, agree_in_group

        params, host = args["params"], args["host"]
        hosts = params.host_names
        host_index = params.host_index(host)
        ranks = strategies.Ranks(host_index, rank, [params.host(h).local_gpus for h in hosts])
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
        passing = None
        if args["strategy"] == "passing":
            # Only the local ranks form a process group: between hosts there is the switch.
            dist.init_process_group("nccl" if cuda else "gloo",
                                    init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world)
            # The leaders agree on the run's session at the first host; the store stays open
            # for the whole run (see host_agent.session).
            session, store, failure = 0, None, ""
            if rank == 0:
                try:
                    session, store = agree_by_tcp(
                        params.host(hosts[0]).host_ip, args["rendezvous_port"],
                        params.job_id, host_index, len(hosts), args["rendezvous_timeout"],
                        bytes.fromhex(params.session_key))
                except RendezvousError as e:
                    failure = str(e)
            session = agree_in_group(None, session)  # 0: the leader's rendezvous failed
            if not session:
                raise RendezvousError(failure or "the leader could not agree on a session")
            path = args["params_file"]
            source = (lambda: JobParams.load(path)) if path else params_from_env
            passing = strategies.PassingAllreduce(params, host, session=session,
                                                  params_source=source, poll=args["pool_poll"],
                                                  **stream)
            allreduce, stats = passing.allreduce, passing.streamer.stats if rank == 0 else None
        else:
            # The baselines need every rank of every host in one group, met at the first host
            # (ina only for the barrier that starts each timed call together).
            if args["ifname"]:
                os.environ["GLOO_SOCKET_IFNAME"] = args["ifname"]
            first = params.host(hosts[0]).host_ip
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
        exact, tol, count = expected_sum(params, args["seed"], args["size"], args["strategy"])
        times, errors, excess, wrong = [], [], [], 0
        for it in range(args["iters"] + 1):  # the first call warms up and is not timed
            t = base.clone()
            dist.barrier()
            t0 = time.perf_counter()
            allreduce(t)
            if it:
                times.append(time.perf_counter() - t0)
            # Every call is checked, the warm-up too: a wrong first answer is still wrong.
            err = np.abs(t.cpu().numpy().astype(np.float64) - exact)
            errors.append(float(np.max(err)))
            excess.append(float(np.max(err / tol)))
            wrong += int(np.count_nonzero(err > tol))
        # The leader reports for the host; every local rank's calls count.
        report = torch.tensor([wrong, max(excess)], dtype=torch.float64)
        dist.all_reduce(report, op=dist.ReduceOp.MAX)
        if rank == 0:
            if passing is not None:  # after a pool move the counters are the new pool's
                stats = passing.streamer.stats
            out.put({"ok": True, "rank": 0, "strategy": args["strategy"],
                     "device": str(device), "times": times, "max_error": max(errors),
                     "call_errors": errors, "tolerance": float(np.max(tol)),
                     "error_vs_bound": float(report[1]), "wrong_values": int(report[0]),
                     "contributors": count, **_stream_counts(stats), **_pools(passing)})
        dist.destroy_process_group()
    except Exception as e:
        out.put({"ok": False, "rank": rank, "error": f"{type(e).__name__}: {e}"})


def _pools(passing) -> dict:
    """The leader's pool moves ([call, pool, window] each) and the window it ended in; {} for
    the baselines."""
    stream = getattr(passing, "stream", None)
    if stream is None:
        return {}
    return {"pool_moves": [list(m) for m in stream.vote.moves],
            "window": stream.streamer.cfg.window}


def _stream_counts(stats) -> dict:
    """What this rank's own switch stream sent (zero for strategies without one)."""
    return {"packets": stats.packets if stats else 0,
            "retransmissions": stats.retransmissions if stats else 0,
            "fast_retransmissions": stats.fast_retransmissions if stats else 0,
            "probes": stats.probes if stats else 0}


def _train(allreduce, ranks, args: dict, stats) -> dict:
    """The training workload (bench/training.py) with this strategy's all-reduce: every rank
    of every host is one data-parallel worker."""
    from bench.training import train

    world = sum(ranks.local_size)
    res = train(allreduce, ranks.rank, world, args["train_steps"],
                seed=args["seed"], global_batch=args["global_batch"] or 8 * world,
                model=args["model"], eval_every=args["eval_every"])
    res.update({"ok": True, "rank": ranks.local_rank, "strategy": args["strategy"],
                "world": world, **_stream_counts(stats)})
    return res


@dataclass(frozen=True)
class RunOptions:
    """What one passing-agent run does on its host (the command line's options)."""

    size: int = 1 << 20  # float32 values per tensor
    iters: int = 3
    seed: int = 0
    rto: float = 0.05
    timeout: float = 10.0
    min_rto: float = 0.02
    strategy: str = "passing"
    ifname: str | None = None
    rendezvous_port: int | None = None  # None: 29500 + job id
    rendezvous_timeout: float = 60.0
    train_steps: int = 0  # > 0: train an MLP on the digits instead of timed all-reduces
    global_batch: int = 0  # 0: 8 x ranks
    model: str = "digits-mlp"  # with train_steps: which MLP (bench.workloads.MODELS)
    eval_every: int = 0  # with train_steps: test accuracy every this many steps (0: at the end)
    # Where the leader re-reads the job's parameters to learn of a live resize: this file, or
    # (None) the environment's source; every pool_poll seconds (0: never).
    params_file: str | None = None
    pool_poll: float = 2.0


def _reports(out, procs: list, budget: float) -> list[dict]:
    """The ranks' reports, until the leader's or every rank's is in. A rank that dies without
    one (killed, or crashed in native code) ends the wait at once with an error rather than
    after the whole budget, and so does the budget running out."""
    reports: list[dict] = []
    deadline = time.monotonic() + budget
    while not any(r.get("rank") == 0 for r in reports) and len(reports) < len(procs):
        try:
            reports.append(out.get(timeout=1.0))
            continue
        except queue.Empty:
            pass
        # Ranks exit 0 after putting their report (errors included); anything else died.
        dead = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if dead:
            what = ", ".join(f"local rank {i} exit code {code}" for i, code in dead)
            return [{"ok": False, "rank": -1, "error": f"a local rank died: {what}"}]
        if time.monotonic() > deadline:
            return [{"ok": False, "rank": -1,
                     "error": f"no report from the local ranks within {budget:.0f}s"}]
    return reports


def run(params: JobParams, host: str, opts: RunOptions) -> dict:
    """Timed all-reduces of `opts.size` values (or, with train_steps, data-parallel training of
    the digits MLP for that many steps) on `host` of the job `params`; the leader's report."""
    gpus = params.host(host).local_gpus
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    job = {**dataclasses.asdict(opts), "params": params, "host": host,
           "rendezvous_port": opts.rendezvous_port or 29500 + params.job_id % 1000,
           "parent_pid": os.getpid()}
    procs = [ctx.Process(target=_worker, args=(r, gpus, port, job, out)) for r in range(gpus)]
    for p in procs:
        p.start()
    try:
        reports = _reports(out, procs, opts.timeout * (opts.iters + 2) + opts.rendezvous_timeout
                           + 120 + train_budget_s(opts.model, opts.train_steps))
        # The leader's report says most (its error names the switch); others only if it has none.
        res = next((r for r in reports if r.get("rank") == 0), reports[0])
    finally:
        for p in procs:
            p.join(opts.timeout + 10)
            if p.is_alive():
                p.kill()
    if not res["ok"] or opts.train_steps:
        return res
    mean = float(np.mean(res["times"]))
    nbytes = opts.size * 4
    res.update({"host": host, "local_ranks": gpus, "size": opts.size, "bytes": nbytes,
                "iters": opts.iters, "mean_s": mean, "goodput_gbps": nbytes * 8 / mean / 1e9,
                "correct": res["wrong_values"] == 0})
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="passing-agent", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run timed PASSING all-reduces on this host: G local ranks pre-aggregate "
                    "with torch.distributed, the leader streams through the switch.",
        epilog="example:\n  " + EXAMPLE)
    ap.add_argument("--params", default=None,
                    help="the job's agent parameters (JSON from passing-ctl); default: from "
                         "the environment, PASSING_PARAMS or PASSING_JOB + PASSING_CONTROLLER "
                         "(`passing-ctl serve`)")
    ap.add_argument("--host", default=None,
                    help="this host's name in the job (default: PASSING_HOST, else the job's "
                         "host whose address is this machine's)")
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
                    help="TCP port on the first host where the hosts meet to start a session "
                         "(and, for the baselines, all ranks) (default 29500 + job id)")
    ap.add_argument("--rendezvous-timeout", type=float, default=60.0,
                    help="seconds to wait for every host of the job to start (default 60)")
    ap.add_argument("--train", type=int, default=0, metavar="STEPS",
                    help="instead of timed all-reduces: train a small MLP on scikit-learn's "
                         "digits for STEPS data-parallel steps (every rank a worker) and report "
                         "iterations/s and test accuracy")
    ap.add_argument("--global-batch", type=int, default=0,
                    help="with --train: samples per step over all ranks (default 8 x ranks)")
    ap.add_argument("--model", choices=sorted(TRAIN_MODELS), default="digits-mlp",
                    help="with --train: digits-mlp (9,610 parameters, default) or digits-wide "
                         "(1,126,410 parameters: the all-reduce is most of each step)")
    ap.add_argument("--eval-every", type=int, default=0, metavar="STEPS",
                    help="with --train: also measure test accuracy every STEPS steps, the "
                         "clock stopped (the report's curve: seconds, step, accuracy)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    try:
        params = JobParams.load(args.params) if args.params else params_from_env()
        if args.host is None:
            args.host = this_host(params)
    except ParamsError as e:
        ap.error(f"--params {args.params}: {e}")
    except JobSourceError as e:
        ap.error(str(e))
    if args.host not in params.host_names:
        ap.error(f"--host: {args.host} is not in job {params.job_id} "
                 f"(hosts: {', '.join(params.host_names)})")
    if args.iters < 1:
        ap.error("--iters must be at least 1")
    try:
        poll = pool_poll()
    except JobSourceError as e:
        ap.error(str(e))
    if args.strategy in ("passing", "ina") and params.mode != args.strategy:
        ap.error(f"--strategy {args.strategy}: job {params.job_id} was created in mode "
                 f"{params.mode} (passing-ctl job create --mode {args.strategy})")
    if args.train < 0:
        ap.error("--train must be a number of steps (0: no training)")
    if args.eval_every < 0:
        ap.error("--eval-every must be a number of steps (0: accuracy at the end only)")
    if args.train and importlib.util.find_spec("sklearn") is None:
        # Said here, once, rather than by every rank as an ImportError.
        ap.error("--train needs scikit-learn (its digits data set is the training data): "
                 "pip install 'passing[bench]' or pip install scikit-learn")
    opts = RunOptions(size=args.size, iters=args.iters, seed=args.seed, rto=args.rto,
                      timeout=args.timeout, min_rto=args.min_rto, strategy=args.strategy,
                      ifname=args.ifname, rendezvous_port=args.rendezvous_port,
                      rendezvous_timeout=args.rendezvous_timeout, train_steps=args.train,
                      global_batch=args.global_batch, model=args.model,
                      eval_every=args.eval_every, params_file=args.params, pool_poll=poll)
    res = run(params, args.host, opts)
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
              f"{'correct in every call' if res['correct'] else 'WRONG'} (max error "
              f"{res['max_error']:.2e}, {res['error_vs_bound']:.2f} of the bound; "
              f"{res['wrong_values']} values beyond it), "
              f"{res['retransmissions']} retransmissions")
    return 0 if res.get("ok") and (args.train or res.get("correct")) else 1


if __name__ == "__main__":
    sys.exit(main())
