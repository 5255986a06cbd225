"""One rank of the `passing` backend tests, started by torchrun (tests/host_agent/test_backend.py).

Writes what it saw to $OUT_DIR/rank<R>.json: the results of every collective next to gloo's on
the same inputs, or the error it met. SCENARIO picks what to run:
  collectives  every all-reduce PASSING carries and every delegated collective, checked
  ddp          the same DDP training on the passing group and on a gloo group
  semantics    what gloo does that a user relies on: autograd untouched, views, fp16 AVG of
               large values, NaN propagated (GradScaler), a parameter summed
  slow         rank 0 arrives 8 s late: the others wait, as with gloo
  die          training until the test kills a node; the survivors must raise, not hang
  reinit       sum, destroy the group, init again in the same process and sum again (what
               destroy_process_group must release: the leader's port, the in-host group)
  train_straggler
               bench/straggler_train.py's loop, node 1 slower, skipping what it missed
  behind       node 1 is three calls behind node 0 (a quorum); it takes them without computing
  straggler    node 1 starts each of 3 all-reduces (AVG) 1 s late; with a quorum and
               PASSING_PATIENCE the others do not wait for it (but for every other call)
  overlap      four async all-reduces in a row: each returns before its sum is done, the
               futures complete in call order, every sum is right; then DDP with overlap
Every scenario that ends with destroy_process_group then writes the gloo threads still running
(a gloo thread that outlives the interpreter can abort a finished run). Where DDP ran, one
group's remain: torch.distributed.nn, which DDP imports, keeps the world group of its import
time in its functions' default arguments.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# No import of ours: torch registers the backend at start-up (passing._torch_autoload), as it does
# for a user's script.

OUT = Path(os.environ["OUT_DIR"])
RANK = int(os.environ["RANK"])
# The test sends SIGUSR1 to a run that hangs (to the ranks that wrote their pid, after this
# line): every thread's Python stack goes to the node log.
faulthandler.register(signal.SIGUSR1, all_threads=True)


def put(name: str, value: object) -> None:
    (OUT / f"rank{RANK}.{name}.json").write_text(json.dumps(value))


put("pid", os.getpid())


def gloo_threads() -> list[str]:
    """Names of this process's gloo threads (workers and transport loops), from /proc."""
    names = (Path("/proc/self/task", t, "comm").read_text().strip()
             for t in os.listdir("/proc/self/task"))
    return sorted(n for n in names if "gloo" in n)


def values(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Distinct per rank; exactly representable in every dtype tried, so sums are exact."""
    return (torch.arange(n, dtype=torch.float32) % 64 - 20 + rank * 0.25).to(dtype)


def both(gloo: dist.ProcessGroup, fn) -> tuple[list, list]:
    """fn(group) run on the passing world group and on the gloo group, as nested lists."""
    return fn(None), fn(gloo)


def sent() -> int | None:
    """Packets this host's leader has sent to the switch so far (None on other ranks)."""
    streamer = dist.group.WORLD.passing.streamer
    return streamer.stats.packets if streamer is not None else None


def collectives(gloo: dist.ProcessGroup) -> dict:
    world = dist.get_world_size()
    out: dict[str, object] = {"backend": dist.get_backend()}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for op in ("SUM", "AVG"):
            t = values(RANK, 1000, dtype)
            before = sent()
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            out[f"packets_{op}_{dtype}"] = None if before is None else sent() - before
            expected = sum(values(r, 1000, torch.float64) for r in range(world))
            if op == "AVG":
                expected = expected / world
            out[f"allreduce_{op}_{dtype}"] = {
                "dtype_kept": t.dtype == dtype,
                "max_error": float((t.double() - expected).abs().max())}
    before = sent()

    def pair(name: str, fn) -> None:
        mine, ref = both(gloo, fn)
        out[name] = {"passing": mine, "gloo": ref}

    def reduce_with(op):
        def fn(g):
            t = values(RANK, 64, torch.float32)
            dist.all_reduce(t, op=op, group=g)
            return t.tolist()
        return fn
    for op in ("MAX", "MIN", "PRODUCT"):
        pair(f"allreduce_{op}", reduce_with(getattr(dist.ReduceOp, op)))

    def int_sum(g):
        t = torch.arange(10, dtype=torch.int64) * (RANK + 1) + 2**40
        dist.all_reduce(t, group=g)
        return t.tolist()
    pair("allreduce_int64", int_sum)

    def f64_sum(g):
        t = torch.full((5,), 0.1 * (RANK + 1), dtype=torch.float64)
        dist.all_reduce(t, group=g)
        return t.tolist()
    pair("allreduce_float64", f64_sum)

    def broadcast(g):
        t = values(RANK, 8, torch.float32)
        dist.broadcast(t, src=1, group=g)
        return t.tolist()
    pair("broadcast", broadcast)

    def all_gather(g):
        parts = [torch.zeros(3) for _ in range(world)]
        dist.all_gather(parts, torch.full((3,), float(RANK)), group=g)
        return [p.tolist() for p in parts]
    pair("all_gather", all_gather)

    def all_gather_into_tensor(g):
        whole = torch.zeros(2 * world)
        dist.all_gather_into_tensor(whole, torch.full((2,), RANK + 0.5), group=g)
        return whole.tolist()
    pair("all_gather_into_tensor", all_gather_into_tensor)

    def reduce_scatter(g):
        t = torch.zeros(2)
        dist.reduce_scatter_tensor(t, values(RANK, 2 * world, torch.float32), group=g)
        return t.tolist()
    pair("reduce_scatter_tensor", reduce_scatter)

    def reduce(g):
        t = values(RANK, 4, torch.float32)
        dist.reduce(t, dst=0, group=g)
        return t.tolist() if RANK == 0 else None
    pair("reduce", reduce)

    def all_to_all(g):
        t = torch.arange(world, dtype=torch.float32) + 10 * RANK
        o = torch.zeros(world)
        dist.all_to_all_single(o, t, group=g)
        return o.tolist()
    pair("all_to_all_single", all_to_all)

    def gather_object(g):
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": RANK}, group=g)
        return objs
    pair("all_gather_object", gather_object)

    def send_recv(g):
        t = torch.full((2,), float(RANK))
        peer = RANK ^ 1
        if RANK % 2 == 0:
            dist.send(t, peer, group=g)
            dist.recv(t, peer, group=g)
        else:
            got = torch.zeros(2)
            dist.recv(got, peer, group=g)
            dist.send(t, peer, group=g)
            t = got
        return t.tolist()
    pair("send_recv", send_recv)

    def barrier(g):
        dist.barrier(group=g)
        return "passed"
    pair("barrier", barrier)

    out["delegated_packets"] = None if before is None else sent() - before
    sub = dist.new_group([0, 1])  # under the default backend: delegates
    if RANK < 2:
        t = torch.full((3,), RANK + 1.0)
        dist.all_reduce(t, group=sub)
        out["subgroup_sum"] = t.tolist()
    return out


def semantics(gloo: dist.ProcessGroup) -> dict:
    world = dist.get_world_size()
    out: dict[str, object] = {}

    def loss_grad(g) -> float:
        # A loss summed across ranks keeps its graph: the collective is not recorded.
        w = torch.full((3,), float(RANK + 1), requires_grad=True)
        loss = (w * w).sum()
        dist.all_reduce(loss, group=g)
        loss.backward()
        return float(w.grad.norm())
    out["loss_grad"] = {"passing": loss_grad(None), "gloo": loss_grad(gloo)}

    p = nn.Parameter(torch.full((4,), float(RANK)))
    dist.all_reduce(p)
    out["parameter"] = p.detach().tolist()

    big = torch.full((8,), 30000.0, dtype=torch.float16)
    dist.all_reduce(big, op=dist.ReduceOp.AVG)
    out["fp16_avg"] = big.float().tolist()

    base = torch.arange(20, dtype=torch.float32) * (RANK + 1)
    view = base[::2]
    dist.all_reduce(view)
    out["view"] = base.tolist()

    t = torch.ones(100)
    if RANK == 3:
        t[17] = float("inf")
    dist.all_reduce(t)
    out["nonfinite"] = [x != x for x in t.tolist()]  # NaN everywhere
    t = torch.full((100,), float(RANK))
    dist.all_reduce(t)
    out["after_nonfinite"] = t.tolist()
    out["world"] = world
    return out


def train(group, steps: int) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + RANK)
    for step in range(steps):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randint(0, 4, (8,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if step == 2:
            put("training", True)  # the "die" scenario kills a node from here on
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def reinit() -> list:
    """Two lives of the world group in one process; each one's sum, as every rank saw it, then
    what an all_reduce on the first life's group (held, destroyed) raised."""
    sums, held = [], []
    for life in range(2):
        if life:
            dist.init_process_group("passing")
        t = torch.full((300,), float(RANK + 10 * life))
        dist.all_reduce(t)
        sums.append(sorted(set(t.tolist())))
        held.append(dist.group.WORLD)  # as a DDP model that outlives its group holds it
        dist.destroy_process_group()
    try:  # a destroyed group no longer sums, through the switch or otherwise
        dist.all_reduce(torch.ones(3), group=held[0])
        sums.append("summed on a destroyed group")
    except RuntimeError as e:
        sums.append(str(e))
    return sums


def straggler() -> list[list[float]]:
    """Each call's distinct result values, as this rank saw them."""
    out = []
    for _ in range(3):
        if RANK >= 2:
            time.sleep(1.0)
        t = torch.full((2000,), float(RANK + 1))
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        out.append(sorted(set(t.tolist())))
    return out


def behind() -> dict:
    """Node 0 makes three AVG calls while node 1 is away; node 1 then asks how many calls it
    is behind and makes them with zeros; in a fourth call node 0 is the late one."""
    from host_agent.backend import calls_behind
    node = int(os.environ["GROUP_RANK"])
    results = []
    if node == 1:
        time.sleep(2.0)
    count = calls_behind(2000) if node == 1 else 0
    for c in range(3 if node == 0 else count):
        t = torch.full((2000,), float(RANK + 1) * (c + 1)) if node == 0 else torch.zeros(2000)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        results.append(sorted(set(t.tolist())))
    if node == 0:
        time.sleep(3.0)
    t = torch.full((2000,), float(RANK + 1) * 4)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    results.append(sorted(set(t.tolist())))
    return {"behind": count, "after": calls_behind(2000), "results": results}


def overlap() -> dict:
    """Async all-reduces return at once and complete in order, each sum exact; the world
    group's calls all ran when a barrier returns."""
    world = dist.get_world_size()
    tensors = [torch.full((200_000,), float(RANK + 1) * (c + 1)) for c in range(4)]
    order: list[int] = []
    works, pending_at_return = [], []
    t0 = time.perf_counter()
    for c, t in enumerate(tensors):
        work = dist.all_reduce(t, async_op=True)
        pending_at_return.append(not work.is_completed())
        work.get_future().then(lambda _, c=c: order.append(c))
        works.append(work)
    returned = time.perf_counter() - t0
    for w in works:
        w.wait()
    waited = time.perf_counter() - t0
    total = world * (world + 1) / 2
    right = [sorted(set(t.tolist())) == [total * (c + 1)] for c, t in enumerate(tensors)]
    late = torch.full((1000,), float(RANK))
    work = dist.all_reduce(late, async_op=True)
    dist.barrier()
    done_by_barrier = work.is_completed()
    work.wait()
    right.append(sorted(set(late.tolist())) == [float(sum(range(world)))])
    return {"pending_at_return": pending_at_return, "order": order, "right": right,
            "returned_s": returned, "waited_s": waited, "done_by_barrier": done_by_barrier}


def main() -> int:
    scenario = os.environ["SCENARIO"]
    if scenario == "train_straggler":  # the benchmark's own script, which inits the group
        from bench import straggler_train
        args = straggler_train.parse_args(os.environ["TRAIN_ARGS"].split())
        try:
            put("result", straggler_train.run(args))
        except Exception as e:
            put("error", {"type": type(e).__name__, "message": str(e),
                          "traceback": traceback.format_exc()})
            return 1
        return 0
    try:
        dist.init_process_group("passing")
        if scenario == "reinit":
            put("result", reinit())
            return 0
        gloo = dist.new_group(backend="gloo")
        if scenario == "collectives":
            put("result", collectives(gloo))
        elif scenario == "semantics":
            put("result", semantics(gloo))
        elif scenario == "ddp":
            before = sent()
            passing = train(None, 6)
            middle = sent()
            ref = train(gloo, 6)
            stream = dist.group.WORLD.passing.stream
            put("result", {"passing": passing, "gloo": ref, "packets": None if before is None
                           else [middle - before, sent() - middle],
                           "host_calls": stream.host_calls if stream is not None else None})
        elif scenario == "straggler":
            put("result", straggler())
        elif scenario == "overlap":
            put("result", overlap())
        elif scenario == "behind":
            put("result", behind())
        elif scenario == "slow":
            if RANK == 0:
                time.sleep(8)
            t = torch.full((10,), float(RANK))
            dist.all_reduce(t)
            put("result", t.tolist())
        elif scenario == "die":
            start = time.monotonic()
            try:
                train(None, 10**6)
            finally:
                put("elapsed", time.monotonic() - start)
        dist.destroy_process_group()
        del gloo
        put("gloo_threads_left", gloo_threads())
    except Exception as e:
        put("error", {"type": type(e).__name__, "message": str(e),
                      "traceback": traceback.format_exc()})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
