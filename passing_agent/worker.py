"""One local rank of `passing-agent`: what it does for one command (timed all-reduces of a
strategy, or training), and the loop that keeps it alive between commands.

A rank lives as long as its agent (passing_agent.pool), forked from a server that imported
torch once for all of the agent's ranks; every command builds its own process groups and
sockets and tears them down before the next, so one command cannot see another's state.
Every report carries the command's number, so a report of a command given up on is never
taken for the next one's.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
from datetime import timedelta

import numpy as np

from host_agent.job_source import params_from_env
from passing.contract import JobParams
from passing_agent import check
from passing_agent.check import Answers, expected_sum, rank_tensor
from passing_agent.rank_report import link_bytes, pools_report, stream_counts, timed_link_bytes

_GLOO_IFNAME = "GLOO_SOCKET_IFNAME"


def _die_with_agent(agent: int) -> None:
    """A rank must not outlive its passing-agent: an orphaned leader would go on streaming as
    if its host were still in the session. The rank's parent is the agent's fork server
    (passing_agent.pool), which stays up while any rank does (each holds its pipe), so the
    parent's death signal alone would never come: a thread waits on the agent itself (a
    pidfd, which becomes readable when it exits) and kills the rank then; the fork server
    exits after its ranks, as the agent's other helper does."""
    try:
        watched = os.pidfd_open(agent)
    except ProcessLookupError:
        os._exit(1)  # the agent was gone before the rank started
    except (OSError, AttributeError):
        watched = None  # no pidfd (not Linux 5.3+): the agent is asked instead, every second

    def wait_for_the_agent() -> None:
        if watched is not None:
            select.select([watched], [], [])
        else:
            while _alive(agent):
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)  # as the agent's own SIGKILL would end it

    threading.Thread(target=wait_for_the_agent, name="passing-agent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class _Tagged:
    """The report queue as one command sees it: what it puts carries the command's number."""

    def __init__(self, out, run: int):
        self.out, self.run = out, run

    def put(self, report: dict) -> None:
        self.out.put({**report, "run": self.run})


def serve(rank: int, commands, out, agent: int, environ: dict[str, str]) -> None:
    """The life of local rank `rank`: run each command from `commands` (a job dict, see
    passing_agent.pool) until None, then report "idle" with the command's number. The pool
    takes a rank that does not come back idle for stuck (a peer failed mid-collective) and
    starts the ranks afresh. `environ`: the agent's environment when it started the rank (a
    forked rank has its fork server's)."""
    _die_with_agent(agent)
    os.environ.clear()
    os.environ.update(environ)
    while (job := commands.get()) is not None:
        # The one variable a command sets (a baseline's interface): put back as it was.
        ifname = os.environ.get(_GLOO_IFNAME)
        closers: list = []
        try:
            _command(rank, job, _Tagged(out, job["run"]), closers)
        finally:
            _tear_down(closers)
            if ifname is None:
                os.environ.pop(_GLOO_IFNAME, None)
            else:
                os.environ[_GLOO_IFNAME] = ifname
        out.put({"idle": rank, "run": job["run"]})


def _tear_down(closers: list) -> None:
    """Release what a command held (its UDP sockets: the next command binds the same ports)
    and its process group, whether it ended well or not."""
    for close in closers:
        try:
            close()
        except OSError:
            pass
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # an idle rank keeps no GPU memory another program may need


def _command(rank: int, args: dict, out, closers: list) -> None:
    world = args["world"]
    try:
        import torch
        import torch.distributed as dist

        from host_agent.leaders import leaders_group
        from host_agent.session import (
            RendezvousError,
            agree_by_tcp,
            agree_in_group,
            reach_rendezvous,
        )
        from passing_agent import strategies
        from passing_agent.start_line import StartLine

        params, host = args["params"], args["host"]
        hosts = params.host_names
        host_index = params.host_index(host)
        ranks = strategies.Ranks(host_index, rank, [params.host(h).local_gpus for h in hosts])
        stream = dict(rto=args["rto"], min_rto=min(args["min_rto"], args["rto"]),
                      gather_max=args["gather_max"],
                      deadline=args["timeout"])
        udp_segments = args["udp_segments"] or None  # None: the transport's default
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
        # Before each call every rank of every host meets at the start line (UDP datagrams
        # resent in milliseconds; see passing_agent.start_line): its address now, its peers' once
        # the groups below can exchange them.
        line = StartLine((params.host(host).host_ip, 0))
        closers.append(line.close)
        if args["strategy"] == "passing":
            # Only the local ranks form a process group: between hosts there is the switch.
            dist.init_process_group("nccl" if cuda else "gloo",
                                    store=dist.FileStore(args["store"], world), rank=rank,
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
            # A job waiting for switch slots sums over its leaders' group meanwhile.
            hosts_group = leaders_group(store, params, host, timedelta(
                seconds=args["rendezvous_timeout"])) if rank == 0 and params.window == 0 \
                else None
            passing = strategies.PassingAllreduce(params, host, session=session,
                                                  params_source=source, poll=args["pool_poll"],
                                                  udp_segments=udp_segments,
                                                  hosts_group=hosts_group, **stream)
            closers.append(passing.close)
            allreduce, stats = passing.allreduce, passing.streamer.stats if rank == 0 else None
            # The start line's addresses: the host's ranks' to their leader, the leaders'
            # through their session store, all of them back to every rank.
            here: list = [None] * world
            dist.all_gather_object(here, list(line.address))
            every = [None]
            if rank == 0:
                store.set(f"start-line/{host_index}", json.dumps(here))
                every[0] = [a for h in range(len(hosts))
                            for a in json.loads(store.get(f"start-line/{h}"))]
            dist.broadcast_object_list(every, 0)
            addresses, token = every[0], session
        else:
            # The baselines need every rank of every host in one group, met at the first host
            # (ina for its session and the start line's token).
            if args["ifname"]:
                os.environ[_GLOO_IFNAME] = args["ifname"]
            first = params.host(hosts[0]).host_ip
            port = args["rendezvous_port"]
            if ranks.rank != 0:  # rank 0 serves the group's store
                reach_rendezvous(first, port, args["rendezvous_timeout"],
                                 f"the rendezvous of the {args['strategy']} group")
            dist.init_process_group("gloo", rank=ranks.rank, world_size=sum(ranks.local_size),
                                    init_method=f"tcp://{first}:{port}")
            if args["strategy"] == "ina":
                ina = strategies.InaAllreduce(params, host, rank, udp_segments=udp_segments,
                                              **stream)
                closers.append(ina.streamer.close)
                allreduce, stats = ina.allreduce, ina.streamer.stats
            else:
                allreduce = strategies.build(args["strategy"], ranks, params, host, **stream)
                stats = None
            # The start line's addresses and the run's token (rank 0's), over the group.
            every = [None] * sum(ranks.local_size)
            dist.all_gather_object(every, (list(line.address), os.urandom(8).hex()))
            addresses, token = [a for a, _ in every], int(every[0][1], 16)
        line.connect(ranks.rank, [tuple(a) for a in addresses], token,
                     names=[f"{hosts[h]} rank {r - ranks.host_ranks(h)[0]}"
                            for h in range(len(hosts)) for r in ranks.host_ranks(h)])
        if args["train_steps"]:
            check.forget()
            # The clock starts with every rank of every host at the start line.
            out.put(_train(allreduce, ranks, args, stats,
                           lambda: line.meet(0, args["rendezvous_timeout"])))
            dist.destroy_process_group()
            return
        base = torch.from_numpy(rank_tensor(args["seed"], host_index, rank, args["size"]))
        base = base.to(device)
        exact, tol, count = expected_sum(params, args["seed"], args["size"], args["strategy"])
        answers = Answers(exact, tol)
        times = []
        spans = []
        timed_from = None
        t = torch.empty_like(base)  # the same memory every call: no page faults
        for it in range(args["warmup"] + args["iters"]):  # warm-up calls are not timed
            if it == args["warmup"] and rank == 0:
                timed_from = link_bytes(args["ifname"])
            t.copy_(base)
            # The first call waits as long as the rendezvous (hosts finish starting at
            # different times); later ones only as long as a call may take.
            line.meet(it, args["rendezvous_timeout"] if it == 0 else args["timeout"])
            t0 = time.perf_counter()
            allreduce(t)
            if it >= args["warmup"]:
                times.append(time.perf_counter() - t0)
                spans.append((t0, time.perf_counter()))
            # Every call is checked, the warm-ups too: a wrong first answer is still wrong.
            answers.check(t.cpu().numpy())
        # The leader reports for the host; every local rank's calls count.
        link = timed_link_bytes(timed_from, args["ifname"], args["iters"]) if rank == 0 else {}
        report = torch.tensor([answers.wrong, max(answers.excess)], dtype=torch.float64)
        dist.all_reduce(report, op=dist.ReduceOp.MAX)
        if rank == 0:
            if passing is not None:  # after a pool move the counters are the new pool's
                stats = passing.streamer.stats
            out.put({"ok": True, "rank": 0, "strategy": args["strategy"],
                     "device": str(device), "times": times, "max_error": max(answers.errors),
                     # perf_counter at each timed call's start and end: Mininet's hosts
                     # share the clock, so a benchmark can see how together they started
                     "spans": spans, "start_line_sent": line.sent,
                     "call_errors": answers.errors, "tolerance": float(np.max(tol)),
                     "error_vs_bound": float(report[1]), "wrong_values": int(report[0]),
                     "contributors": count, **stream_counts(stats), **pools_report(passing),
                     **link})
        dist.destroy_process_group()
    except Exception as e:
        out.put({"ok": False, "rank": rank, "error": f"{type(e).__name__}: {e}"})


def _train(allreduce, ranks, args: dict, stats, ready) -> dict:
    """The training workload (passing_agent/training.py) with this strategy's all-reduce: every rank
    of every host is one data-parallel worker; `ready` meets the others before the clock."""
    from passing_agent.training import train

    world = sum(ranks.local_size)
    res = train(allreduce, ranks.rank, world, args["train_steps"],
                seed=args["seed"], global_batch=args["global_batch"] or 8 * world,
                model=args["model"], eval_every=args["eval_every"], ready=ready)
    res.update({"ok": True, "rank": ranks.local_rank, "strategy": args["strategy"],
                "world": world, **stream_counts(stats)})
    return res


